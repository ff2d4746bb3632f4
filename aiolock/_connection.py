"""Connecting to a node: specs and names, the taken-over transport, replies, errors.

What :class:`~aiolock._node.Node` (pipelined requests) and
:class:`~aiolock._pubsub.Subscriber` (pub/sub) share: redis-py opens the connection
(URL parsing, connect, TLS, AUTH/ACL, SELECT), then :class:`Endpoint` takes its
transport over and :class:`ReplyReader` parses the replies with hiredis straight
from ``data_received``: no task, no future and no lock per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
from collections.abc import Callable, Iterable
from typing import Any, Final, Protocol, cast
from urllib.parse import urlsplit, urlunsplit

import hiredis
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AskError, ClusterDownError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from ._lua import Script
from ._redis import (
    cluster_addresses,
    cluster_connection,
    connection_settings,
    sentinel_service,
    take_over,
)

__all__ = [
    "BACKOFF_FIRST",
    "BACKOFF_MAX",
    "MAX_KEY_ROUNDS",
    "Callback",
    "Endpoint",
    "NodeSpec",
    "ReplyProtocol",
    "ReplyReader",
    "as_connection_error",
    "call_with_keys_asked",
    "check_nodes",
    "cluster_endpoint",
    "display_url",
    "ignore",
    "is_moved",
    "named",
    "node_key",
    "node_name",
    "pack",
    "parse_info",
    "parse_version",
    "subscriber_endpoints",
    "unread",
]

NodeSpec = str | Redis | RedisCluster
Callback = Callable[[Any], None]
pack: Final = cast(Callable[[tuple[bytes, ...]], bytes], hiredis.pack_command)

#: Reconnect back-off after a failed connect: doubles from the first to the last.
BACKOFF_FIRST: Final = 0.05
BACKOFF_MAX: Final = 0.5


def display_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def connection_kwargs(spec: NodeSpec) -> tuple[type[AbstractConnection], dict[str, Any]]:
    # Narrowed by what it is, not by what it is not (see node_name).
    if isinstance(spec, str | Redis):
        return connection_settings(spec)
    raise TypeError("a cluster has one connection per server: see cluster_endpoint()")


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
    _cls, kwargs = connection_kwargs(spec)
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
    # Each branch narrowed by what it is: redis-py lines annotate the clients so that a
    # negative isinstance leaves both in the union (mypy, 5.3 and 6.0 to 6.2).
    if isinstance(spec, str):
        return display_url(spec)
    if isinstance(spec, RedisCluster):
        return "redis-cluster://" + ",".join(f"{h}:{p}" for h, p in cluster_addresses(spec))
    if isinstance(spec, Redis):
        service = sentinel_service(spec)
        if service is not None:
            return f"sentinel://{service}"
        kwargs = spec.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix://{kwargs['path']}"
        return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    raise TypeError(f"not a node: {type(spec).__name__}")


def cluster_endpoint(
    client: RedisCluster, address: tuple[str, int], connect_timeout: float
) -> Endpoint:
    """How to connect to the server at ``address`` of ``client``'s cluster."""
    return Endpoint(None, connect_timeout, settings=cluster_connection(client, address))


def subscriber_endpoints(spec: NodeSpec, connect_timeout: float = 2.0) -> list[Endpoint]:
    """Where a subscriber may listen: any server of a cluster hears every PUBLISH."""
    if isinstance(spec, RedisCluster):
        return [cluster_endpoint(spec, a, connect_timeout) for a in cluster_addresses(spec)]
    return [Endpoint(spec, connect_timeout)]


class Sink(Protocol):
    def on_data(self, protocol: ReplyProtocol, data: bytes) -> None: ...
    def on_lost(self, protocol: ReplyProtocol, exc: Exception | None) -> None: ...


class ReplyProtocol(asyncio.Protocol):
    """Feeds the bytes of a taken-over transport to its owner's reply reader."""

    __slots__ = ("_sink",)

    def __init__(self, sink: Sink) -> None:
        self._sink = sink

    def data_received(self, data: bytes) -> None:
        self._sink.on_data(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._sink.on_lost(self, exc)


class Endpoint:
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
            cls, kwargs = connection_kwargs(spec)
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
        self.connection_kwargs = kwargs
        self.connect_timeout = connect_timeout

    async def open(
        self, sink: Sink
    ) -> tuple[asyncio.Transport, asyncio.StreamWriter, ReplyProtocol]:
        """Connect, then hand the transport's bytes to ``sink``.

        Returns the transport, the stream writer (which closes the transport when
        garbage-collected, so it must be kept) and the protocol now feeding ``sink``.
        """
        conn = self._connection_class(**self.connection_kwargs)
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
        protocol = ReplyProtocol(sink)
        transport.set_protocol(protocol)
        return transport, writer, protocol


class ReplyReader:
    """A taken-over connection whose replies hiredis parses (a Node, a Subscriber).

    Subclasses implement ``on_data`` and ``on_lost`` (the :class:`Sink`), reading
    replies with :meth:`_feed` and :meth:`_reply`, and call :meth:`_attach` when a
    connection opened and :meth:`_detach` to drop it.
    """

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        # The stream writer closes the transport when garbage-collected: kept while
        # the transport is ours.
        self._writer: asyncio.StreamWriter | None = None
        self._protocol: ReplyProtocol | None = None
        self._reader = hiredis.Reader()

    def _attach(
        self, opened: tuple[asyncio.Transport, asyncio.StreamWriter, ReplyProtocol]
    ) -> None:
        """Use a connection just opened (see :meth:`Endpoint.open`), with a fresh parser."""
        self._transport, self._writer, self._protocol = opened
        self._reader = hiredis.Reader()

    def _detach(self, *, graceful: bool = False) -> bool:
        """Drop the connection if any (and say if there was); ``graceful``: flush first."""
        transport = self._transport
        if transport is not None:
            # Before the writer goes: the writer would close it on collection.
            if graceful:
                transport.close()
            else:
                transport.abort()
        self._transport = self._protocol = self._writer = None
        return transport is not None

    def _current(self, protocol: ReplyProtocol) -> bool:
        """Whether ``protocol`` feeds the current connection (not an old one)."""
        return protocol is self._protocol

    def _feed(self, protocol: ReplyProtocol, data: bytes) -> bool:
        """Take ``data`` of ``protocol``'s connection; False if it is not the current one."""
        if protocol is not self._protocol:
            return False
        self._reader.feed(data)
        return True

    def _reply(self) -> Any:
        """The next complete reply, or ``False`` (``hiredis.ProtocolError``: not RESP)."""
        return self._reader.gets()


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


def unread(transport: asyncio.BaseTransport) -> bool:
    """Whether the connection's socket holds data not read yet (it reads none).

    Replies wait there while our loop is blocked: the node is not silent (Node._send).
    """
    sock = transport.get_extra_info("socket")
    try:
        if sock is None or not hasattr(select, "poll"):  # (select() fails past fd 1023)
            return sock is not None and bool(select.select([sock], [], [], 0)[0])
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):  # (closed meanwhile: the loop will say so)
        return False


def is_moved(error: Exception) -> bool:
    # MOVED/ASK: the slot is served elsewhere; CLUSTERDOWN/TRYAGAIN: not served now.
    return isinstance(error, AskError | ClusterDownError | TryAgainError)


def named(name: str, error: Exception) -> Exception:
    """Prefix a server error with the node's name, keeping its class."""
    args = error.args
    if args and isinstance(args[0], str):
        error.args = (f"{name}: {args[0]}", *args[1:])
    return error


def as_connection_error(name: str, exc: Exception) -> Exception:
    if isinstance(exc, ResponseError):  # AUTH, NOPERM, ... during the handshake
        return named(name, exc)
    if isinstance(exc, TimeoutError):
        return TimeoutError(f"{name}: connect timed out")
    return RedisConnectionError(f"{name}: cannot connect: {exc}")


#: How often one node may be asked again with the keys its reply named.
MAX_KEY_ROUNDS: Final = 3


class ScriptRunner(Protocol):
    """A node, as far as running a script goes (``Node``, ``ClusterNode``, a fake)."""

    def call_script(self, script: Script, args: tuple[bytes, ...], callback: Callback) -> None: ...


def call_with_keys_asked(
    node: ScriptRunner,
    script: Script,
    args: tuple[bytes, ...],
    keys_asked: Callable[[Any], tuple[bytes, ...] | None],
    callback: Callback,
) -> None:
    """Run ``script`` on ``node``; while its reply asks for keys, run it again with them.

    ``args`` is ``(numkeys, *keys, *argv)``; the keys asked for are appended to the keys.
    After :data:`MAX_KEY_ROUNDS` rounds the node counts as "held", holder's ttl unknown.
    """
    numkeys = int(args[0])
    keys, argv = args[1 : 1 + numkeys], args[1 + numkeys :]
    rounds = 0

    def on_reply(reply: Any) -> None:
        nonlocal rounds
        more = None if isinstance(reply, BaseException) else keys_asked(reply)
        if more is None:
            callback(reply)
        elif rounds >= MAX_KEY_ROUNDS:
            callback([0, -2])  # the keys kept changing: held, ttl unknown
        else:
            rounds += 1
            node.call_script(script, (b"%d" % (numkeys + len(more)), *keys, *more, *argv), on_reply)

    node.call_script(script, args, on_reply)


def check_nodes(nodes: object) -> list[NodeSpec]:
    """Validate a manager's nodes: a non-empty sequence, each server at most once."""
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
    return specs
