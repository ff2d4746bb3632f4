"""The Lock handle: acquire / release / extend / owned / remaining and ``async with``."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from .._core import tokens
from .._core.checks import shown
from .._core.errors import LockLost, LockNotOwned, QuorumError
from .._core.hold import Hold, Renewing, TaskHold
from .._core.votes import Attempt, Votes
from .base import BaseHandle
from .ticket import Ticket, encode_ticket

if TYPE_CHECKING:
    from .._engine import Engine

__all__ = ["Lock"]


class Lock(BaseHandle):
    """A handle on one distributed lock; created by :meth:`LockManager.lock`.

    The lock is owned by the handle, not by a task: it may be released from another
    task. One handle holds the lock at most once at a time.
    """

    __slots__ = (
        "_auto_renew",
        "_detached",
        "_entry",
        "_hold",
        "_key",
        "_max_hold",
        "_reentrant",
        "_renewal",
        "_task_bound",
    )

    def __init__(
        self,
        engine: Engine,
        name: str,
        *,
        ttl: float,
        timeout: float | None,
        auto_renew: bool,
        max_hold: float | None = None,
        key: bytes | None = None,
        report: bool = True,
        reentrant: bool = False,
        task_bound: bool = False,
    ) -> None:
        super().__init__(engine, name, ttl=ttl, timeout=timeout, report=report)
        #: Whether the handle is in its task's bookkeeping (_core/hold.py), sharing its holds.
        self._task_bound = task_bound
        self._reentrant = reentrant
        self._entry: TaskHold | None = None
        self._max_hold = max_hold
        self._key = engine.key(name) if key is None else key
        self._auto_renew = auto_renew
        #: The current acquisition (kept after a loss: release() deletes what remains),
        #: the last one's renewal (its loss readable in ``lost`` until the next one).
        self._hold: Hold | None = None
        self._renewal: Renewing | None = None
        #: The held lock was handed over (see :meth:`detach`).
        self._detached = False

    def __repr__(self) -> str:
        state = f"held, {self.remaining():.3f}s left" if self.owned else "not held"
        return f"<Lock {shown(self._name)} ttl={self._ttl:g} {state}>"

    # -- properties -----------------------------------------------------------------

    @property
    def auto_renew(self) -> bool:
        """Whether the lock is extended in the background while held."""
        return self._auto_renew

    @property
    def reentrant(self) -> bool:
        """Whether the task that holds the name may acquire it again through this handle."""
        return self._reentrant

    @property
    def max_hold(self) -> float | None:
        """Longest time the renewal keeps the lock; ``None`` for no limit."""
        return self._max_hold

    @property
    def owned(self) -> bool:
        """Held, with validity left (no I/O); ``False`` from the moment release() begins."""
        return self._hold is not None and self.remaining() > 0.0

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current acquisition; ``None`` when not held.

        Across every holder of the name, tokens strictly increase in acquisition order:
        give it to the protected resource, which refuses a write with a token lower than
        one it has seen (``examples/fenced_store.py``).
        """
        hold = self._hold
        return hold.fence if hold is not None else None

    def remaining(self) -> float:
        """Seconds of validity left, from a monotonic clock; ``0.0`` when not held."""
        hold = self._hold
        return hold.remaining(self._engine.clock()) if hold is not None else 0.0

    @property
    def lost(self) -> LockLost | None:
        """Why the lock was lost by the background renewal, if it was; else ``None``."""
        renewal = self._renewal
        return renewal.lost if renewal is not None else None

    # -- acquire ----------------------------------------------------------------------

    async def _acquire(self, wait: float | None) -> bool:
        self._detached = False
        if self._hold is not None:
            self._engine.forget(self._hold.token)
            self._disown()  # expired or lost, not released: forget it
        engine = self._engine
        task = asyncio.current_task() if self._task_bound else None
        if task is not None:
            entry = engine.tasks.held(task, self._key, engine.clock())
            if entry is not None:
                if self._reentrant and entry.reentrant:
                    entry.levels += 1  # one more level of the same acquisition: no I/O
                    self._entry, self._hold, self._renewal = entry, entry.hold, entry.renewal
                    return True
                raise RuntimeError(
                    f"{self._what} is already held by this task through this manager: "
                    "acquiring it again would wait for itself (reentrant=True on both "
                    "handles shares the acquisition instead)"
                )
        token = tokens.new_token()
        attempt = await self._wait_for(
            functools.partial(self._attempt, token),
            wait,
            queue=self._queue_key,
            channels=self._channels,
            exclusive=self._exclusive,
            taker=(token, self._ttl) if self._passes_on else None,
        )
        if attempt is None:
            return False
        assert attempt.expires_at is not None  # noqa: S101
        # A lease's token is the key's, as its holder took it (see _waiting/lease.py).
        hold = self._own(
            attempt.token or token, attempt.fence, attempt.start, attempt.expires_at, task
        )
        hold.reserve = attempt.reserve or hold.reserve  # fencing tokens for leases after us
        return True

    def _own(
        self,
        token: bytes,
        fence: int | None,
        valid_from: float,
        expires_at: float,
        task: asyncio.Task[Any] | None = None,
    ) -> Hold:
        """Hold the key with ``token`` (acquired, or attached): renew it, note the task.

        ``task``: the current task, when the caller has it at hand.
        """
        engine = self._engine
        hold = self._hold = Hold(
            self._name,
            self._key,
            token,
            ttl=self._ttl,
            fence=fence,
            valid_from=valid_from,
            expires_at=expires_at,
            acquired_at=engine.clock(),
            max_hold=self._max_hold,
            repairable=self._repairable,
        )
        self._renewal = engine.renewer.start(hold) if self._auto_renew else None
        if self._task_bound:
            task = task or asyncio.current_task()
            assert task is not None  # noqa: S101 - acquire runs in a task
            self._entry = engine.tasks.add(
                TaskHold(task, self._key, hold, self._renewal, reentrant=self._reentrant)
            )
        return hold

    def _outage(self, outcome: Attempt) -> QuorumError:
        return self._engine.quorum_error(f"acquire of {self._what}", outcome.votes)

    # -- release / extend ---------------------------------------------------------------

    async def release(self) -> None:
        """Release the lock on every node.

        Completes even if the calling task is cancelled meanwhile (the cancellation
        is re-raised after).

        Raises:
            LockNotOwned: the lock was no longer held (expired, taken over, never
                acquired).
            QuorumError: too many nodes failed to confirm.

        """
        hold = self._hold
        if hold is None:
            raise LockNotOwned(f"{self._what} is not held")
        if hold.ended:
            raise LockNotOwned(f"{self._what} is being released")
        expired = self.remaining() <= 0.0
        if self._exit_level():  # an outer level of this task still holds it
            if expired:  # (as the outer level's release will say too)
                raise LockNotOwned(f"{self._what} had expired before release")
            return
        self._stop_renewal()
        # From the first node that applies it, the release deletes the key: the handle
        # no longer reads owned from now on (remaining() is 0.0 once the hold ended).
        hold.end()
        engine = self._engine
        held = engine.clock() - hold.acquired_at
        try:
            votes = await self._release_hold(hold, valid=not expired)
        finally:
            self._disown()
        if self._report:
            engine.emit("released", self._name, held)
        if expired:
            raise LockNotOwned(f"{self._what} had expired before release")
        if votes is None or votes.won:  # None: leased to a waiter of this process
            return
        if votes.rejected:
            raise LockNotOwned(
                f"{self._what} was not held any more on a majority of nodes (taken over or deleted)"
            )
        raise engine.quorum_error(f"release of {self._what}", votes)

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lock's validity to ``ttl`` seconds (default: the lock's ttl).

        Never re-creates an expired lock. Completes even if the caller is cancelled
        meanwhile; the validity then follows what the nodes applied.

        Raises:
            LockNotOwned: the lock was not held (it is then released wherever it
                remained).
            QuorumError: too many nodes failed (the lock stays held until its current
                validity runs out).
            TypeError, ValueError: a bad ``ttl``, before any I/O.

        """
        engine = self._engine
        new_ttl = self._ttl if ttl is None else engine.ttl_used(ttl)
        hold = self._hold
        if hold is None:
            raise LockNotOwned(f"{self._what} is not held")
        if hold.ended:
            raise LockNotOwned(f"{self._what} is being released")
        if self.remaining() <= 0.0:
            await self._abandon()
            raise LockNotOwned(f"{self._what} had expired; it is not re-created")
        quorum = engine.quorum
        start = engine.clock()  # the requests go out now: no await before them
        # (A shorter ttl is announced by the nodes: every process's waiters learn it.)
        extension = hold.begin_extension(quorum.expiry(start, new_ttl), new_ttl)

        def settle(votes: Votes) -> None:
            # Runs even if we are cancelled meanwhile: the nodes applied it anyway.
            expires_at = quorum.expiry(start, new_ttl)
            hold.end_extension(extension, start, expires_at, new_ttl, won=votes.won)

        votes, _expires_at = await quorum.extend(hold.key, hold.token, new_ttl, then=settle)
        if votes.won and self._hold is hold and (hold.ended or self.remaining() > 0.0):
            return  # (ended: our own release, sent after it, is on its way)
        if votes.rejected:
            gone = LockNotOwned(
                f"{self._what} was not held any more on a majority of nodes (taken over or deleted)"
            )
            if self._renewal is not None and self._hold is hold:  # the body is told, even
                # if a deadline of the caller's swallows ``gone``
                self._renewal.declare_lost("the key is gone or held by another token", gone)
            await self._abandon()
            raise gone
        raise engine.quorum_error(f"extend of {self._what}", votes)

    # -- handing over ------------------------------------------------------------------

    def detach(self) -> str:
        """Hand the held lock over: return a ticket for :meth:`LockManager.attach`. No I/O.

        The handle stops renewing and no longer owns the lock (an ``async with`` around
        it then ends without releasing); the lock stays held on the nodes until its
        validity runs out, unless a handle in any process attaches the ticket first.
        The ticket carries the lock's token: treat it as a secret. It works once.

        Raises:
            LockNotOwned: the lock is not held (or no validity is left).

        """
        hold = self._hold
        if hold is None or not self.owned or hold.fence is None:
            raise LockNotOwned(f"{self._what} is not held")
        if self._entry is not None and self._entry.levels > 1:
            raise RuntimeError(f"{self._what} is held at several levels: it cannot be detached")
        ticket = Ticket(self._engine.prefix, self._name, hold.token, hold.fence, self._ttl)
        self._engine.forget(hold.token)  # held elsewhere from now on, if anywhere
        self._disown()
        self._detached = True
        return encode_ticket(ticket)

    async def _attach(self, ticket: Ticket) -> None:
        """Take over the detached lock of ``ticket`` (see :meth:`LockManager.attach`)."""
        engine = self._engine
        if engine.closed or not engine.connected:
            await engine.open()
        token = tokens.new_token()
        start = engine.clock()
        votes, expires_at = await engine.hand_over(self._key, ticket.token, self._ttl, token)
        if expires_at is not None:
            self._own(token, ticket.fence, start, expires_at)
            engine.emit("acquired", self._name, engine.clock() - start)
            return
        if votes.rejected:
            raise LockNotOwned(
                f"{self._what}: the ticket's lock is not held any more (expired, "
                "released, taken over, or the ticket was already attached)"
            )
        raise engine.quorum_error(f"attach of {self._what}", votes)

    # -- hooks of the read-write lock's handles ------------------------------------------

    # How a lock is taken and given back; the read-write lock's handles override these.
    _channels: tuple[bytes, ...] | None = None
    _exclusive = True
    #: Whether a release may pass the lock to a local waiter in one script (_handoff),
    #: and waiting processes take turns (_turns): a plain lock's keys and scripts.
    _passes_on = True
    #: Whether the renewal may re-create the key where a node lost it (a plain key and
    #: counter; a reader of a read-write lock is also a member of a set: not repaired).
    _repairable = True

    @property
    def _queue_key(self) -> bytes:
        return self._key

    # The hot path's forwarders return the awaitable they make (no coroutine of their
    # own: a frame less to create and to resume on every acquire and release).
    def _attempt(self, token: bytes) -> Awaitable[Attempt]:
        return self._engine.quorum.acquire(self._key, token, self._ttl)

    def _release_hold(self, hold: Hold, *, valid: bool) -> Awaitable[Votes | None]:
        """Release, or pass a ``valid`` lock to our queue's head (``None``: a lease)."""
        engine = self._engine
        local = engine.released(self._queue_key, valid=valid, pass_on=valid and self._passes_on)
        if not isinstance(local, bool):
            return engine.pass_on(hold, local)
        engine.forget(hold.token)  # late grants of it are given back now
        return self._release_votes(hold.token, local=local)

    def _release_votes(self, token: bytes, *, local: bool = False) -> Awaitable[Votes]:
        return self._engine.release(self._key, token, local=local)

    def _handed_over(self) -> bool:
        return self._detached

    def _busy(self) -> bool:
        hold = self._hold  # owned, or being released: acquire() refuses both
        return hold is not None and (hold.ended or self.remaining() > 0.0)

    def _renewals(self) -> list[Renewing] | None:
        renewal = self._renewal
        return [renewal] if self._hold is not None and renewal is not None else None

    def _exit_level(self) -> bool:
        """Give up this handle's level; True when other levels still hold (no I/O then)."""
        entry, self._entry = self._entry, None
        if entry is None:
            return False
        entry.levels -= 1
        if entry.levels > 0:
            self._hold = None  # this handle lets go; the task's other levels keep it
            return True
        self._engine.tasks.remove(entry)
        return False

    def _disown(self) -> None:
        self._stop_renewal()
        if self._entry is not None:
            self._engine.tasks.remove(self._entry)
            self._entry = None
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.end()

    def _stop_renewal(self) -> None:
        if self._renewal is not None:
            self._renewal.stop()

    async def _abandon(self) -> None:
        """Forget the lock and delete it wherever it may remain (shielded)."""
        hold = self._hold
        if hold is None or self._exit_level():
            return
        self._disown()
        await self._release_hold(hold, valid=False)
