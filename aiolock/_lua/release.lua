-- RELEASE: delete the lock if it holds our token, and tell the waiters.
--
-- KEYS[1] lock key
-- ARGV[1] token
-- ARGV[2] (optional) the message: NOT_FREE, or none
-- returns 1 when the key held the token and was deleted, else 0.
-- On release, the channel KEYS[1] .. ':released' tells waiting processes to try now.

if redis.call('get', KEYS[1]) == ARGV[1] then
    redis.call('del', KEYS[1])
    redis.call('publish', KEYS[1] .. ':released', ARGV[2] or '')
    return 1
end
return 0
