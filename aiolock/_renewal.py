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
from ._quorum import drift

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
        self.due = now + lock.ttl / 3
        self.give_up_at = lock._expires_at - renewer.guard(lock.ttl)
        max_hold = lock.max_hold
        self.hold_until = math.inf if max_hold is None else now + max_hold

    def next_event(self) -> float:
        """When the renewer must look at this lock next."""
        return min(self.due, self.give_up_at, self.hold_until)

    def stop(self) -> None:
        """Stop renewing (the lock was released or dropped); idempotent."""
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
        renewal = Renewal(self, lock, token, self._manager._clock())
        self._renewals[renewal] = None
        if self._task is None:
            if self._closed:
                raise RuntimeError("the lock manager is closed")
            self._task = asyncio.get_running_loop().create_task(self._run())
        elif renewal.next_event() < self._sleep_until:
            self._wake.set()
        return renewal

    def discard(self, renewal: Renewal) -> None:
        """Forget ``renewal``; the task sleeps on until its next event anyway."""
        self._renewals.pop(renewal, None)

    async def aclose(self) -> None:
        """Stop the background task."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        clock = self._manager._clock
        while True:
            now = clock()
            due: list[Renewal] = []
            for renewal in list(self._renewals):
                if now >= renewal.hold_until:
                    renewal.declare_lost("max_hold reached", None)
                elif now >= renewal.give_up_at:
                    renewal.declare_lost(
                        "no quorum confirmed the renewal before validity ran out",
                        renewal.last_error,
                    )
                elif now >= renewal.due - renewal.lock.ttl / 6:
                    # Due soon: renew it with this batch rather than wake up again.
                    due.append(renewal)
            if due:
                # Then sleep until the next lock is *due*, not merely in the window:
                # locks that came into the window during this batch join the next
                # one rather than each starting a batch of its own.
                try:
                    await self._renew(due)
                except Exception:  # never let one bad tick end renewal for every lock
                    logger.exception("aiolock: a renewal tick failed; retrying")
                    for renewal in due:
                        renewal.due = min(renewal.due, clock() + 0.05)
                    await anyio.sleep(0.05)
            self._sleep_until = min((r.next_event() for r in self._renewals), default=math.inf)
            self._wake.clear()
            delay = self._sleep_until - clock()
            if delay > 0:
                with anyio.move_on_after(delay):
                    await self._wake.wait()

    async def _renew(self, due: list[Renewal]) -> None:
        manager = self._manager
        quorum = manager._renewal_quorum
        # Renewal is not latency-bound: a batch may take a node longer than one
        # small request, up to a sixth of the shortest ttl (validity is still ample).
        timeout = max(quorum.node_timeout, min(r.lock.ttl for r in due) / 6)
        batch = await quorum.extend_many(
            [(r.lock._key, r.token, r.lock.ttl) for r in due], budget=timeout
        )
        now = manager._clock()
        drift_factor = quorum.drift_factor
        for j, renewal in enumerate(due):
            if not renewal.active:
                continue  # released meanwhile
            lock = renewal.lock
            ttl = lock.ttl
            if batch.yes[j] >= quorum.quorum:
                expires_at = batch.start + ttl - drift(ttl, drift_factor)
                if expires_at > now and lock._token is renewal.token:
                    lock._expires_at = expires_at
                    renewal.due = batch.start + ttl / 3
                    renewal.give_up_at = expires_at - self.guard(ttl)
                    renewal.last_error = None
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
                self.retry_interval(ttl), max(0.0, (renewal.give_up_at - now) / 2)
            )
