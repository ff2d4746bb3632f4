-- INSPECT: who holds a lock and for how long, read-only; never the token.
--
-- KEYS[1] lock key
-- KEYS[2] fencing counter of the same name
-- returns {pttl of the lock key (-2: none), digest of the holder's token or false, the
-- fencing counter or false}. Read-only. The token never leaves the node: a digest
-- (12 hex digits of its SHA1) tells holders apart. `locks.inspect()`, `locks.locked()`.

local token = redis.call('get', KEYS[1])
local holder = false
if token then
    holder = string.sub(redis.sha1hex(token), 1, 12)
end
return {redis.call('pttl', KEYS[1]), holder, redis.call('get', KEYS[2])}
