"""Keeping held locks alive, and cancelling the holder the moment a lock is lost.

One :class:`Renewer` per manager runs one background task (owned by the manager,
stopped by ``aclose()``) for every auto-renewed lock of the process. Each lock is
renewed about every ``ttl / 3``; whatever is due at a wake-up is renewed in one
batch: **one script call per node per tick**, whatever the number of locks, so a
process may hold thousands of locks for the price of a few commands a second.

A lock is lost when

* a majority of nodes says the key is gone or holds another token (taken over,
  deleted, restarted empty), or
* renewal has not reached a quorum while validity runs out: the holder is told
  ``guard`` seconds *before* ``remaining()`` reaches 0, so that it stops while the
  lock is still its own, or
* the optional ``max_hold`` has passed.

Loss is decided by the clock, never by a request in flight: each renewal keeps a
deadline (``give_up_at``, or ``max_hold``), moved whenever the lock's validity
changes, and it fires even while a renewal batch still waits for hung nodes (a
deadline looked at only between batches would be late: a batch may wait
``ttl / 6``). The deadlines of a manager share one loop timer (:class:`Deadlines`).
A deadline that has passed is final: a confirmation read after it (the loop was
blocked) declares the loss rather than moving the deadline.

Loss sets :attr:`Renewal.lost`, makes the lock not ``owned``, wakes
:meth:`Renewal.wait_lost` and runs the ``on_lost`` callbacks (``async with`` uses
one to cancel its body).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Protocol

import anyio

from .._core.calls import ignore
from .._core.cancel import move_on_after
from .._core.checks import shown
from .._core.errors import LockLost, LockNotOwned, QuorumError
from .._core.events import Emit, logger
from .._core.hold import Hold
from .._core.keys import fence_key, fence_retention
from .._core.votes import milliseconds
from .._lua import REPAIR_SCRIPT
from .quorum import Quorum

__all__ = ["Deadlines", "Renewal", "Renewer"]

#: Stopped or moved entries that Deadlines keeps before it drops them (when they are
#: also half its heap): each drop walks the heap once.
STALE_KEPT = 64


class _Armed(Protocol):
    """What Deadlines calls: a renewal, which notes its latest entry in ``armed``."""

    armed: int

    def deadline_passed(self) -> None: ...


class Deadlines:
    """The deadlines of one manager's renewals, on one loop timer.

    A deadline is what tells a holder that its lock is lost in time, so it fires at
    its time whatever else is armed, moved or stopped. A timer per renewal would cost
    every lock cycle a ``TimerHandle`` made and cancelled, and every loop iteration
    a heap of them; here a deadline is an entry in a heap of our own and one timer
    waits for the earliest live one. An entry is live while it is its renewal's
    latest (``armed`` holds its number; 0: none): moving a deadline pushes a new
    entry, and stopping one leaves the old entry to be skipped, or dropped with the
    others once they pile up.
    """

    __slots__ = ("_clock", "_count", "_heap", "_loop", "_stale", "_timer", "_timer_at")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, _Armed]] = []
        self._count = 0
        self._stale = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None

    def pending(self) -> int:
        """Entries in the heap, live or not (for tests)."""
        return len(self._heap)

    def arm(self, armed: _Armed, at: float) -> None:
        """Call ``armed.deadline_passed()`` at ``at`` (our clock), instead of any earlier arm."""
        self._count += 1
        if armed.armed:
            self._stale += 1
        armed.armed = self._count
        heap = self._heap
        # Entries stopped or moved since leave from the top now, not when the timer
        # next fires (which skips them alike): kept, each keeps its renewal and hold
        # alive past the young garbage collections.
        while heap and heap[0][2].armed != heap[0][1]:
            heappop(heap)
            self._stale -= 1
        heappush(heap, (at, self._count, armed))
        loop = asyncio.get_running_loop()
        if at < self._timer_at or loop is not self._loop:  # (a timer on a loop gone)
            self._set(self._heap[0][0], loop)

    def disarm(self, armed: _Armed) -> None:
        """Never call ``armed.deadline_passed()`` for what was armed so far."""
        if armed.armed:
            armed.armed = 0
            self._stale += 1
            if self._stale > STALE_KEPT and 2 * self._stale > len(self._heap):
                self._heap = [entry for entry in self._heap if entry[2].armed == entry[1]]
                heapify(self._heap)
                self._stale = 0

    def close(self) -> None:
        """Cancel the timer (every renewal is stopped)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf

    def _set(self, at: float, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at, self._loop = at, loop
        self._timer = loop.call_later(max(0.0, at - self._clock()), self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        heap = self._heap
        now = self._clock()
        while heap:
            at, number, armed = heap[0]
            if armed.armed != number:  # moved or stopped since
                heappop(heap)
                self._stale -= 1
            elif at <= now:
                heappop(heap)
                armed.armed = 0
                armed.deadline_passed()  # (may arm again: pushes, and may set the timer)
            else:
                break
        if heap and heap[0][0] < self._timer_at:
            self._set(heap[0][0], asyncio.get_running_loop())


class Renewal:
    """The renewal of one held lock; created when an auto-renewed lock is acquired."""

    __slots__ = (
        "_callbacks",
        "_event",
        "_renewer",
        "active",
        "armed",
        "due",
        "give_up_at",
        "hold",
        "hold_until",
        "last_error",
        "lost",
        "token",
    )

    def __init__(self, renewer: Renewer, hold: Hold, now: float) -> None:
        self._renewer = renewer
        self.hold = hold
        self.token = hold.token
        self.active = True
        self.lost: LockLost | None = None
        self.last_error: BaseException | None = None
        self._callbacks: list[Callable[[], object]] = []
        self._event: asyncio.Event | None = None
        #: The number of our latest deadline's entry in the renewer's Deadlines (0: none).
        self.armed = 0
        self.hold_until = hold.deadline(now)
        self.due = self.give_up_at = now
        self._schedule(hold.ttl)  # sets due and give_up_at, arms the timer

    def validity_changed(self, ttl: float) -> None:
        """The hold's validity was set by an extension of ``ttl``: move the schedule.

        Unless the deadline has passed: then the lock is lost now, as the deadline's
        timer would have said. A confirmation read after the deadline (the loop was
        blocked with its replies in hand, the timer not yet run) does not bring the
        lock back: the holder may have read ``remaining() == 0`` meanwhile, and acted
        on it (the lock would be renewed on, for a task that went on as if it were
        lost).
        """
        if self._renewer.clock() >= min(self.give_up_at, self.hold_until):
            self.deadline_passed()
            return
        self._schedule(ttl)
        self._renewer.rescheduled(self)

    def validity_lowered(self, ttl: float) -> None:
        """An extension of ``ttl`` went out that lowered the validity: move the deadline.

        (Not the next renewal: the extension's outcome sets it, see validity_changed.)
        """
        guard = self._renewer.guard(ttl)
        self.give_up_at = min(self.give_up_at, self.hold.expires_at - guard)
        self._arm()

    def _schedule(self, ttl: float) -> None:
        """Set the deadline and the next renewal from the hold's validity.

        The deadline is ``guard`` before the validity ends; the next renewal is due a
        third of ``ttl`` after the validity began (so that an ``extend()`` to a
        shorter ttl is renewed in time), and never later than the deadline.
        """
        hold = self.hold
        self.give_up_at = hold.expires_at - self._renewer.guard(ttl)
        self.due = min(hold.valid_from + ttl / 3, self.give_up_at)
        self._arm()

    def _arm(self) -> None:
        if self.active:
            self._renewer.deadlines.arm(self, min(self.give_up_at, self.hold_until))

    def deadline_passed(self) -> None:
        now = self._renewer.clock()
        if now >= self.hold_until:
            self.declare_lost("max_hold reached", None)
        elif now >= self.give_up_at:
            self.declare_lost(
                "no quorum confirmed the renewal before validity ran out", self.last_error
            )
        else:  # the loop's timer and our clock disagree by a hair: wait the rest
            self._arm()

    def stop(self) -> None:
        """Stop renewing (the lock was released or dropped); idempotent."""
        if self.active:
            self.active = False
            self._renewer.deadlines.disarm(self)
            self._renewer.discard(self)

    def on_lost(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` when the lock is lost (at once if it already was)."""
        if self.lost is not None:
            callback()
        else:
            self._callbacks.append(callback)

    async def wait_lost(self) -> LockLost:
        """Wait until the lock is lost and return the ``LockLost``."""
        if self.lost is None:
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()
        assert self.lost is not None  # noqa: S101
        return self.lost

    def declare_lost(self, reason: str, cause: BaseException | None) -> None:
        """Give the lock up: it is no longer owned, and whoever waits is told."""
        if self.lost is not None:
            return
        hold = self.hold
        lost = LockLost(f"lock {shown(hold.name)} lost: {reason}")
        lost.__cause__ = cause
        self.lost = lost
        renewer = self._renewer
        renewer.emit("lost", hold.name, renewer.clock() - hold.acquired_at, lost)
        renewer.forget(hold.token)
        self.stop()
        # From now on the lock is not owned and remaining() is 0 (see Hold.remaining);
        # its token stays so that release() still deletes what remains on the nodes.
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class Renewer:
    """Renews every auto-renewed lock of one manager from one background task.

    ``quorum``: the nodes (their one ordered connection each, shared with every other
    command of the manager: see _engine.py); ``emit``: where losses are reported.
    """

    def __init__(
        self, quorum: Quorum, *, emit: Emit, forget: Callable[[bytes], None] = lambda _t: None
    ) -> None:
        self._quorum = quorum
        self.clock = quorum.clock
        self.emit = emit
        #: Every renewal's deadline, on one loop timer.
        self.deadlines = Deadlines(self.clock)
        #: A lost lock is not held here any more: its late grants go back (_waiting/grants.py).
        self.forget = forget
        self._renewals: dict[Renewal, None] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._sleep_until = math.inf
        #: When the renewal started last was due: the task's sleep while none is held.
        self._last_due = -math.inf
        self._closed = False

    def __len__(self) -> int:
        return len(self._renewals)

    def guard(self, ttl: float) -> float:
        """How long before validity ends the holder is told of a failing renewal."""
        return min(ttl / 5, max(3 * self._quorum.node_timeout, 0.05))

    def retry_interval(self, ttl: float) -> float:
        """Pause before retrying a renewal that failed without a verdict."""
        return max(ttl / 10, 2 * self._quorum.node_timeout)

    def start(self, hold: Hold) -> Renewal:
        """Start renewing ``hold`` (just acquired); it is ``hold.renewal`` from now on."""
        if self._closed:
            raise RuntimeError("the lock manager is closed")
        renewal = Renewal(self, hold, self.clock())
        hold.renewal = renewal
        self._renewals[renewal] = None
        self._last_due = renewal.due
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        else:
            self.rescheduled(renewal)
        return renewal

    def rescheduled(self, renewal: Renewal) -> None:
        """``renewal`` may now be due before the task's next wake-up: wake it."""
        if renewal.due < self._sleep_until:
            self._wake.set()

    def discard(self, renewal: Renewal) -> None:
        """Forget ``renewal``; the task sleeps on until its next event anyway."""
        self._renewals.pop(renewal, None)

    async def aclose(self) -> None:
        """Stop the background task and every renewal's deadline timer."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for renewal in list(self._renewals):
            renewal.stop()
        self.deadlines.close()

    async def _run(self) -> None:
        clock = self.clock
        while True:
            now = clock()
            # Due soon: renew with this batch rather than wake up again. Then sleep
            # until the next lock is *due*, not merely in the window: locks that came
            # into the window during this batch join the next one rather than each
            # starting a batch of its own.
            due = [r for r in self._renewals if now >= r.due - r.hold.ttl / 6]
            if due:
                try:
                    await self._renew(due)
                except Exception:  # never let one bad tick end renewal for every lock
                    logger.exception("aiolock: a renewal tick failed; retrying")
                    for renewal in due:
                        renewal.due = min(renewal.due, clock() + 0.05)
                    await anyio.sleep(0.05)
            # With none held, it sleeps until the one started last was due (then for
            # good): a lock taken meanwhile with a ttl no shorter is due after that,
            # and need not wake the task, as each lock of a steady stream would. (Any
            # lock due sooner wakes it: see rescheduled.)
            idle = self._last_due if self._last_due > clock() else math.inf
            self._sleep_until = min((r.due for r in self._renewals), default=idle)
            self._wake.clear()
            delay = self._sleep_until - clock()
            if delay > 0:
                with move_on_after(delay):
                    await self._wake.wait()

    async def _renew(self, due: list[Renewal]) -> None:
        quorum = self._quorum
        clock = self.clock
        # Renewal is not latency-bound: each script call of a batch may take a node
        # longer than one small request, up to a sixth of the shortest ttl, but the
        # batch not past the first deadline in it (each deadline's timer fires
        # regardless: this only frees the renewer for the next batch in time).
        first_deadline = min(r.give_up_at for r in due) - clock()
        budget = max(quorum.node_timeout, min(min(r.hold.ttl for r in due) / 6, first_deadline))
        start = clock()
        extensions = [
            r.hold.begin_extension(quorum.expiry(start, r.hold.ttl), r.hold.ttl) for r in due
        ]
        try:
            batch = await quorum.extend_many(
                [(r.hold.key, r.token, r.hold.ttl) for r in due],
                budget=budget,
                limit=max(budget, first_deadline),
            )
        except BaseException:
            for renewal, extension in zip(due, extensions, strict=True):
                ttl = renewal.hold.ttl
                renewal.hold.end_extension(extension, start, quorum.expiry(start, ttl), ttl)
            raise
        now = clock()
        for j, renewal in enumerate(due):
            hold = renewal.hold
            won = batch.won(j)
            expires_at = quorum.expiry(start, hold.ttl)
            hold.end_extension(extensions[j], start, expires_at, hold.ttl, won=won)
            if not renewal.active:
                continue  # released, dropped or lost meanwhile
            if won and hold.remaining(now) > 0.0:
                renewal.last_error = None
                missing = batch.missing.get(j)
                if missing and hold.repairable:
                    self._repair(renewal, missing)
                continue
            if batch.rejected(j):
                renewal.declare_lost(
                    "the key is gone or held by another token on a majority of nodes",
                    LockNotOwned(f"lock {shown(hold.name)} not held on a majority of nodes"),
                )
                continue
            renewal.last_error = QuorumError(
                f"renewal of lock {shown(hold.name)}: {batch.failed[j]} of {quorum.n} nodes failed",
                batch.errors,
            )
            # Retry, and leave time for one more try before giving up; never sooner
            # than a node can answer. (Half the time left alone came ever sooner as
            # the deadline neared, then at once past it: when every node fails at
            # once, in its reconnect back-off, a retry due at once fails without an
            # await, and this task looped without letting the loop run the deadline.)
            renewal.due = now + min(
                self.retry_interval(hold.ttl),
                max(quorum.node_timeout, (renewal.give_up_at - now) / 2),
            )

    def _repair(self, renewal: Renewal, nodes: list[int]) -> None:
        """Re-create a lock that a renewal kept on a quorum where nodes lost it.

        Only after a renewal that *won* (the lock is ours): a node that restarted empty
        gets our key back (``SET NX``: someone else's key is left alone) and its fencing
        counter our token, so that one more node failure does not lose a lock that a
        restart had thinned out. Not awaited: the next renewal counts it. The counter
        goes up to the tokens reserved for our leases too (see _waiting/lease.py): they are ours.
        """
        hold = renewal.hold
        fence = hold.reserve
        if fence is None:  # pragma: no cover - a renewed lock has its token
            return
        ttl = hold.ttl
        args = (
            b"2",
            hold.key,
            fence_key(hold.key),
            renewal.token,
            b"%d" % milliseconds(ttl),
            b"%d" % fence,
            b"%d" % milliseconds(fence_retention(ttl)),
        )
        nodes_of = self._quorum.nodes
        for i in nodes:
            nodes_of[i].call_script(REPAIR_SCRIPT, args, ignore)
