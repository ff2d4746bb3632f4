"""LockManager: the nodes, their connections and the shared background machinery."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import string
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Final, ParamSpec, TypeVar

import anyio
from redis.asyncio import RedisCluster

from ._cluster import ClusterNode
from ._errors import NodeQuarantined
from ._events import EventKind, LockEvent, logger
from ._keys import lock_key
from ._lock import Lock, check_name, check_timeout, check_ttl
from ._many import LockMany, check_names
from ._node import Node, NodeSpec, Script, ignore, node_key, node_name
from ._quorum import EXTEND_MANY_SCRIPT, REPAIR_SCRIPT, SCRIPTS, Quorum
from ._renewal import Renewer
from ._rwlock import RWLock
from ._semaphore import Semaphore
from ._waiting import Waiting

__all__ = ["LockManager"]

#: The most holders a semaphore may have: a try on a full semaphore costs one quorum
#: attempt per slot (and a waiter listens on every slot's channel).
MAX_SEMAPHORE_LIMIT: Final = 1000


_P = ParamSpec("_P")
_R = TypeVar("_R")

#: How long ``async with LockManager(...)`` waits for the first connections.
CONNECT_TIMEOUT: Final = 2.0
#: The least restart grace of ``restart_grace=None`` (the default ttl).
MIN_RESTART_GRACE: Final = 30.0


def _check_number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, got {number!r}")
    return number


def make_node(
    spec: NodeSpec, node_timeout: float, scripts: tuple[Script, ...]
) -> Node | ClusterNode:
    """The connection(s) for one node: a Redis Cluster client is one logical node."""
    if isinstance(spec, RedisCluster):
        return ClusterNode(spec, request_timeout=node_timeout, scripts=scripts)
    return Node(spec, request_timeout=node_timeout, scripts=scripts)


class LockManager:
    """Distributed locks over one Redis node or a Redlock quorum of N nodes.

    ``nodes`` are Redis URLs (``redis://``, ``rediss://``, ``unix://``) or
    ``redis.asyncio.Redis`` clients. With N nodes a lock is held when a majority
    (``N // 2 + 1``) granted it. Nodes that are down count as failed votes and may
    come back later; clients passed in are not closed by the manager.

    Use it as ``async with LockManager(...) as locks:``, or call :meth:`aclose`.
    ``on_event`` (optional) is called with a :class:`LockEvent` on every acquisition,
    release, timeout, loss and outage: a hook for metrics.

    ``restart_grace``: a node whose server started less than this many seconds ago, or
    whose ``run_id`` changed since the manager last saw it, is quarantined: its yes to an
    acquire does not count (it may have lost keys of locks still held). ``None`` (the
    default): the longest ttl this manager has used, at least 30 s; ``0``: off (servers
    that persist with ``appendfsync always``, or that a test started empty itself).
    """

    def __init__(
        self,
        nodes: Iterable[NodeSpec],
        *,
        prefix: str = "aiolock:",
        drift_factor: float = 0.01,
        node_timeout: float = 0.05,
        on_event: Callable[[LockEvent], object] | None = None,
        restart_grace: float | None = None,
    ) -> None:
        if isinstance(nodes, str | bytes) or not isinstance(nodes, Iterable):
            raise TypeError(
                "nodes must be a sequence of Redis URLs or redis.asyncio.Redis clients, "
                f"not {type(nodes).__name__}"
            )
        specs = list(nodes)
        if not specs:
            raise ValueError("nodes must not be empty")
        seen: dict[tuple[object, ...], NodeSpec] = {}
        for spec in specs:
            key = node_key(spec)
            if key in seen:
                raise ValueError(
                    f"duplicate node: {node_name(spec)} is the same server as "
                    f"{node_name(seen[key])} (one server would count as several votes "
                    "and fake a quorum; another database number is not another server)"
                )
            seen[key] = spec
        if len(specs) % 2 == 0:
            # Logged, not warnings.warn(): an even number is a valid configuration
            # (API.md), and a warning would break programs that treat them as errors.
            logger.warning(
                "%d nodes tolerate no more failures than %d: a quorum of %d is needed "
                "either way; use an odd number of nodes",
                len(specs),
                len(specs) - 1,
                len(specs) // 2 + 1,
            )
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        drift_factor = _check_number(drift_factor, "drift_factor")
        if not 0 <= drift_factor < 1:
            raise ValueError(f"drift_factor must be in [0, 1), got {drift_factor!r}")
        node_timeout = _check_number(node_timeout, "node_timeout")
        if node_timeout <= 0:
            raise ValueError(f"node_timeout must be > 0, got {node_timeout!r}")

        if restart_grace is not None:
            restart_grace = _check_number(restart_grace, "restart_grace")
            if restart_grace < 0:
                raise ValueError(f"restart_grace must be None or >= 0, got {restart_grace!r}")
        if on_event is not None and not callable(on_event):
            raise TypeError("on_event must be callable")
        self._on_event = on_event
        self._prefix = prefix
        self._prefix_bytes = prefix.encode()
        self._drift_factor = drift_factor
        self._node_timeout = node_timeout
        self._clock: Callable[[], float] = time.monotonic
        self._nodes = [make_node(spec, node_timeout, SCRIPTS) for spec in specs]
        for node in self._nodes:
            if isinstance(node, Node):
                node.on_identity = self._on_identity
        self._quorum = Quorum(
            self._nodes,
            node_timeout=node_timeout,
            drift_factor=drift_factor,
            clock=self._clock,
        )
        # Renewal has connections of its own (opened on first use): a batch of a
        # thousand locks takes a node milliseconds, and on the ordered hot-path
        # connection every acquire and release would queue behind it.
        self._renewal_nodes = [
            make_node(spec, node_timeout, (EXTEND_MANY_SCRIPT, REPAIR_SCRIPT)) for spec in specs
        ]
        self._renewal_quorum = Quorum(
            self._renewal_nodes,
            node_timeout=node_timeout,
            drift_factor=drift_factor,
            clock=self._clock,
        )
        self._restart_grace = restart_grace
        #: The longest ttl of a handle or an extension of this manager (restart_grace).
        self._longest_ttl = 0.0
        self._grace = self.restart_grace  # kept up to date by _ttl_used
        if restart_grace != 0:
            self._quorum.veto = self._quarantined
        self._renewer = Renewer(self)
        self._waiting = Waiting(
            self._nodes,
            clock=self._clock,
            confirm_timeout=max(2 * node_timeout, 0.1),
            announce=self._announce,
        )
        self._closed = False
        self._connected_once = False
        self._connecting_all: asyncio.Future[None] | None = None

    def _announce(self, channel: bytes) -> None:
        """Publish a release message on every node (see Waiting.released)."""
        for node in self._nodes:
            node.call((b"PUBLISH", channel, b""), ignore)

    def __repr__(self) -> str:
        names = ", ".join(node.name for node in self._nodes)
        return f"<LockManager [{names}] quorum={self._quorum.quorum}>"

    # -- configuration ----------------------------------------------------------------

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        """The nodes as given (URLs or clients)."""
        return tuple(node.spec for node in self._nodes)

    @property
    def quorum(self) -> int:
        """How many nodes must agree: ``len(nodes) // 2 + 1``."""
        return self._quorum.quorum

    @property
    def prefix(self) -> str:
        """Prefix of every key and channel the manager touches."""
        return self._prefix

    @property
    def drift_factor(self) -> float:
        """Clock drift allowance, as a fraction of the ttl."""
        return self._drift_factor

    @property
    def node_timeout(self) -> float:
        """Budget of one request to one node, in seconds."""
        return self._node_timeout

    @property
    def restart_grace(self) -> float:
        """How long a restarted node's yes to an acquire does not count, in seconds.

        As given, or (``restart_grace=None``) the longest ttl this manager has used, at
        least 30 s: by then every lock the node may have lost has expired. ``0``: off.
        """
        if self._restart_grace is not None:
            return self._restart_grace
        return max(MIN_RESTART_GRACE, self._longest_ttl)

    def _quarantined(self, i: int) -> NodeQuarantined | None:
        """Why node ``i``'s yes to an acquire must not count now, if it must not.

        Its server started (or its ``run_id`` changed) less than ``restart_grace``
        ago: it may have lost keys of locks that are still held, so counting its yes
        could hand out a lock that another holder still has.
        """
        node = self._nodes[i]
        restarted_at = node.restarted_at
        if restarted_at is None:
            return None
        grace = self._grace
        now = time.monotonic()
        left = restarted_at + grace - now
        if left <= 0.0:
            return None
        return NodeQuarantined(
            f"{node.name}: restarted {now - restarted_at:.1f}s ago, quarantined for "
            f"{left:.1f}s more (restart_grace {grace:g}s): its yes does not count"
        )

    def _ttl_used(self, ttl: object, what: str = "ttl") -> float:
        """Validate a ttl, and remember the longest (it sets the restart grace)."""
        checked = check_ttl(ttl, self._node_timeout, what)
        if checked > self._longest_ttl:
            self._longest_ttl = checked
            self._grace = self.restart_grace
        return checked

    # -- primitives -------------------------------------------------------------------

    def lock(
        self,
        name: str,
        *,
        ttl: float = 30.0,
        timeout: float | None = None,
        auto_renew: bool = True,
        max_hold: float | None = None,
    ) -> Lock:
        """An unacquired handle on the lock ``name``. Cheap; no I/O.

        ``ttl``: validity of each acquisition and renewal (seconds). ``timeout``:
        how long ``acquire()`` and ``async with`` wait (``None``: forever).
        ``auto_renew``: extend in the background while held; a lock that cannot be
        kept is reported lost. ``max_hold``: stop renewing (the lock is lost) after
        this many seconds held.
        """
        name = check_name(name)
        ttl = self._ttl_used(ttl)
        timeout = check_timeout(timeout)
        if max_hold is not None:
            max_hold = check_ttl(max_hold, 0.0, "max_hold")
        return Lock(
            self, name, ttl=ttl, timeout=timeout, auto_renew=bool(auto_renew), max_hold=max_hold
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
        """An unacquired semaphore: at most ``limit`` holders of ``name`` at once."""
        name = check_name(name)
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, not {type(limit).__name__}")
        if not 1 <= limit <= MAX_SEMAPHORE_LIMIT:
            raise ValueError(f"limit must be from 1 to {MAX_SEMAPHORE_LIMIT}, got {limit!r}")
        ttl = self._ttl_used(ttl)
        timeout = check_timeout(timeout)
        return Semaphore(self, name, limit, ttl=ttl, timeout=timeout, auto_renew=bool(auto_renew))

    def lock_many(
        self,
        names: Iterable[str],
        *,
        ttl: float = 30.0,
        timeout: float | None = None,
        auto_renew: bool = True,
    ) -> LockMany:
        """One handle over several names: all-or-nothing, deadlock-free (sorted order)."""
        checked = check_names(names)
        ttl = self._ttl_used(ttl)
        timeout = check_timeout(timeout)
        return LockMany(self, checked, ttl=ttl, timeout=timeout, auto_renew=bool(auto_renew))

    def rwlock(self, name: str, *, ttl: float = 30.0, timeout: float | None = None) -> RWLock:
        """A read-write lock: ``.read()`` and ``.write()`` give handles.

        Many readers or one writer; a waiting writer keeps new readers out.
        """
        name = check_name(name)
        ttl = self._ttl_used(ttl)
        timeout = check_timeout(timeout)
        return RWLock(self, name, ttl=ttl, timeout=timeout)

    def synchronized(
        self, name_or_template: str, *, ttl: float = 30.0, timeout: float | None = None
    ) -> Callable[[Callable[_P, Awaitable[_R]]], Callable[_P, Awaitable[_R]]]:
        """Decorate an async function to run it under a lock.

        The name may be a template formatted from the call's arguments, by name::

            @locks.synchronized("order:{order_id}", ttl=10, timeout=5)
            async def charge(order_id: int, amount: int) -> None: ...

        Raises :class:`LockTimeout` when the lock is not acquired in time.
        """
        if not isinstance(name_or_template, str):
            raise TypeError(f"the name must be a str, not {type(name_or_template).__name__}")
        check_name(name_or_template)
        ttl = self._ttl_used(ttl)
        timeout = check_timeout(timeout)
        fields = {field for _, field, _, _ in string.Formatter().parse(name_or_template) if field}

        def decorate(fn: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]:
            signature = inspect.signature(fn)
            missing = {f.split(".")[0].split("[")[0] for f in fields} - set(signature.parameters)
            if missing:
                raise ValueError(
                    f"lock name {name_or_template!r} uses {sorted(missing)}, which "
                    f"{fn.__qualname__} has no parameter for"
                )

            @functools.wraps(fn)
            async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
                name = name_or_template
                if fields:
                    bound = signature.bind(*args, **kwargs)
                    bound.apply_defaults()
                    name = name_or_template.format(**bound.arguments)
                async with self.lock(name, ttl=ttl, timeout=timeout):
                    return await fn(*args, **kwargs)

            return wrapper

        return decorate

    # -- life cycle -------------------------------------------------------------------

    async def __aenter__(self) -> LockManager:
        self._check_open()
        try:
            await self._connect_once()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def _connect_once(self) -> None:
        """Connect every node once, up front, within ``CONNECT_TIMEOUT``.

        Nodes that are down do not fail this: they are retried on use. Also run by the
        first acquire of a manager used without ``async with``: otherwise its first
        requests would count nodes that are still connecting as failed votes.
        """
        if self._connected_once:
            return
        if self._connecting_all is None:
            self._connecting_all = asyncio.get_running_loop().create_future()
            try:
                with anyio.move_on_after(CONNECT_TIMEOUT):
                    async with anyio.create_task_group() as tg:
                        for node in self._nodes:
                            tg.start_soon(node.connect)
            finally:
                self._connected_once = True
                self._connecting_all.set_result(None)
            self._check_same_servers()
        else:
            await asyncio.shield(self._connecting_all)

    def _same_server(self, node: Node) -> Node | None:
        """Another node that reached the same server as ``node`` (same ``run_id``)."""
        if node.run_id is None:
            return None
        for other in self._nodes:
            if other is not node and isinstance(other, Node) and other.run_id == node.run_id:
                return other
        return None

    def _check_same_servers(self) -> None:
        """At first contact: refuse to start when a node turned out to be another's server.

        ``_on_identity`` found it (and refused its votes) as each node identified itself.
        """
        for node in self._nodes:
            # (A ValueError: the same server; any other refusal fails the node's votes.)
            if isinstance(node, Node) and isinstance(node.refusal, ValueError):
                raise ValueError(f"{node.refusal}; give each server once")  # noqa: TRY004

    def _on_identity(self, node: Node) -> None:
        """A node (re)connected: it must not be the server of another node."""
        other = self._same_server(node)
        if other is not None and other.connected:
            error = ValueError(
                f"{node.name} is the same server as {other.name} (run_id "
                f"{node.run_id!r}): it does not count as a vote"
            )
            logger.error("aiolock: %s", error)
            node.refuse(error)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop background work and close every connection the manager opened."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self._renewer.aclose()
            await self._waiting.aclose()
            for node in (*self._nodes, *self._renewal_nodes):
                await node.aclose()

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    # -- internals ----------------------------------------------------------------------

    def _emit(
        self, kind: EventKind, name: str, seconds: float, error: BaseException | None = None
    ) -> None:
        """Report an event to the hook and the log."""
        hook = self._on_event
        if hook is not None:
            try:
                hook(LockEvent(kind, name, seconds, error))
            except Exception:  # a metrics hook must never break a lock
                logger.exception("aiolock on_event hook failed")
        level = logging.WARNING if error is not None else logging.DEBUG
        if logger.isEnabledFor(level):
            detail = f": {error}" if error is not None else ""
            logger.log(level, "lock %r %s after %.3fs%s", name, kind, seconds, detail)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the lock manager is closed")

    def _key(self, name: str) -> bytes:
        return lock_key(self._prefix_bytes, name)  # (the layout: _keys.py)
