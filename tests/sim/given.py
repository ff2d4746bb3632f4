"""A fairness rule of the turns, read on the nodes and the wire: a turn given goes first.

* **the turn given goes first** (docs/explanation/waiting.md: "The release that ends a
  streak also drops a wake-up the first waiter already had", and a late confirmation,
  a shortening heard then, "a pub/sub connection lost or refused" wake it "only after
  0.5 s", "the late release of a hold of ours that expired wakes nobody"; "Woken at
  once, its attempt would follow the release on every connection and beat the process
  named"; where pub/sub is refused, it "lets one poll of the process named go by (0.16
  s after its release)"): once a manager's release of a plain lock named another
  process (``RELEASE_TURN`` published that member on the release channel, or granted
  the lock to it), its head tries that lock (``ACQUIRE`` by a waiter from its queue:
  run.run notes each as it queues) no sooner than its own sleep ends: the shortest
  PTTL its last attempt from the queue read, on the slowest clock, and 2 ms; or, if it
  became head since, the validity of the lock its process took then (``taken``); where
  pub/sub is refused, 0.1 s at most, and not before 0.16 s after the release
  (Queue.holding_back). Unless, since the release, the manager heard a release name
  nobody or itself, or a grant; or it is 0.5 s after the last release it heard name
  another (TurnEntry._fall_back), or 0.5 to 0.55 s after a wake-up put off so (a
  shortening or a confirmation heard, a connection lost or refused, at any time:
  Queue._wake_unless_given_way sets a timer nothing cancels); or the fallback (0.5 s)
  passed since the release; or a waiter of its process left the queue without it
  (a new head tries at once, or after 50 ms); or the attempt was the head's last, at
  its deadline.

Judged where the rules of subs.py are (``world.quiet`` runs, no cluster: world.subs)
with the library's memory sizes, for managers in line (a release that carries their
member; a process waiting out of line names none). A violation goes to ``World.wire``.
It reads, never touches, the stores and the random streams: a run's schedule is the
same with it or without (run.run's wrapper of ``Waiting.acquire`` only notes who
queues and who leaves).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from aiolock._core.keys import RELEASED_SUFFIX, grant_channel
from aiolock._lua import ACQUIRE_SCRIPT, PASS_ON_SCRIPT, RELEASE_TURN_SCRIPT

from .promised import EXPIRY_SLACK, FALLBACK, GAVE_WAY_POLL, POLL_INTERVAL, UNKNOWN_HOLDER_WAIT
from .sleeps import name_of

if TYPE_CHECKING:
    from .subs import Subscriptions
    from .world import Link, World

#: As documented (promised.py: the turn queue's fallback, a head's holding back and
#: poll, its margin on a PTTL, its sleep when no PTTL was read), and the slowest
#: clock's rate (run.DRIFT: within 1 ± 0.009).
SLOWEST = 1.01
#: Leeway for the instants compared (a command takes under a millisecond here).
EPSILON = 0.002
#: The library's drift allowance on a validity (1 % and 2 ms: aiolock._quorum.quorum).
DRIFT_ALLOWANCE = 0.01
SHAS = (ACQUIRE_SCRIPT.sha, RELEASE_TURN_SCRIPT.sha, PASS_ON_SCRIPT.sha)
_RELEASED = RELEASED_SUFFIX
_GRANTS = grant_channel(b"", b"")


class GivenTurns:
    """The rule above, for one run (World.given)."""

    def __init__(self, world: World, subs: Subscriptions) -> None:
        self.world = world
        self.subs = subs
        #: token -> when its waiter entered its process's queue (Waiting.acquire, for
        #: a plain lock's waiter: see run.run), and its deadline. Its attempts from then
        #: on are a head's; the one at its deadline, its last.
        self.queued: dict[bytes, tuple[float, float]] = {}
        #: (token, key) -> its attempts ended so far, and the replies of the one under
        #: way (node -> reply) with when its first node ran it.
        self.attempts: dict[tuple[bytes, bytes], tuple[int, dict[int, Any], float]] = {}
        #: (token, key) -> when its last failed attempt from its queue began (first
        #: node), and how long its head sleeps after it at least (seconds).
        self.failed: dict[tuple[bytes, bytes], tuple[float, float]] = {}
        #: (member, key) -> when its release last named another process (the first
        #: node's run of it, less a millisecond), and whom.
        self.given: dict[tuple[bytes, bytes], tuple[float, bytes]] = {}
        #: (member, key) -> when a waiter of its last took the lock (the first node's
        #: run of the attempt or handoff, less a millisecond) and how long the next
        #: head sleeps on it at least (its validity: None where not known, a grant's).
        self.taken: dict[tuple[bytes, bytes], tuple[float, float | None]] = {}
        #: (process, key) -> when a waiter of it last left its queue without the lock.
        self.ended: dict[tuple[int, bytes], float] = {}
        self._told: set[tuple[bytes, bytes, float]] = set()

    # -- the nodes' side -------------------------------------------------------------

    def ran(
        self, link: Link, sha: bytes, command: list[bytes], reply: Any, messages: list[Any]
    ) -> None:
        """A node ran ``command`` (one of :data:`SHAS`) from ``link``, replying ``reply``
        and publishing ``messages`` ((channel, message) pairs)."""
        member = self.subs.writers.get(link)
        if sha == RELEASE_TURN_SCRIPT.sha:
            self._released(command, messages)
        elif sha == PASS_ON_SCRIPT.sha:
            if member is not None and isinstance(reply, list) and reply[:1] == [1]:
                self._took(member, command, self.world.now)
        elif len(command) > 6:
            self._tried(link, member, command, reply)

    def _took(self, member: bytes, command: list[bytes], began: float) -> None:
        """A waiter of ``member`` took the lock with ``command`` (its attempt, or a
        handoff to it) begun at ``began``: the next head sleeps on its validity."""
        keys = int(command[2])
        ttl = int(command[3 + keys + 1]) / 1000
        valid = ttl * (1 - DRIFT_ALLOWANCE) - 0.002 - EPSILON
        self.taken[(member, command[3])] = (began - 0.001, valid)

    def _released(self, command: list[bytes], messages: list[Any]) -> None:
        if len(command) < 13 or command[2] != b"5":
            return  # (out of line: names nobody of its own)
        key, member = command[3], command[12]
        now = self.world.now
        for channel, message in messages:
            if channel == key + _RELEASED and message:
                named = message
            elif channel.startswith(key + _GRANTS):
                named = channel[len(key + _GRANTS) :]
                self.taken[(named, key)] = (now - 0.001, None)  # (not known how long)
            else:
                continue
            if named == member:
                continue
            given = self.given.get((member, key))
            if given is None or now - given[0] > FALLBACK:  # (the first node's)
                self.given[(member, key)] = (now - 0.001, named)

    def _tried(self, link: Link, member: bytes | None, command: list[bytes], reply: Any) -> None:
        now = self.world.now
        key, token = command[3], command[5]
        ended, replies, began = self.attempts.get((token, key), (0, {}, now))
        node = link.node.index
        if node in replies:
            replies = {}
        if not replies:
            began = now
            if member is not None:
                self._judge(link.process, member, key, token)
        replies[node] = reply
        self.attempts[(token, key)] = (ended, replies, began)
        n = len(self.world.nodes)
        if len(replies) < n:
            return
        self.attempts[(token, key)] = (ended + 1, {}, now)
        took = sum(1 for r in replies.values() if type(r) is int)  # (a fencing token)
        if took >= n // 2 + 1:
            if member is not None:
                self._took(member, command, began)
            return
        queued, _ = self.queued.get(token, (math.inf, 0.0))
        if began < queued:
            return  # (not a head's: its process's first try, or a try with timeout 0)
        pttls = [
            r[1]
            for r in replies.values()
            if isinstance(r, list) and len(r) >= 2 and r[0] == 0 and r[1] >= 0
        ]
        sleep = min(pttls) / 1000 / SLOWEST + EXPIRY_SLACK if pttls else UNKNOWN_HOLDER_WAIT
        self.failed[(token, key)] = (began, sleep)

    def _judge(self, process: int, member: bytes, key: bytes, token: bytes) -> None:
        """A new attempt by ``member``'s head on ``key``: early after a turn it gave?"""
        now = self.world.now
        given = self.given.get((member, key))
        if given is None or token not in self.queued or now - given[0] >= FALLBACK:
            return
        queued, deadline = self.queued[token]
        at, named = given
        name = name_of(key)
        if (
            queued >= at - EPSILON  # (a queue begun since: its first waiter tries at once)
            or self.taken.get((member, key), (-1.0, None))[0] >= at  # (taken since)
            or now >= deadline - EPSILON  # (its last attempt, at its deadline)
            or self.subs.wakes.get((member, key), -1.0) >= at
            or now >= self.subs.others.get((member, key), math.inf) + FALLBACK - EPSILON
            or self._woken_late(process, member, key)
            or (member, key, at) in self._told
        ):
            return
        failed = self.failed.get((token, key))
        if failed is not None:  # (head since then: it sleeps on what it read)
            began, sleep = failed
            if began >= at:
                return  # (tried since: its sleeps are its own again)
        else:  # head since a waiter of its process took the lock, or left it
            began, valid = self.taken.get((member, key), (-1.0, None))
            if valid is None or began < queued:
                return
            if self.ended.get((process, key), -1.0) >= queued:
                return  # (a waiter left: the next may try at once, or after 50 ms)
            sleep = valid
        due = began + sleep
        if self.world.pubsub_refused:
            due = max(began + min(sleep, POLL_INTERVAL), at + GAVE_WAY_POLL)
        if now >= due - EPSILON:
            return
        self._told.add((member, key, at))
        self.world.wire.append(
            f"the turn given goes first: p{process}'s head tried {name!r} at {now:.6f}, "
            f"{now - at:.3f} s after its release named {named!r} ({at:.6f}), its sleep "
            f"from {began:.6f} due at {due:.6f}, and nothing heard"
        )

    def _woken_late(self, process: int, member: bytes, key: bytes) -> bool:
        """Whether a wake-up put off to the fallback (after a give-way, by a shortening
        heard, a confirmation, a connection lost or refused) may come now."""
        now, subs = self.world.now, self.subs
        ours = [
            link
            for link in subs.written
            if subs.owners.get(link) == member or (link.process == process and not subs.owners)
        ]
        lost = [link.died_at for link in ours if link.died_at is not None]
        lost += [at for link in ours for at in subs.refused.get(link, ())]
        return any(
            now - FALLBACK * 1.1 - EPSILON <= at <= now - FALLBACK + EPSILON
            for at in [*subs.delayed.get((member, key), ()), *lost]
        )

    # -- the library's and the workload's side ----------------------------------------

    def queue(self, token: bytes, deadline: float) -> None:
        """A plain lock's waiter with ``token`` enters its process's queue, to wait until
        ``deadline`` (loop time: the world's)."""
        self.queued.setdefault(token, (self.world.now, deadline))

    def left(self, key: bytes, process: int) -> None:
        """A waiter of ``process`` for ``key`` left its queue without the lock (at its
        deadline, or cancelled: run.run wraps Waiting.acquire)."""
        self.ended[(process, key)] = self.world.now
