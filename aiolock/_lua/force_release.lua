-- FORCE_RELEASE: the CLI's `release --force`, whoever holds the lock.
--
-- KEYS[1] lock key
-- returns 1 when the key existed and was deleted, else 0; the waiters are woken either
-- way, sharded pub/sub included (Redis 7.0+ clusters; before 7.0 SPUBLISH fails, which
-- pcall ignores). The CLI's `release --force`, whoever holds the lock: one call, routed
-- by the key on a cluster.

local deleted = redis.call('del', KEYS[1])
redis.call('publish', KEYS[1] .. ':released', '')
redis.pcall('spublish', KEYS[1] .. ':released', '')
return deleted
