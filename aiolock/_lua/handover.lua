-- HANDOVER: a detached lock's ticket attached to a new handle (locks.attach()).
--
-- KEYS[1] lock key
-- ARGV[1] the token of a detached lock (its ticket's)
-- ARGV[2] the token of the handle attaching it
-- ARGV[3] new time to live in milliseconds
-- returns 1 when the key held ARGV[1] and now holds ARGV[2] for ARGV[3] ms, else 0.
-- A missing key is a failure (never re-created), and a ticket works once: after it, the
-- old token is no longer the key's. The fencing counter is left alone: the same
-- acquisition changes hands. `locks.attach()`. A shorter time to live than the key had
-- left (after a longer extend()) is announced as a shortening EXTEND is (SHORTENED).

if redis.call('get', KEYS[1]) == ARGV[1] then
    if redis.call('pttl', KEYS[1]) > tonumber(ARGV[3]) then
        redis.call('publish', KEYS[1] .. ':released', 's')
    end
    redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])
    return 1
end
return 0
