"""The tasks of one process waiting for one name (see _waiting/waiting.py): their local queue."""

from __future__ import annotations

import asyncio
import random
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, TypeVar

from .._lua import SHORTENED
from . import turns as _turns

if TYPE_CHECKING:
    from .._io.pubsub import Listener
    from .taker import Taker
    from .turns import TurnEntry

__all__ = ["Queue", "Streaks", "listening"]

_L = TypeVar("_L")

#: How often a queue's head tries again when pub/sub is refused on one of its nodes.
POLL_INTERVAL: Final = 0.1
#: How long after a release of ours named another process a head that polls waits
#: before it tries: a poll of the process named (with its jitter) and a margin.
GAVE_WAY_POLL: Final = POLL_INTERVAL * 1.1 + 0.05
#: The most names whose streak is kept (see Streaks), the oldest forgotten first.
STREAKS_KEPT: Final = 1024


class Queue:
    """The tasks of this process waiting for one name."""

    __slots__ = (
        "alone",
        "channels",
        "entries",
        "entry",
        "gave_way",
        "grants",
        "listeners",
        "local_streak",
        "promised",
        "subscribed",
        "takers",
        "unconfirmed",
        "wake",
    )

    def __init__(self, channels: tuple[bytes, ...], listeners: Sequence[Listener]) -> None:
        self.channels = channels
        # The subscribers (nodes) this queue listens on (see listening).
        self.listeners = listeners
        # One future per waiting task, in FIFO order; the head's is done ("your
        # turn"): with None to try at once, or with the ttl of the lock the previous
        # head just took (the new head then waits for its release, or expiry, first).
        self.entries: deque[asyncio.Future[float | None]] = deque()
        self.wake = asyncio.Event()
        self.subscribed = False
        # Our subscriptions to the release channels that a node has not confirmed
        # since our head's attempt went out (see confirmed_late).
        self.unconfirmed = 0
        # Handoffs in a row to a waiter of this process (see Waiting.released).
        self.local_streak = 0
        # The last handoff found no other process in the name's turn queue.
        self.alone = False
        # A release told other processes that a waiter of ours takes the lock, and
        # none has taken it since.
        self.promised = False
        # When a release of ours ended our streak (it named another process), if no
        # head of ours has tried since: a head that takes over from one that left
        # meanwhile waits first, or it would beat the process named (see
        # Waiting._leave); so does a head that polls (see holding_back).
        self.gave_way: float | None = None
        # The offers of the waiters that may be passed the lock, by turn (see Taker).
        self.takers: dict[asyncio.Future[float | None], Taker] = {}
        # Our place in the name's turn queue on the nodes (a plain lock's; see _turns).
        self.entry: TurnEntry | None = None
        # Our subscription to the grants of the name, one confirmation per node (None:
        # not subscribed).
        self.grants: list[asyncio.Future[None]] | None = None

    def hear_grants(self, channel: bytes, subscribers: Sequence[Listener]) -> None:
        """Subscribe to ``channel``, the grants to us, on every node (once; not polling)."""
        if self.grants is None and not self.polling():
            self.grants = [subscriber.subscribe(channel) for subscriber in subscribers]

    def reset(self, grants: bytes | None, subscribers: Sequence[Listener]) -> None:
        """A pub/sub connection dropped (or refused us): a message may have been lost.

        A release: the head tries again; or a grant to us, which a node that has our
        subscription no more undoes, taking us out of line, telling nobody: our entry joins
        again (not where we poll: no offer). Until the new connection confirms our
        subscriptions, a release or a grant to us goes unheard too: the confirmations of
        ours on the release channels wake the head, and ours to the grants (``grants``, on
        each of ``subscribers``) make our offer tentative until every node has confirmed
        again (firm, a grant unheard would take us out of line again, until our refresh).
        """
        self.missed_release()
        if self.subscribed:
            for listener in self.listeners:
                for channel in self.channels:
                    back = listener.confirmation(channel)
                    if back is not None:
                        self.confirmed_late(back)
        if self.entry is not None and not self.polling():
            ours = self.grants
            if ours is not None and grants is not None:
                ours[:] = [
                    listener.confirmation(grants) or grant
                    for listener, grant in zip(subscribers, ours, strict=True)
                ]
            self.entry.taken_out(ours)

    def confirmed_late(self, confirmation: asyncio.Future[None]) -> None:
        """A node will confirm a subscription to a release channel after the head tried.

        Until it does, a release there goes unheard: the head tries again at least
        every fallback (see deaf). When it does, the head tries again at once (see
        missed_release).
        """
        self.unconfirmed += 1
        confirmation.add_done_callback(self._confirmed)

    def _confirmed(self, _confirmation: asyncio.Future[None]) -> None:
        self.unconfirmed -= 1
        self.missed_release()

    def deaf(self) -> bool:
        """Whether a node we listen on has yet to confirm our subscription.

        Until it does, a release there goes unheard, however long the head would
        sleep otherwise.
        """
        return self.unconfirmed > 0

    def missed_release(self) -> None:
        """A release may have gone unheard: a subscription confirmed late, or lost.

        A node confirmed a subscription after the attempt that followed it, or a pub/sub
        connection went down (or refused us): the head tries again now (not at the holder's
        expiry). Unless a release of ours gave way since: what the head missed came before
        ours, which took the lock after it and names another process, which goes first (a
        head trying now would follow our release on every connection, and win; where pub/sub
        is refused, a refusal just after our release would wake it so). The head then tries
        at the fallback, as the others do that hear ours (should it go unheard).
        """
        self._wake_unless_given_way()

    def heard(self, message: bytes) -> None:
        """A message on our channels, but ``NOT_FREE``: a release's, or a shortening's.

        A shortening ``extend()`` wakes the head to learn the new PTTL; as for a missed
        release, not at once after a release of ours gave way: heard then, it most likely
        came before our release (an ``extend()`` of ours, heard on the pub/sub connection
        after our release went out on the other). The process named may have shortened it
        since: that costs the head the fallback. So does a release that names a process
        while we are not in line yet (the head still subscribing): after ours gave way, it
        is ours, naming another.
        """
        ours = bool(message) and self.entry is None and self.gave_way is not None
        if message == SHORTENED or ours:
            self._wake_unless_given_way()
        elif self.entry is None or self.entry.heard(message):
            self.wake.set()

    def _wake_unless_given_way(self) -> None:
        if self.gave_way is None:
            self.wake.set()
        else:
            delay = _turns.FALLBACK * random.uniform(1.0, 1.1)
            asyncio.get_running_loop().call_later(delay, self.wake.set)

    def polling(self) -> bool:
        """A node we listen on refused pub/sub: our heads poll (see Waiting.acquire)."""
        return any(listener.refused is not None for listener in self.listeners)

    def holding_back(self, clock: Callable[[], float]) -> float:
        """How much longer a head that polls waits before it tries (0: it may try).

        After a release of ours named another process: where pub/sub is refused, that
        process polls too, hearing no release, and must have had one poll first (else
        our head, its poll due just then, would beat it at every streak's end). A head
        that polls because it may not hear a release yet (see deaf) tries no sooner
        than the fallback after our release, as one that missed a release does (see
        missed_release). ``clock`` is read only then: not once per attempt.
        """
        if self.gave_way is None:
            return 0.0
        if self.polling():
            return self.gave_way + GAVE_WAY_POLL - clock()
        if self.unconfirmed:
            return self.gave_way + _turns.FALLBACK - clock()
        return 0.0


class Streaks:
    """Streaks of handoffs kept while a name's queue is gone and its lock is ours.

    A queue that empties (its last waiter took the lock, or left while a task of ours
    held it) keeps its streak here, and a task that queues before the holder releases
    goes on counting it (Waiting.released); a release with no waiter of ours ends it.
    Without it, a process whose tasks queue one at a time, each while the one before
    holds, starts a streak at every handoff, and the other processes' turns never come
    (the simulation's liveness rules check it, tests/sim/live.py).
    """

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[bytes, tuple[int, bool]] = {}

    def keep(self, key: bytes, queue: Queue) -> None:
        """``queue`` of ``key`` empties (the lock may stay with a task of ours)."""
        if queue.local_streak:
            self._kept[key] = (queue.local_streak, queue.alone)
            if len(self._kept) > STREAKS_KEPT:
                del self._kept[next(iter(self._kept))]

    def resume(self, key: bytes, queue: Queue) -> None:
        """A new ``queue`` of ``key`` goes on with the streak kept, if any."""
        queue.local_streak, queue.alone = self._kept.pop(key, (0, False))

    def seen(self, key: bytes, *, alone: bool) -> None:
        """A handoff of ``key`` said whether others are in line, its queue since gone.

        The handoff's taker wakes (and leaves the queue, if it was the last waiter)
        before the handoff's replies are read: without this, a streak that began
        alone would run to ``LONE_STREAK`` though others have joined the line since.
        """
        kept = self._kept.get(key)
        if kept is not None:
            self._kept[key] = (kept[0], alone)

    def end(self, key: bytes) -> None:
        """The lock of ``key`` leaves this process (a release with no waiter of ours)."""
        self._kept.pop(key, None)


def listening(subscribers: Sequence[_L], key: bytes) -> list[_L]:
    """The ``n - quorum + 1`` of the nodes' ``subscribers`` a queue for ``key`` listens on.

    That is enough to hear every successful release: it deleted the key on at
    least a quorum of nodes, each of which published, and any ``n - quorum + 1``
    nodes share one with any quorum (also when some are down: a node that is
    down publishes nothing, but neither does it count in the quorum). Fewer
    messages per release per waiting process: 3 instead of 5 with five nodes.
    Which nodes depends on the key, to spread the pub/sub work.
    """
    n = len(subscribers)
    count = n - (n // 2 + 1) + 1
    first = zlib.crc32(key) % n
    return [subscribers[(first + i) % n] for i in range(count)]
