"""How a blocked acquire learns that the lock was released.

Polling (redis-py's Lock sleeps 0.1 s, Redlock ports 0.1-0.3 s) caps contention at a
few hundred critical sections a second, each handoff tens of milliseconds. Instead:

* **Within a process**, the tasks waiting for one name queue locally, in FIFO order.
  Only the head of the queue contends remotely; the others wait for their turn. So a
  thousand waiting tasks cost the nodes what one does.
* **Across processes**, the release script publishes on the channel
  ``<key>:released``; the head of each process's queue is subscribed (one pub/sub
  connection per node per manager, subscribed only while someone waits) and tries
  again on the first message. It listens on ``n - quorum + 1`` of the nodes, which
  hear every successful release (see ``_queue.listening``).
* **A release that hands the lock to a waiter of its own process says so** (``l``):
  other processes' waiters would only lose the race, and do not try. If no local
  waiter takes it after all, the last to leave announces it free. The clean-up of a
  race lost to a holder with a quorum says the same (see ``Quorum.acquire``).
* **A local release wakes the local head at once**, before its own replies are in:
  on the ordered connection of each node the release is written before the head's
  acquire, so it reaches the node first, and the handoff costs no extra round trip.
* **Processes take turns** for a plain lock: each waiting process has an entry in
  the name's turn queue on the nodes, and a release names the process whose turn it
  is; the others do not try (see ``_waiting/turns.py``). Where it can, the release grants
  that process the lock outright, which then makes no attempt (see ``_waiting/grants.py``).
* **After a split vote the head pauses** (random, longer at each one; see
  ``head.split_pause``) before it tries again: its clean-up woke every waiter.
* **A lost message costs at most one ttl, never a hang**: the head also wakes when
  the holder's key would expire (its PTTL, from the failed attempt), when a pub/sub
  connection is lost, and at the caller's deadline.
* **Where a node refuses pub/sub** (an ACL without ``+subscribe``, a proxy without
  it: a WARNING is logged once, see ``Subscriber``), the heads listening on it poll,
  every :data:`POLL_INTERVAL` (with jitter), never longer than the holder's PTTL.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Protocol, TypeVar

import anyio

from .._core.cancel import done_within, move_on_after
from .._core.keys import grant_channel, release_channel, turn_keys
from .._core.votes import Attempt, Outcome, Votes
from .._io.cluster import ClusterNode
from .._io.cluster_pubsub import ClusterSubscriber
from .._io.pubsub import Listener, Subscriber
from .._lua import NOT_FREE
from .grants import Grants
from .handoff import Line, others_in_line
from .head import Act, Wait, next_act, split_pause
from .queue import Queue, Streaks, listening
from .taker import Taker, attempt_as_head
from .turns import FALLBACK, TAKEN_OUT, Turns

__all__ = ["Outcome", "Waiting"]


class _HasSpec(Protocol):
    @property
    def spec(self) -> Any: ...


_A = TypeVar("_A", bound=Outcome)


#: Most handoffs in a row to a waiter of the same process before waiters of other
#: processes get an equal chance (see Waiting.released).
LOCAL_STREAK: Final = 4
#: The same when the last handoff found no other process in the turn queue: a release
#: then only lets in processes that wait without taking turns (see Waiting.released).
LONE_STREAK: Final = 32


class Waiting:
    """The local wait queues of one manager, and its pub/sub subscribers."""

    def __init__(
        self,
        nodes: Sequence[_HasSpec],
        *,
        clock: Callable[[], float],
        confirm_timeout: float,
        announce: Callable[[bytes], None],
        turns: Turns | None = None,
        grants: Grants | None = None,
    ) -> None:
        self._clock = clock
        self._turns = turns
        self._grants = grants
        # Publishes an (empty) release message on a channel, on every node.
        self._announce = announce
        self._confirm_timeout = confirm_timeout
        self._queues: dict[bytes, Queue] = {}
        self._streaks = Streaks()
        self._by_channel: dict[bytes, Queue] = {}
        self._subscribers: list[Listener] = [
            ClusterSubscriber(node, on_message=self._on_message, on_reset=self._on_reset)
            if isinstance(node, ClusterNode)
            else Subscriber(
                node.spec, on_message=functools.partial(self._heard, i), on_reset=self._on_reset
            )
            for i, node in enumerate(nodes)
        ]

    def waiters(self, key: bytes) -> int:
        """How many tasks of this process wait for ``key``."""
        queue = self._queues.get(key)
        return len(queue.entries) if queue is not None else 0

    def released(self, key: bytes, *, pass_on: bool = False, valid: bool = True) -> Taker | bool:
        """A task of this process is releasing ``key``: wake the head of its queue.

        Woken now, the local head's acquire follows the release on every node's connection
        and always wins: other processes would never get the lock while this one has
        waiters. So after ``LOCAL_STREAK`` local handoffs in a row the local head is not
        woken early, and a wake-up it had (heard during its attempt, before this release) is
        dropped: it learns of the release from pub/sub, like the waiters of every other
        process, whose turn goes first.

        Returns whether the lock goes to a local waiter: the release then says so
        (:data:`~aiolock._lua.NOT_FREE`; see the module's docstring). After a handoff that
        found no other process in the turn queue, the streak is ``LONE_STREAK`` long: its end
        lets in processes that wait out of line. Only a handoff reads the line: a release that
        wakes a head busy with its own attempt forgets it (whoever joined since must not wait
        out a lone streak). A streak survives the queue emptying while the lock stays here
        (``Streaks``), and the release of a hold that expired (``valid=False``: it may release
        nothing, the lock taken since by another task of ours), which after we gave way wakes
        nobody. ``pass_on``: the caller can pass the lock on in one script
        (a plain lock); when the head sleeps, it is claimed and returned.
        """
        queue = self._queues.get(key)
        if queue is None:
            if valid:  # (an expired hold's release: the lock may be with another of ours)
                self._streaks.end(key)  # the lock leaves this process
            return False
        if not valid and queue.gave_way is not None:
            return False  # (an expired hold's, late: the turn we gave stays given)
        if queue.local_streak < (LONE_STREAK if queue.alone else LOCAL_STREAK):
            queue.local_streak += 1
            queue.promised = True
            queue.wake.set()
            taker = queue.takers.get(queue.entries[0]) if pass_on and queue.entries else None
            if taker is not None and not taker.busy and not taker.claimed:
                taker.claimed = True
                return taker
            queue.alone = False  # (nothing read the line: nobody waits out a lone streak)
            return True
        if valid:  # (an expired hold's release may release nothing: the streak goes on)
            queue.local_streak = 0
        queue.gave_way = self._clock()
        queue.wake.clear()  # (stale: see above)
        return False

    def line(self, key: bytes) -> Line:
        """``key``'s turn queue and our member in it, for a handoff (none: no turns)."""
        turns = self._turns
        return () if turns is None else (turn_keys(key)[0], turns.member)

    def line_seen(self, key: bytes, votes: Votes) -> None:
        """A handoff of ``key`` said whether other processes are in its turn queue."""
        if self._turns is None:
            return
        alone = not others_in_line(votes)
        queue = self._queues.get(key)
        if queue is not None:
            queue.alone = alone
        else:  # the taker was our last waiter and has left: its streak is kept aside
            self._streaks.seen(key, alone=alone)

    def release_args(self, key: bytes) -> tuple[bytes, ...]:
        """Our place in ``key``'s turn queue and our offer, as a release's arguments."""
        queue = self._queues.get(key)
        return () if queue is None or queue.entry is None else queue.entry.release_args()

    def _heard(self, node: int, channel: bytes, message: bytes) -> None:
        """A message on node ``node``: a release's, a grant to us, or TAKEN_OUT."""
        grants, turns = self._grants, self._turns
        if grants is None or turns is None or not channel.endswith(turns.member):
            self._on_message(channel, message)
            return
        key = channel[: -len(grant_channel(b"", turns.member))]
        queue = self._queues.get(key)
        if message == TAKEN_OUT:
            if queue is not None and queue.entry is not None:
                queue.entry.taken_out()
            return
        seq, _, fence = message.partition(b" ")
        offer = turns.offered(key, int(seq)) if seq.isdigit() and fence.isdigit() else None
        if offer is not None:
            head = queue.takers.get(queue.entries[0]) if queue and queue.entries else None
            wake = queue.wake.set if queue is not None else lambda: None
            grants.heard(node, key, offer, int(fence), head=head, wake=wake)

    def _on_message(self, channel: bytes, message: bytes) -> None:
        queue = self._by_channel.get(channel)
        if queue is not None and message != NOT_FREE:
            queue.heard(message)

    def _on_reset(self) -> None:
        """A pub/sub connection dropped (or refused us): each queue makes up for it."""
        turns = self._turns
        for key, queue in self._queues.items():
            grants = None if turns is None else grant_channel(key, turns.member)
            queue.reset(grants, self._subscribers)

    async def acquire(
        self,
        key: bytes,
        attempt: Callable[[], Awaitable[_A]],
        deadline: float,
        *,
        channels: tuple[bytes, ...] | None = None,
        exclusive: bool = True,
        taker: tuple[bytes, float] | None = None,
    ) -> _A | None:
        """Queue for ``key`` and call ``attempt`` when it may succeed, until ``deadline``.

        Returns the attempt that acquired the lock or showed an outage, or ``None``
        when the deadline passed first. Leaves the queue on return, on error and on
        cancellation, and passes the turn on. ``channels`` announce releases (default:
        ``key``'s own); ``exclusive=False`` (a semaphore) lets the next waiter try at
        once after one acquired. ``taker``: the waiter's token and ttl, when a release
        of this process may pass it the lock (see :class:`Taker`); such a waiter's
        process (a plain lock's) also joins the name's turn queue (see ``turns.py``).
        """
        queue = self._queue(key, channels)
        turn: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        queue.entries.append(turn)
        if len(queue.entries) == 1:
            turn.set_result(None)
        wait = Wait(queue, turn, deadline, None if taker is None else Taker(*taker))
        if wait.offer is not None:
            queue.takers[turn] = wait.offer
        try:
            if not await self._turn_comes(wait):
                return None
            if not queue.subscribed:
                await self._subscribe(queue, None if wait.offer is None else key)
            if wait.offer is not None and queue.entry is None and self._turns is not None:
                # (Not only after subscribing: a head cancelled meanwhile left it to us.)
                self._join(key, queue)
            result = await self._contend(wait, attempt)
            if result is not None and result.expires_at is not None:
                self._won(wait, result, exclusive=exclusive)
            return result
        finally:
            offer = wait.offer
            if offer is not None:
                offer.leave()
                if self._grants is not None:
                    self._grants.settled(offer.token, key, wait.won)
            self._leave(key, queue, turn, wait.taken)

    def _queue(self, key: bytes, channels: tuple[bytes, ...] | None) -> Queue:
        """``key``'s local queue, made (with its channels' routes) if nobody waits yet."""
        queue = self._queues.get(key)
        if queue is None:
            announced = channels or (release_channel(key),)
            queue = self._queues[key] = Queue(announced, self._listeners(key))
            self._streaks.resume(key, queue)
            for channel in queue.channels:
                self._by_channel[channel] = queue
        return queue

    async def _turn_comes(self, wait: Wait) -> bool:
        """Until the waiter is the head of its queue; False when the deadline came first."""
        turn = wait.turn
        if not turn.done():
            # Not in a cancel scope: that would cancel the turn itself.
            left = wait.deadline - self._clock()
            await done_within(turn, None if math.isinf(left) else max(0.0, left))
            if not turn.done():
                return False
        # Not None: the previous head of ours holds it; its release wakes us.
        wait.hint = turn.result()
        return True

    async def _contend(self, wait: Wait, attempt: Callable[[], Awaitable[_A]]) -> _A | None:
        """The head's loop: each act ``next_act`` decides, until the lock is taken.

        Returns the outcome that acquired or showed an outage, or ``None`` at the deadline.
        A head waits first while a lock of ours is held (a ``hint``), and after a release
        of ours named another process (``gave_way``): trying at once, its attempt would
        follow that release on every connection and win, before the process named heard
        of its turn.
        """
        queue = wait.queue
        wait.tried = wait.hint is not None or wait.queue.gave_way is not None
        while True:
            act, seconds = next_act(wait, self._clock)
            if act is Act.GIVE_UP:
                return None
            if act is Act.SLEEP:
                await self._doze(queue, seconds)
                wait.tried = False
                continue
            if act is Act.HOLD_BACK:
                wait.held_back = True
                with move_on_after(seconds):
                    await queue.wake.wait()
                continue
            wait.held_back = False
            result: _A | None
            if act is Act.TAKE:
                result = await self._take_handoff(wait)
                if result is None:
                    continue  # it failed: the head tries as usual
            else:
                result = await self._try(wait, attempt)
            if result.expires_at is not None or result.outage:
                return result
            wait.hint = result.holder_ttl()
            wait.tried = True

    async def _take_handoff(self, wait: Wait) -> Any:
        """The outcome of a handoff to the head (passed the lock, or ``None``: it failed)."""
        offer = wait.offer
        assert offer is not None  # noqa: S101 - claimed
        result = await offer.future  # passed the lock, or not
        wait.offer = wait.queue.takers[wait.turn] = Taker(offer.token, offer.ttl)
        return None if result.expires_at is None else result  # (failed: try as usual)

    async def _try(self, wait: Wait, attempt: Callable[[], Awaitable[_A]]) -> _A:
        """The head's own attempt; after a split vote, the pause before the next one."""
        queue, offer = wait.queue, wait.offer
        queue.wake.clear()
        queue.gave_way = None
        if queue.entry is not None and queue.polling():
            queue.entry.withdraw()  # an offer made before the refusal
        began = self._clock()
        result = await attempt_as_head(attempt, offer)
        if offer is not None and self._grants is not None:
            self._grants.tried(offer.token, result)  # (its clean-up)
        if pause := split_pause(result, self._clock() - began, wait.splits):
            wait.splits += 1  # (the next pause twice as long)
            await anyio.sleep(min(pause, max(0.0, wait.deadline - self._clock())))
        return result

    async def _doze(self, queue: Queue, sleep: float) -> None:
        """Sleep ``sleep`` seconds unless woken.

        While a release may go unheard (a node has yet to confirm our subscription:
        see Queue.deaf), no longer than the fallback at a time. A confirmation wakes
        the head itself (Queue.missed_release): once every node has confirmed, the
        sleep goes on to its end.
        """
        end = self._clock() + sleep
        while True:
            deaf = queue.deaf()
            with move_on_after(min(sleep, FALLBACK) if deaf else sleep):
                await queue.wake.wait()
            sleep = end - self._clock()
            if queue.wake.is_set() or sleep <= 0 or queue.deaf():
                return

    def _won(self, wait: Wait, result: Outcome, *, exclusive: bool) -> None:
        """The head acquired: its turn and offer are used, the next waiter's turn set."""
        # (A lease's votes are no node's: its offer was taken nowhere.)
        if isinstance(result, Attempt) and result.token is None:
            wait.won = result
        queue = wait.queue
        queue.promised = False
        if queue.entry is not None:
            queue.entry.taken()
        if exclusive:
            assert result.expires_at is not None  # noqa: S101 - acquired
            wait.taken = max(0.0, result.expires_at - self._clock())

    def _leave(
        self, key: bytes, queue: Queue, turn: asyncio.Future[float | None], taken: float | None
    ) -> None:
        was_head = bool(queue.entries) and queue.entries[0] is turn
        queue.entries.remove(turn)
        queue.takers.pop(turn, None)
        if not turn.done():
            turn.cancel()
        if queue.entries:
            if was_head:
                if taken is not None:
                    # Wake-ups so far announced the release we just profited from.
                    queue.wake.clear()
                queue.entries[0].set_result(taken)
            return
        self._close(key, queue)

    def _close(self, key: bytes, queue: Queue) -> None:
        """The last waiter of ``key`` left: the queue goes, with its subscriptions."""
        del self._queues[key]
        self._streaks.keep(key, queue)  # the lock may stay with us: its streak goes on
        # Named by a release, and no waiter of ours took the lock: it is free for all.
        unused_turn = queue.entry is not None and queue.entry.leave()
        for channel in queue.channels:
            del self._by_channel[channel]
            if queue.promised or unused_turn:
                # We said a waiter of ours takes it, and none did: others must hear it free.
                self._announce(channel)
        if queue.subscribed:
            for subscriber in queue.listeners:
                for channel in queue.channels:
                    subscriber.unsubscribe(channel)
        if queue.grants is not None and self._turns is not None:
            for subscriber in self._subscribers:
                subscriber.unsubscribe(grant_channel(key, self._turns.member))

    def _join(self, key: bytes, queue: Queue) -> None:
        """Join ``key``'s turn queue; take grants (_waiting/grants.py) unless pub/sub is refused."""
        assert self._turns is not None  # noqa: S101
        queue.hear_grants(grant_channel(key, self._turns.member), self._subscribers)

        def head() -> Taker | None:  # (read at each offer: a refusal may come after we
            # joined, and a grant nobody can hear takes us out of line)
            polling = queue.polling()
            return queue.takers.get(queue.entries[0]) if queue.entries and not polling else None

        queue.entry = self._turns.join(key, queue.wake.set, head, queue.grants or ())

    def _listeners(self, key: bytes) -> list[Listener]:
        """The ``n - quorum + 1`` nodes a queue for ``key`` listens on (see ``listening``)."""
        return listening(self._subscribers, key)

    async def _subscribe(self, queue: Queue, grants: bytes | None) -> None:
        """Subscribe on the queue's nodes; wait (briefly) for the confirmations.

        The attempt that follows must not miss a release that happens after it
        failed, so the subscription should be in place first; a node that confirms
        later wakes the head when it does (a release may have gone unheard meanwhile).
        With ``grants`` (our key, when we offer to take them), to the grants to us too,
        on every node, not waited for (one slow node would hold every wait up): their
        confirmations are normally in by our offer, which is firm only then (TurnEntry._offer).
        """
        queue.subscribed = True
        confirmations = [s.subscribe(c) for s in queue.listeners for c in queue.channels]
        if grants is not None and self._turns is not None:
            queue.hear_grants(grant_channel(grants, self._turns.member), self._subscribers)
        pending = [c for c in confirmations if not c.done()]  # (not the grants': see above)
        if pending:
            await asyncio.wait(pending, timeout=self._confirm_timeout)
            for late in confirmations:
                if not late.done():
                    queue.confirmed_late(late)

    async def aclose(self) -> None:
        """Close the pub/sub connections."""
        for subscriber in self._subscribers:
            await subscriber.aclose()
