-- PASS_ON: a release that passes the lock to a waiter of the same process.
--
-- The release that passes the lock to a waiter of the same process: one script per
-- node instead of a release and an acquire (see _handoff.py). Nothing is published:
-- the lock is not free for anyone else; unless the waiter's ttl is shorter than the
-- key has left, which is announced as a shortening EXTEND is (SHORTENED): the waiters
-- of other processes sleep on the longer PTTL their attempts learnt, and the waiter's
-- lock may expire unreleased.
-- KEYS[1] lock key, KEYS[2] its fencing counter, KEYS[3] (optional) its turn queue
-- ARGV[1..4] as for ACQUIRE, for the waiter (its token, ttl, ...); ARGV[5] the old token
-- ARGV[6] how many fencing tokens to reserve above the waiter's, for the handoffs that
--         follow it within the process (the lease, see _handoff.py): the counter is
--         left at fence + ARGV[6]
-- ARGV[7] (with KEYS[3]) the releasing process's member in the turn queue
-- returns {1, fence, others} when the key held the old token and now holds the
--         waiter's (with a fresh ttl and the next fencing token, as ACQUIRE would);
--         others: 1 when another process is in the turn queue, else 0 (see
--         Waiting.released); else
--         {0, pttl, holder's first 8 bytes}: the old holder's key is gone (pttl -2)
--         or held by another token, and nothing was changed.

local holder = redis.call('get', KEYS[1])
if holder == ARGV[5] then
    if redis.call('pttl', KEYS[1]) > tonumber(ARGV[2]) then
        redis.call('publish', KEYS[1] .. ':released', 's')
    end
    redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
--+ _fence.lua
if ARGV[6] ~= '0' then
    redis.call('set', KEYS[2], string.format('%.0f', fence + tonumber(ARGV[6])), 'PX', ARGV[3])
end
local others = 0
if KEYS[3] then
    local line = redis.call('zrange', KEYS[3], 0, 1)
    if #line == 2 or (#line == 1 and line[1] ~= ARGV[7]) then
        others = 1
    end
end
return {1, fence, others}
end
if not holder then
    return {0, -2}
end
return {0, redis.call('pttl', KEYS[1]), string.sub(holder, 1, 8)}
