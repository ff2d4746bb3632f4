"""The turn queue's scripts (see ``_turns.py``), pure data as ``_scripts.py``.

Join, leave, and the release that names, and where it can grants, the next process in
line.

On each node a name's turn queue is three sorted sets, all with the name's hash tag:
``<key>:turns`` (member -> place), ``<key>:turns:live`` (member -> when the entry
expires, server ms) and ``<key>:turns:offers`` (place -> the member's offer: the token
and ttl its head would take the lock with, as ``"member seq ttl retention at token"``,
``at`` the server's ms when the offer arrived; ``seq`` ends in ``*`` when the offer is
tentative, see ``RELEASE_TURN``: an older client's release, which reads digits only,
passes such an offer by and names its process instead).
"""

from __future__ import annotations

from typing import Final

from ._scripts import NOW_MS, Script, fence_lines

__all__ = [
    "RELEASE_TURN",
    "RELEASE_TURN_SCRIPT",
    "TURN_JOIN",
    "TURN_JOIN_SCRIPT",
    "TURN_LEAVE",
    "TURN_LEAVE_SCRIPT",
    "TURN_SCRIPTS",
]


# Takes member ARGV[m]'s offer out of KEYS[k] (its place: ARGV[p]).
def _remove_offer(k: int, p: int, m: int) -> bytes:
    return b"""\
for _, old in ipairs(redis.call('zrangebyscore', KEYS[%(k)d], ARGV[%(p)d], ARGV[%(p)d])) do
    if string.sub(old, 1, #ARGV[%(m)d] + 1) == ARGV[%(m)d] .. ' ' then
        redis.call('zrem', KEYS[%(k)d], old)
    end
end
""" % {b"k": k, b"p": p, b"m": m}


# Puts member ARGV[m]'s offer ARGV[s .. s+3] (seq, ttl ms, retention ms, token) at its
# place ARGV[p] in KEYS[k], noting when it arrived; KEYS[k] is kept ARGV[life] ms.
# Needs ``now``; the member's earlier offer must be out.
def _add_offer(k: int, p: int, m: int, s: int, life: int) -> bytes:
    return b"""\
redis.call('zadd', KEYS[%(k)d], ARGV[%(p)d], ARGV[%(m)d] .. ' ' .. ARGV[%(s)d] .. ' '
    .. ARGV[%(t)d] .. ' ' .. ARGV[%(r)d] .. ' ' .. string.format('%%.0f', now) .. ' '
    .. ARGV[%(o)d])
redis.call('pexpire', KEYS[%(k)d], ARGV[%(l)d])
""" % {b"k": k, b"p": p, b"m": m, b"s": s, b"t": s + 1, b"r": s + 2, b"o": s + 3, b"l": life}


# The release of a plain lock, which names the process whose turn it is: the first in
# line after the releasing process (by place, going round), so that nodes with the same
# entries name the same process whatever they saw before. Entries whose process stopped
# refreshing them are dropped first (a few per call).
# When that process (not the releasing one: the end of a streak of handoffs within a
# process lets others in) left an offer fresh enough (at least half its ttl left since
# it arrived), the lock is granted to it here: the key gets the offer's token, expiring
# the offer's ttl after the offer arrived (its process counts its validity from when it
# sent the offer: never longer than the node keeps the key), and the next fencing token
# as an acquire would; the grant is published to that process alone. Nobody else hears
# of the release: the lock is not free. A grant nobody receives (the process is gone:
# its connections closed) is undone, the process taken out of line, and every waiter
# may try; a *tentative* offer's (its sequence number ends in ``*``: sent before
# every node confirmed the process's subscription to its grants, so the node may not
# have it yet) is undone too, but the process stays in line (seed 17592196048300).
# Each offer is used once.
# KEYS[1] lock key, KEYS[2] its fencing counter, KEYS[3] the turn queue, KEYS[4] the
#         entries' expiries, KEYS[5] the offers
# ARGV[1] token, ARGV[2] the releaser's clock in microseconds (the fencing floor, see
#         _fencing.py); when the releasing process is in line: ARGV[3] how long the
#         queue's keys live, in ms, ARGV[4] its place and ARGV[5] its member, and
#         ARGV[6..9] (optional) its head's offer: seq, ttl ms, retention ms, token
#         (without: its offer is taken out)
# returns 1 when the key held the token and was released (or granted), else 0. The
# message on ``<key>:released`` is the member named, or empty (nobody in line: every
# waiting process may try); a grant's, on ``<key>:turn:<member>``, is "seq fence". A
# key already gone (expired just before its release) is announced as a release is:
# the lock is free, and a waiter that learnt a longer PTTL (the holder shortened it
# with extend() since) would otherwise sleep until then.
RELEASE_TURN = (
    b"""\
local holder = redis.call('get', KEYS[1])
if holder and holder ~= ARGV[1] then
    return 0
end
local released = 0
if holder then
    redis.call('del', KEYS[1])
    released = 1
end
local turn = ''
if redis.call('zcard', KEYS[3]) > 0 then
"""
    + NOW_MS
    + b"""\
    local gone = redis.call('zrangebyscore', KEYS[4], '-inf', now, 'LIMIT', 0, 8)
    for _, member in ipairs(gone) do
        redis.call('zrem', KEYS[3], member)
        redis.call('zrem', KEYS[4], member)
    end
    if ARGV[5] then
"""
    + _remove_offer(5, 4, 5)
    + b"""\
        if ARGV[9] then
"""
    + _add_offer(5, 4, 5, 6, 3)
    + b"""\
        end
    end
    local after = {}
    if ARGV[4] then
        after = redis.call(
            'zrangebyscore', KEYS[3], '(' .. ARGV[4], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    end
    if #after == 0 then
        after = redis.call('zrange', KEYS[3], 0, 0, 'WITHSCORES')
    end
    if #after > 0 then
        turn = after[1]
        for _, offer in ipairs(redis.call('zrangebyscore', KEYS[5], after[2], after[2])) do
            local member, seq, tentative, ttl, retention, at, token =
                string.match(offer, '^(%S+) (%d+)(%*?) (%d+) (%d+) (%d+) (.*)$')
            if member == turn and turn ~= ARGV[5] then
                redis.call('zrem', KEYS[5], offer)
                local left = tonumber(at) + tonumber(ttl) - now
                if left * 2 >= tonumber(ttl) then
                    redis.call('set', KEYS[1], token, 'PX', string.format('%.0f', left))
"""
    + fence_lines(b"KEYS[2]", b"retention", b"ARGV[2]")
    + b"""\
                    local message = seq .. ' ' .. string.format('%.0f', fence)
                    if redis.call('publish', KEYS[1] .. ':turn:' .. turn, message) > 0 then
                        return released
                    end
                    redis.call('del', KEYS[1])
                    if tentative == '' then
                        redis.call('zrem', KEYS[3], turn)
                        redis.call('zrem', KEYS[4], turn)
                    end
                    turn = ''
                end
                break
            end
        end
    end
end
if released == 1 or not holder then
    redis.call('publish', KEYS[1] .. ':released', turn)
end
return released
"""
)

# A process waiting for a lock joins its turn queue, or refreshes its entry there, with
# its head's offer (see RELEASE_TURN).
# KEYS[1] the turn queue, KEYS[2] the entries' expiries, KEYS[3] the offers
# ARGV[1] the process's member, ARGV[2] its place (the same on every node: its clock
#         in microseconds when it joined), ARGV[3] how long the entry lives unless
#         refreshed, in ms, ARGV[4..7] (optional) its offer: seq, ttl ms, retention ms,
#         token (without: its offer is taken out, as where pub/sub turned out refused)
# returns 1. A member already in line keeps its place; the keys expire with the last
# entry, so that a name nobody waits for leaves nothing behind.
TURN_JOIN = (
    NOW_MS
    + b"""\
redis.call('zadd', KEYS[1], 'NX', ARGV[2], ARGV[1])
redis.call('zadd', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('pexpire', KEYS[1], ARGV[3])
redis.call('pexpire', KEYS[2], ARGV[3])
"""
    + _remove_offer(3, 2, 1)
    + b"""\
if ARGV[7] then
"""
    + _add_offer(3, 2, 1, 4, 3)
    + b"""\
end
return 1
"""
)

# A process that waits no more leaves the turn queue, with its offer; or a process that
# was named and did not use its turn is taken out by one that went in its place. Not
# while the lock is held: then the process named most likely took it (and holds it
# longer than the others' fallback), and out of line it would let the next holder's
# handoffs find nobody else waiting (a streak run to LONE_STREAK: seed 549755813917).
# The process taken out is told on its grant channel (``out``): alive and waiting (it
# may have used its turn, and held the lock until it expired just before the other's
# fallback: seed 35184372089874), it joins again at its place at once, not at its
# next refresh (see Entry.taken_out).
# KEYS[1] the turn queue, KEYS[2] the entries' expiries, KEYS[3] the offers, KEYS[4]
# (only to take another process out) the lock
# ARGV[1] the process's member
# returns the number of entries removed (0 or 1).
TURN_LEAVE = b"""\
if KEYS[4] and redis.call('exists', KEYS[4]) == 1 then
    return 0
end
for _, offer in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
    if string.sub(offer, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
        redis.call('zrem', KEYS[3], offer)
    end
end
redis.call('zrem', KEYS[2], ARGV[1])
local removed = redis.call('zrem', KEYS[1], ARGV[1])
if KEYS[4] and removed == 1 then
    redis.call('publish', KEYS[4] .. ':turn:' .. ARGV[1], 'out')
end
return removed
"""

RELEASE_TURN_SCRIPT: Final = Script(RELEASE_TURN)
TURN_JOIN_SCRIPT: Final = Script(TURN_JOIN)
TURN_LEAVE_SCRIPT: Final = Script(TURN_LEAVE)
#: Loaded with the hot path's scripts on each connection.
TURN_SCRIPTS: Final = (RELEASE_TURN_SCRIPT, TURN_JOIN_SCRIPT, TURN_LEAVE_SCRIPT)
