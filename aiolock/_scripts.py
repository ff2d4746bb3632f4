"""Lua scripts run on each node. Pure data: each is headed by its KEYS, ARGV and return.

Every script touches only keys of one lock name, all sharing one hash tag, so the
scripts also run on Redis Cluster nodes. At the end, each as a :class:`Script`: its
source with its SHA1, what the nodes run.
"""

from __future__ import annotations

import hashlib
from typing import Final

__all__ = [
    "ACQUIRE",
    "ACQUIRE_SCRIPT",
    "EXTEND",
    "EXTEND_MANY",
    "EXTEND_MANY_SCRIPT",
    "EXTEND_SCRIPT",
    "FENCE",
    "FORCE_RELEASE",
    "HANDOVER",
    "HANDOVER_SCRIPT",
    "HOLDER",
    "INSPECT",
    "INSPECT_SCRIPT",
    "NOT_FREE",
    "NOW_MS",
    "PASS_ON",
    "PASS_ON_SCRIPT",
    "RAISE_FENCE",
    "RAISE_FENCE_SCRIPT",
    "RELEASE",
    "RELEASE_EITHER",
    "RELEASE_EITHER_SCRIPT",
    "RELEASE_SCRIPT",
    "REPAIR",
    "REPAIR_SCRIPT",
    "SCRIPTS",
    "SHORTENED",
    "Script",
    "fence_lines",
]


# The fencing lines shared by every acquire script: KEYS[2] is the name's counter,
# ARGV[3] its retention in ms, ARGV[4] the acquirer's floor (see _fencing.py). They
# leave the token in ``fence``.
# The usual case costs one command: the counter is set to the floor, and only when its
# old value was not below the floor (clocks disagree) is it set again, to old + 1.
# (Script calls are atomic: the floor in between is never seen.) SET ... GET needs
# Redis 6.2 or any Valkey.
def fence_lines(counter: bytes, retention: bytes, floor: bytes) -> bytes:
    """FENCE's lines for another counter key, retention and floor (Lua expressions)."""
    return b"""\
local fence = tonumber(%(f)s)
local last = tonumber(redis.call('set', %(c)s, %(f)s, 'PX', %(r)s, 'GET'))
if last and last >= fence then
    fence = last + 1
    redis.call('set', %(c)s, string.format('%%.0f', fence), 'PX', %(r)s)
end
""" % {b"c": counter, b"r": retention, b"f": floor}


FENCE = fence_lines(b"KEYS[2]", b"ARGV[3]", b"ARGV[4]")

# The server's clock in ms, into ``now`` (TIME: the same clock as the keys' expiry);
# shared by the scripts that note expiries (the turn queue's, the semaphore's).
NOW_MS = b"""\
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# The lines that read a held lock's token into ``holder``, or reply WRONGTYPE when the
# key exists but is not a lock (a name collision); shared by the acquire scripts.
HOLDER = b"""\
local holder = redis.pcall('get', KEYS[1])
if type(holder) ~= 'string' then
    local kind = redis.call('type', KEYS[1])['ok']
    return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is a ' .. kind .. ', not a lock')
end
"""

# KEYS[1] lock key
# KEYS[2] fencing counter of the same name
# ARGV[1] token
# ARGV[2] time to live in milliseconds
# ARGV[3] how long the counter is kept after its last use, in milliseconds
# ARGV[4] the acquirer's clock in microseconds: the floor of the fencing token
# returns {1, fence} when the key was set (the lock taken on this node): fence is
#         max(counter + 1, ARGV[4]), also stored as the counter (see _fencing.py); the
#         same when the key already held this very token (a release granted it to this
#         attempt's process, see RELEASE_TURN: its expiry is reset to ARGV[2]);
#         {0, pttl, holder} when held by someone else: the holder's remaining time to
#         live in ms (-1: no expiry), which bounds how long a waiter sleeps if the
#         release message is lost, and the first 8 bytes of the holder's token, which
#         tell a lost race from a split vote (see Quorum.acquire);
#         a WRONGTYPE error when the key exists but is not a lock (a name collision).
ACQUIRE = (
    b"""\
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
"""
    + FENCE
    + b"""\
return {1, fence}
end
"""
    + HOLDER
    + b"""\
if holder == ARGV[1] then
    redis.call('pexpire', KEYS[1], ARGV[2])
"""
    + FENCE
    + b"""\
    return {1, fence}
end
return {0, redis.call('pttl', KEYS[1]), string.sub(holder, 1, 8)}
"""
)

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

#: The message of a release after which the lock is not free for the waiters of other
#: processes, who then do not try: it goes to a waiter of the releasing process (see
#: _waiting.py), or it was the clean-up of a lost race, whose winner holds the lock.
NOT_FREE = b"l"
#: The message of an ``EXTEND`` that shortened the lock, or of a ``PASS_ON`` or a
#: ``HANDOVER`` to a shorter ttl than the key had left: the waiters of every process
#: try again, and so learn when it now expires (the lock is held: nobody's turn is
#: used, nobody is named).
SHORTENED = b"s"

# KEYS[1] lock key
# ARGV[1] token
# ARGV[2] (optional) the message: NOT_FREE, or none
# returns 1 when the key held the token and was deleted, else 0.
# On release, the channel KEYS[1] .. ':released' tells waiting processes to try now.
RELEASE = b"""\
if redis.call('get', KEYS[1]) == ARGV[1] then
    redis.call('del', KEYS[1])
    redis.call('publish', KEYS[1] .. ':released', ARGV[2] or '')
    return 1
end
return 0
"""

# KEYS[1] lock key
# returns 1 when the key existed and was deleted, else 0; the waiters are woken either
# way, sharded pub/sub included (Redis 7.0+ clusters; before 7.0 SPUBLISH fails, which
# pcall ignores). The CLI's `release --force`, whoever holds the lock: one call, routed
# by the key on a cluster.
FORCE_RELEASE = b"""\
local deleted = redis.call('del', KEYS[1])
redis.call('publish', KEYS[1] .. ':released', '')
redis.pcall('spublish', KEYS[1] .. ':released', '')
return deleted
"""

# KEYS[1] lock key
# KEYS[2] fencing counter of the same name
# returns {pttl of the lock key (-2: none), digest of the holder's token or false, the
# fencing counter or false}. Read-only. The token never leaves the node: a digest
# (12 hex digits of its SHA1) tells holders apart. `locks.inspect()`, `locks.locked()`.
INSPECT = b"""\
local token = redis.call('get', KEYS[1])
local holder = false
if token then
    holder = string.sub(redis.sha1hex(token), 1, 12)
end
return {redis.call('pttl', KEYS[1]), holder, redis.call('get', KEYS[2])}
"""

# KEYS[1] lock key
# ARGV[1] the token of a detached lock (its ticket's)
# ARGV[2] the token of the handle attaching it
# ARGV[3] new time to live in milliseconds
# returns 1 when the key held ARGV[1] and now holds ARGV[2] for ARGV[3] ms, else 0.
# A missing key is a failure (never re-created), and a ticket works once: after it, the
# old token is no longer the key's. The fencing counter is left alone: the same
# acquisition changes hands. `locks.attach()`. A shorter time to live than the key had
# left (after a longer extend()) is announced as a shortening EXTEND is (SHORTENED).
HANDOVER = b"""\
if redis.call('get', KEYS[1]) == ARGV[1] then
    if redis.call('pttl', KEYS[1]) > tonumber(ARGV[3]) then
        redis.call('publish', KEYS[1] .. ':released', 's')
    end
    redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])
    return 1
end
return 0
"""

# KEYS[1] lock key
# ARGV[1] token
# ARGV[2] new time to live in milliseconds
# returns 1 when the key held the token and its expiry was reset, else 0.
# A missing key is a failure: an expired lock is never re-created. A shorter time to
# live is announced (SHORTENED): the waiters of other processes sleep on the longer
# PTTL their attempts learnt, and the lock may expire unreleased.
EXTEND = b"""\
if redis.call('get', KEYS[1]) == ARGV[1] then
    if redis.call('pttl', KEYS[1]) > tonumber(ARGV[2]) then
        redis.call('publish', KEYS[1] .. ':released', 's')
    end
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""

# The release that passes the lock to a waiter of the same process: one script per
# node instead of a release and an acquire (see _handoff.py). Nothing is published:
# the lock is not free for anyone else; unless the waiter's ttl is shorter than the
# key has left, which is announced as a shortening EXTEND is (SHORTENED): the waiters
# of other processes sleep on the longer PTTL their attempts learnt, and the waiter's
# lock may expire unreleased (seed 281474996725057).
# KEYS[1] lock key, KEYS[2] its fencing counter, KEYS[3] (optional) its turn queue
# ARGV[1..4] as for ACQUIRE, for the waiter (its token, ttl, ...); ARGV[5] the old token
# ARGV[6] how many fencing tokens to reserve above the waiter's, for the handoffs that
#         follow it within the process (the lease, see _handoff.py): the counter is
#         left at fence + ARGV[6]
# ARGV[7] (with KEYS[3]) the releasing process's member in the turn queue
# returns {1, fence, others} when the key held the old token and now holds the
#         waiter's (with a fresh ttl and the next fencing token, as ACQUIRE would);
#         others: 1 when another process is in the turn queue, else 0 (see
#         Waiting.released); else
#         {0, pttl, holder's first 8 bytes}: the old holder's key is gone (pttl -2)
#         or held by another token, and nothing was changed.
PASS_ON = (
    b"""\
local holder = redis.call('get', KEYS[1])
if holder == ARGV[5] then
    if redis.call('pttl', KEYS[1]) > tonumber(ARGV[2]) then
        redis.call('publish', KEYS[1] .. ':released', 's')
    end
    redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
"""
    + FENCE
    + b"""\
if ARGV[6] ~= '0' then
    redis.call('set', KEYS[2], string.format('%.0f', fence + tonumber(ARGV[6])), 'PX', ARGV[3])
end
local others = 0
if KEYS[3] then
    local line = redis.call('zrange', KEYS[3], 0, 1)
    if #line == 2 or (#line == 1 and line[1] ~= ARGV[7]) then
        others = 1
    end
end
return {1, fence, others}
end
if not holder then
    return {0, -2}
end
return {0, redis.call('pttl', KEYS[1]), string.sub(holder, 1, 8)}
"""
)

# The clean-up of a PASS_ON that did not win a quorum: the lock is given up by both.
# KEYS[1] lock key
# ARGV[1] the waiter's token, ARGV[2] the old holder's, ARGV[3] (optional) the message
# returns 1 when the key held either token and was deleted, else 0.
RELEASE_EITHER = b"""\
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] or holder == ARGV[2] then
    redis.call('del', KEYS[1])
    redis.call('publish', KEYS[1] .. ':released', ARGV[3] or '')
    return 1
end
return 0
"""

# KEYS[1] lock key
# KEYS[2] fencing counter of the same name
# ARGV[1] token, ARGV[2] time to live in milliseconds
# ARGV[3] the holder's fencing token, ARGV[4] how long the counter is kept, in ms
# returns 1 when the key was missing and is now the holder's again, else 0 (it exists:
# ours already, or someone else's, which is left alone).
# Run only on the nodes that said "missing" in a renewal that won a quorum (a node that
# restarted empty): the lock is still held, so one more node failure must not lose it.
# The counter is brought up to the holder's token, so that the next holder's is higher.
REPAIR = b"""\
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local last = tonumber(redis.call('get', KEYS[2]))
    if not last or last < tonumber(ARGV[3]) then
        redis.call('set', KEYS[2], ARGV[3], 'PX', ARGV[4])
    end
    return 1
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


class Script:
    """A Lua script with its SHA1, run with EVALSHA and re-sent with EVAL on NOSCRIPT.

    ``per_key_args``: when non-zero, the script treats each key alike, with that many
    arguments of its own (key *i* owns ``ARGV[per_key_args*(i-1)+1 ...]``), and replies
    with one value per key. Such a call may be split by the keys' hash slots (see
    :class:`aiolock._cluster.ClusterNode`); any other must keep its keys in one slot.
    """

    __slots__ = ("per_key_args", "sha", "source")

    def __init__(self, source: bytes, *, per_key_args: int = 0) -> None:
        self.source = source
        self.per_key_args = per_key_args
        # SHA1 names the script for EVALSHA; it is not used for security.
        self.sha = hashlib.sha1(source, usedforsecurity=False).hexdigest().encode()

    def sharded(self) -> Script:
        """The script announcing with ``SPUBLISH`` (never failing its caller for it)."""
        source = self.source.replace(b"redis.call('publish'", b"redis.pcall('spublish'")
        return Script(source, per_key_args=self.per_key_args)


ACQUIRE_SCRIPT: Final = Script(ACQUIRE)
RELEASE_SCRIPT: Final = Script(RELEASE)
RAISE_FENCE_SCRIPT: Final = Script(RAISE_FENCE)
EXTEND_SCRIPT: Final = Script(EXTEND)
EXTEND_MANY_SCRIPT: Final = Script(EXTEND_MANY, per_key_args=2)
REPAIR_SCRIPT: Final = Script(REPAIR)
INSPECT_SCRIPT: Final = Script(INSPECT)
HANDOVER_SCRIPT: Final = Script(HANDOVER)
PASS_ON_SCRIPT: Final = Script(PASS_ON)
RELEASE_EITHER_SCRIPT: Final = Script(RELEASE_EITHER)
#: Loaded on each node's first connection: the hot path's.
SCRIPTS: Final = (
    ACQUIRE_SCRIPT,
    RELEASE_SCRIPT,
    EXTEND_SCRIPT,
    RAISE_FENCE_SCRIPT,
    PASS_ON_SCRIPT,
)
# The others are loaded on first use (NOSCRIPT fallback): most applications never
# need the read-write lock's (the renewal's two are loaded with SCRIPTS: _engine.py).
