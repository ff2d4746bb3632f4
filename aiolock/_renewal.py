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
timer at its deadline (``give_up_at``, or ``max_hold``), moved whenever the lock's
validity changes, and the timer fires even while a renewal batch still waits for
hung nodes. (Before, the deadline was looked at only between batches, and a batch
may wait ``ttl / 6``: holders of locks with ttl above a second were told after
their lock had expired.)

Loss sets :attr:`Renewal.lost`, makes the lock not ``owned``, wakes
:meth:`Renewal.wait_lost` and runs the ``on_lost`` callbacks (``async with`` uses
one to cancel its body).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from ._errors import LockLost, LockNotOwned, QuorumError
from ._events import logger
from ._fencing import fence_retention
from ._keys import fence_key
from ._node import ignore
from ._quorum import REPAIR_SCRIPT, drift, milliseconds

if TYPE_CHECKING:
    from ._lock import Lock
    from ._manager import LockManager

__all__ = ["Renewal", "Renewer"]


class Renewal:
    """The renewal of one held lock; created when an auto-renewed lock is acquired."""

    __slots__ = (
        "_callbacks",
        "_event",
        "_renewer",
        "_timer",
        "active",
        "due",
        "give_up_at",
        "hold_until",
        "last_error",
        "lock",
        "lost",
        "token",
    )

    def __init__(self, renewer: Renewer, lock: Lock, token: bytes, now: float) -> None:
        self._renewer = renewer
        self.lock = lock
        self.token = token
        self.active = True
        self.lost: LockLost | None = None
        self.last_error: BaseException | None = None
        self._callbacks: list[Callable[[], object]] = []
        self._event: asyncio.Event | None = None
        self._timer: asyncio.TimerHandle | None = None
        max_hold = lock.max_hold
        self.hold_until = math.inf if max_hold is None else now + max_hold
        self.validity_changed(lock.ttl)  # sets due and give_up_at, arms the timer

    def validity_changed(self, ttl: float) -> None:
        """The lock's validity was set by an extension of ``ttl``: move the schedule.

        The deadline is ``guard`` before the new validity ends; the next renewal is
        due a third of ``ttl`` after it began (so that an ``extend()`` to a shorter
        ttl is renewed in time), and never later than the deadline.
        """
        expires_at = self.lock._expires_at
        renewer = self._renewer
        self.give_up_at = expires_at - renewer.guard(ttl)
        # expires_at = start + ttl - drift: due at start + ttl / 3.
        began = expires_at - ttl + drift(ttl, renewer._manager.drift_factor)
        self.due = min(began + ttl / 3, self.give_up_at)
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self.active:
            return
        deadline = min(self.give_up_at, self.hold_until)
        delay = deadline - self._renewer._manager._clock()
        self._timer = asyncio.get_running_loop().call_later(max(0.0, delay), self._deadline)

    def _deadline(self) -> None:
        self._timer = None
        now = self._renewer._manager._clock()
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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.active:
            self.active = False
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
        lost = LockLost(f"lock {self.lock.name!r} lost: {reason}")
        lost.__cause__ = cause
        self.lost = lost
        manager = self._renewer._manager
        manager._emit("lost", self.lock.name, manager._clock() - self.lock._acquired_at, lost)
        self.stop()
        # From now on the lock is not owned and remaining() is 0 (see Lock.remaining);
        # its token stays so that release() still deletes what remains on the nodes.
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class Renewer:
    """Renews every auto-renewed lock of one manager from one background task."""

    def __init__(self, manager: LockManager) -> None:
        self._manager = manager
        self._renewals: dict[Renewal, None] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._sleep_until = math.inf
        self._closed = False

    def __len__(self) -> int:
        return len(self._renewals)

    def guard(self, ttl: float) -> float:
        """How long before validity ends the holder is told of a failing renewal."""
        return min(ttl / 5, max(3 * self._manager.node_timeout, 0.05))

    def retry_interval(self, ttl: float) -> float:
        """Pause before retrying a renewal that failed without a verdict."""
        return max(ttl / 10, 2 * self._manager.node_timeout)

    def start(self, lock: Lock) -> Renewal:
        """Start renewing ``lock`` (just acquired)."""
        token = lock._token
        assert token is not None  # noqa: S101
        if self._closed:
            raise RuntimeError("the lock manager is closed")
        renewal = Renewal(self, lock, token, self._manager._clock())
        self._renewals[renewal] = None
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

    async def _run(self) -> None:
        clock = self._manager._clock
        while True:
            now = clock()
            # Due soon: renew with this batch rather than wake up again. Then sleep
            # until the next lock is *due*, not merely in the window: locks that came
            # into the window during this batch join the next one rather than each
            # starting a batch of its own.
            due = [r for r in self._renewals if now >= r.due - r.lock.ttl / 6]
            if due:
                try:
                    await self._renew(due)
                except Exception:  # never let one bad tick end renewal for every lock
                    logger.exception("aiolock: a renewal tick failed; retrying")
                    for renewal in due:
                        renewal.due = min(renewal.due, clock() + 0.05)
                    await anyio.sleep(0.05)
            self._sleep_until = min((r.due for r in self._renewals), default=math.inf)
            self._wake.clear()
            delay = self._sleep_until - clock()
            if delay > 0:
                with anyio.move_on_after(delay):
                    await self._wake.wait()

    async def _renew(self, due: list[Renewal]) -> None:
        manager = self._manager
        quorum = manager._renewal_quorum
        clock = manager._clock
        # Renewal is not latency-bound: a batch may take a node longer than one
        # small request, up to a sixth of the shortest ttl, but not past the first
        # deadline in it (each deadline's timer fires regardless: this only frees
        # the renewer for the next batch in time).
        first_deadline = min(r.give_up_at for r in due) - clock()
        budget = max(quorum.node_timeout, min(min(r.lock.ttl for r in due) / 6, first_deadline))
        extensions = [r.lock._begin_extension() for r in due]
        start = clock()
        try:
            batch = await quorum.extend_many(
                [(r.lock._key, r.token, r.lock.ttl) for r in due], budget=budget
            )
        except BaseException:
            for renewal, extension in zip(due, extensions, strict=True):
                renewal.lock._end_extension(extension, renewal.token, start, renewal.lock.ttl)
            raise
        now = clock()
        for j, renewal in enumerate(due):
            lock = renewal.lock
            won = batch.yes[j] >= quorum.quorum
            lock._end_extension(extensions[j], renewal.token, start, lock.ttl, won=won)
            if not renewal.active:
                continue  # released, dropped or lost meanwhile
            if won and lock.remaining() > 0.0:
                renewal.last_error = None
                missing = batch.missing.get(j)
                if missing and lock._repairable:
                    self._repair(renewal, missing)
                continue
            if batch.no[j] > quorum.n - quorum.quorum:
                renewal.declare_lost(
                    "the key is gone or held by another token on a majority of nodes",
                    LockNotOwned(f"lock {lock.name!r} not held on a majority of nodes"),
                )
                continue
            renewal.last_error = QuorumError(
                f"renewal of lock {lock.name!r}: {batch.failed[j]} of {quorum.n} nodes failed",
                batch.errors,
            )
            # Retry, and leave time for one more try before giving up.
            renewal.due = now + min(
                self.retry_interval(lock.ttl), max(0.0, (renewal.give_up_at - now) / 2)
            )

    def _repair(self, renewal: Renewal, nodes: list[int]) -> None:
        """Re-create a lock that a renewal kept on a quorum where nodes lost it.

        Only after a renewal that *won* (the lock is ours): a node that restarted empty
        gets our key back (``SET NX``: someone else's key is left alone) and its fencing
        counter our token, so that one more node failure does not lose a lock that a
        restart had thinned out. Not awaited: the next renewal counts it.
        """
        lock = renewal.lock
        fence = lock._fencing_token
        if fence is None:  # pragma: no cover - a renewed lock has its token
            return
        ttl = lock.ttl
        args = (
            b"2",
            lock._key,
            fence_key(lock._key),
            renewal.token,
            b"%d" % milliseconds(ttl),
            b"%d" % fence,
            b"%d" % milliseconds(fence_retention(ttl)),
        )
        nodes_of = self._manager._renewal_quorum.nodes
        for i in nodes:
            nodes_of[i].call_script(REPAIR_SCRIPT, args, ignore)
