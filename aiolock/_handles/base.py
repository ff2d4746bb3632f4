"""What every handle shares: the properties, acquire's checks and its wait, ``async with``.

:class:`BaseHandle` carries the parts of the handle API that do not depend on what is
held; ``Lock``, ``Semaphore``, ``LockMany`` and the read-write lock's handles are thin
variants that implement a few hooks (as trio's ``_LockImpl`` and its public
subclasses). A variant implements:

* ``owned``, ``remaining()``, ``fencing_token``, ``lost``, ``release()``, ``extend()``;
* ``_acquire(wait)``: one acquisition, ``wait`` already checked (``None``: forever);
* ``_renewals()``: the renewals that cancel the body of ``async with`` on loss;
* ``_abandon()``: after a loss, forget what is held and delete what may remain.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from types import EllipsisType, TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import anyio

from .._core.cancel import shielded
from .._core.checks import check_timeout, shown
from .._core.errors import LockError, LockLost, LockNotOwned, LockTimeout
from .._core.votes import Outcome

if TYPE_CHECKING:
    from .._core.hold import Renewing
    from .._engine import Engine

__all__ = ["BaseHandle", "Configured"]


_O = TypeVar("_O", bound=Outcome)


class Configured:
    """The name, ttl and timeout a handle (or a read-write lock) was made with."""

    __slots__ = ("_name", "_timeout", "_ttl")

    def __init__(self, name: str, *, ttl: float, timeout: float | None) -> None:
        self._name = name
        self._ttl = ttl
        self._timeout = timeout

    @property
    def name(self) -> str:
        """The name (without the manager's prefix)."""
        return self._name

    @property
    def ttl(self) -> float:
        """Time to live of each acquisition and renewal, in seconds."""
        return self._ttl

    @property
    def timeout(self) -> float | None:
        """Default wait of ``acquire()`` and ``async with`` (``None``: forever)."""
        return self._timeout


class BaseHandle(Configured):
    """The handle API that does not depend on what is held (see the module docstring)."""

    __slots__ = ("_acquiring", "_engine", "_report", "_scope")

    #: What the handle is called in messages ("lock 'x'", "semaphore 'x'").
    _kind = "lock"

    def __init__(
        self,
        engine: Engine,
        name: str,
        *,
        ttl: float,
        timeout: float | None,
        report: bool = True,
    ) -> None:
        super().__init__(name, ttl=ttl, timeout=timeout)
        self._engine = engine
        #: Whether acquisitions, releases, timeouts and outages are reported (on_event,
        #: the log); a semaphore reports its own, not its slots' every try.
        self._report = report
        self._acquiring = False
        self._scope: anyio.CancelScope | None = None

    @property
    def _what(self) -> str:
        return f"{self._kind} {shown(self._name)}"

    # -- hooks ----------------------------------------------------------------------

    # (The public ones are documented on each variant.)
    @property
    def owned(self) -> bool:
        raise NotImplementedError

    @property
    def lost(self) -> LockLost | None:
        raise NotImplementedError

    async def release(self) -> None:
        raise NotImplementedError

    async def _acquire(self, wait: float | None) -> bool:
        raise NotImplementedError

    def _handed_over(self) -> bool:
        """Whether what was held was handed to someone else (``Lock.detach()``)."""
        return False

    def _busy(self) -> bool:
        """Whether the handle holds something that acquire() must not replace."""
        return self.owned

    def _renewals(self) -> list[Renewing] | None:
        """The renewals of what is held; ``None`` when something held is not renewed."""
        raise NotImplementedError

    async def _abandon(self) -> None:
        raise NotImplementedError

    # -- acquire ----------------------------------------------------------------------

    async def acquire(self, *, timeout: float | EllipsisType | None = ...) -> bool:  # noqa: ASYNC109
        """Acquire, waiting up to ``timeout`` seconds (default ``...``: the handle's).

        ``timeout=None`` waits forever, ``timeout=0`` tries once. Returns ``True`` when
        held, ``False`` when the time is up; no key is left behind on any node then.

        Raises:
            QuorumError: too many nodes failed for a quorum to be possible (rather
                than waiting for them).
            RuntimeError: the handle already holds, or is acquiring; the manager is
                closed.
            TypeError, ValueError: a bad ``timeout``, before any I/O.

        """
        wait = self._timeout if timeout is ... else check_timeout(timeout)
        if self._acquiring:
            raise RuntimeError(f"{self._what}: acquire() already in progress on this handle")
        if self._busy():
            raise RuntimeError(f"{self._what} is already held by this handle")
        engine = self._engine
        if engine.closed or not engine.connected:
            await engine.open()
        self._acquiring = True
        try:
            return await self._acquire(wait)
        finally:
            self._acquiring = False

    async def _wait_for(
        self,
        attempt: Callable[[], Awaitable[_O]],
        wait: float | None,
        *,
        queue: bytes,
        channels: tuple[bytes, ...] | None,
        exclusive: bool,
        taker: tuple[bytes, float] | None = None,
    ) -> _O | None:
        """Try, and wait in the local queue for ``queue`` while it is worth it.

        Returns the outcome that acquired; ``None`` when the time is up (reported).
        Raises the outcome's QuorumError (reported) when nodes failed.
        """
        engine = self._engine
        clock = engine.clock
        started = clock()
        deadline = math.inf if wait is None else started + wait
        outcome: _O | None = None
        # Try at once unless other tasks of this process already queue for the name
        # (they go first); timeout=0 always tries, exactly once.
        if wait == 0 or not engine.waiting.waiters(queue):
            outcome = await attempt()
            if outcome.expires_at is None and not outcome.outage and clock() < deadline:
                outcome = None
        if outcome is None:
            outcome = await engine.waiting.acquire(
                queue, attempt, deadline, channels=channels, exclusive=exclusive, taker=taker
            )
        if outcome is not None and outcome.expires_at is not None:
            if self._report:
                engine.emit("acquired", self._name, clock() - started)
            return outcome
        if outcome is not None and outcome.outage:
            error = self._outage(outcome)
            if self._report:
                engine.emit("quorum_error", self._name, clock() - started, error)
            raise error
        if self._report:
            engine.emit("timeout", self._name, clock() - started)
        return None

    def _outage(self, outcome: Any) -> LockError:
        """The QuorumError of an outcome that failed for want of nodes."""
        raise NotImplementedError

    # -- loss -------------------------------------------------------------------------

    async def wait_lost(self) -> LockLost:
        """Wait until the background renewal gives up; return the ``LockLost``.

        Returns at once if it already did.

        Raises:
            LockNotOwned: not held with ``auto_renew`` (nothing would ever be reported).

        """
        lost = self.lost
        if lost is not None:
            return lost
        renewals = self._renewals()
        if not renewals:
            raise LockNotOwned(f"{self._what} is not held with auto_renew")
        if len(renewals) == 1:
            return await renewals[0].wait_lost()
        waits = [asyncio.ensure_future(renewal.wait_lost()) for renewal in renewals]
        try:
            done, _pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            return next(iter(done)).result()
        finally:
            for one in waits:
                one.cancel()

    # -- async with -------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if not await self.acquire():
            raise LockTimeout(f"{self._what} not acquired within {self._timeout}s")
        # The renewals cancel the body the moment what is held is lost. The scope is
        # entered here and exited in __aexit__, in the same task, around the body.
        renewals = self._renewals() or []
        if renewals:
            scope = self._scope = shielded(shield=False)
            scope.__enter__()
            for renewal in renewals:
                renewal.on_lost(scope.cancel)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        scope, self._scope = self._scope, None
        # The scope swallows its own cancellation: then the lock was lost, and
        # LockLost is raised below.
        suppressed = bool(scope.__exit__(exc_type, exc, tb)) if scope is not None else False
        # A body that ends with a cancellation from elsewhere (or a KeyboardInterrupt)
        # keeps it: never replaced by a lock error.
        foreign = exc_type is not None and not suppressed and not issubclass(exc_type, Exception)
        if self._handed_over():
            return  # detached in the body: the lock is someone else's now
        lost = self.lost
        if lost is not None:
            await self._abandon()
            if foreign:
                return
            raise lost
        try:
            await self.release()
        except LockError:
            if foreign:
                return
            raise
