-- RELEASE_EITHER: the clean-up of a PASS_ON that did not win a quorum.
--
-- The clean-up of a PASS_ON that did not win a quorum: the lock is given up by both.
-- KEYS[1] lock key
-- ARGV[1] the waiter's token, ARGV[2] the old holder's, ARGV[3] (optional) the message
-- returns 1 when the key held either token and was deleted, else 0.

local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] or holder == ARGV[2] then
    redis.call('del', KEYS[1])
    redis.call('publish', KEYS[1] .. ':released', ARGV[3] or '')
    return 1
end
return 0
