"""One Redis node: pipelined requests on one connection, and pub/sub.

A lock cycle is a handful of tiny commands, so the cost per command of the client
decides the speed of the library. Instead of redis-py's pooled client (pool checkout,
retry wrapper and response callbacks on every call) each node keeps **one long-lived
connection** on which requests are written at once and replies are matched to
requests in order, parsed by hiredis straight from ``data_received``: no task, no
future and no lock per request.

redis-py still does what it does well: URL parsing, connecting, TLS, AUTH/ACL and
SELECT are done by a :class:`redis.asyncio.Connection`, whose transport is then taken
over by :class:`_ReplyProtocol`.

One ordered connection per node also means that a release written before another
task's acquire reaches the node first, and that a clean-up written after a timed-out
request runs after it on the node.

Requests never raise: every outcome, reply or failure, is handed to the request's
callback. Failures are exceptions passed as values (``ConnectionError``,
``TimeoutError``, a :class:`redis.exceptions.ResponseError` subclass, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol, cast
from urllib.parse import urlsplit, urlunsplit

import hiredis
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AskError,
    ClusterDownError,
    NoScriptError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from ._events import logger
from ._redis import (
    cluster_addresses,
    cluster_connection,
    connection_settings,
    error_from_reply,
    sentinel_service,
    take_over,
)

__all__ = [
    "Callback",
    "Node",
    "NodeSpec",
    "Script",
    "Subscriber",
    "cluster_addresses",
    "ignore",
    "node_key",
    "node_name",
    "pack",
    "parse_info",
    "parse_version",
    "subscriber_endpoints",
]

NodeSpec = str | Redis | RedisCluster
Callback = Callable[[Any], None]
pack: Final = cast(Callable[[tuple[bytes, ...]], bytes], hiredis.pack_command)

#: How long a node may leave its oldest request unanswered before the connection is
#: considered stalled (a hung or blackholed node) and reset, at the least.
MIN_STALL_TIMEOUT: Final = 1.0
#: The oldest server version aiolock's scripts run on (``SET ... GET``).
OLDEST_SERVER: Final = (6, 2)
#: Reconnect back-off after a failed connect: doubles from the first to the last.
BACKOFF_FIRST: Final = 0.05
BACKOFF_MAX: Final = 0.5


class Script:
    """A Lua script with its SHA1, run with EVALSHA and re-sent with EVAL on NOSCRIPT.

    ``per_key_args``: when non-zero, the script treats each key alike, with that many
    arguments of its own (key *i* owns ``ARGV[per_key_args*(i-1)+1 ...]``), and replies
    with one value per key. Such a call may be split by the keys' hash slots (see
    :class:`aiolock._cluster.ClusterNode`); any other must keep its keys in one slot.
    """

    __slots__ = ("per_key_args", "sha", "source")

    def __init__(self, source: bytes, *, per_key_args: int = 0) -> None:
        self.source = source
        self.per_key_args = per_key_args
        # SHA1 names the script for EVALSHA; it is not used for security.
        self.sha = hashlib.sha1(source, usedforsecurity=False).hexdigest().encode()


def _display_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _connection_kwargs(spec: NodeSpec) -> tuple[type[AbstractConnection], dict[str, Any]]:
    if isinstance(spec, RedisCluster):  # pragma: no cover - routed by ClusterNode
        raise TypeError("a cluster has one connection per server: see cluster_endpoint()")
    return connection_settings(spec)


def node_key(spec: NodeSpec) -> tuple[object, ...]:
    """What identifies a node's server, to reject duplicate nodes (a fake quorum)."""
    if isinstance(spec, RedisCluster):
        # Two clients of one cluster are one node: any server they start from.
        return ("cluster", *sorted(cluster_addresses(spec)))
    if not isinstance(spec, str | Redis):
        raise TypeError(
            "a node must be a Redis URL (str), a redis.asyncio.Redis client or a "
            f"redis.asyncio.RedisCluster client, not {type(spec).__name__}"
        )
    if not isinstance(spec, str):
        service = sentinel_service(spec)
        if service is not None:  # Sentinel-managed: the node is the service, not an address
            return ("sentinel", service, id(spec.connection_pool))
    _cls, kwargs = _connection_kwargs(spec)
    # The database number is left out: two databases of one server are one server,
    # and would hold a majority between them.
    if "path" in kwargs:
        return ("unix", kwargs["path"])
    host = str(kwargs.get("host", "localhost")).lower()
    if host == "localhost":
        host = "127.0.0.1"
    return ("tcp", host, int(kwargs.get("port", 6379)))


def node_name(spec: NodeSpec) -> str:
    """A readable name of the node for messages: its URL without the password."""
    if isinstance(spec, str):
        return _display_url(spec)
    if isinstance(spec, RedisCluster):
        return "redis-cluster://" + ",".join(f"{h}:{p}" for h, p in cluster_addresses(spec))
    service = sentinel_service(spec)
    if service is not None:
        return f"sentinel://{service}"
    kwargs = spec.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def cluster_endpoint(
    client: RedisCluster, address: tuple[str, int], connect_timeout: float
) -> _Endpoint:
    """How to connect to the server at ``address`` of ``client``'s cluster."""
    return _Endpoint(None, connect_timeout, settings=cluster_connection(client, address))


def subscriber_endpoints(spec: NodeSpec, connect_timeout: float = 2.0) -> list[_Endpoint]:
    """Where a subscriber may listen: any server of a cluster hears every PUBLISH."""
    if isinstance(spec, RedisCluster):
        return [cluster_endpoint(spec, a, connect_timeout) for a in cluster_addresses(spec)]
    return [_Endpoint(spec, connect_timeout)]


class _Sink(Protocol):
    def _on_data(self, protocol: _ReplyProtocol, data: bytes) -> None: ...
    def _on_lost(self, protocol: _ReplyProtocol, exc: Exception | None) -> None: ...


class _ReplyProtocol(asyncio.Protocol):
    """Feeds the bytes of a taken-over transport to its owner's reply reader."""

    __slots__ = ("_sink",)

    def __init__(self, sink: _Sink) -> None:
        self._sink = sink

    def data_received(self, data: bytes) -> None:
        self._sink._on_data(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._sink._on_lost(self, exc)


class _Endpoint:
    """How to open a connection to one node: redis-py does the handshake."""

    def __init__(
        self,
        spec: NodeSpec | None,
        connect_timeout: float,
        *,
        settings: tuple[str, type[AbstractConnection], dict[str, Any]] | None = None,
    ) -> None:
        if settings is not None:  # one server of a cluster: (name, class, kwargs)
            self.name, cls, kwargs = settings[0], settings[1], dict(settings[2])
        elif spec is not None:
            self.name = node_name(spec)
            cls, kwargs = _connection_kwargs(spec)
        else:  # pragma: no cover - programming error
            raise TypeError("an endpoint needs a spec or settings")
        # Our replies are parsed as RESP2 by our own reader; redis-py must not retry a
        # connect for seconds either: the node's back-off decides when to retry.
        kwargs["protocol"] = 2
        kwargs["retry"] = Retry(NoBackoff(), 0)
        kwargs.setdefault("socket_connect_timeout", connect_timeout)
        if kwargs.get("socket_timeout") is None:
            kwargs["socket_timeout"] = connect_timeout
        self._connection_class = cls
        self._connection_kwargs = kwargs
        self.connect_timeout = connect_timeout

    async def open(
        self, sink: _Sink
    ) -> tuple[asyncio.Transport, asyncio.StreamWriter, _ReplyProtocol]:
        """Connect, then hand the transport's bytes to ``sink``.

        Returns the transport, the stream writer (which closes the transport when
        garbage-collected, so it must be kept) and the protocol now feeding ``sink``.
        """
        conn = self._connection_class(**self._connection_kwargs)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await conn.connect()  # type: ignore[no-untyped-call]
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            raise
        # Take the transport over from redis-py once the handshake (TLS, AUTH,
        # SELECT, CLIENT SETNAME) is done; detach it so the connection object
        # neither closes it nor warns about it.
        writer = take_over(conn)
        if writer is None:  # pragma: no cover - connect() returned without a stream
            raise RedisConnectionError(f"{self.name}: connection closed during handshake")
        transport = writer.transport
        if transport.is_closing():
            raise RedisConnectionError(f"{self.name}: connection closed during handshake")
        # (uvloop's transports are not asyncio.Transport subclasses, but alike.)
        transport = cast(asyncio.Transport, transport)
        protocol = _ReplyProtocol(sink)
        transport.set_protocol(protocol)
        return transport, writer, protocol


# A request waiting for its reply: (callback, script or None, args after the script's
# name, monotonic time it was written).
_Pending = tuple[Callback, Script | None, tuple[bytes, ...], float]
# A request waiting for a connection: (packed bytes, callback, script, args, deadline).
_Queued = tuple[bytes, Callback, Script | None, tuple[bytes, ...], float]


class Node:
    """A connection to one Redis node with pipelined, callback-based requests.

    ``spec`` is what the user gave (URL or client); the node only borrows a client's
    settings to open its own connection and never closes the client.
    """

    def __init__(
        self,
        spec: NodeSpec,
        *,
        request_timeout: float,
        connect_timeout: float = 2.0,
        scripts: tuple[Script, ...] = (),
        endpoint: _Endpoint | None = None,
    ) -> None:
        self.spec = spec
        self._endpoint = endpoint if endpoint is not None else _Endpoint(spec, connect_timeout)
        self.name = self._endpoint.name
        self._request_timeout = request_timeout
        self._stall_timeout = max(MIN_STALL_TIMEOUT, 20 * request_timeout)
        self._scripts = scripts

        self._transport: asyncio.Transport | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._protocol: _ReplyProtocol | None = None
        self._reader = hiredis.Reader()
        self._pending: deque[_Pending] = deque()
        self._queued: list[_Queued] = []
        self._connecting: asyncio.Task[None] | None = None
        self._retry_at = 0.0
        self._backoff = BACKOFF_FIRST
        self._last_error: Exception = RedisConnectionError(f"{self.name}: not connected yet")
        self._closed = False
        #: The server's ``run_id`` as of the current connection (``None``: not known
        #: yet, or ``INFO`` is not allowed).
        self.run_id: bytes | None = None
        #: Since when the node counts as restarted (monotonic): its server's start, or
        #: the moment we saw its ``run_id`` change (a restart or a failover behind the
        #: same address); ``None`` when unknown (``INFO`` denied). See restart_grace.
        self.restarted_at: float | None = None
        self._last_run_id: bytes | None = None
        #: The server's ``redis_version`` (Valkey reports the Redis version it is
        #: compatible with), e.g. ``(7, 2)``; ``None`` while not known.
        self.server_version: tuple[int, ...] | None = None
        #: Called with the node when a new connection told who the server is.
        self.on_identity: Callable[[Node], None] | None = None
        self._identified: asyncio.Future[None] | None = None
        self._info_denied_logged = False
        #: When set, every reply is replaced by this error (the node must not vote:
        #: see :meth:`refuse`).
        self._refused: Exception | None = None

    def __repr__(self) -> str:
        state = "connected" if self._transport is not None else "disconnected"
        return f"<Node {self.name} {state}>"

    @property
    def refusal(self) -> Exception | None:
        """Why the node's requests fail at once, if :meth:`refuse` was called."""
        return self._refused

    def refuse(self, error: Exception | None) -> None:
        """Fail every request with ``error`` until called with ``None`` or reconnected.

        For a node found to be the same server as another node: it must not count
        as a second vote.
        """
        self._refused = error

    @property
    def connected(self) -> bool:
        """Whether the connection is up now."""
        return self._transport is not None

    # -- requests ---------------------------------------------------------------

    def call(self, args: tuple[bytes, ...], callback: Callback) -> None:
        """Send one command; ``callback`` gets the reply or an exception."""
        self._send(pack(args), callback, None, args)

    def call_script(self, script: Script, args: tuple[bytes, ...], callback: Callback) -> None:
        """Run ``script`` with ``args`` (numkeys, keys, argv) via EVALSHA."""
        self._send(pack((b"EVALSHA", script.sha, *args)), callback, script, args)

    def _send(
        self, packed: bytes, callback: Callback, script: Script | None, args: tuple[bytes, ...]
    ) -> None:
        if self._refused is not None:
            callback(self._refused)
            return
        transport = self._transport
        now = time.monotonic()
        if transport is not None:
            pending = self._pending
            if pending and now - pending[0][3] > self._stall_timeout:
                self._reset(TimeoutError(f"{self.name}: no reply for {self._stall_timeout:.2f}s"))
            else:
                self._write(packed)
                pending.append((callback, script, args, now))
                return
        if self._closed:
            callback(RedisConnectionError(f"{self.name}: the lock manager is closed"))
            return
        if self._connecting is None:
            if now < self._retry_at:
                # Back-off after a failed connect: fail fast, the node counts as a
                # failed vote until it may be tried again.
                callback(self._last_error)
                return
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        self._queued.append((packed, callback, script, args, now + self._request_timeout))

    def _write(self, packed: bytes) -> None:
        # Written at once, not coalesced at the end of the loop iteration: with many
        # tasks ready, a deferred write would wait behind all of them and eat into
        # the request's node_timeout (seen with 1,000 waiters).
        transport = self._transport
        if transport is not None:
            transport.write(packed)

    # -- connection -------------------------------------------------------------

    async def connect(self) -> None:
        """Connect now (if not yet connected), without raising on failure."""
        if self._transport is not None or self._closed:
            return
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        await asyncio.shield(self._connecting)
        identified = self._identified
        if identified is not None and not identified.done():
            await asyncio.shield(identified)

    async def _connect(self) -> None:
        try:
            transport, writer, protocol = await self._endpoint.open(self)
        except Exception as exc:  # every failure is a failed vote, never a crash
            self._connecting = None
            self._last_error = _as_connection_error(self.name, exc)
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX)
            queued, self._queued = self._queued, []
            for _packed, callback, _script, _args, _deadline in queued:
                callback(self._last_error)
            return
        except BaseException:
            self._connecting = None
            raise
        self._connecting = None
        self._backoff = BACKOFF_FIRST
        self._retry_at = 0.0
        self._reader = hiredis.Reader()
        self._transport = transport
        self._writer = writer
        self._protocol = protocol
        now = time.monotonic()
        # Who the server is, first: on an ordered connection its reply comes before
        # any other, so every reply is counted knowing it (same-server check, restart
        # quarantine). One command per connection, never per request.
        self.run_id = None
        self._refused = None
        self._identified = asyncio.get_running_loop().create_future()
        transport.write(pack(_INFO_SERVER))
        self._pending.append((self._on_info, None, _INFO_SERVER, now))
        # Load the scripts next: on an ordered connection they are known before the
        # first EVALSHA runs (and NOSCRIPT remains handled if they are flushed later).
        for loaded in self._scripts:
            load = (b"SCRIPT", b"LOAD", loaded.source)
            transport.write(pack(load))
            self._pending.append((ignore, None, load, now))
        queued, self._queued = self._queued, []
        for packed, callback, script, args, deadline in queued:
            if now > deadline:
                # The caller has given up on it; sending it now would only leave a
                # stray key or run a stale release.
                callback(TimeoutError(f"{self.name}: not connected in time"))
            else:
                transport.write(packed)
                self._pending.append((callback, script, args, now))

    def _on_info(self, reply: Any) -> None:
        if isinstance(reply, bytes | str):
            fields = parse_info(reply)
            now = time.monotonic()
            self.server_version = version = parse_version(fields.get("redis_version", ""))
            if version is not None and version < OLDEST_SERVER:
                # Our scripts would fail with a Lua error on every call: say why.
                self._refused = RedisError(
                    f"{self.name}: Redis {fields['redis_version']} is older than "
                    f"{'.'.join(map(str, OLDEST_SERVER))}, the oldest aiolock supports "
                    "(its scripts use SET ... GET)"
                )
            self.run_id = fields.get("run_id", "").encode() or None
            uptime = fields.get("uptime_in_seconds", "")
            # Whole seconds, rounded down: the start looks later, never earlier.
            restarted_at = now - int(uptime) if uptime.isdigit() else None
            if self.run_id is not None:
                if self._last_run_id is not None and self.run_id != self._last_run_id:
                    # Another server behind the same address (restarted, or a replica
                    # promoted that may lack keys): count from now whatever its uptime.
                    restarted_at = now if restarted_at is None else max(restarted_at, now)
                self._last_run_id = self.run_id
            if restarted_at is not None:
                self.restarted_at = restarted_at
        elif not self._info_denied_logged and not isinstance(reply, RedisConnectionError):
            self._info_denied_logged = True
            logger.warning(
                "aiolock: %s: cannot read INFO server (%s): this node cannot be checked "
                "for restarts or for being the same server as another node; allow +info",
                self.name,
                reply,
            )
        identified = self._identified
        if identified is not None and not identified.done():
            identified.set_result(None)
        if self.on_identity is not None:
            self.on_identity(self)

    def _on_data(self, protocol: _ReplyProtocol, data: bytes) -> None:
        if protocol is not self._protocol:
            return
        reader = self._reader
        reader.feed(data)
        pending = self._pending
        while True:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError as exc:
                self._reset(RedisConnectionError(f"{self.name}: protocol error: {exc}"))
                return
            if reply is False:
                return
            if not pending:
                self._reset(RedisConnectionError(f"{self.name}: reply without a request"))
                return
            callback, script, sent_args, _sent = pending.popleft()
            if isinstance(reply, hiredis.ReplyError):
                error = error_from_reply(self.name, str(reply))
                if script is not None and isinstance(error, NoScriptError):
                    # The script cache was flushed (SCRIPT FLUSH, restart): send
                    # the source. Later requests may run before this one; only the
                    # retried script is delayed, never a reply mismatched.
                    retry = (b"EVAL", script.source, *sent_args)
                    if self._transport is not None:
                        self._write(pack(retry))
                        pending.append((callback, None, retry, time.monotonic()))
                        continue
                reply = error
            if self._refused is not None and callback != self._on_info:
                reply = self._refused
            callback(reply)

    def _on_lost(self, protocol: _ReplyProtocol, exc: Exception | None) -> None:
        if protocol is not self._protocol:
            return
        reason = f": {exc}" if exc is not None else ""
        self._reset(RedisConnectionError(f"{self.name}: connection lost{reason}"))

    def _reset(self, error: Exception) -> None:
        """Drop the connection and fail every request still waiting for a reply."""
        transport = self._transport
        self._transport = None
        self._protocol = None
        self._last_error = error
        if transport is not None:
            transport.abort()
        self._writer = None
        pending, self._pending = self._pending, deque()
        for callback, _script, _args, _sent in pending:
            callback(error)

    async def aclose(self) -> None:
        """Close the connection; requests still waiting fail with ConnectionError."""
        self._closed = True
        connecting = self._connecting
        if connecting is not None:
            connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await connecting
            self._connecting = None
        queued, self._queued = self._queued, []
        error = RedisConnectionError(f"{self.name}: the lock manager is closed")
        for _packed, callback, _script, _args, _deadline in queued:
            callback(error)
        transport = self._transport
        if transport is not None:
            # close(), not abort(): releases already written still reach the node.
            self._transport = None
            self._protocol = None
            transport.close()
            self._writer = None
            pending, self._pending = self._pending, deque()
            for callback, _script, _args, _sent in pending:
                callback(error)


_INFO_SERVER: Final = (b"INFO", b"server")


def parse_info(reply: bytes | str) -> dict[str, str]:
    """The ``field:value`` lines of an ``INFO`` reply."""
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply
    fields = {}
    for line in text.splitlines():
        field, sep, value = line.partition(":")
        if sep and not field.startswith("#"):
            fields[field.strip()] = value.strip()
    return fields


def parse_version(text: str) -> tuple[int, ...] | None:
    """``"7.0.15"`` → ``(7, 0, 15)``; ``None`` when it is not a version."""
    parts = text.split(".")
    if not text or not all(part.isdigit() for part in parts):
        return None
    return tuple(int(part) for part in parts)


def ignore(_reply: Any) -> None:
    """A callback for requests whose reply does not matter."""
    return


def _confirm(waiting: list[asyncio.Future[None]]) -> None:
    """Let the waiters of a subscription go on (confirmed, or nothing to wait for)."""
    for future in waiting:
        if not future.done():
            future.set_result(None)


def _is_moved(error: Exception) -> bool:
    # MOVED/ASK: the slot is served elsewhere; CLUSTERDOWN/TRYAGAIN: not served now.
    return isinstance(error, AskError | ClusterDownError | TryAgainError)


def _named(name: str, error: Exception) -> Exception:
    """Prefix a server error with the node's name, keeping its class."""
    args = error.args
    if args and isinstance(args[0], str):
        error.args = (f"{name}: {args[0]}", *args[1:])
    return error


def _as_connection_error(name: str, exc: Exception) -> Exception:
    if isinstance(exc, ResponseError):  # AUTH, NOPERM, ... during the handshake
        return _named(name, exc)
    if isinstance(exc, TimeoutError):
        return TimeoutError(f"{name}: connect timed out")
    return RedisConnectionError(f"{name}: cannot connect: {exc}")


#: After pub/sub was refused by a node, how long before a new subscription tries again.
PUBSUB_RETRY: Final = 30.0
#: Connections lost before the node confirmed any subscription on them, in a row,
#: after which pub/sub counts as refused (a proxy that closes on SUBSCRIBE).
PUBSUB_DROPS: Final = 3


class Subscriber:
    """One pub/sub connection to a node, shared by every channel the manager waits on.

    Connected on first use and subscribed only to the channels someone waits on. If
    the connection is lost, ``on_reset`` is called (a message may have been missed)
    and the connection is re-established in the background while channels remain.

    Where the node refuses pub/sub (an ACL without ``+subscribe``, a proxy without
    it), :attr:`refused` says why (a WARNING is logged once), subscriptions are
    confirmed at once and the waiters poll instead (see ``Waiting``); a new
    subscription tries again after :data:`PUBSUB_RETRY` seconds.

    ``sharded``: sharded pub/sub (``SSUBSCRIBE``, Redis 7.0+) on one server of a
    cluster, given by ``endpoints``; a channel whose slot is served elsewhere (a
    ``MOVED`` reply, or the server dropping it after a slot migration) is handed to
    ``on_moved`` with the redirect, if any (see ``_cluster.ClusterSubscriber``).
    """

    def __init__(
        self,
        spec: NodeSpec | None,
        *,
        on_message: Callable[[bytes, bytes], None],
        on_reset: Callable[[], None],
        connect_timeout: float = 2.0,
        endpoints: list[_Endpoint] | None = None,
        sharded: bool = False,
        on_moved: Callable[[bytes, Exception | None], None] | None = None,
    ) -> None:
        if endpoints is None:
            if spec is None:  # pragma: no cover - programming error
                raise TypeError("a subscriber needs a spec or endpoints")
            # A cluster gives one endpoint per server: any of them hears every
            # PUBLISH, so the subscriber moves on to the next one when a connect fails.
            endpoints = subscriber_endpoints(spec, connect_timeout)
            self.name = node_name(spec)
        else:
            self.name = endpoints[0].name
        self._endpoints = endpoints
        self._endpoint_index = 0
        self._sharded = sharded
        self._unsubscribe_command = b"SUNSUBSCRIBE" if sharded else b"UNSUBSCRIBE"
        self._on_moved = on_moved
        # Sharded: the channels asked for and not yet confirmed, in order (an error
        # reply names no channel: it answers the oldest request).
        self._asked: deque[bytes] = deque()
        self._on_message = on_message
        self._on_reset = on_reset
        self._channels: dict[bytes, list[asyncio.Future[None]]] = {}
        self._transport: asyncio.Transport | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._protocol: _ReplyProtocol | None = None
        self._reader = hiredis.Reader()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: Why the node does not do pub/sub for us, if it does not (see the class).
        self.refused: Exception | None = None
        self._refused_at = 0.0
        self._refusal_logged = False
        self._confirmed_on_connection = False
        self._drops = 0

    @property
    def channels(self) -> frozenset[bytes]:
        """The channels subscribed to (or about to be)."""
        return frozenset(self._channels)

    def subscribe(self, channel: bytes) -> asyncio.Future[None]:
        """Subscribe to ``channel``; the future is done when the node confirmed it."""
        confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.refused is not None:
            if time.monotonic() - self._refused_at < PUBSUB_RETRY:
                confirmed.set_result(None)  # nothing to wait for: the waiter polls
                return confirmed
            self.refused = None  # try again (the ACL may have been fixed)
            self._drops = 0
        waiting = self._channels.get(channel)
        if waiting is None:
            self._channels[channel] = [confirmed]
            if self._transport is not None:
                self._ask((channel,))
            else:
                self._ensure_connecting()
        elif not waiting:
            confirmed.set_result(None)  # already confirmed
        else:
            waiting.append(confirmed)
        return confirmed

    def unsubscribe(self, channel: bytes) -> None:
        """Stop listening on ``channel``."""
        waiting = self._channels.pop(channel, None)
        if waiting is None:
            return
        for future in waiting:
            if not future.done():
                future.cancel()
        if self._transport is not None:
            self._transport.write(pack((self._unsubscribe_command, channel)))

    def _ask(self, channels: tuple[bytes, ...]) -> None:
        transport = self._transport
        if transport is None:
            return
        if not self._sharded:
            transport.write(pack((b"SUBSCRIBE", *channels)))
            return
        for channel in channels:  # one slot per SSUBSCRIBE: one channel each
            self._asked.append(channel)
            transport.write(pack((b"SSUBSCRIBE", channel)))

    def _ensure_connecting(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._keep_connected())

    async def _keep_connected(self) -> None:
        backoff = BACKOFF_FIRST
        try:
            while self._channels and not self._closed:
                endpoint = self._endpoints[self._endpoint_index % len(self._endpoints)]
                try:
                    transport, writer, protocol = await endpoint.open(self)
                except Exception:  # retried with back-off while channels need it
                    self._endpoint_index += 1
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                    continue
                self._reader = hiredis.Reader()
                self._transport = transport
                self._writer = writer
                self._protocol = protocol
                self._confirmed_on_connection = False
                self._asked.clear()
                if self._channels:
                    self._ask(tuple(self._channels))
                return
        finally:
            self._task = None

    def _on_data(self, protocol: _ReplyProtocol, data: bytes) -> None:
        if protocol is not self._protocol:
            return
        reader = self._reader
        reader.feed(data)
        while True:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError:
                self._reset()
                return
            if reply is False:
                return
            if isinstance(reply, hiredis.ReplyError):  # SUBSCRIBE refused (NOPERM, ...)
                error = error_from_reply(self.name, str(reply))
                asked = self._asked.popleft() if self._asked else None
                if asked is not None and self._on_moved is not None and _is_moved(error):
                    self._moved(asked, error)
                    continue
                self._refuse(error)
                return
            if not isinstance(reply, list) or len(reply) < 3:
                continue
            kind, channel = reply[0], reply[1]
            if kind in (b"message", b"smessage"):
                self._on_message(channel, reply[2])
            elif kind == b"sunsubscribe" and channel in self._channels:
                # Not asked for (ours pop the channel first): its slot moved away.
                self._moved(channel, None)
            elif kind in (b"subscribe", b"ssubscribe"):
                if self._asked and self._asked[0] == channel:
                    self._asked.popleft()
                self._confirmed_on_connection = True
                self._drops = 0
                waiting = self._channels.get(channel)
                if waiting:
                    _confirm(waiting)
                    waiting.clear()

    def _on_lost(self, protocol: _ReplyProtocol, exc: Exception | None) -> None:
        if protocol is not self._protocol:
            return
        if self._channels and not self._confirmed_on_connection:
            self._drops += 1
            if self._drops >= PUBSUB_DROPS:
                reason = f": {exc}" if exc is not None else ""
                self._refuse(
                    RedisConnectionError(f"{self.name}: connection closed on SUBSCRIBE{reason}")
                )
                return
        self._reset()

    def _moved(self, channel: bytes, redirect: Exception | None) -> None:
        """``channel`` is served by another server now: hand it over (see __init__)."""
        _confirm(self._channels.pop(channel, []))
        if self._on_moved is not None:
            self._on_moved(channel, redirect)

    def _refuse(self, error: Exception) -> None:
        """The node does not do pub/sub for us: let the waiters poll (see the class)."""
        self.refused = error
        self._refused_at = time.monotonic()
        if not self._refusal_logged:
            self._refusal_logged = True
            logger.warning(
                "aiolock: %s: pub/sub unavailable (%s): waiters poll instead, at most "
                "until the holder's ttl; allow +subscribe +unsubscribe and the channels",
                self.name,
                error,
            )
        channels, self._channels = self._channels, {}
        for waiting in channels.values():
            _confirm(waiting)
        # No channels left: the connection is dropped and not reopened; the waiters,
        # woken by on_reset, now poll.
        self._reset()

    def _reset(self) -> None:
        transport = self._transport
        if transport is not None:
            transport.abort()  # before the writer goes: it closes on collection
        self._transport = self._protocol = self._writer = None
        # Messages may have been lost while the connection was going down.
        self._on_reset()
        if self._channels:
            self._ensure_connecting()

    async def aclose(self) -> None:
        """Close the connection and stop reconnecting."""
        self._closed = True
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        transport = self._transport
        if transport is not None:
            transport.close()
        self._transport = self._protocol = self._writer = None
        for waiting in self._channels.values():
            for future in waiting:
                if not future.done():
                    future.cancel()
        self._channels.clear()
