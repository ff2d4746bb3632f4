"""The engine under every handle: nodes, quorum, waiting, renewal, clock and events.

:class:`LockManager` checks its configuration and builds one :class:`Engine`; every
handle it makes receives the engine and calls it, never the manager. What a handle
may use is the attributes and methods below, nothing private:

* ``quorum`` (acquire / release / extend on the nodes), ``renewal_quorum`` (the
  renewal's view of the same nodes and connections, without the restart veto),
  ``waiting`` (local queues and pub/sub), ``renewer``, ``turns`` (the turn queues
  across processes, ``None`` on Redis Cluster);
* ``clock`` (monotonic seconds), ``key(name)`` (the key layout, from _core/keys.py),
  ``emit(...)`` (the ``on_event`` hook and the log), ``quorum_error(...)``;
* ``check_open()``, ``open()`` (refuses once closed; connects on first use),
  ``connected`` / ``connect()`` (the first contact, once),
  ``ttl_used(ttl)`` (validates a ttl and remembers the longest, for the restart grace).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Final

import anyio
from redis.asyncio import RedisCluster

from ._core.calls import Soon, ignore
from ._core.cancel import join, shielded
from ._core.checks import check_ttl, shown
from ._core.errors import NodeQuarantined, QuorumError
from ._core.events import EventKind, LockEvent, logger
from ._core.hold import Hold, TaskHolds
from ._core.info import LockInfo, decided, summarize
from ._core.keys import fence_key, lock_key, turn_keys
from ._core.votes import Votes
from ._io.cluster import ClusterNode
from ._io.node import Node
from ._io.specs import NodeSpec
from ._lua import (
    EXTEND_MANY_SCRIPT,
    INSPECT_SCRIPT,
    NOT_FREE,
    RELEASE_TURN_SCRIPT,
    REPAIR_SCRIPT,
    SCRIPTS,
    TURN_SCRIPTS,
    Script,
)
from ._quorum.quorum import Quorum
from ._quorum.renewal import Renewer
from ._waiting import handoff
from ._waiting.grants import Grants
from ._waiting.lease import LEASE_RESERVE, lease
from ._waiting.taker import Taker
from ._waiting.turns import Turns
from ._waiting.waiting import Waiting

__all__ = ["Engine", "connect_each"]

#: The renewal's scripts, loaded on each node's connection with the others.
RENEWAL_SCRIPTS: Final = (EXTEND_MANY_SCRIPT, REPAIR_SCRIPT)
#: How long the first contact waits for the nodes' connections.
CONNECT_TIMEOUT: Final = 2.0
#: The least restart grace of ``restart_grace=None`` (the default ttl).
MIN_RESTART_GRACE: Final = 30.0


def make_node(
    spec: NodeSpec, node_timeout: float, scripts: tuple[Script, ...], soon: Soon | None = None
) -> Node | ClusterNode:
    """The connection(s) for one node: a Redis Cluster client is one logical node."""
    if isinstance(spec, RedisCluster):
        return ClusterNode(spec, request_timeout=node_timeout, scripts=scripts, soon=soon)
    return Node(spec, request_timeout=node_timeout, scripts=scripts, soon=soon)


async def connect_each(nodes: Iterable[Node | ClusterNode]) -> None:
    """Connect ``nodes`` all at once; return when each is connected or gave up."""
    async with anyio.create_task_group() as tg:
        for node in nodes:
            tg.start_soon(node.connect)


class Engine:
    """The shared machinery of one manager (see the module docstring)."""

    def __init__(
        self,
        specs: Sequence[NodeSpec],
        *,
        prefix: str,
        drift_factor: float,
        node_timeout: float,
        on_event: Sequence[Callable[[LockEvent], object]],
        restart_grace: float | None,
    ) -> None:
        self.prefix = prefix
        self._prefix_bytes = prefix.encode()
        self.node_timeout = node_timeout
        self._hooks = tuple(on_event)
        self.clock: Callable[[], float] = time.monotonic
        soon = Soon()  # (the nodes' flushes, then the fan-outs' timers: one loop handle)
        self.nodes = tuple(
            make_node(spec, node_timeout, SCRIPTS + TURN_SCRIPTS + RENEWAL_SCRIPTS, soon)
            for spec in specs
        )
        for node in self.nodes:
            if isinstance(node, Node):
                node.on_identity = self._on_identity
        self.quorum = Quorum(
            self.nodes,
            node_timeout=node_timeout,
            drift_factor=drift_factor,
            clock=self.clock,
            soon=soon,
        )
        # The renewal shares each node's one ordered connection with every other command
        # of ours: at a node, the commands of one lock then apply in the order
        # they were sent, so an extend() given up on and landing late is applied before
        # any renewal sent after it, never after (it would cut the renewed key). What it
        # costs: a renewal batch written before an acquire is run before it (the node
        # runs one script at a time either way). See docs/explanation/safety.md.
        self.renewal_nodes = self.nodes
        self.renewal_quorum = Quorum(
            self.renewal_nodes,
            node_timeout=node_timeout,
            drift_factor=drift_factor,
            clock=self.clock,
            soon=soon,
        )
        self._restart_grace = restart_grace
        #: The longest ttl of a handle or an extension of this manager (restart_grace).
        self._longest_ttl = 0.0
        self._grace = self.restart_grace  # kept up to date by ttl_used
        if restart_grace != 0:
            self.quorum.veto = self._quarantined
        self.renewer = Renewer(self.renewal_quorum, emit=self.emit, forget=self.forget)
        #: The names each task holds through this manager (see _core/hold.py).
        self.tasks = TaskHolds()
        #: Waiting processes take turns (see _waiting/turns.py); not on Redis Cluster, where a
        #: release touching the turn queue's keys besides the lock's would get TRYAGAIN
        #: while its slot migrates (the lock key there, the queue's not).
        self.turns = (
            None
            if any(isinstance(node, ClusterNode) for node in self.nodes)
            else Turns(self._broadcast, clock=self.clock)
        )
        #: Locks granted by other processes' releases (see _waiting/grants.py).
        self.grants = None if self.turns is None else Grants(self.quorum)
        self.waiting = Waiting(
            self.nodes,
            clock=self.clock,
            confirm_timeout=max(2 * node_timeout, 0.1),
            announce=self._announce,
            turns=self.turns,
            grants=self.grants,
        )
        self.closed = False
        #: Whether the first contact with the nodes was made (see :meth:`connect`).
        self.connected = False
        self._connecting: asyncio.Future[None] | None = None

    # -- what handles use ---------------------------------------------------------------

    def key(self, name: str) -> bytes:
        """The key of the lock ``name`` (the layout: _core/keys.py)."""
        return lock_key(self._prefix_bytes, name)

    def forget(self, token: bytes) -> None:
        """A lock held with ``token`` is no longer held here (see _waiting/grants.py)."""
        if self.grants is not None:
            self.grants.forget(token)

    def check_open(self) -> None:
        """Raise ``RuntimeError`` once the manager is closed."""
        if self.closed:
            raise RuntimeError("the lock manager is closed")

    async def open(self) -> None:
        """Raise ``RuntimeError`` once the manager is closed; else connect, on first use.

        Callers on a hot path test ``closed or not connected`` first: then a call that
        has nothing to do costs no coroutine.
        """
        self.check_open()
        await self.connect()

    def ttl_used(self, ttl: object, what: str = "ttl") -> float:
        """Validate a ttl, and remember the longest (it sets the restart grace)."""
        checked = check_ttl(ttl, self.node_timeout, what)
        if checked > self._longest_ttl:
            self._longest_ttl = checked
            self._grace = self.restart_grace
        return checked

    def emit(
        self, kind: EventKind, name: str, seconds: float, error: BaseException | None = None
    ) -> None:
        """Report an event to the hooks and the log."""
        if self._hooks:
            event = LockEvent(kind, name, seconds, error)
            for hook in self._hooks:
                try:
                    hook(event)
                except Exception:  # a metrics hook must never break a lock
                    logger.exception("aiolock on_event hook failed")
        level = logging.WARNING if error is not None else logging.DEBUG
        if logger.isEnabledFor(level):
            detail = f": {error}" if error is not None else ""
            logger.log(level, "lock %s %s after %.3fs%s", shown(name), kind, seconds, detail)

    def quorum_error(self, what: str, votes: Votes) -> QuorumError:
        """The error for ``what`` (say, "acquire of lock 'x'") when too many nodes failed.

        Or when none did, and a quorum's yes was read after the validity it gave ran out.
        """
        quorum = self.quorum
        errors = votes.errors(quorum.nodes)
        if not errors and votes.won:  # (read too late: a task blocked the event loop?)
            return QuorumError(
                f"{what}: confirmed only after the validity it gave had run out (was the "
                "event loop blocked?)",
                errors,
            )
        detail = "; ".join(str(e) or type(e).__name__ for e in errors.values())
        return QuorumError(
            f"{what}: {len(errors)} of {quorum.n} nodes failed, "
            f"a quorum needs {quorum.quorum}: {detail}",
            errors,
        )

    async def inspect(self, name: str) -> tuple[LockInfo, Votes]:
        """Every node's view of the lock ``name`` (one read-only script each)."""
        await self.open()
        key = self.key(name)
        start = self.clock()
        votes = await self.quorum.ask(INSPECT_SCRIPT, (b"2", key, fence_key(key)))
        info = summarize(
            name,
            self.quorum.names,
            votes.replies,
            elapsed=self.clock() - start,
            drift_factor=self.quorum.drift_factor,
        )
        return info, votes

    async def locked(self, name: str) -> bool:
        """Whether the lock ``name`` is held on a quorum (QuorumError: undecided)."""
        info, votes = await self.inspect(name)
        if not decided(info):
            raise self.quorum_error(f"locked({shown(name)})", votes)
        return info.held

    # -- restart quarantine --------------------------------------------------------------

    @property
    def restart_grace(self) -> float:
        """How long a restarted node's yes to an acquire does not count (see LockManager)."""
        if self._restart_grace is not None:
            return self._restart_grace
        return max(MIN_RESTART_GRACE, self._longest_ttl)

    def _quarantined(self, i: int) -> NodeQuarantined | None:
        """Why node ``i``'s yes to an acquire must not count now, if it must not.

        Its server started (or its ``run_id`` changed) less than ``restart_grace``
        ago: it may have lost keys of locks that are still held, so counting its yes
        could hand out a lock that another holder still has.
        """
        node = self.nodes[i]
        restarted_at = node.restarted_at
        if restarted_at is None:
            return None
        grace = self._grace
        now = time.monotonic()
        left = restarted_at + grace - now
        if left <= 0.0:
            return None
        if getattr(node, "restart_seen", False):
            seen = f"restarted {now - restarted_at:.1f}s ago (its run_id changed)"
        else:
            seen = f"server started {now - restarted_at:.1f}s ago"
        return NodeQuarantined(
            f"{node.name}: {seen}, quarantined for {left:.1f}s more (restart_grace "
            f"{grace:g}s): a server this young may have lost the keys of locks still "
            "held, so its yes does not count yet. Await LockManager.wait_ready() at "
            "startup; pass restart_grace=0 only for servers that never held a lock "
            "(tests, a development server)"
        )

    def unready(self, i: int) -> BaseException | None:
        """Why node ``i``'s yes to an acquire would not count now, if it would not."""
        node = self.nodes[i]
        if not isinstance(node, Node):
            return None  # a Redis Cluster: its client connects and routes on its own
        if node.refusal is not None:
            return node.refusal
        if not node.connected:
            return node.last_error
        return None if self.quorum.veto is None else self._quarantined(i)

    def quarantine_left(self, i: int) -> float:
        """Seconds until node ``i``'s restart quarantine ends (0.0: not in one)."""
        node = self.nodes[i]
        restarted_at: float | None = getattr(node, "restarted_at", None)
        if restarted_at is None or self.quorum.veto is None:
            return 0.0
        return max(0.0, restarted_at + self._grace - time.monotonic())

    # -- first contact --------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect every node once, up front, within ``CONNECT_TIMEOUT``.

        Nodes that are down do not fail this: they are retried on use. Run by
        ``async with LockManager(...)``, and by the first acquire of a manager used
        without it: otherwise its first requests would count nodes that are still
        connecting as failed votes.
        """
        if self.connected:
            return
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_future()
            try:
                with anyio.move_on_after(CONNECT_TIMEOUT):
                    await connect_each(self.nodes)
            finally:
                self.connected = True
                self._connecting.set_result(None)
            self._check_same_servers()
        else:
            await join(self._connecting)

    def _same_server(self, node: Node) -> Node | None:
        """Another node that reached the same server as ``node`` (same ``run_id``)."""
        if node.run_id is None:
            return None
        for other in self.nodes:
            if other is not node and isinstance(other, Node) and other.run_id == node.run_id:
                return other
        return None

    def _check_same_servers(self) -> None:
        """At first contact: refuse to start when a node turned out to be another's server.

        ``_on_identity`` found it (and refused its votes) as each node identified itself.
        """
        for node in self.nodes:
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

    def release(self, key: bytes, token: bytes, *, local: bool = False) -> Awaitable[Votes]:
        """Release the plain lock ``key`` held with ``token`` on every node.

        ``local``: a waiter of this process takes the lock next, and the message says so
        (see _waiting/waiting.py); else it names the process whose turn it is (see
        _waiting/turns.py).
        """
        quorum = self.quorum
        if local:
            return quorum.release(key, token, more_args=(NOT_FREE,))
        if self.turns is None:
            return quorum.release(key, token)
        # The fencing floor, should the release grant the lock to the next in line.
        floor = b"%d" % int(quorum.wall_clock() * 1_000_000)
        return quorum.release(
            key, token, script=RELEASE_TURN_SCRIPT, more_keys=(fence_key(key), *turn_keys(key)),
            more_args=(floor, *self.waiting.release_args(key)),
        )  # fmt: skip

    def released(self, key: bytes, *, valid: bool, pass_on: bool) -> Taker | bool:
        """A holder of the plain lock ``key`` lets go: whether a waiter here takes it.

        Returns the waiter to pass the lock to in one script (``pass_on`` asked, and no
        node in its restart quarantine), else whether a waiter of this process takes it
        after the release (see ``Waiting.released``).
        """
        waiting = self.waiting
        pass_on = pass_on and waiting.waiters(key) > 0 and handoff.can_pass_on(self.quorum)
        return waiting.released(key, pass_on=pass_on, valid=valid)

    async def pass_on(self, hold: Hold, taker: Taker) -> Votes | None:
        """Pass the lock of ``hold`` to ``taker``, a waiter of this process.

        With no I/O when it may be (a lease: returns ``None``, see _waiting/lease.py),
        else in one script per node (returns its votes, read as a release's; see
        ``pass_on``). Only a release of a plain lock still valid gets here.
        """
        quorum, waiting, grants = self.quorum, self.waiting, self.grants
        key, token = hold.key, hold.token
        if lease(quorum, hold, taker, grants):
            return None  # the key keeps its token: its late grants too (_waiting/grants.py)
        self.forget(token)  # late grants of it are given back now
        behind = min(LEASE_RESERVE, waiting.waiters(key) - 1)  # tokens for leases after it
        votes = await handoff.pass_on(quorum, key, token, taker, waiting.line(key), reserve=behind)
        waiting.line_seen(key, votes)
        return votes

    async def hand_over(
        self, key: bytes, old_token: bytes, ttl: float, token: bytes
    ) -> tuple[Votes, float | None]:
        """Give the detached lock held with ``old_token`` the new ``token`` on a quorum.

        One ``HANDOVER`` per node; returns the votes and the validity's end (``None``:
        not taken over). Where it was not taken over on a quorum, or the caller was
        cancelled, the nodes that took it are given back to ``old_token`` (its ticket
        stays usable if nodes only failed), shielded like any clean-up.
        """
        quorum = self.quorum
        try:
            votes, expires_at = await quorum.extend(key, old_token, ttl, new_token=token)
        except BaseException:  # cancelled: the nodes decided, the handle will not own it
            with shielded():
                await quorum.extend(key, token, ttl, new_token=old_token)
            raise
        if expires_at is None:
            with shielded():
                await quorum.extend(key, token, ttl, new_token=old_token)
        return votes, expires_at

    def _broadcast(self, script: Script, args: tuple[bytes, ...]) -> None:
        """Send a script to every node without waiting for the replies (see _waiting/turns.py)."""
        for node in self.nodes:
            node.call_script(script, args, ignore)

    def _announce(self, channel: bytes) -> None:
        """Publish a release message on every node (see Waiting.released)."""
        for node in self.nodes:
            node.call((b"PUBLISH", channel, b""), ignore)

    # -- life cycle ----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop background work and close every connection; idempotent."""
        if self.closed:
            return
        self.closed = True
        with shielded():
            await self.renewer.aclose()
            await self.waiting.aclose()
            for node in dict.fromkeys((*self.nodes, *self.renewal_nodes)):
                await node.aclose()
