"""The API every public handle shares, as a Protocol.

``Lock``, ``Semaphore``, ``LockMany``, ``ReadLock`` and ``WriteLock`` are each checked
against it, statically (mypy) and at run time, by ``tests/test_handles.py``.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from ._errors import LockLost

__all__ = ["Handle"]


@runtime_checkable
class Handle(Protocol):
    """What code written for "a lock" may use of any handle."""

    @property
    def name(self) -> str: ...

    @property
    def ttl(self) -> float: ...

    @property
    def timeout(self) -> float | None: ...

    @property
    def owned(self) -> bool: ...

    @property
    def fencing_token(self) -> int | None: ...

    @property
    def lost(self) -> LockLost | None: ...

    def remaining(self) -> float: ...

    async def wait_lost(self) -> LockLost: ...

    async def acquire(self, *, timeout: Any = ...) -> bool: ...  # noqa: ASYNC109

    async def release(self) -> None: ...

    async def extend(self, ttl: float | None = None) -> None: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
