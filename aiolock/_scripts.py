"""Lua scripts run on each node. Pure data: each is headed by its KEYS, ARGV and return.

Every script touches only keys of one lock name, all sharing one hash tag, so the
scripts also run on Redis Cluster nodes.
"""

from __future__ import annotations

__all__ = ["ACQUIRE", "EXTEND", "EXTEND_MANY", "RAISE_FENCE", "RELEASE"]

# KEYS[1] lock key
# KEYS[2] fencing counter of the same name
# ARGV[1] token
# ARGV[2] time to live in milliseconds
# ARGV[3] how long the counter is kept after its last use, in milliseconds
# ARGV[4] the acquirer's clock in microseconds: the floor of the fencing token
# returns {1, fence} when the key was set (the lock taken on this node): fence is
#         max(counter + 1, ARGV[4]), also stored as the counter (see _fencing.py);
#         {0, pttl} when held by someone else: the holder's remaining time to live in
#         ms (-1: no expiry), which bounds how long a waiter sleeps if the release
#         message is lost;
#         a WRONGTYPE error when the key exists but is not a lock (a name collision).
ACQUIRE = b"""\
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local fence = tonumber(ARGV[4])
    local last = tonumber(redis.call('get', KEYS[2]))
    if last and last >= fence then
        fence = last + 1
    end
    redis.call('set', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3])
    return {1, fence}
end
local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'string' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is a ' .. kind .. ', not a lock')
end
return {0, redis.call('pttl', KEYS[1])}
"""

# KEYS[1] fencing counter
# ARGV[1] a fencing token handed out (or about to be)
# ARGV[2] how long the counter is kept after its last use, in milliseconds
# returns 1: the counter is now at least ARGV[1] (raised if it was lower)
RAISE_FENCE = b"""\
local last = tonumber(redis.call('get', KEYS[1]))
if not last or last < tonumber(ARGV[1]) then
    redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
"""

# KEYS[1] lock key
# ARGV[1] token
# returns 1 when the key held the token and was deleted, else 0.
# On release, the channel KEYS[1] .. ':released' tells waiting processes to try now.
RELEASE = b"""\
if redis.call('get', KEYS[1]) == ARGV[1] then
    redis.call('del', KEYS[1])
    redis.call('publish', KEYS[1] .. ':released', '')
    return 1
end
return 0
"""

# KEYS[1] lock key
# ARGV[1] token
# ARGV[2] new time to live in milliseconds
# returns 1 when the key held the token and its expiry was reset, else 0.
# A missing key is a failure: an expired lock is never re-created.
EXTEND = b"""\
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS[i] lock keys, one per lock being renewed
# ARGV[2i-1] token of KEYS[i]; ARGV[2i] its new time to live in milliseconds
# returns an array: 1 at i when KEYS[i] held its token and was extended, else 0.
# One call renews every lock of a batch: one command per node per renewal tick.
# GET goes through pcall so that a key of another type fails only its own entry.
EXTEND_MANY = b"""\
local out = {}
for i = 1, #KEYS do
    if redis.pcall('get', KEYS[i]) == ARGV[2 * i - 1] then
        out[i] = redis.call('pexpire', KEYS[i], ARGV[2 * i])
    else
        out[i] = 0
    end
end
return out
"""
