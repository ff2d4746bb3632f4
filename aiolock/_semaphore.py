"""Semaphore: at most ``limit`` holders of a name at once, across all processes.

One sorted set of holders per node with "a majority admitted me" is unsafe for
``limit > 1``: different holders can win different majorities, so more than ``limit``
hold at once. Here the semaphore is ``limit`` *slots*, each an ordinary quorum lock
(keys ``<key>:slot:<i>``, same hash tag): a holder holds one slot, and two holders
never hold the same slot, so there are never more than ``limit`` holders. A crashed
holder's slot frees itself after its ttl.

Acquire tries the slots once each, starting at a random one (holders spread over the
slots); when none is free it waits like a lock does: local FIFO, woken by any slot's
release message, or when the shortest holder's ttl runs out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._base import BaseHandle
from ._checks import shown
from ._errors import LockNotOwned, QuorumError
from ._keys import release_channel, slot_key
from ._lock import Lock

if TYPE_CHECKING:
    from ._engine import Engine
    from ._errors import LockLost
    from ._renewal import Renewal

__all__ = ["Semaphore"]


@dataclass
class _Round:
    """One try over every slot (what the wait queue needs of it)."""

    expires_at: float | None
    outage: bool
    hint: float | None
    error: QuorumError | None = None

    def holder_ttl(self) -> float | None:
        return self.hint


class Semaphore(BaseHandle):
    """A distributed semaphore; created by :meth:`LockManager.semaphore`.

    Same handle API as :class:`Lock`. ``fencing_token`` is the token of the slot held:
    strictly increasing among the holders of that slot.
    """

    __slots__ = ("_channels", "_held", "_key", "_limit", "_slots")

    _kind = "semaphore"

    def __init__(
        self,
        engine: Engine,
        name: str,
        limit: int,
        *,
        ttl: float,
        timeout: float | None,
        auto_renew: bool,
    ) -> None:
        super().__init__(engine, name, ttl=ttl, timeout=timeout)
        self._limit = limit
        self._key = engine.key(name)
        self._slots = [
            Lock(
                engine,
                f"{name}[slot {i}]",
                ttl=ttl,
                timeout=0,
                auto_renew=auto_renew,
                key=slot_key(self._key, i),
                report=False,
            )
            for i in range(limit)
        ]
        self._channels = tuple(release_channel(slot_key(self._key, i)) for i in range(limit))
        self._held: Lock | None = None

    def __repr__(self) -> str:
        state = "held" if self.owned else "not held"
        return f"<Semaphore {shown(self._name)} limit={self._limit} ttl={self._ttl:g} {state}>"

    @property
    def limit(self) -> int:
        """Most holders at once."""
        return self._limit

    @property
    def owned(self) -> bool:
        """A slot is held, with validity left."""
        return self._held is not None and self._held.owned

    def remaining(self) -> float:
        """Validity left; ``0.0`` when not held."""
        return self._held.remaining() if self._held is not None else 0.0

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the slot held; ``None`` when not held."""
        return self._held.fencing_token if self._held is not None else None

    @property
    def slot(self) -> int | None:
        """Which slot is held (0 to limit - 1); ``None`` when not held."""
        return self._slots.index(self._held) if self._held is not None else None

    @property
    def lost(self) -> LockLost | None:
        """Why the slot was lost by the background renewal, if it was."""
        return self._held.lost if self._held is not None else None

    async def _round(self) -> _Round:
        start = random.randrange(self._limit)
        failures: list[QuorumError] = []
        for i in range(self._limit):
            slot = self._slots[(start + i) % self._limit]
            try:
                if await slot.acquire(timeout=0):
                    self._held = slot
                    return _Round(slot.remaining() + self._engine.clock(), False, None)
            except QuorumError as exc:
                failures.append(exc)
        if len(failures) == self._limit:
            return _Round(None, outage=True, hint=None, error=failures[0])
        # Every slot is taken: wake at the latest when the first holder's key expires.
        return _Round(None, outage=False, hint=min(self._ttl, 1.0))

    async def _acquire(self, wait: float | None) -> bool:
        self._held = None
        outcome = await self._wait_for(
            self._round, wait, queue=self._key, channels=self._channels, exclusive=False
        )
        return outcome is not None

    def _outage(self, outcome: _Round) -> QuorumError:
        assert outcome.error is not None  # noqa: S101
        return outcome.error

    async def release(self) -> None:
        """Give the slot back.

        Raises:
            LockNotOwned: the slot was no longer held.
            QuorumError: too many nodes failed to confirm.

        """
        held = self._held
        if held is None:
            raise LockNotOwned(f"{self._what} is not held")
        self._held = None
        self._engine.waiting.released(self._key)
        await held.release()

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the slot's validity (see :meth:`Lock.extend`).

        Raises:
            LockNotOwned: the slot was not held.
            QuorumError: too many nodes failed.

        """
        if self._held is None:
            raise LockNotOwned(f"{self._what} is not held")
        await self._held.extend(ttl)

    def _renewals(self) -> list[Renewal] | None:
        # The slot is a Lock, a handle of the same family (BaseHandle).
        return self._held._renewals() if self._held is not None else None  # noqa: SLF001

    async def _drop(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._engine.waiting.released(self._key)
            await held._drop()  # noqa: SLF001 - a Lock, a handle of the same family
