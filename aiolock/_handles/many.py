"""LockMany: one handle over several names, all-or-nothing, deadlock-free.

The names are acquired one after the other in sorted order, whoever asks: two callers
wanting ``{a, b}`` and ``{b, a}`` both take ``a`` first, so neither can hold ``b``
while waiting for ``a`` (no cycle, no deadlock). If one name cannot be had in time,
the ones already taken are released and ``acquire()`` returns ``False``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import anyio

from .._core.cancel import shielded
from .._core.checks import shown
from .._core.errors import LockError, LockLost
from .base import BaseHandle
from .lock import Lock

if TYPE_CHECKING:
    from .._core.hold import Renewing
    from .._engine import Engine

__all__ = ["LockMany"]


class LockMany(BaseHandle):
    """Several locks taken and released together; created by :meth:`LockManager.lock_many`.

    Same handle API as :class:`Lock`; ``name`` is the names joined by commas.
    """

    __slots__ = ("_locks", "_names")

    _kind = "locks"

    def __init__(
        self,
        engine: Engine,
        names: tuple[str, ...],
        *,
        ttl: float,
        timeout: float | None,
        auto_renew: bool,
    ) -> None:
        super().__init__(engine, ",".join(names), ttl=ttl, timeout=timeout)
        self._names = names
        self._locks = [
            Lock(engine, name, ttl=ttl, timeout=timeout, auto_renew=auto_renew, task_bound=True)
            for name in names
        ]

    def __repr__(self) -> str:
        state = "held" if self.owned else "not held"
        return f"<LockMany {shown(self._name)} ttl={self._ttl:g} {state}>"

    @property
    def names(self) -> tuple[str, ...]:
        """The names, sorted (the order they are acquired in)."""
        return self._names

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

    def _busy(self) -> bool:
        return any(lock._busy() for lock in self._locks)  # noqa: SLF001 - same family

    async def _acquire(self, wait: float | None) -> bool:
        clock = self._engine.clock
        deadline = math.inf if wait is None else clock() + wait
        taken: list[Lock] = []
        try:
            for lock in self._locks:
                left = None if math.isinf(deadline) else max(0.0, deadline - clock())
                if not await lock.acquire(timeout=left):
                    await self._release_all(taken)  # (errors: nothing more to undo)
                    return False
                taken.append(lock)
        except BaseException:
            with shielded():
                await self._release_all(taken)
            raise
        return True

    @staticmethod
    async def _release_all(locks: list[Lock]) -> LockError | None:
        """Release every one of ``locks`` (the last first); the first error, if any.

        All of them even if the caller is cancelled meanwhile, the cancellation
        re-raised once they are done (as ``Lock.release`` does for one): stopped at the
        first, the others stayed held and renewed, by a handle that no longer owned them.
        """
        first: LockError | None = None
        cancelled: BaseException | None = None
        for lock in reversed(locks):
            try:
                # (After a cancellation, shielded: a cancel scope would deliver it again.)
                with shielded(cancelled is not None):
                    await lock.release()
            except LockError as exc:
                first = first or exc
            except anyio.get_cancelled_exc_class() as exc:
                cancelled = cancelled or exc
        if cancelled is not None:
            raise cancelled
        return first

    async def release(self) -> None:
        """Release every name; then raise the first error met, if any.

        Raises:
            LockNotOwned: a name was no longer held.
            QuorumError: too many nodes failed to confirm a release.

        """
        first = await self._release_all(self._locks)
        if first is not None:
            raise first

    async def extend(self, ttl: float | None = None) -> None:
        """Extend every name; then raise the first error met, if any.

        Raises:
            LockNotOwned: a name was not held.
            QuorumError: too many nodes failed.

        """
        first: LockError | None = None
        for lock in self._locks:
            try:
                await lock.extend(ttl)
            except LockError as exc:
                first = first or exc
        if first is not None:
            raise first

    def _renewals(self) -> list[Renewing] | None:
        renewals = []
        for lock in self._locks:
            one = lock._renewals()  # noqa: SLF001 - a Lock, a handle of the same family
            if one is None:
                return None
            renewals.extend(one)
        return renewals

    async def _abandon(self) -> None:
        # (A name not held any more raises LockNotOwned at once, without I/O.)
        await self._release_all(self._locks)
