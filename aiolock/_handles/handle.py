"""The API every public handle shares, as a Protocol.

``Lock``, ``Semaphore``, ``LockMany``, ``ReadLock`` and ``WriteLock`` are each checked
against it, statically (mypy) and at run time, by ``tests/test_handles.py``.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from .._core.errors import LockLost

__all__ = ["Handle"]


@runtime_checkable
class Handle(Protocol):
    """What code written for "a lock" may use of any handle."""

    @property
    def name(self) -> str:
        """The name given (for ``LockMany``: the names, joined)."""
        ...

    @property
    def ttl(self) -> float:
        """Validity of each acquisition and renewal, in seconds."""
        ...

    @property
    def timeout(self) -> float | None:
        """How long ``acquire()`` and ``async with`` wait by default (``None``: forever)."""
        ...

    @property
    def owned(self) -> bool:
        """Held, with validity left (no I/O)."""
        ...

    @property
    def fencing_token(self) -> int | None:
        """Strictly increasing across every holder of the name; ``None`` when not held."""
        ...

    @property
    def lost(self) -> LockLost | None:
        """Why the held lock was lost (reported by the renewal), else ``None``."""
        ...

    def remaining(self) -> float:
        """Seconds of validity left, from a monotonic clock; ``0.0`` when not held."""
        ...

    async def wait_lost(self) -> LockLost:
        """Wait until the held lock is lost; returns the ``LockLost``."""
        ...

    async def acquire(self, *, timeout: Any = ...) -> bool:  # noqa: ASYNC109
        """``True`` when held; ``False`` when ``timeout`` ran out (nothing left behind)."""
        ...

    async def release(self) -> None:
        """Release on every node; ``LockNotOwned`` if it was no longer held."""
        ...

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the validity to ``ttl`` (default: the handle's) on a quorum."""
        ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
