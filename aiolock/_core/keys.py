"""The key layout: every key and channel aiolock touches, built in one place.

A lock name is a hash tag, ``<prefix>{<name>}``, so that every key of one name maps to
one slot of a Redis Cluster (and a script may touch them all):

- ``<key>``: the lock (its value the holder's token);
- ``<key>:fence``: the name's fencing counter, kept :func:`fence_retention` after its last
  use (why tokens increase: docs/explanation/safety.md, "Fencing tokens");
- ``<key>:released``: the channel that announces a release (the scripts build it from
  ``KEYS[1]`` the same way: ``tests/test_redis_seam.py`` checks they agree);
- ``<key>:turns``, ``<key>:turns:live``: the processes waiting for the name, in turn
  order, and when each entry expires (sorted sets; see ``_waiting/turns.py``);
- ``<key>:slot:<i>``: a semaphore's slots, each a lock of its own; ``<key>:slots``,
  what each node noted of them (a sorted set: slot -> expiry), and its channel
  ``<key>:slots:released`` (see ``_handles/semaphore.py``);
- ``<key>:rw``, then ``:w``, ``:i``, ``:r``, ``:r:<id>``, ``:fence``, ``:released``: the
  read-write lock's (see ``_handles/rwlock.py``).

The engine and the command line both use these functions.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "FENCE_SUFFIX",
    "MIN_RETENTION",
    "RELEASED_SUFFIX",
    "RWKeys",
    "fence_key",
    "fence_retention",
    "grant_channel",
    "lock_key",
    "release_channel",
    "semaphore_index",
    "slot_key",
    "turn_keys",
]

FENCE_SUFFIX: Final = b":fence"
RELEASED_SUFFIX: Final = b":released"


def lock_key(prefix: bytes, name: str) -> bytes:
    """The key of lock ``name`` under ``prefix``."""
    return b"%s{%s}" % (prefix, name.encode())


def fence_key(key: bytes) -> bytes:
    """The fencing counter of the lock ``key``."""
    return key + FENCE_SUFFIX


#: Least time a fencing counter is kept after its last use.
MIN_RETENTION: Final = 3600.0


def fence_retention(ttl: float) -> float:
    """How long a name's fencing counter outlives its last acquisition, in seconds.

    Long enough that clocks of the nodes agree much better than that; short enough
    that a name used once (a row id, an order id) does not cost memory forever.
    """
    return max(MIN_RETENTION, 100 * ttl)


def release_channel(key: bytes) -> bytes:
    """The channel on which a release of ``key`` is announced."""
    return key + RELEASED_SUFFIX


def turn_keys(key: bytes) -> tuple[bytes, bytes, bytes]:
    """The turn queue of the lock ``key``, its entries' expiries and offers (_waiting/turns.py)."""
    return key + b":turns", key + b":turns:live", key + b":turns:offers"


def grant_channel(key: bytes, member: bytes) -> bytes:
    """The channel on which a release grants the lock ``key`` to process ``member``."""
    return key + b":turn:" + member


def slot_key(key: bytes, slot: int) -> bytes:
    """Slot ``slot`` of the semaphore ``key``."""
    return key + b":slot:%d" % slot


def semaphore_index(key: bytes) -> bytes:
    """What each node noted of the semaphore ``key``'s slots (see ``SEM_ACQUIRE``)."""
    return key + b":slots"


class RWKeys:
    """The keys of the read-write lock ``key``."""

    __slots__ = ("base", "channel", "fence", "intent", "reader_prefix", "readers", "writer")

    def __init__(self, key: bytes) -> None:
        self.base = key + b":rw"
        self.writer = self.base + b":w"
        self.intent = self.base + b":i"
        self.readers = self.base + b":r"
        self.reader_prefix = self.base + b":r:"
        self.fence = fence_key(self.base)
        self.channel = release_channel(self.base)
