"""A Redis Cluster as **one logical node**: requests are routed by hash slot.

Every key of one lock name shares a hash tag (``{prefix:name}``), so each request
of the engine lands in one slot and is sent to the master that serves it, on a
pipelined :class:`~aiolock._io.node.Node` per master, exactly as for a standalone node.
What a cluster adds:

- **The slot map**, read with ``CLUSTER SLOTS`` from a known server (the masters
  already known first, then the client's startup nodes) when the node first
  connects and again whenever a reply says it is stale: ``MOVED`` (the slot is
  re-pointed at once and the request re-sent), a connection error (the request is
  re-sent if the map, read again, names another master: a failover happened), a
  timeout or ``CLUSTERDOWN``.
- **ASK** redirects during a slot migration: ``ASKING`` and the request are written
  back to back on the target's connection. ``TRYAGAIN`` (a multi-key request while
  its keys are split by a migration) is re-sent shortly after.
- **Batched renewal**: a renewal call carries the keys of many names, which a
  cluster refuses across slots (``CROSSSLOT``). Scripts that declare
  ``per_key_args`` are split by slot and their replies put back in order; a part
  that fails counts as failed for its own keys only.
- **Sharded pub/sub** on Redis 7.0+ and Valkey: releases are announced with
  ``SPUBLISH`` (see _io/pubsub.py for why, and for the waiters' side).

The cluster is one vote: replication inside it is asynchronous, so a failover can
lose a lock that was just taken, as with one standalone master and its replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from typing import Any, Final

from redis.asyncio import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import (
    AskError,
    ClusterCrossSlotError,
    ClusterDownError,
    MovedError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from .._core.calls import Callback, Record, Soon, ignore
from .._core.cancel import join
from .._lua import Script
from .node import Node
from .protocol import cluster_endpoint
from .redis import cluster_addresses
from .specs import node_name

__all__ = ["Address", "ClusterNode"]

#: How many MOVED/ASK redirects one request may follow.
MAX_REDIRECTS: Final = 5
#: How long to wait before re-sending a request answered with TRYAGAIN.
TRY_AGAIN_DELAY: Final = 0.01
#: How long one server may take to answer CLUSTER SLOTS (once connected).
SLOTS_REPLY_TIMEOUT: Final = 0.25
#: The slot map is read again at most this often while replies keep saying it is stale.
MIN_REFRESH_INTERVAL: Final = 0.1
#: The first server version with sharded pub/sub (SSUBSCRIBE, SPUBLISH).
SHARDED_PUBSUB: Final = (7, 0)


Address = tuple[str, int]


class _Request:
    """One request on its way to the master of its slot."""

    __slots__ = ("args", "callback", "deadline", "failed", "redirects", "script", "slot")

    def __init__(
        self, slot: int, script: Script | None, args: tuple[bytes, ...], callback: Callback
    ) -> None:
        self.slot = slot
        self.script = script
        self.args = args
        self.callback = callback
        self.redirects = 0
        #: Set when first held for the slot map: later than this, it is not sent.
        self.deadline = 0.0
        #: The server that could not be reached, and why (see ClusterNode._on_reply).
        self.failed: tuple[Address, Exception] | None = None


class ClusterNode:
    """A Redis Cluster behind the interface of one :class:`~aiolock._io.node.Node`."""

    #: Not checked for restarts yet (its masters come and go with the slot map).
    restarted_at: float | None = None

    def __init__(
        self,
        client: RedisCluster,
        *,
        request_timeout: float,
        connect_timeout: float = 2.0,
        scripts: tuple[Script, ...] = (),
        soon: Soon | None = None,
    ) -> None:
        self.spec = client
        self._soon = Soon() if soon is None else soon
        self.name = node_name(client)
        self._client = client
        self._request_timeout = request_timeout
        self._connect_timeout = connect_timeout
        self._startup: list[Address] = cluster_addresses(client)
        self._servers: dict[Address, Node] = {}
        self._slots: list[Address | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        self._mapped = False
        self._refreshing: asyncio.Task[None] | None = None
        self._refreshed_at = -MIN_REFRESH_INTERVAL
        # Requests waiting for the slot map to be read (again), with their deadline.
        self._held: list[tuple[float, _Request]] = []
        self.closed = False
        # Each script as sent when the cluster has sharded pub/sub (see Script.sharded()).
        self._sharded_scripts: dict[Script, Script] = {}
        # Loaded on each master's connection: both kinds, whichever the cluster uses.
        self._loaded = tuple(dict.fromkeys((*scripts, *map(self._as_sharded, scripts))))
        #: Releases use SPUBLISH and waiters SSUBSCRIBE: every master heard from so
        #: far runs Redis 7.0+ or Valkey (``None``: none was heard from yet).
        self.sharded_pubsub: bool | None = None
        #: Renewals stay scripts on a cluster (see Node.set_ifeq).
        self.set_ifeq = False

    def __repr__(self) -> str:
        return f"<ClusterNode {self.name} masters={len(set(self._slots) - {None})}>"

    # -- requests ---------------------------------------------------------------

    def call(self, args: tuple[bytes, ...], callback: Callback) -> None:
        """Send one command whose first argument after the name is its key."""
        slot = key_slot(args[1]) if len(args) > 1 else 0
        self._dispatch(_Request(slot, None, args, callback), may_hold=True)

    def call_for_vote(
        self, script: Script, args: tuple[bytes, ...], record: Record, index: int
    ) -> None:
        """:meth:`call_script`, whose reply goes to ``record(index, reply)``."""
        self.call_script(script, args, functools.partial(record, index))

    def call_script(self, script: Script, args: tuple[bytes, ...], callback: Callback) -> None:
        """Run ``script`` on the master of its keys' slot (split by slot if it may be)."""
        numkeys = int(args[0])
        slot = key_slot(args[1]) if numkeys else 0
        for key in args[2 : 1 + numkeys]:
            if key_slot(key) != slot:
                break
        else:
            self._dispatch(_Request(slot, script, args, callback), may_hold=True)
            return
        if script.per_key_args:
            self._split(script, args, numkeys, callback)
        else:
            callback(ClusterCrossSlotError(f"{self.name}: the keys of one request span slots"))

    def _split(
        self, script: Script, args: tuple[bytes, ...], numkeys: int, callback: Callback
    ) -> None:
        per = script.per_key_args
        keys = args[1 : 1 + numkeys]
        argv = args[1 + numkeys :]
        groups: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(key_slot(key), []).append(i)
        replies: list[Any] = [None] * numkeys
        left = [len(groups)]

        def collect(indices: list[int], reply: Any) -> None:
            if isinstance(reply, list):
                for i, one in zip(indices, reply, strict=False):
                    replies[i] = one
            else:  # the part failed: its exception (or a malformed reply) for each key
                error = reply if isinstance(reply, BaseException) else TypeError(repr(reply))
                for i in indices:
                    replies[i] = error
            left[0] -= 1
            if left[0] == 0:
                callback(replies)

        for slot, indices in groups.items():
            part: list[bytes] = [b"%d" % len(indices)]
            part.extend(keys[i] for i in indices)
            for i in indices:
                part.extend(argv[per * i : per * (i + 1)])
            request = _Request(slot, script, tuple(part), functools.partial(collect, indices))
            self._dispatch(request, may_hold=True)

    def _dispatch(self, request: _Request, *, may_hold: bool) -> None:
        address = self._slots[request.slot]
        if address is None:
            if self.closed:
                request.callback(RedisConnectionError(f"{self.name}: the lock manager is closed"))
            elif may_hold:
                self._hold(request)
            else:
                error = RedisConnectionError(f"{self.name}: no server serves slot {request.slot}")
                request.callback(error)
            return
        self._send(address, request)

    def _send(self, address: Address, request: _Request) -> None:
        node = self._server(address)
        on_reply = functools.partial(self._on_reply, address, request)
        script = request.script
        if script is None:
            args = request.args
            if self.sharded_pubsub and args[0] == b"PUBLISH":
                args = (b"SPUBLISH", *args[1:])
            node.call(args, on_reply)
        else:
            if self.sharded_pubsub:
                script = self._as_sharded(script)
            node.call_script(script, request.args, on_reply)

    def _as_sharded(self, script: Script) -> Script:
        swapped = self._sharded_scripts.get(script)
        if swapped is None:
            publishes = b"'publish'" in script.source
            swapped = self._sharded_scripts[script] = script.sharded() if publishes else script
        return swapped

    def _on_reply(self, address: Address, request: _Request, reply: Any) -> None:
        # (MovedError is a subclass of AskError.)
        if isinstance(reply, AskError) and request.redirects < MAX_REDIRECTS and not self.closed:
            request.redirects += 1
            target = (reply.host or address[0], int(reply.port))
            if isinstance(reply, MovedError):
                self._slots[reply.slot_id] = target
                self._refresh_soon()
                self._dispatch(request, may_hold=False)
            else:  # ASK: this one request goes to the importing server, after ASKING
                self._server(target).call((b"ASKING",), ignore)
                self._send(target, request)
            return
        if isinstance(reply, TryAgainError) and not self.closed:
            # A multi-key request in a slot being migrated, some keys moved already:
            # the migration ends soon. Re-sent until the request's own budget (the
            # node_timeout) is spent, not a fixed number of times. (The source may
            # answer ASK and the target TRYAGAIN again until the migration ends: that
            # back and forth is bounded by the deadline, not by MAX_REDIRECTS.)
            request.redirects = 0
            now = time.monotonic()
            if not request.deadline:
                request.deadline = now + self._request_timeout
            if now + TRY_AGAIN_DELAY < request.deadline:
                retry = functools.partial(self._dispatch, request, may_hold=False)
                asyncio.get_running_loop().call_later(TRY_AGAIN_DELAY, retry)
                return
        if (
            isinstance(reply, RedisConnectionError)
            and request.redirects < MAX_REDIRECTS
            and not self.closed
        ):
            # The slot's master is gone, maybe failed over already: read the slot
            # map again and re-send if the slot has another master now; else fail
            # (the failover is not done: an outage for now). Every request is safe
            # to repeat: compare-and-delete and compare-and-expire are idempotent,
            # and a repeated acquire finds its own key "held" and is cleaned up.
            request.redirects += 1
            request.failed = (address, reply)
            self._hold(request)
            return
        if isinstance(reply, RedisConnectionError | TimeoutError | ClusterDownError):
            self._refresh_soon()  # the slot may have a new master (failover)
        request.callback(reply)

    def _hold(self, request: _Request) -> None:
        """Keep ``request`` until the slot map was read again, then dispatch it."""
        if not request.deadline:
            request.deadline = time.monotonic() + self._request_timeout
        self._held.append((request.deadline, request))
        self._refresh_soon()

    # -- the slot map -----------------------------------------------------------

    def _server(self, address: Address) -> Node:
        node = self._servers.get(address)
        if node is None:
            node = Node(
                self._client,
                request_timeout=self._request_timeout,
                scripts=self._loaded,
                endpoint=self.endpoint(address),
                soon=self._soon,
            )
            node.on_identity = self._on_identity
            self._servers[address] = node
        return node

    def _on_identity(self, _node: Node) -> None:
        versions = [n.server_version for n in self._servers.values()]
        known = [v for v in versions if v is not None]
        if known:
            self.sharded_pubsub = min(known) >= SHARDED_PUBSUB

    def address_of(self, slot: int) -> Address | None:
        """The master serving ``slot``, as far as the slot map knows."""
        return self._slots[slot]

    def redirected(self, slot: int, address: Address | None) -> None:
        """A server said ``slot`` is served elsewhere; the slot map is read again soon.

        ``address``: where (a MOVED), or ``None`` when not said (the server dropped it).
        """
        if address is not None:
            self._slots[slot] = address
        self._refresh_soon()

    def endpoint(self, address: Address) -> Any:
        """How to connect to the server at ``address`` (for a subscriber)."""
        return cluster_endpoint(self._client, address, self._connect_timeout)

    def _refresh_soon(self) -> None:
        if self._refreshing is None and not self.closed:
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        try:
            wait = self._refreshed_at + MIN_REFRESH_INTERVAL - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            # Ask connected servers first: a dead master only costs a failed connect,
            # but the map is read sooner from a live one.
            known = [a for a in dict.fromkeys(self._slots) if a is not None]
            candidates = list(dict.fromkeys([*known, *self._startup]))
            candidates.sort(key=self._unconnected)
            for address in candidates:
                reply = await self._ask_slots(address)
                if isinstance(reply, list) and reply:
                    self._apply(reply, address)
                    break
            self._refreshed_at = time.monotonic()
        finally:
            self._refreshing = None
            held, self._held = self._held, []
            now = time.monotonic()
            for deadline, request in held:
                failed = request.failed
                if now > deadline:
                    error = TimeoutError(f"{self.name}: the slot map was not read in time")
                    request.callback(failed[1] if failed is not None else error)
                elif failed is not None and self._slots[request.slot] == failed[0]:
                    request.callback(failed[1])  # still the unreachable master
                else:
                    self._dispatch(request, may_hold=False)

    def _unconnected(self, address: Address) -> bool:
        node = self._servers.get(address)
        return node is None or not node.connected

    async def _ask_slots(self, address: Address) -> Any:
        node = self._server(address)
        await node.connect()
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def on_reply(reply: Any) -> None:
            if not answer.done():
                answer.set_result(reply)

        node.call((b"CLUSTER", b"SLOTS"), on_reply)
        try:
            # A healthy server answers at once: a hung one must not hold up the
            # refresh for long before the next server is asked.
            async with asyncio.timeout(max(SLOTS_REPLY_TIMEOUT, 5 * self._request_timeout)):
                return await answer
        except TimeoutError as exc:
            return exc

    def _apply(self, reply: list[Any], asked: Address) -> None:
        slots: list[Address | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        for entry in reply:
            lo, hi, master = int(entry[0]), int(entry[1]), entry[2]
            host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
            if host == "?":  # the server does not know its own address yet
                continue
            address = (host or asked[0], int(master[1]))  # "": the host we asked
            slots[lo : hi + 1] = [address] * (hi + 1 - lo)
        self._slots = slots
        self._mapped = True

    # -- connection -------------------------------------------------------------

    async def connect(self) -> None:
        """Read the slot map and connect to every master, without raising on failure."""
        if self.closed:
            return
        if not self._mapped:
            self._refresh_soon()
            refreshing = self._refreshing
            if refreshing is not None:
                await join(refreshing)
        masters = {a for a in self._slots if a is not None}
        await asyncio.gather(*(self._server(a).connect() for a in masters))

    async def aclose(self) -> None:
        """Close every connection; requests still waiting fail with ConnectionError."""
        self.closed = True
        refreshing = self._refreshing
        if refreshing is not None:
            refreshing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refreshing
        error = RedisConnectionError(f"{self.name}: the lock manager is closed")
        held, self._held = self._held, []
        for _deadline, request in held:
            request.callback(error)
        for node in self._servers.values():
            await node.aclose()
