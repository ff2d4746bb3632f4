"""The Lock handle: acquire / release / extend / owned / remaining and ``async with``."""

from __future__ import annotations

import math
import secrets
from types import TracebackType
from typing import TYPE_CHECKING, Final

import anyio

from ._errors import LockLost, LockNotOwned, LockTimeout, QuorumError
from ._quorum import Attempt, Votes, drift
from ._scripts import NOT_FREE

if TYPE_CHECKING:
    from ._manager import LockManager
    from ._renewal import Renewal

__all__ = [
    "Lock",
    "check_name",
    "check_timeout",
    "check_ttl",
    "close_loss_scope",
    "open_loss_scope",
]

#: Token size in bytes: 160 bits from ``secrets``, unguessable and never logged.
TOKEN_BYTES: Final = 20


class _Default:
    """Marker for "use the lock's own timeout"."""

    def __repr__(self) -> str:
        return "<lock's timeout>"


_DEFAULT: Final = _Default()


#: The longest ttl (and ``max_hold``), in seconds: a year. Far inside what ``PX`` takes,
#: with the fencing counter's retention (100 x ttl, see _fencing.py) inside it too.
MAX_TTL: Final = 365 * 24 * 3600.0
#: The longest lock name, in UTF-8 bytes. A name is in every key and request of the
#: lock: a huge one would hold up the other requests queued on each node's connection.
MAX_NAME_BYTES: Final = 4096


def check_ttl(ttl: object, node_timeout: float, what: str = "ttl") -> float:
    """Validate a ttl (seconds) before any I/O."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise TypeError(f"{what} must be a number of seconds, not {type(ttl).__name__}")
    ttl = float(ttl)
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"{what} must be a finite number of seconds > 0, got {ttl!r}")
    if ttl > MAX_TTL:
        raise ValueError(f"{what} must be at most {MAX_TTL:g}s (a year), got {ttl:g}")
    if node_timeout >= ttl:
        raise ValueError(
            f"{what} ({ttl:g}s) must be greater than the manager's node_timeout "
            f"({node_timeout:g}s): every lock would expire while being acquired"
        )
    return ttl


def check_timeout(timeout: object) -> float | None:
    """Validate a timeout: ``None`` (wait forever) or a number of seconds >= 0."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(
            f"timeout must be None or a number of seconds, not {type(timeout).__name__}"
        )
    timeout = float(timeout)
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be None or >= 0, got {timeout!r}")
    return None if math.isinf(timeout) else timeout


def check_name(name: object) -> str:
    """Validate a lock name: a non-empty string of at most MAX_NAME_BYTES in UTF-8."""
    if not isinstance(name, str):
        raise TypeError(f"a lock name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("a lock name must not be empty")
    try:
        size = len(name.encode())
    except UnicodeEncodeError as exc:  # a lone surrogate
        raise ValueError(f"a lock name must be encodable as UTF-8: {exc.reason}") from None
    if size > MAX_NAME_BYTES:
        raise ValueError(
            f"a lock name must be at most {MAX_NAME_BYTES} bytes in UTF-8, got {size} "
            f"(starting {name[:40]!r})"
        )
    return name


def open_loss_scope(renewals: list[Renewal]) -> anyio.CancelScope | None:
    """Enter a cancel scope that each renewal cancels when its lock is lost.

    Entered in ``__aenter__`` and exited in ``__aexit__`` of the same task, around the
    body of ``async with``; ``None`` when nothing is renewed.
    """
    if not renewals:
        return None
    scope = anyio.CancelScope()
    scope.__enter__()
    for renewal in renewals:
        renewal.on_lost(scope.cancel)
    return scope


def close_loss_scope(
    scope: anyio.CancelScope | None,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> bool:
    """Exit the scope of :func:`open_loss_scope`.

    Returns True when the body ends with a cancellation from elsewhere (or a
    KeyboardInterrupt): that is never replaced by a lock error. The scope swallows
    its own cancellation: then the lock was lost, and the caller raises LockLost.
    """
    suppressed = bool(scope.__exit__(exc_type, exc, tb)) if scope is not None else False
    return exc_type is not None and not suppressed and not issubclass(exc_type, Exception)


class Extension:
    """One extension of a lock's validity in flight (an ``extend()`` or a renewal)."""

    __slots__ = ("overlapped", "settled")

    def __init__(self) -> None:
        #: Another extension of the same lock was in flight at the same time.
        self.overlapped = False
        self.settled = False


class Lock:
    """A handle on one distributed lock; created by :meth:`LockManager.lock`.

    The lock is owned by the handle, not by a task: it may be released from another
    task. One handle holds the lock at most once at a time.
    """

    __slots__ = (
        "_acquired_at",
        "_acquiring",
        "_auto_renew",
        "_expires_at",
        "_extensions",
        "_fencing_token",
        "_key",
        "_manager",
        "_max_hold",
        "_name",
        "_renewal",
        "_report",
        "_scope",
        "_timeout",
        "_token",
        "_ttl",
    )

    def __init__(
        self,
        manager: LockManager,
        name: str,
        *,
        ttl: float,
        timeout: float | None,
        auto_renew: bool,
        max_hold: float | None = None,
        key: bytes | None = None,
    ) -> None:
        self._manager = manager
        self._max_hold = max_hold
        self._name = name
        self._key = manager._key(name) if key is None else key
        self._ttl = ttl
        self._timeout = timeout
        self._auto_renew = auto_renew
        self._token: bytes | None = None
        self._expires_at = 0.0
        self._extensions: list[Extension] = []
        self._fencing_token: int | None = None
        self._acquiring = False
        self._acquired_at = 0.0
        # Whether acquisitions and releases are reported (on_event, the log);
        # a semaphore reports its own, not its slots' every try.
        self._report = True
        self._renewal: Renewal | None = None
        self._scope: anyio.CancelScope | None = None

    def __repr__(self) -> str:
        state = f"held, {self.remaining():.3f}s left" if self.owned else "not held"
        return f"<Lock {self._name!r} ttl={self._ttl:g} {state}>"

    # -- properties -----------------------------------------------------------------

    @property
    def name(self) -> str:
        """The lock's name (without the manager's prefix)."""
        return self._name

    @property
    def ttl(self) -> float:
        """Time to live of each acquisition and renewal, in seconds."""
        return self._ttl

    @property
    def timeout(self) -> float | None:
        """Default time :meth:`acquire` waits; ``None`` waits forever."""
        return self._timeout

    @property
    def auto_renew(self) -> bool:
        """Whether the lock is extended in the background while held."""
        return self._auto_renew

    @property
    def max_hold(self) -> float | None:
        """Longest time the renewal keeps the lock; ``None`` for no limit."""
        return self._max_hold

    @property
    def owned(self) -> bool:
        """Held, with validity left (no I/O)."""
        return self._token is not None and self.remaining() > 0.0

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current acquisition; ``None`` when not held.

        Across every holder of the name, tokens strictly increase in acquisition
        order: pass it to the protected resource, which must refuse a write with a
        token lower than one it has seen (see ``examples/fenced_store.py``).
        """
        return self._fencing_token if self._token is not None else None

    def remaining(self) -> float:
        """Seconds of validity left, from a monotonic clock; ``0.0`` when not held."""
        if self._token is None:
            return 0.0
        renewal = self._renewal
        if renewal is not None and renewal.lost is not None:
            return 0.0
        left: float = self._expires_at - self._manager._clock()
        return left if left > 0.0 else 0.0

    @property
    def lost(self) -> LockLost | None:
        """Why the lock was lost by the background renewal, if it was; else ``None``."""
        renewal = self._renewal
        return renewal.lost if renewal is not None else None

    async def wait_lost(self) -> LockLost:
        """Wait until the renewal gives up on the held lock; return the ``LockLost``.

        Returns at once if it was already lost. Raises :class:`LockNotOwned` when the
        lock is not held with ``auto_renew`` (nothing would ever be reported).
        """
        renewal = self._renewal
        if renewal is None:
            raise LockNotOwned(f"lock {self._name!r} is not held with auto_renew")
        return await renewal.wait_lost()

    # -- acquire ----------------------------------------------------------------------

    async def acquire(self, *, timeout: float | _Default | None = _DEFAULT) -> bool:  # noqa: ASYNC109
        """Acquire the lock, waiting up to ``timeout`` seconds (default: the lock's).

        ``timeout=None`` waits forever, ``timeout=0`` tries once. Returns ``True`` when
        held, ``False`` when the time is up; no key is left behind on any node then.
        Raises :class:`QuorumError` when too many nodes fail for a quorum to be
        possible, rather than waiting for them.
        """
        wait = self._timeout if isinstance(timeout, _Default) else check_timeout(timeout)
        if self._acquiring:
            raise RuntimeError(f"lock {self._name!r}: acquire() already in progress on this handle")
        if self._token is not None:
            if self.owned:
                raise RuntimeError(f"lock {self._name!r} is already held by this handle")
            self._clear()
        manager = self._manager
        manager._check_open()
        if not manager._connected_once:
            await manager._connect_once()
        clock = manager._clock
        started = clock()
        deadline = math.inf if wait is None else started + wait
        token = secrets.token_bytes(TOKEN_BYTES)
        self._acquiring = True
        try:
            attempt: Attempt | None = None
            # Try at once unless other tasks of this process already queue for the
            # name (they go first); timeout=0 always tries, exactly once.
            queue_key = self._queue_key
            if wait == 0 or not manager._waiting.waiters(queue_key):
                attempt = await self._attempt(token)
                if attempt.expires_at is None and not attempt.votes.outage:
                    attempt = None if clock() < deadline else attempt
            if attempt is None:
                attempt = await manager._waiting.acquire(
                    queue_key,
                    lambda: self._attempt(token),
                    deadline,
                    channels=self._channels,
                    exclusive=self._exclusive,
                )
                if attempt is None:
                    if self._report:
                        manager._emit("timeout", self._name, clock() - started)
                    return False
            if attempt.expires_at is None:
                if attempt.votes.outage:
                    error = self._quorum_error("acquire", attempt.votes)
                    if self._report:
                        manager._emit("quorum_error", self._name, clock() - started, error)
                    raise error
                if self._report:
                    manager._emit("timeout", self._name, clock() - started)
                return False
            self._acquired_at = clock()
            if self._report:
                manager._emit("acquired", self._name, self._acquired_at - started)
            self._token = token
            self._expires_at = attempt.expires_at
            self._fencing_token = attempt.fence
            if self._auto_renew:
                self._renewal = manager._renewer.start(self)
            return True
        finally:
            self._acquiring = False

    # -- release / extend ---------------------------------------------------------------

    async def release(self) -> None:
        """Release the lock on every node.

        Completes even if the calling task is cancelled meanwhile (the cancellation
        is re-raised after). Raises :class:`LockNotOwned` if the lock was no longer
        held (expired, taken over, never acquired), :class:`QuorumError` if too many
        nodes failed to confirm.
        """
        token = self._token
        if token is None:
            raise LockNotOwned(f"lock {self._name!r} is not held")
        self._stop_renewal()
        expired = self.remaining() <= 0.0
        manager = self._manager
        quorum = manager._quorum
        # Wake the next local waiter now: its attempt is written after our release
        # on each node's ordered connection, so the handoff costs no extra trip.
        local = manager._waiting.released(self._queue_key)
        held = manager._clock() - self._acquired_at
        try:
            votes = await self._release_votes(token, local=local)
        finally:
            self._clear()
        if self._report:
            manager._emit("released", self._name, held)
        if expired:
            raise LockNotOwned(f"lock {self._name!r} had expired before release")
        if votes.won:
            return
        if votes.no > quorum.n - quorum.quorum:
            raise LockNotOwned(
                f"lock {self._name!r} was not held any more on a majority of nodes "
                "(taken over or deleted)"
            )
        raise self._quorum_error("release", votes)

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lock's validity to ``ttl`` seconds (default: the lock's ttl).

        Never re-creates an expired lock. Raises :class:`LockNotOwned` when the lock
        was not held (it is then released wherever it remained), and
        :class:`QuorumError` when too many nodes failed (the lock stays held until
        its current validity runs out).
        """
        manager = self._manager
        new_ttl = self._ttl if ttl is None else manager._ttl_used(ttl)
        token = self._token
        if token is None:
            raise LockNotOwned(f"lock {self._name!r} is not held")
        if self.remaining() <= 0.0:
            await self._drop(token)
            raise LockNotOwned(f"lock {self._name!r} had expired; it is not re-created")
        quorum = manager._quorum
        extension = self._begin_extension()
        start = manager._clock()  # the requests go out now: no await before them

        def settle(votes: Votes) -> None:
            # Runs even if we are cancelled meanwhile: the nodes applied it anyway.
            self._end_extension(extension, token, start, new_ttl, won=votes.won)

        votes, _expires_at = await quorum.extend(self._key, token, new_ttl, then=settle)
        if votes.won and self._token is token and self.remaining() > 0.0:
            return
        if votes.no > quorum.n - quorum.quorum:
            await self._drop(token)
            raise LockNotOwned(
                f"lock {self._name!r} was not held any more on a majority of nodes "
                "(taken over or deleted)"
            )
        raise self._quorum_error("extend", votes)

    def _begin_extension(self) -> Extension:
        """Note an extension going out (see :meth:`_end_extension`)."""
        extension = Extension()
        if self._extensions:
            extension.overlapped = True
            for other in self._extensions:
                other.overlapped = True
        self._extensions.append(extension)
        return extension

    def _end_extension(
        self, extension: Extension, token: bytes, start: float, ttl: float, *, won: bool = False
    ) -> None:
        """Make the local validity follow an extension by ``ttl`` sent at ``start``.

        Each node that applied it holds the key until at least ``start + ttl``; the
        others keep the expiry they had. So the validity becomes ``start + ttl``
        (less drift) only when a quorum confirmed it and no other extension of this
        lock was in flight meanwhile (then the nodes may have applied them in either
        order); otherwise it becomes the earlier of the two. That also holds when
        the caller of ``extend()`` was cancelled, when the ttl is shorter than the
        one before, and when the outcome is unknown. The renewal schedule follows.
        """
        if extension.settled:
            return
        extension.settled = True
        self._extensions.remove(extension)
        if self._token is not token:
            return  # released (or dropped) meanwhile
        expires_at = start + ttl - drift(ttl, self._manager._quorum.drift_factor)
        if (not won or extension.overlapped) and expires_at >= self._expires_at:
            return  # unconfirmed or raced: keep the earlier
        self._expires_at = expires_at
        renewal = self._renewal
        if renewal is not None and renewal.active:
            renewal.validity_changed(ttl)
            self._manager._renewer.rescheduled(renewal)

    # -- async with -------------------------------------------------------------------

    async def __aenter__(self) -> Lock:
        if not await self.acquire():
            raise LockTimeout(f"lock {self._name!r} not acquired within {self._timeout}s")
        self._enter_scope()
        return self

    def _enter_scope(self) -> None:
        """After acquiring for ``async with``: let the renewal cancel the body on loss."""
        self._scope = open_loss_scope([self._renewal] if self._renewal is not None else [])

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        scope, self._scope = self._scope, None
        foreign = close_loss_scope(scope, exc_type, exc, tb)
        lost = self.lost
        if lost is not None:
            if self._token is not None:
                await self._drop(self._token)
            if foreign:
                return
            raise lost
        try:
            await self.release()
        except (LockNotOwned, QuorumError):
            if foreign:
                return
            raise
        return

    # -- internals ----------------------------------------------------------------------

    # How a lock is taken and given back; the read-write lock's handles override these.
    _channels: tuple[bytes, ...] | None = None
    _exclusive = True
    #: Whether the renewal may re-create the key where a node lost it (a plain key and
    #: counter; a reader of a read-write lock is also a member of a set: not repaired).
    _repairable = True

    @property
    def _queue_key(self) -> bytes:
        return self._key

    async def _attempt(self, token: bytes) -> Attempt:
        return await self._manager._quorum.acquire(self._key, token, self._ttl)

    async def _release_votes(self, token: bytes, *, local: bool = False) -> Votes:
        # ``local``: a waiter of this process takes the lock next (see _waiting.py).
        message = (NOT_FREE,) if local else ()
        return await self._manager._quorum.release(self._key, token, more_args=message)

    def _clear(self) -> None:
        self._stop_renewal()
        self._token = None
        self._expires_at = 0.0
        self._fencing_token = None

    def _stop_renewal(self) -> None:
        renewal = self._renewal
        if renewal is not None:
            renewal.stop()

    async def _drop(self, token: bytes) -> None:
        """Forget the lock and delete it wherever it may remain (shielded)."""
        self._clear()
        local = self._manager._waiting.released(self._queue_key)
        await self._release_votes(token, local=local)

    def _quorum_error(self, what: str, votes: Votes) -> QuorumError:
        quorum = self._manager._quorum
        errors = votes.errors(quorum.nodes)
        detail = "; ".join(str(e) or type(e).__name__ for e in errors.values())
        return QuorumError(
            f"{what} of lock {self._name!r}: {len(errors)} of {quorum.n} nodes failed, "
            f"a quorum needs {quorum.quorum}: {detail}",
            errors,
        )
