"""A liveness rule read on the nodes: a waiter sleeps no longer than its quorum needs.

* **woken at the quorum's expiry** (docs/explanation/waiting.md, "A lost message costs
  at most one ttl": "a waiter also wakes when the holder's key would expire on enough
  nodes for a quorum (the PTTLs learnt from the failed attempt; not a rival's longer
  one on a minority, which a lost race cleans up quietly)"): once a waiter's attempt
  on a plain lock has failed, its process tries that lock again (``ACQUIRE``, by that
  waiter or the next in its line) no later than the PTTLs the attempt read say a
  quorum is free (the k-th shortest among the nodes that said "held", k the quorum
  less the nodes that did not: ``Attempt.holder_ttl``), with the library's slack and
  jitter, the clocks' drift and :data:`SLACK`; unless a wait of that process for the
  lock ends or one of its tasks takes the lock meanwhile, or the process dies. After a
  release of that process named another ("a head that cannot hear a release yet tries
  again at least every 0.5 s (...) no sooner than 0.5 s after a release of its own
  process that named another"), no later than the fallback after that release, with
  :data:`SLACK`, if that is later.

Judged where the liveness rules are (live.py: no fault but deaths, late subscriptions
and dropped pub/sub connections, and the library's real memory sizes; clusters too),
on the attempts of a waiter that tries again: a token's second attempt and later (its
first may be a ``timeout=0`` try, which never sleeps, or the try before the waiter
queues, after which it subscribes and tries again at once), of a process with a wait
for that lock under way (the workload's plain locks: live.Liveness.begins). A violation
is reported with the liveness rules ("woken at the quorum's expiry:").

Read from every node's run of ``ACQUIRE`` (SimNode._execute): what it replied, not what
reached the client, a round trip apart at most where this is judged. A bound from every
node's reply is never shorter than the library's from the replies in when it decided
(another "held" can only move the k-th shortest on). It reads, never touches, the
stores and the random streams: a run's schedule is the same with it or without.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiolock._core.keys import RELEASED_SUFFIX, grant_channel
from aiolock._lua import ACQUIRE_SCRIPT, RELEASE_TURN_SCRIPT

from .promised import EXPIRY_SLACK, FALLBACK, UNKNOWN_HOLDER_WAIT

if TYPE_CHECKING:
    from .live import Liveness
    from .world import World

#: A lock's key on the nodes (the default prefix; live.KEY).
KEY = b"aiolock:{%s}"
#: The sha of the plain lock's attempt (SimNode._execute calls :meth:`Sleeps.ran`).
ACQUIRE_SHA = ACQUIRE_SCRIPT.sha
#: The sha of a plain lock's release that names the next process in line.
RELEASE_TURN_SHA = RELEASE_TURN_SCRIPT.sha
_GRANTS = grant_channel(b"", b"")
#: The library's jitter on its sleep (up to 10 % more), and the nodes' clock rates
#: (within 1 ± 0.009: run.DRIFT), as a factor (its margin: EXPIRY_SLACK).
STRETCH = 1.1 * 1.02
#: What may come between a waiter's wake-up and its next attempt, seconds: a polling
#: head's holding back after its release gave way (0.16 s), a split vote's random pause
#: (twice its attempt, a few milliseconds), a handoff claimed meanwhile (a round trip).
SLACK = 0.25


class Sleeps:
    """The rule above, for one run (World.sleeps; its violations go to live.problems)."""

    def __init__(self, world: World, live: Liveness) -> None:
        self.world = world
        self.live = live
        #: (token, key) -> how many of its attempts ended, and the replies so far of the
        #: one under way (node -> reply).
        self.attempts: dict[tuple[bytes, bytes], tuple[int, dict[int, Any]]] = {}
        #: (process, key) -> when its last failed attempt ended, by when it must try
        #: again, the k-th shortest PTTL it read (ms) and each node's reply.
        self.due: dict[tuple[int, bytes], tuple[float, float, int, list[Any]]] = {}
        #: (process, key) -> when a release of that process last named another process.
        self.gave_way: dict[tuple[int, bytes], float] = {}

    def ran(self, node: int, process: int, command: list[bytes], reply: Any) -> None:
        """Node ``node`` ran ``process``'s ``ACQUIRE`` ``command``, replying ``reply``."""
        if not self.live._active() or len(command) < 6:
            return
        key, token = command[3], command[5]
        self._tried(process, key)
        ended, replies = self.attempts.get((token, key), (0, {}))
        if node in replies:  # (a node that did not answer the last one: a new attempt)
            replies = {}
        replies[node] = reply
        self.attempts[(token, key)] = (ended, replies)
        n = len(self.world.nodes)
        if len(replies) < n:
            return
        self.attempts[(token, key)] = (ended + 1, {})
        quorum = n // 2 + 1
        took = sum(1 for r in replies.values() if type(r) is int)  # (a fencing token)
        if not ended or took >= quorum or not self._waiting(process, key):
            return  # (its first attempt, won, or nobody's wait: see the module's doc)
        pttls = sorted(
            r[1]
            for r in replies.values()
            if isinstance(r, list) and len(r) >= 2 and r[0] == 0 and r[1] >= 0
        )
        now = self.world.now
        kth = pttls[max(1, quorum - (n - len(pttls))) - 1] if pttls else 0
        sleep = (kth / 1000 + EXPIRY_SLACK) * STRETCH if pttls else UNKNOWN_HOLDER_WAIT * 1.1
        ordered = [replies[i] for i in range(n)]
        by = max(now + sleep, self.gave_way.get((process, key), -FALLBACK) + FALLBACK)
        self.due[(process, key)] = (now, by + SLACK, kth, ordered)

    def released(self, process: int, command: list[bytes], messages: list[Any]) -> None:
        """A node ran ``process``'s ``RELEASE_TURN`` ``command``, publishing ``messages``
        ((channel, message) pairs): where it named another process, the due moves on."""
        key = command[3]
        # Its own member, when the releasing process is in line (numkeys 5, ARGV[5]).
        member = command[12] if command[2] == b"5" and len(command) > 12 else None
        for channel, message in messages:
            if channel == key + RELEASED_SUFFIX:
                named = message
            elif channel.startswith(key + _GRANTS):
                named = channel[len(key + _GRANTS) :]
            else:
                continue
            if named and named != member:
                now = self.world.now
                self.gave_way[(process, key)] = now
                due = self.due.get((process, key))
                if due is not None:
                    ended, by, kth, replies = due
                    self.due[(process, key)] = (
                        ended,
                        max(by, now + FALLBACK + SLACK),
                        kth,
                        replies,
                    )
                return

    def _waiting(self, process: int, key: bytes) -> bool:
        """Whether a wait of ``process`` for the lock of ``key`` is under way."""
        name = name_of(key)
        return any(p == process for _, p, _ in self.live.waits.get(name, {}).values())

    def _tried(self, process: int, key: bytes) -> None:
        """``process`` tried ``key`` again: its last failed attempt's due, judged."""
        due = self.due.pop((process, key), None)
        if due is not None and self.world.now > due[1]:
            self._late(process, key, due)

    def excused(self, name: str, process: int) -> None:
        """A wait of ``process`` for ``name`` ended, or one of its tasks took it."""
        self.due.pop((process, KEY % name.encode()), None)

    def check(self) -> None:
        """After every command a node ran: a due passed without an attempt."""
        if not self.due:
            return
        now = self.world.now
        for (process, key), due in list(self.due.items()):
            if process in self.world.dead:
                del self.due[(process, key)]
            elif now > due[1]:
                del self.due[(process, key)]
                self._late(process, key, due)

    def _late(self, process: int, key: bytes, due: tuple[float, float, int, list[Any]]) -> None:
        if not self.live._active():
            return
        ended, by, kth, replies = due
        self.live.problems.append(
            f"woken at the quorum's expiry: p{process}'s attempt on {name_of(key)!r} failed at "
            f"{ended:.6f}, its replies {replies} (a quorum free in {kth} ms), and it had "
            f"not tried again by {by:.6f} ({self.world.now:.6f})"
        )


def name_of(key: bytes) -> str:
    """The lock name of the key ``aiolock:{name}``."""
    return key.decode().partition("{")[2].rpartition("}")[0]
