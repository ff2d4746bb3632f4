"""LockManager: the nodes, their connections and the shared background machinery."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import NoReturn, ParamSpec, TypeVar

from ._campaign import campaign, synchronized
from ._core.checks import (
    check_limit,
    check_name,
    check_names,
    check_number,
    check_timeout,
    check_ttl,
)
from ._core.events import LockEvent, logger
from ._core.info import LockInfo
from ._engine import Engine
from ._handles.lock import Lock
from ._handles.many import LockMany
from ._handles.rwlock import RWLock
from ._handles.semaphore import Semaphore
from ._handles.ticket import decode_ticket
from ._io.specs import NodeSpec, check_nodes
from ._ready import wait_ready

__all__ = ["LockManager"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


class LockManager:
    """Distributed locks over one Redis node or a Redlock quorum of N nodes.

    ``nodes`` are Redis URLs (``redis://``, ``rediss://``, ``unix://``) or
    ``redis.asyncio.Redis`` clients. With N nodes a lock is held when a majority
    (``N // 2 + 1``) granted it. Nodes that are down count as failed votes and may
    come back later; clients passed in are not closed by the manager.

    Use it as ``async with LockManager(...) as locks:``, or call :meth:`aclose`.
    ``on_event`` (optional; one callable or a sequence of them) is called with a
    :class:`LockEvent` on every acquisition, release, timeout, loss and outage: a hook
    for metrics (``aiolock.telemetry`` has OpenTelemetry and Prometheus ones).

    ``restart_grace``: a node whose server started less than this many seconds ago, or
    whose ``run_id`` changed since the manager last saw it, is quarantined: its yes to an
    acquire does not count (it may have lost keys of locks still held). ``None`` (the
    default): the longest ttl this manager has used, at least 30 s; ``0``: off (servers
    that persist with ``appendfsync always``, or that a test started empty itself).

    Raises:
        TypeError, ValueError: a bad configuration (no nodes, the same server given
            twice, ``node_timeout <= 0``, ...), before any I/O.
        ValueError: from ``async with`` (the first contact), when two nodes turn out
            to be one server behind different addresses (same ``run_id``).

    """

    def __init__(
        self,
        nodes: Iterable[NodeSpec],
        *,
        prefix: str = "aiolock:",
        drift_factor: float = 0.01,
        node_timeout: float = 0.05,
        on_event: Callable[[LockEvent], object]
        | Sequence[Callable[[LockEvent], object]]
        | None = None,
        restart_grace: float | None = None,
    ) -> None:
        specs = check_nodes(nodes)
        if len(specs) % 2 == 0:
            # Logged, not warnings.warn(): an even number is a valid configuration
            # (docs/reference/contract.md), and a warning would break programs that
            # treat warnings as errors.
            logger.warning(
                "%d nodes tolerate no more failures than %d: a quorum of %d is needed "
                "either way; use an odd number of nodes",
                len(specs),
                len(specs) - 1,
                len(specs) // 2 + 1,
            )
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        drift_factor = check_number(drift_factor, "drift_factor")
        if not 0 <= drift_factor < 1:
            raise ValueError(f"drift_factor must be in [0, 1), got {drift_factor!r}")
        node_timeout = check_number(node_timeout, "node_timeout")
        if node_timeout <= 0:
            raise ValueError(f"node_timeout must be > 0, got {node_timeout!r}")
        if restart_grace is not None:
            restart_grace = check_number(restart_grace, "restart_grace")
            if restart_grace < 0:
                raise ValueError(f"restart_grace must be None or >= 0, got {restart_grace!r}")
        hooks = [] if on_event is None else [on_event] if callable(on_event) else on_event
        if not isinstance(hooks, Sequence) or not all(callable(hook) for hook in hooks):
            raise TypeError("on_event must be callable, or a sequence of callables")
        #: Everything the handles use (see _engine.py).
        self._engine = Engine(
            specs,
            prefix=prefix,
            drift_factor=drift_factor,
            node_timeout=node_timeout,
            on_event=hooks,
            restart_grace=restart_grace,
        )

    def __repr__(self) -> str:
        names = ", ".join(node.name for node in self._engine.nodes)
        return f"<LockManager [{names}] quorum={self.quorum}>"

    # -- configuration ----------------------------------------------------------------

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The nodes as given (URLs or clients)."""
        return tuple(node.spec for node in self._engine.nodes)

    @property
    def quorum(self) -> int:
        """How many nodes must agree: ``len(nodes) // 2 + 1``."""
        return self._engine.quorum.quorum

    @property
    def prefix(self) -> str:
        """Prefix of every key and channel the manager touches."""
        return self._engine.prefix

    @property
    def drift_factor(self) -> float:
        """Clock drift allowance, as a fraction of the ttl."""
        return self._engine.quorum.drift_factor

    @property
    def node_timeout(self) -> float:
        """Budget of one request to one node, in seconds."""
        return self._engine.node_timeout

    @property
    def restart_grace(self) -> float:
        """How long a restarted node's yes to an acquire does not count, in seconds.

        As given, or (``restart_grace=None``) the longest ttl this manager has used, at
        least 30 s: by then every lock the node may have lost has expired. ``0``: off.
        """
        return self._engine.restart_grace

    # -- primitives -------------------------------------------------------------------

    def lock(
        self,
        name: str,
        *,
        ttl: float = 30.0,
        timeout: float | None = None,
        auto_renew: bool = True,
        max_hold: float | None = None,
        reentrant: bool = False,
    ) -> Lock:
        """An unacquired handle on the lock ``name``. Cheap; no I/O.

        ``ttl``: validity of each acquisition and renewal (seconds). ``timeout``:
        how long ``acquire()`` and ``async with`` wait (``None``: forever).
        ``auto_renew``: extend in the background while held; a lock that cannot be
        kept is reported lost. ``max_hold``: stop renewing (the lock is lost) after
        this many seconds held. ``reentrant``: the task that holds ``name`` through
        a reentrant handle of this manager may acquire it again through this one, at
        once and with no I/O, sharing that acquisition (released with its last
        level). Without it, a task acquiring a name it already holds through this
        manager gets ``RuntimeError`` at once, rather than waiting for itself.

        Raises:
            TypeError, ValueError: a bad argument (the bounds: docs/getting-started.md),
                before any I/O.

        """
        name = check_name(name)
        ttl = self._engine.ttl_used(ttl)
        timeout = check_timeout(timeout)
        if max_hold is not None:
            max_hold = check_ttl(max_hold, 0.0, "max_hold")
        return Lock(
            self._engine,
            name,
            ttl=ttl,
            timeout=timeout,
            auto_renew=bool(auto_renew),
            max_hold=max_hold,
            reentrant=bool(reentrant),
            task_bound=True,
        )

    def semaphore(
        self,
        name: str,
        limit: int,
        *,
        ttl: float = 30.0,
        timeout: float | None = None,
        auto_renew: bool = True,
    ) -> Semaphore:
        """An unacquired semaphore: at most ``limit`` holders of ``name`` at once.

        Raises:
            TypeError, ValueError: a bad argument (``limit`` from 1 to 1000), before
                any I/O.

        """
        name = check_name(name)
        limit = check_limit(limit)
        ttl = self._engine.ttl_used(ttl)
        timeout = check_timeout(timeout)
        return Semaphore(
            self._engine, name, limit, ttl=ttl, timeout=timeout, auto_renew=bool(auto_renew)
        )

    def lock_many(
        self,
        names: Iterable[str],
        *,
        ttl: float = 30.0,
        timeout: float | None = None,
        auto_renew: bool = True,
    ) -> LockMany:
        """One handle over several names: all-or-nothing, deadlock-free (sorted order).

        Raises:
            TypeError, ValueError: a bad argument (no names, a bad name), before any I/O.

        """
        checked = check_names(names)
        ttl = self._engine.ttl_used(ttl)
        timeout = check_timeout(timeout)
        return LockMany(
            self._engine, checked, ttl=ttl, timeout=timeout, auto_renew=bool(auto_renew)
        )

    def rwlock(self, name: str, *, ttl: float = 30.0, timeout: float | None = None) -> RWLock:
        """A read-write lock: ``.read()`` and ``.write()`` give handles.

        Many readers or one writer; a waiting writer keeps new readers out.

        Raises:
            TypeError, ValueError: a bad argument, before any I/O.

        """
        name = check_name(name)
        ttl = self._engine.ttl_used(ttl)
        timeout = check_timeout(timeout)
        return RWLock(self._engine, name, ttl=ttl, timeout=timeout)

    def synchronized(
        self,
        name_or_template: str,
        *,
        ttl: float = 30.0,
        timeout: float | None = None,
        reentrant: bool = False,
    ) -> Callable[[Callable[_P, Awaitable[_R]]], Callable[_P, Awaitable[_R]]]:
        """Decorate an async function to run it under a lock.

        ``reentrant=True``: a call made while the same task already runs a reentrant
        function on the same name (say ``charge`` calling ``refund`` for one order)
        shares its lock instead of raising ``RuntimeError`` (see :meth:`lock`).

        The name may be a template formatted from the call's arguments, by name::

            @locks.synchronized("order:{order_id}", ttl=10, timeout=5)
            async def charge(order_id: int, amount: int) -> None: ...

        Raises:
            LockTimeout: (from a call) the lock was not acquired in time.
            LockLost: (from a call) the lock was lost while the function ran; the
                function was cancelled.
            TypeError, ValueError: a bad argument, or a template naming a field the
                function has no parameter for (when decorating).

        """
        check_name(name_or_template)
        ttl = self._engine.ttl_used(ttl)
        timeout = check_timeout(timeout)

        def make(name: str) -> Lock:
            return self.lock(name, ttl=ttl, timeout=timeout, reentrant=reentrant)

        return synchronized(name_or_template, make)

    async def attach(self, ticket: str, *, auto_renew: bool = True) -> Lock:
        """Take over a lock detached with :meth:`Lock.detach`, in this or any process.

        On a quorum the key is given a token of the new handle's (so a ticket works
        once) and its validity is reset to the lock's ttl, counted from now. Returns
        the owned :class:`Lock`, with the same name and fencing token.

        Raises:
            LockNotOwned: the ticket's lock is not held any more (expired, released,
                taken over, or the ticket was already attached).
            QuorumError: too many nodes failed (the ticket stays usable).
            TypeError, ValueError: not a ticket, or one of a manager with another
                prefix, before any I/O.

        """
        parsed = decode_ticket(ticket, prefix=self.prefix)
        lock = self.lock(parsed.name, ttl=parsed.ttl, auto_renew=auto_renew)
        # The manager completes the handle it has just made (a Lock of its own family).
        await lock._attach(parsed)  # noqa: SLF001
        return lock

    async def campaign(
        self, name: str, run: Callable[[Lock], Awaitable[object]], *, ttl: float = 30.0
    ) -> NoReturn:
        """Leader election: forever, be elected and ``await run(term)`` while leader.

        ``term`` is the held (auto-renewed) :class:`Lock`; ``term.fencing_token`` numbers
        the term: hand it to what the leader writes. ``run`` is cancelled the moment
        leadership is lost; then, or when ``run`` returns, the lock is released and the
        campaign goes on after a short jittered pause. A leader that dies is replaced
        when its lock expires, within about ``ttl``. Returns only by cancellation
        (releasing the lock if leader).

        Raises:
            Exception: whatever ``run`` raises (other than the loss of the lock) ends
                the campaign with it.
            TypeError, ValueError: a bad argument, before any I/O.

        """
        name = check_name(name)
        ttl = self._engine.ttl_used(ttl)
        if not callable(run):
            raise TypeError(f"run must be an async callable, not {type(run).__name__}")
        await campaign(name, lambda: self.lock(name, ttl=ttl), run, pause=min(ttl / 10, 1.0))

    # -- read-only queries ------------------------------------------------------------

    async def inspect(self, name: str) -> LockInfo:
        """Who holds the lock ``name``, on which nodes, and for how long. No acquisition.

        Each node runs one read-only script; a holder is named by a digest of its
        token, never the token. Nodes that fail are reported in ``nodes`` (their
        ``error``), not raised.

        Raises:
            TypeError, ValueError: a bad name, before any I/O.
            RuntimeError: the manager is closed.

        """
        info, _votes = await self._engine.inspect(check_name(name))
        return info

    async def locked(self, name: str) -> bool:
        """Whether the lock ``name`` is held on a quorum of nodes, by anyone. No acquisition.

        Raises:
            QuorumError: too many nodes failed to tell held from free.
            TypeError, ValueError: a bad name, before any I/O.
            RuntimeError: the manager is closed.

        """
        return await self._engine.locked(check_name(name))

    async def wait_ready(self, *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until a quorum of nodes would count for an acquire (startup, readiness).

        Ready: a quorum connected and out of its restart quarantine (``restart_grace``;
        servers started a moment ago are in it). ``timeout=0`` checks once (a probe).

        Raises:
            QuorumError: not ready within ``timeout`` (each node not counting, and why).
            TypeError, ValueError: a bad timeout, before any I/O.
            RuntimeError: the manager is closed.

        """
        seconds = check_timeout(timeout)
        self._engine.check_open()
        await wait_ready(self._engine, seconds)

    # -- life cycle -------------------------------------------------------------------

    async def __aenter__(self) -> LockManager:
        try:
            await self._engine.open()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop background work and close every connection the manager opened."""
        await self._engine.aclose()

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._engine.closed
