"""Connecting to a node: the taken-over transport, replies, errors.

What :class:`~aiolock._io.node.Node` (pipelined requests) and
:class:`~aiolock._io.pubsub.Subscriber` (pub/sub) share: redis-py opens the connection
(URL parsing, connect, TLS, AUTH/ACL, SELECT), then :class:`Endpoint` takes its
transport over and :class:`ReplyReader` parses the replies with hiredis straight
from ``data_received``: no task, no future and no lock per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol, cast

import hiredis
from redis.asyncio import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AskError, ClusterDownError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from .redis import (
    adopt_transport,
    cluster_addresses,
    cluster_connection,
)
from .specs import NodeSpec, connection_kwargs, node_name

__all__ = [
    "BACKOFF_FIRST",
    "BACKOFF_MAX",
    "Endpoint",
    "ReplyProtocol",
    "ReplyReader",
    "Sink",
    "as_connection_error",
    "cluster_endpoint",
    "has_set_ifeq",
    "is_moved",
    "named",
    "pack",
    "pack_evalsha",
    "parse_info",
    "parse_version",
    "subscriber_endpoints",
    "unread",
]


pack: Final = cast(Callable[[tuple[bytes, ...]], bytes], hiredis.pack_command)

#: Lengths up to this have their RESP prefixes made once (``$5``, ``*9``).
_PREFIXED: Final = 1024
_BULK: Final = tuple(b"$%d" % n for n in range(_PREFIXED))
_ARRAY: Final = tuple(b"*%d" % n for n in range(_PREFIXED))


def pack_evalsha(sha: bytes, args: tuple[bytes, ...]) -> bytes:
    """``EVALSHA sha *args`` as RESP: the bytes :data:`pack` makes of it, in 60 % of the time.

    ``pack_command`` formats each argument's length with ``snprintf``; here the
    lengths are looked up, and one join makes the request.
    """
    try:
        parts = [_ARRAY[len(args) + 2], b"$7", b"EVALSHA", _BULK[len(sha)], sha]
        for arg in args:
            parts.append(_BULK[len(arg)])
            parts.append(arg)
    except IndexError:  # (a length past the table's)
        return pack((b"EVALSHA", sha, *args))
    parts.append(b"")  # (the last argument's CRLF)
    return b"\r\n".join(parts)


#: Reconnect back-off after a failed connect: doubles from the first to the last.
BACKOFF_FIRST: Final = 0.05


BACKOFF_MAX: Final = 0.5


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
        writer = adopt_transport(conn)
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

    def _fed(self, protocol: ReplyProtocol, data: bytes) -> hiredis.Reader | None:
        """The parser, given ``data`` of ``protocol``'s connection (``None``: not the current).

        Its ``gets()`` returns each complete reply, then ``False``; it raises
        ``hiredis.ProtocolError`` on bytes that are not RESP.
        """
        if protocol is not self._protocol:
            return None
        reader = self._reader
        reader.feed(data)
        return reader


def parse_info(reply: bytes | str) -> dict[str, str]:
    """The ``field:value`` lines of an ``INFO`` reply."""
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply
    fields = {}
    for line in text.splitlines():
        field, sep, value = line.partition(":")
        if sep and not field.startswith("#"):
            fields[field.strip()] = value.strip()
    return fields


#: The first version of each server (INFO's ``server_name``; Redis gives none) whose
#: ``SET`` takes ``IFEQ``: Valkey 8.1, Redis 8.4.
SET_IFEQ_SINCE: Final = {"valkey": (8, 1), "redis": (8, 4)}


def has_set_ifeq(info: Mapping[str, str]) -> bool:
    """Whether the server whose ``INFO server`` fields are ``info`` has ``SET ... IFEQ``."""
    server = info.get("server_name", "redis")
    since = SET_IFEQ_SINCE.get(server)
    version = parse_version(info.get(f"{server}_version", ""))
    return since is not None and version is not None and version >= since


def parse_version(text: str) -> tuple[int, ...] | None:
    """``"7.0.15"`` → ``(7, 0, 15)``; ``None`` when it is not a version."""
    parts = text.split(".")
    if not text or not all(part.isdigit() for part in parts):
        return None
    return tuple(int(part) for part in parts)


def unread(transport: asyncio.BaseTransport) -> bool:
    """Whether the connection's socket holds data not read yet (it reads none).

    Replies wait there while our loop is blocked: the node is not silent (Node.call_script).
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
