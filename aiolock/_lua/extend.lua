-- EXTEND: reset the lock's expiry if it holds our token; never re-create it.
--
-- KEYS[1] lock key
-- ARGV[1] token
-- ARGV[2] new time to live in milliseconds
-- returns 1 when the key held the token and its expiry was reset, else 0.
-- A missing key is a failure: an expired lock is never re-created. A shorter time to
-- live is announced (SHORTENED): the waiters of other processes sleep on the longer
-- PTTL their attempts learnt, and the lock may expire unreleased.

if redis.call('get', KEYS[1]) == ARGV[1] then
    if redis.call('pttl', KEYS[1]) > tonumber(ARGV[2]) then
        redis.call('publish', KEYS[1] .. ':released', 's')
    end
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
