-- RELEASE_TURN: the release of a plain lock that names the next process in line.
--
-- On each node a name's turn queue is three sorted sets, all with the name's hash tag:
-- <key>:turns (member -> place), <key>:turns:live (member -> when the entry expires,
-- server ms) and <key>:turns:offers (place -> the member's offer: the token and ttl its
-- head would take the lock with, as "member seq ttl retention at token", at the
-- server's ms when the offer arrived; seq ends in * when the offer is tentative, see
-- release_turn.lua).
--
-- The release of a plain lock, which names the process whose turn it is: the first in
-- line after the releasing process (by place, going round), so that nodes with the same
-- entries name the same process whatever they saw before. Entries whose process stopped
-- refreshing them are dropped first (a few per call).
-- When that process (not the releasing one: the end of a streak of handoffs within a
-- process lets others in) left an offer fresh enough (at least half its ttl left since
-- it arrived), the lock is granted to it here: the key gets the offer's token, expiring
-- the offer's ttl after the offer arrived (its process counts its validity from when it
-- sent the offer: never longer than the node keeps the key), and the next fencing token
-- as an acquire would; the grant is published to that process alone. Nobody else hears
-- of the release: the lock is not free. A grant nobody receives (the process is gone:
-- its connections closed) is undone, the process taken out of line, and every waiter
-- may try; a *tentative* offer's (its sequence number ends in ``*``: sent before
-- every node confirmed the process's subscription to its grants, so the node may not
-- have it yet) is undone too, but the process stays in line.
-- Each offer is used once.
-- KEYS[1] lock key, KEYS[2] its fencing counter, KEYS[3] the turn queue, KEYS[4] the
--         entries' expiries, KEYS[5] the offers
-- ARGV[1] token, ARGV[2] the releaser's clock in microseconds (the fencing floor, see
--         _fence.lua); when the releasing process is in line: ARGV[3] how long the
--         queue's keys live, in ms, ARGV[4] its place and ARGV[5] its member, and
--         ARGV[6..9] (optional) its head's offer: seq, ttl ms, retention ms, token
--         (without: its offer is taken out)
-- returns 1 when the key held the token and was released (or granted), else 0. The
-- message on ``<key>:released`` is the member named, or empty (nobody in line: every
-- waiting process may try); a grant's, on ``<key>:turn:<member>``, is "seq fence". A
-- key already gone (expired just before its release) is announced as a release is:
-- the lock is free, and a waiter that learnt a longer PTTL (the holder shortened it
-- with extend() since) would otherwise sleep until then.

local holder = redis.call('get', KEYS[1])
if holder and holder ~= ARGV[1] then
    return 0
end
local released = holder and 1 or 0
-- Ours: deleted at the end, unless a grant overwrites it on the way (one nobody hears
-- is deleted there too).
local delete = holder
local turn = ''
if redis.call('zcard', KEYS[3]) > 0 then
--+ _now_ms.lua
    local gone = redis.call('zrangebyscore', KEYS[4], '-inf', now, 'LIMIT', 0, 8)
    for _, member in ipairs(gone) do
        redis.call('zrem', KEYS[3], member)
        redis.call('zrem', KEYS[4], member)
    end
    if ARGV[5] then
        -- Our offer sits at our place on this node, as TURN_JOIN's does.
        local mine = redis.call('zadd', KEYS[3], 'XX', 'INCR', 0, ARGV[5]) or ARGV[4]
        local places = {mine}
        if mine ~= ARGV[4] then
            places[2] = ARGV[4]
        end
        for _, at in ipairs(places) do
            for _, old in ipairs(redis.call('zrangebyscore', KEYS[5], at, at)) do
                if string.sub(old, 1, #ARGV[5] + 1) == ARGV[5] .. ' ' then
                    redis.call('zrem', KEYS[5], old)
                end
            end
        end
        if ARGV[9] then
            redis.call('zadd', KEYS[5], mine, ARGV[5] .. ' ' .. ARGV[6] .. ' '
                .. ARGV[7] .. ' ' .. ARGV[8] .. ' ' .. string.format('%.0f', now) .. ' '
                .. ARGV[9])
            redis.call('pexpire', KEYS[5], ARGV[3])
        end
    end
    local after = {}
    if ARGV[4] then
        after = redis.call(
            'zrangebyscore', KEYS[3], '(' .. ARGV[4], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    end
    if #after == 0 then
        after = redis.call('zrange', KEYS[3], 0, 0, 'WITHSCORES')
    end
    if #after > 0 then
        turn = after[1]
        for _, offer in ipairs(redis.call('zrangebyscore', KEYS[5], after[2], after[2])) do
            local member, seq, tentative, ttl, retention, at, token =
                string.match(offer, '^(%S+) (%d+)(%*?) (%d+) (%d+) (%d+) (.*)$')
            if member == turn and turn ~= ARGV[5] then
                redis.call('zrem', KEYS[5], offer)
                local left = tonumber(at) + tonumber(ttl) - now
                if left * 2 >= tonumber(ttl) then
                    redis.call('set', KEYS[1], token, 'PX', string.format('%.0f', left))
--+ _fence.lua ARGV[3]=retention ARGV[4]=ARGV[2]
                    local message = seq .. ' ' .. string.format('%.0f', fence)
                    if redis.call('publish', KEYS[1] .. ':turn:' .. turn, message) > 0 then
                        return released
                    end
                    delete = true
                    if tentative == '' then
                        redis.call('zrem', KEYS[3], turn)
                        redis.call('zrem', KEYS[4], turn)
                    end
                    turn = ''
                end
                break
            end
        end
    end
end
if delete then
    redis.call('del', KEYS[1])
end
redis.call('publish', KEYS[1] .. ':released', turn)
return released
