-- REPAIR: put a renewed lock back on a node that lost it (restarted empty).
--
-- KEYS[1] lock key
-- KEYS[2] fencing counter of the same name
-- ARGV[1] token, ARGV[2] time to live in milliseconds
-- ARGV[3] the holder's fencing token, ARGV[4] how long the counter is kept, in ms
-- returns 1 when the key was missing and is now the holder's again, else 0 (it exists:
-- ours already, or someone else's, which is left alone).
-- Run only on the nodes that said "missing" in a renewal that won a quorum (a node that
-- restarted empty): the lock is still held, so one more node failure must not lose it.
-- The counter is brought up to the holder's token, so that the next holder's is higher.

if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local last = tonumber(redis.call('get', KEYS[2]))
    if not last or last < tonumber(ARGV[3]) then
        redis.call('set', KEYS[2], ARGV[3], 'PX', ARGV[4])
    end
    return 1
end
return 0
