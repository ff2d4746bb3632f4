"""Semaphore: at most ``limit`` holders of a name at once, across all processes.

One sorted set of holders per node with "a majority admitted me" is unsafe for
``limit > 1``: different holders can win different majorities, so more than ``limit``
hold at once. Here the semaphore is ``limit`` *slots*, each an ordinary quorum lock
(keys ``<key>:slot:<i>``, same hash tag): a holder holds one slot, and two holders
never hold the same slot, so there are never more than ``limit`` holders. A crashed
holder's slot frees itself after its ttl.

Finding a free slot does not walk the slots. Each node also notes, in one sorted set
(``<key>:slots``), when each taken slot's key expires; the acquire script
(``SEM_ACQUIRE``) tries one slot and, when it is held, replies with slots the node has
no note of and slots whose note has run out (a renewed holder's, or a dead one's),
so that the next attempt tries a slot a majority reported free and has the others'
keys checked on the way. A try is at most :data:`MAX_ATTEMPTS` quorum attempts of one
script per node, whatever ``limit`` is; usually one. The notes are advice only: a
slot is taken by ``SET NX`` on its own key, on a majority, like any lock.

A waiter waits like a lock's: local FIFO, woken by the semaphore's one channel (every
slot's release announces on it), or when the first noted holder's ttl runs out.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from .._core import tokens
from .._core.checks import shown
from .._core.errors import LockNotOwned, QuorumError
from .._core.keys import release_channel, semaphore_index, slot_key
from .._lua import NOT_FREE, SEM_ACQUIRE_SCRIPT, SEM_CHECKS, SEM_RELEASE_SCRIPT
from .base import BaseHandle
from .lock import Lock

if TYPE_CHECKING:
    from .._core.errors import LockLost
    from .._core.hold import Renewing
    from .._core.votes import Attempt, Votes
    from .._engine import Engine

__all__ = ["Semaphore"]

#: Quorum attempts in one try of a semaphore: the slot tried first, then slots that
#: the nodes reported free (a race lost on one costs another attempt).
MAX_ATTEMPTS: Final = 4
#: How long a waiter sleeps before trying again when a try ended with slots still to
#: check or races lost (no holder's expiry to wait for).
RETRY_SOON: Final = 0.05


@dataclass
class _Round:
    """One try (what the wait queue needs of it)."""

    expires_at: float | None
    outage: bool
    hint: float | None
    error: QuorumError | None = None

    def holder_ttl(self) -> float | None:
        return self.hint


@dataclass
class _Reported:
    """What the nodes that said "held" replied to a failed attempt, tallied."""

    free: dict[int, int]
    due: dict[int, int]
    wait: float | None

    @classmethod
    def read(cls, votes: Votes, limit: int) -> _Reported:
        free: dict[int, int] = {}
        due: dict[int, int] = {}
        waits: list[int] = []
        for reply, verdict in zip(votes.replies, votes.verdicts, strict=True):
            if verdict is not False or type(reply) is not list or len(reply) < 4:
                continue
            waits.append(reply[1])
            count = reply[3]
            for i, slot in enumerate(reply[4:]):
                if 0 <= slot < limit:
                    tally = free if i < count else due
                    tally[slot] = tally.get(slot, 0) + 1
        wait = max(waits) / 1000 if waits and min(waits) >= 0 else None
        return cls(free, due, wait)

    def next_try(self) -> tuple[int, list[int]] | None:
        """The slot to try next and the slots to have checked; None: none is free."""
        due = sorted(self.due, key=lambda slot: -self.due[slot])
        if self.free:
            most = max(self.free.values())
            slot = random.choice([s for s, n in self.free.items() if n == most])
        elif due:
            slot = due.pop(0)
        else:
            return None
        return slot, [s for s in due if s != slot][:SEM_CHECKS]


class _Slot(Lock):
    """The slot a semaphore handle holds: a lock whose key is chosen at each acquire."""

    __slots__ = ("index", "semaphore_key")

    def __init__(
        self, engine: Engine, name: str, key: bytes, *, ttl: float, auto_renew: bool
    ) -> None:
        super().__init__(
            engine, name, ttl=ttl, timeout=0, auto_renew=auto_renew, key=key, report=False
        )
        self.semaphore_key = key
        self.index = 0

    def take(self, index: int, name: str, token: bytes, attempt: Attempt) -> None:
        """Hold slot ``index``, just won by ``attempt`` with ``token``."""
        assert attempt.expires_at is not None  # noqa: S101
        if self._hold is not None:
            self._disown()  # an earlier acquisition that expired or was lost
        self.index = index
        self._name = f"{name}[slot {index}]"
        self._key = slot_key(self.semaphore_key, index)
        self._own(token, attempt.fence, attempt.start, attempt.expires_at)

    _passes_on = False  # the semaphore's waiters try slots, not this key

    @property
    def _queue_key(self) -> bytes:
        return self.semaphore_key

    def _release_votes(self, token: bytes, *, local: bool = False) -> Awaitable[Votes]:
        message = (NOT_FREE,) if local else ()
        return self._engine.quorum.release(
            self._key,
            token,
            script=SEM_RELEASE_SCRIPT,
            more_keys=(semaphore_index(self.semaphore_key),),
            more_args=(b"%d" % self.index, *message),
        )


class Semaphore(BaseHandle):
    """A distributed semaphore; created by :meth:`LockManager.semaphore`.

    Same handle API as :class:`Lock`. ``fencing_token`` is the token of the slot held:
    strictly increasing among the holders of that slot.
    """

    __slots__ = ("_channels", "_held", "_index", "_key", "_limit", "_slot")

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
        self._index = semaphore_index(self._key)
        self._channels = (release_channel(self._index),)
        self._slot = _Slot(engine, name, self._key, ttl=ttl, auto_renew=auto_renew)
        self._held: _Slot | None = None

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
        return self._held.index if self._held is not None else None

    @property
    def lost(self) -> LockLost | None:
        """Why the slot was lost by the background renewal, if it was."""
        return self._held.lost if self._held is not None else None

    async def _round(self) -> _Round:
        quorum = self._engine.quorum
        token = tokens.new_token()
        slot, checks = random.randrange(self._limit), list[int]()
        wait: float | None = None
        for attempts in range(1, MAX_ATTEMPTS + 1):
            number = b"%d" % slot
            attempt = await quorum.acquire(
                slot_key(self._key, slot),
                token,
                self._ttl,
                script=SEM_ACQUIRE_SCRIPT,
                more_keys=(self._index, *(slot_key(self._key, s) for s in checks)),
                more_args=(number, b"%d" % self._limit, *(b"%d" % s for s in checks)),
                cleanup=(SEM_RELEASE_SCRIPT, (self._index,), (number,)),
            )
            if attempt.acquired:
                self._slot.take(slot, self._name, token, attempt)
                self._held = self._slot
                return _Round(attempt.expires_at, outage=False, hint=None)
            if attempt.outage:
                error = self._engine.quorum_error(f"acquire of {self._what}", attempt.votes)
                return _Round(None, outage=True, hint=None, error=error)
            reported = _Reported.read(attempt.votes, self._limit)
            wait = reported.wait
            following = reported.next_try()
            if following is None:
                break  # every slot is held, as a majority noted
            if attempts == MAX_ATTEMPTS:
                wait = RETRY_SOON  # free slots were reported: come back soon
            slot, checks = following
        # Wake at the latest when the first noted holder's key expires.
        hint = min(self._ttl, 1.0) if wait is None else min(self._ttl, 1.0, max(wait, 0.0))
        return _Round(None, outage=False, hint=hint)

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

    def _renewals(self) -> list[Renewing] | None:
        # The slot is a Lock, a handle of the same family (BaseHandle).
        return self._held._renewals() if self._held is not None else None  # noqa: SLF001

    async def _abandon(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            await held._abandon()  # noqa: SLF001 - a Lock, a handle of the same family
