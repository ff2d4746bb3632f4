"""LockMany: one handle over several names, all-or-nothing, deadlock-free.

The names are acquired one after the other in sorted order, whoever asks: two callers
wanting ``{a, b}`` and ``{b, a}`` both take ``a`` first, so neither can hold ``b``
while waiting for ``a`` (no cycle, no deadlock). If one name cannot be had in time,
the ones already taken are released and ``acquire()`` returns ``False``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING

import anyio

from ._errors import LockError, LockLost, LockNotOwned, LockTimeout
from ._lock import (
    _DEFAULT,
    Lock,
    _Default,
    check_name,
    check_timeout,
    close_loss_scope,
    open_loss_scope,
)

if TYPE_CHECKING:
    from ._manager import LockManager

__all__ = ["LockMany", "check_names"]


def check_names(names: object) -> tuple[str, ...]:
    """Validate the names of a LockMany: a non-empty collection of lock names."""
    if isinstance(names, str | bytes) or not isinstance(names, Iterable):
        raise TypeError(f"names must be a collection of str, not {type(names).__name__}")
    checked = sorted({check_name(name) for name in names})
    if not checked:
        raise ValueError("names must not be empty")
    return tuple(checked)


class LockMany:
    """Several locks taken and released together; created by :meth:`LockManager.lock_many`."""

    def __init__(
        self,
        manager: LockManager,
        names: tuple[str, ...],
        *,
        ttl: float,
        timeout: float | None,
        auto_renew: bool,
    ) -> None:
        self._manager = manager
        self._names = names
        self._ttl = ttl
        self._timeout = timeout
        self._locks = [
            Lock(manager, name, ttl=ttl, timeout=timeout, auto_renew=auto_renew) for name in names
        ]
        self._scope: anyio.CancelScope | None = None

    def __repr__(self) -> str:
        state = "held" if self.owned else "not held"
        return f"<LockMany {list(self._names)!r} ttl={self._ttl:g} {state}>"

    @property
    def names(self) -> tuple[str, ...]:
        """The names, sorted (the order they are acquired in)."""
        return self._names

    @property
    def name(self) -> str:
        """The names joined by commas, for messages."""
        return ",".join(self._names)

    @property
    def ttl(self) -> float:
        """Time to live of each acquisition and renewal, in seconds."""
        return self._ttl

    @property
    def timeout(self) -> float | None:
        """Default wait of :meth:`acquire` and ``async with`` (``None``: forever)."""
        return self._timeout

    @property
    def locks(self) -> tuple[Lock, ...]:
        """The underlying locks, in acquisition order."""
        return tuple(self._locks)

    @property
    def owned(self) -> bool:
        """Every name is held, with validity left."""
        return all(lock.owned for lock in self._locks)

    def remaining(self) -> float:
        """The least validity left among the names; ``0.0`` when not all held."""
        return min(lock.remaining() for lock in self._locks)

    @property
    def fencing_token(self) -> int | None:
        """The highest fencing token of the names; ``None`` when not all held."""
        tokens = self.fencing_tokens
        return max(tokens.values()) if tokens is not None else None

    @property
    def fencing_tokens(self) -> dict[str, int] | None:
        """Each name's fencing token; ``None`` when not all held."""
        tokens = {lock.name: lock.fencing_token for lock in self._locks}
        if any(token is None for token in tokens.values()):
            return None
        return {name: token for name, token in tokens.items() if token is not None}

    @property
    def lost(self) -> LockLost | None:
        """Why one of the names was lost by the background renewal, if one was."""
        return next((lock.lost for lock in self._locks if lock.lost is not None), None)

    async def wait_lost(self) -> LockLost:
        """Wait until the renewal gives up on any of the names; return its ``LockLost``.

        Returns at once if one was already lost. Raises :class:`LockNotOwned` when the
        names are not all held with ``auto_renew``.
        """
        lost = self.lost
        if lost is not None:
            return lost
        if not self.owned or any(lock._renewal is None for lock in self._locks):
            raise LockNotOwned(f"locks {self.name!r} are not held with auto_renew")
        waits = [asyncio.ensure_future(lock.wait_lost()) for lock in self._locks]
        try:
            done, _pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            return next(iter(done)).result()
        finally:
            for wait in waits:
                wait.cancel()

    async def acquire(self, *, timeout: float | _Default | None = _DEFAULT) -> bool:  # noqa: ASYNC109
        """Acquire every name (in sorted order) within ``timeout``, or none of them."""
        wait = self._timeout if isinstance(timeout, _Default) else check_timeout(timeout)
        if any(lock.owned for lock in self._locks):
            raise RuntimeError(f"locks {self.name!r} are already held by this handle")
        clock = self._manager._clock
        deadline = math.inf if wait is None else clock() + wait
        taken: list[Lock] = []
        try:
            for lock in self._locks:
                left = None if math.isinf(deadline) else max(0.0, deadline - clock())
                if not await lock.acquire(timeout=left):
                    await self._release_quietly(taken)
                    return False
                taken.append(lock)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._release_quietly(taken)
            raise
        return True

    @staticmethod
    async def _release_quietly(locks: list[Lock]) -> None:
        for lock in reversed(locks):
            # Expired or nodes failing: nothing more to undo.
            with contextlib.suppress(LockError):
                await lock.release()

    async def release(self) -> None:
        """Release every name; then raise the first error met, if any."""
        first: LockError | None = None
        for lock in reversed(self._locks):
            try:
                await lock.release()
            except LockError as exc:
                first = first or exc
        if first is not None:
            raise first

    async def extend(self, ttl: float | None = None) -> None:
        """Extend every name; then raise the first error met, if any."""
        first: LockError | None = None
        for lock in self._locks:
            try:
                await lock.extend(ttl)
            except LockError as exc:
                first = first or exc
        if first is not None:
            raise first

    async def __aenter__(self) -> LockMany:
        if not await self.acquire():
            raise LockTimeout(f"locks {self.name!r} not acquired within {self._timeout}s")
        self._scope = open_loss_scope(
            [lock._renewal for lock in self._locks if lock._renewal is not None]
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        scope, self._scope = self._scope, None
        foreign = close_loss_scope(scope, exc_type, exc, tb)
        lost: LockLost | None = next(
            (lock.lost for lock in self._locks if lock.lost is not None), None
        )
        if lost is not None:
            await self._release_quietly([lock for lock in self._locks if lock._token is not None])
            if foreign:
                return
            raise lost
        try:
            await self.release()
        except LockError:
            if foreign:
                return
            raise
        return
