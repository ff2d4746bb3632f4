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

import math
import random
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from ._errors import LockNotOwned, LockTimeout, QuorumError
from ._keys import release_channel, slot_key
from ._lock import _DEFAULT, Lock, _Default, check_timeout

if TYPE_CHECKING:
    from ._errors import LockLost
    from ._manager import LockManager

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


class Semaphore:
    """A distributed semaphore; created by :meth:`LockManager.semaphore`.

    Same handle API as :class:`Lock`. ``fencing_token`` is the token of the slot held:
    strictly increasing among the holders of that slot.
    """

    def __init__(
        self,
        manager: LockManager,
        name: str,
        limit: int,
        *,
        ttl: float,
        timeout: float | None,
        auto_renew: bool,
    ) -> None:
        self._manager = manager
        self._name = name
        self._limit = limit
        self._ttl = ttl
        self._timeout = timeout
        self._key = manager._key(name)
        self._slots = [
            Lock(
                manager,
                f"{name}[slot {i}]",
                ttl=ttl,
                timeout=0,
                auto_renew=auto_renew,
                key=slot_key(self._key, i),
            )
            for i in range(limit)
        ]
        for slot in self._slots:
            slot._report = False
        self._channels = tuple(release_channel(slot._key) for slot in self._slots)
        self._held: Lock | None = None
        self._acquiring = False

    def __repr__(self) -> str:
        state = "held" if self.owned else "not held"
        return f"<Semaphore {self._name!r} limit={self._limit} ttl={self._ttl:g} {state}>"

    @property
    def name(self) -> str:
        """The semaphore's name."""
        return self._name

    @property
    def limit(self) -> int:
        """Most holders at once."""
        return self._limit

    @property
    def ttl(self) -> float:
        """Time to live of each acquisition and renewal, in seconds."""
        return self._ttl

    @property
    def timeout(self) -> float | None:
        """Default wait of :meth:`acquire` and ``async with`` (``None``: forever)."""
        return self._timeout

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

    async def wait_lost(self) -> LockLost:
        """Wait until the renewal gives the slot up (see :meth:`Lock.wait_lost`)."""
        if self._held is None:
            raise LockNotOwned(f"semaphore {self._name!r} is not held")
        return await self._held.wait_lost()

    async def _round(self) -> _Round:
        start = random.randrange(self._limit)
        failures: list[QuorumError] = []
        for i in range(self._limit):
            slot = self._slots[(start + i) % self._limit]
            try:
                if await slot.acquire(timeout=0):
                    self._held = slot
                    return _Round(slot._expires_at, outage=False, hint=None)
            except QuorumError as exc:
                failures.append(exc)
        if len(failures) == self._limit:
            return _Round(None, outage=True, hint=None, error=failures[0])
        # Every slot is taken: wake at the latest when the first holder's key expires.
        return _Round(None, outage=False, hint=min(self._ttl, 1.0))

    async def acquire(self, *, timeout: float | _Default | None = _DEFAULT) -> bool:  # noqa: ASYNC109
        """Take a slot, waiting up to ``timeout`` seconds (default: the semaphore's).

        ``timeout=None`` waits forever, ``timeout=0`` tries once. Returns ``True`` when
        held, ``False`` when the time is up. Raises :class:`QuorumError` when nodes fail.
        """
        wait = self._timeout if isinstance(timeout, _Default) else check_timeout(timeout)
        if self._acquiring:
            raise RuntimeError(f"semaphore {self._name!r}: acquire() already in progress")
        if self.owned:
            raise RuntimeError(f"semaphore {self._name!r} is already held by this handle")
        self._held = None
        manager = self._manager
        manager._check_open()
        clock = manager._clock
        started = clock()
        deadline = math.inf if wait is None else started + wait
        self._acquiring = True
        try:
            outcome: _Round | None = None
            if wait == 0 or not manager._waiting.waiters(self._key):
                outcome = await self._round()
                if outcome.expires_at is None and not outcome.outage and clock() < deadline:
                    outcome = None
            if outcome is None:
                outcome = await manager._waiting.acquire(
                    self._key,
                    self._round,
                    deadline,
                    channels=self._channels,
                    exclusive=False,
                )
                if outcome is None:
                    manager._emit("timeout", self._name, clock() - started)
                    return False
            if outcome.error is not None:
                manager._emit("quorum_error", self._name, clock() - started, outcome.error)
                raise outcome.error
            acquired = outcome.expires_at is not None
            manager._emit("acquired" if acquired else "timeout", self._name, clock() - started)
            return acquired
        finally:
            self._acquiring = False

    async def release(self) -> None:
        """Give the slot back; :class:`LockNotOwned` if it was no longer held."""
        held = self._held
        if held is None:
            raise LockNotOwned(f"semaphore {self._name!r} is not held")
        self._held = None
        self._manager._waiting.released(self._key)
        await held.release()

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the slot's validity (see :meth:`Lock.extend`)."""
        if self._held is None:
            raise LockNotOwned(f"semaphore {self._name!r} is not held")
        await self._held.extend(ttl)

    async def __aenter__(self) -> Semaphore:
        if not await self.acquire():
            raise LockTimeout(f"semaphore {self._name!r} not acquired within {self._timeout}s")
        assert self._held is not None  # noqa: S101
        self._held._enter_scope()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        held = self._held
        if held is None:
            if exc_type is not None and not issubclass(exc_type, Exception):
                return
            raise LockNotOwned(f"semaphore {self._name!r} was released in its body")
        self._held = None
        self._manager._waiting.released(self._key)
        await held.__aexit__(exc_type, exc, tb)
