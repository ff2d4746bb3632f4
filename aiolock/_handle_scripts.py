"""The Lua scripts of the read-write lock and the semaphore (the lock's: ``_scripts``).

They share the lock's fencing lines (:data:`~aiolock._scripts.FENCE`) and reply to an
acquire like ``ACQUIRE`` does, so that ``Quorum.acquire`` counts their votes alike.
"""

from __future__ import annotations

from typing import Final

from ._scripts import FENCE, HOLDER, NOW_MS, Script

__all__ = [
    "RW_READ",
    "RW_READ_SCRIPT",
    "RW_RELEASE",
    "RW_RELEASE_SCRIPT",
    "RW_WRITE",
    "RW_WRITE_SCRIPT",
    "SEM_ACQUIRE",
    "SEM_ACQUIRE_SCRIPT",
    "SEM_CHECKS",
    "SEM_FREE_REPORTED",
    "SEM_RELEASE",
    "SEM_RELEASE_SCRIPT",
]

# Read-write lock. Keys share the name's hash tag: W the writer's lock key, I the
# writer's intent (a waiting writer keeps new readers out: writers are not starved),
# R the set of reader ids, R .. id each reader's own lock key, F the fencing counter.
# Both acquire scripts reply like ACQUIRE: {1, fence} or {0, pttl to wait}, and
# use the same fencing lines (ARGV[1..4] as for ACQUIRE).

# KEYS[1] this reader's key, KEYS[2] F, KEYS[3] W, KEYS[4] I, KEYS[5] R
# ARGV[1] token, ARGV[2] ttl ms, ARGV[3] counter retention ms, ARGV[4] fence floor,
# ARGV[5] this reader's id (KEYS[1] is R's prefix .. id)
RW_READ = (
    b"""\
if redis.call('exists', KEYS[3]) == 1 then
    return {0, redis.call('pttl', KEYS[3])}
end
if redis.call('exists', KEYS[4]) == 1 then
    return {0, redis.call('pttl', KEYS[4])}
end
if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {0, redis.call('pttl', KEYS[1])}
end
redis.call('sadd', KEYS[5], ARGV[5])
"""
    + FENCE
    + b"""\
return {1, fence}
"""
)

# KEYS[1] W, KEYS[2] F, KEYS[3] I, KEYS[4] R, KEYS[5..] the readers' keys the caller
# knows of (R's prefix .. id; none at first)
# ARGV[1] token, ARGV[2] ttl ms, ARGV[3] counter retention ms, ARGV[4] fence floor,
# ARGV[5] the prefix of readers' keys (R's members are appended to it),
# ARGV[6] '1' when the writer will wait (then it leaves its intent), '0' if not
# Every key touched is declared: when R names a reader whose key is not among KEYS, the
# script touches nothing and replies {2, id, ...} (R's members): the caller asks again
# with their keys (see Quorum.acquire's keys_asked).
# Readers whose key expired are dropped from R here. While live readers remain, a
# waiting writer leaves its intent (until the last of them would expire, plus a
# second); the writer that gets the lock clears it.
RW_WRITE = (
    b"""\
if redis.call('exists', KEYS[1]) == 1 then
    return {0, redis.call('pttl', KEYS[1])}
end
local declared = {}
for i = 5, #KEYS do
    declared[KEYS[i]] = i
end
local readers = redis.call('smembers', KEYS[4])
for _, id in ipairs(readers) do
    if not declared[ARGV[5] .. id] then
        local ask = {2}
        for j, member in ipairs(readers) do
            ask[j + 1] = member
        end
        return ask
    end
end
local wait = -2
for _, id in ipairs(readers) do
    local left = redis.call('pttl', KEYS[declared[ARGV[5] .. id]])
    if left == -2 then
        redis.call('srem', KEYS[4], id)
    elseif left == -1 then
        wait = math.max(wait, tonumber(ARGV[2]))
    else
        wait = math.max(wait, left)
    end
end
if wait >= 0 then
    if ARGV[6] == '1' then
        redis.call('set', KEYS[3], ARGV[1], 'PX', wait + 1000)
    end
    return {0, wait}
end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('del', KEYS[3])
"""
    + FENCE
    + b"""\
return {1, fence}
"""
)

# KEYS[1] the handle's key (W, or a reader's), KEYS[2] R
# ARGV[1] token, ARGV[2] reader id ('' for the writer), ARGV[3] channel to publish on
# returns 1 when released, else 0
RW_RELEASE = b"""\
if redis.call('get', KEYS[1]) == ARGV[1] then
    redis.call('del', KEYS[1])
    if ARGV[2] ~= '' then
        redis.call('srem', KEYS[2], ARGV[2])
    end
    redis.call('publish', ARGV[3], '')
    return 1
end
return 0
"""


# Semaphore (see _semaphore.py). Each slot is a lock key, S .. i; the index N notes,
# for each slot a holder took, when its key expires (ms, server time). The index is
# advice, never safety: a slot is taken only by SET NX on its own key, and what the
# index says of a slot is corrected whenever that slot's key is looked at. Renewal
# does not update it: a renewed slot's note runs out while its key lives on; such a
# note is "to check", and the caller sends those slots' keys along on its next try.

#: How many slots with no note a failed semaphore try learns of, per node.
SEM_FREE_REPORTED: Final = 4
#: How many slots whose note has run out a failed try learns of, per node; the caller
#: sends at most as many along to be checked.
SEM_CHECKS: Final = 16

# KEYS[1] the slot tried (S .. c), KEYS[2] its fencing counter, KEYS[3] N,
# KEYS[4..] slots whose note has run out, sent to be checked
# ARGV[1..4] as for ACQUIRE, ARGV[5] c, ARGV[6] the limit, ARGV[7..] the slot numbers of
# KEYS[4..], in the same order
# (A node that notes ``limit`` slots reports none free without looking further: callers
# that give one name different limits may see it full while a low slot is free.)
# returns {1, fence} when slot c was taken on this node; else
#         {0, ms until the first noted expiry, holder's first 8 bytes, f, f slots
#         with no note (the first from c + 1 on, at most SEM_FREE_REPORTED),
#         then slots whose note has run out (at most SEM_CHECKS)}
SEM_ACQUIRE = (
    NOW_MS
    + b"""\
for i = 4, #KEYS do
    local left = redis.call('pttl', KEYS[i])
    if left == -2 then
        redis.call('zrem', KEYS[3], ARGV[i + 3])
    else
        if left < 0 then left = tonumber(ARGV[2]) end
        redis.call('zadd', KEYS[3], string.format('%.0f', now + left), ARGV[i + 3])
    end
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    redis.call('zadd', KEYS[3], string.format('%.0f', now + tonumber(ARGV[2])), ARGV[5])
    redis.call('pexpire', KEYS[3], ARGV[3])
"""
    + FENCE
    + b"""\
return {1, fence}
end
"""
    + HOLDER
    + b"""\
local left = redis.call('pttl', KEYS[1])
if left < 0 then left = tonumber(ARGV[2]) end
redis.call('zadd', KEYS[3], string.format('%.0f', now + left), ARGV[5])
-- (N may have been written anew above, once expired or lost: never without a ttl.)
redis.call('pexpire', KEYS[3], ARGV[3])
local limit = tonumber(ARGV[6])
local c = tonumber(ARGV[5])
local free = {}
if redis.call('zcard', KEYS[3]) < limit then
    local noted = {}
    for _, i in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
        noted[tonumber(i)] = true
    end
    for j = 1, limit - 1 do
        local i = (c + j) % limit
        if not noted[i] then
            free[#free + 1] = i
            if #free == """
    + b"%d" % SEM_FREE_REPORTED
    + b""" then break end
        end
    end
end
local first = redis.call('zrangebyscore', KEYS[3], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local wait = left
if first[2] then wait = math.min(wait, tonumber(first[2]) - now) end
local reply = {0, wait, string.sub(holder, 1, 8), #free}
for _, i in ipairs(free) do reply[#reply + 1] = i end
local due = redis.call('zrangebyscore', KEYS[3], '-inf', now, 'LIMIT', 0, """
    + b"%d" % SEM_CHECKS
    + b""")
for _, i in ipairs(due) do reply[#reply + 1] = tonumber(i) end
return reply
"""
)

# KEYS[1] the slot's key, KEYS[2] N
# ARGV[1] token, ARGV[2] the slot's number, ARGV[3] (optional) the message, as RELEASE's
# returns 1 when the key held the token and was deleted, else 0; the note goes with the
# key (and with a key that expired). Announced on N's channel: one for every slot.
SEM_RELEASE = b"""\
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then
    redis.call('del', KEYS[1])
    redis.call('zrem', KEYS[2], ARGV[2])
    redis.call('publish', KEYS[2] .. ':released', ARGV[3] or '')
    return 1
end
if not holder then
    redis.call('zrem', KEYS[2], ARGV[2])
end
return 0
"""


RW_READ_SCRIPT: Final = Script(RW_READ)
RW_WRITE_SCRIPT: Final = Script(RW_WRITE)
RW_RELEASE_SCRIPT: Final = Script(RW_RELEASE)
SEM_ACQUIRE_SCRIPT: Final = Script(SEM_ACQUIRE)
SEM_RELEASE_SCRIPT: Final = Script(SEM_RELEASE)
