"""Every contact with redis-py beyond its public API, in one place.

aiolock uses redis-py for what it does well (URL parsing, connecting, TLS, AUTH/ACL,
SELECT, Sentinel and Cluster clients) and its own pipelined reader for the lock
commands (see :mod:`aiolock._io.node`). The seams between the two lean on redis-py
internals whose behaviour changed between 5.x and 8.x; they all live here, so reading a
new redis-py release means reading this file:

- **error replies** are mapped to redis-py's public exception classes by a table of
  our own (redis-py's parser table lacked ``MOVED``/``ASK`` before 6.x);
- **taking over a connected transport** (``Connection._writer``/``_reader``);
- **a cluster client's start-up nodes** and address remapping
  (``nodes_manager.startup_nodes``, ``nodes_manager.address_remap``);
- **a Sentinel-managed client** (``connection_pool.service_name``);
- **the library's name and version** each connection gives the server (``CLIENT
  SETINFO``: ``driver_info``, or ``lib_name`` before redis-py 7.1), read once.

Supported: redis-py 5.0.1 and later (docs/supported-versions.md); ``nox -s compat`` runs the
suite against each minor line.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import importlib.metadata
from typing import Any, Final

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection, parse_url
from redis.exceptions import (
    AskError,
    AuthenticationError,
    BusyLoadingError,
    ClusterCrossSlotError,
    ClusterDownError,
    ExecAbortError,
    MasterDownError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.utils import get_lib_version

__all__ = [
    "ERROR_CLASSES",
    "adopt_transport",
    "cluster_addresses",
    "cluster_connection",
    "connection_settings",
    "error_from_reply",
    "sentinel_service",
]

#: The exception class of an error reply, by the reply's first word (its code).
#: A code not listed (``ERR``, ``WRONGTYPE``, ``BUSY``, ...) gives a plain
#: :class:`~redis.exceptions.ResponseError`. Redirect classes parse their own text
#: (``MOVED 3999 127.0.0.1:6381`` → ``slot_id``, ``host``, ``port``).
ERROR_CLASSES: Final[dict[str, type[Exception]]] = {
    "MOVED": MovedError,
    "ASK": AskError,
    "TRYAGAIN": TryAgainError,
    "CLUSTERDOWN": ClusterDownError,
    "CROSSSLOT": ClusterCrossSlotError,
    "MASTERDOWN": MasterDownError,
    "NOSCRIPT": NoScriptError,
    "READONLY": ReadOnlyError,
    "OOM": OutOfMemoryError,
    "NOPERM": NoPermissionError,
    "NOAUTH": AuthenticationError,
    "WRONGPASS": AuthenticationError,
    "LOADING": BusyLoadingError,
    "EXECABORT": ExecAbortError,
}


def error_from_reply(name: str, message: str) -> Exception:
    """The exception for the error reply ``message`` of node ``name``.

    The class tells the kind (:class:`~redis.exceptions.ReadOnlyError`, ...); the
    message keeps the server's own words, code first, after the node's name.
    """
    code, _, rest = message.partition(" ")
    cls = ERROR_CLASSES.get(code)
    error: Exception = ResponseError(message)
    if cls is not None:
        # A redirect parses its "slot host:port"; a malformed one stays a plain error.
        with contextlib.suppress(ValueError):
            error = cls(rest)
    error.args = (f"{name}: {message}",)
    return error


try:  # redis-py 7.1 and later
    _DriverInfo: Any = importlib.import_module("redis.driver_info").DriverInfo
except ImportError:  # before: the version is read once, at import
    _DriverInfo = None


@functools.cache
def _versions() -> tuple[str, str | None]:
    """redis-py's version and ours (``None``: aiolock is not installed, only imported)."""
    redis_py = str(get_lib_version())  # type: ignore[no-untyped-call,unused-ignore]
    try:
        ours: str | None = importlib.metadata.version("aiolock-redis")
    except importlib.metadata.PackageNotFoundError:
        ours = None
    return redis_py, ours


def _identity() -> dict[str, Any]:
    """What a connection tells the server it is (``CLIENT SETINFO``).

    redis-py, used by aiolock: ``CLIENT LIST`` shows
    ``lib-name=redis-py(aiolock_v0.3.0)``. redis-py 7.1 and later take a
    ``driver_info`` and, without one, read their own version from the installed
    package's metadata for every connection (a third of a millisecond): it is read
    once here. Older lines take ``lib_name``.
    """
    redis_py, ours = _versions()
    if _DriverInfo is not None:
        info = _DriverInfo(lib_version=redis_py)
        with contextlib.suppress(ValueError):  # (a version it cannot show: redis-py's alone)
            info = info if ours is None else info.add_upstream_driver("aiolock", ours)
        return {"driver_info": info}
    return {} if ours is None else {"lib_name": f"redis-py(aiolock_v{ours})"}


def _passable(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Connection arguments (a URL's, a client's stored ones), fit for a new connection.

    redis-py 7.2 keeps ``lib_name``/``lib_version`` as sentinel objects meaning "the
    default", and passing them back warns (``DeprecationWarning``: use
    ``driver_info``). Where the caller gave no name of its own (none, or redis-py's
    default), the connection takes :func:`_identity`'s.
    """
    for name in ("lib_name", "lib_version"):
        if name in kwargs and not isinstance(kwargs[name], str | None):
            del kwargs[name]
    named = {"driver_info", "lib_name", "lib_version"} & kwargs.keys()
    default = (
        getattr(kwargs.get("driver_info"), "formatted_name", None) == "redis-py"
        or kwargs.get("lib_name") == "redis-py"
    )
    if default or not named:
        for name in named:
            del kwargs[name]
        kwargs.update(_identity())
    return kwargs


def connection_settings(spec: str | Redis) -> tuple[type[AbstractConnection], dict[str, Any]]:
    """The connection class and keyword arguments of a URL or a client's pool."""
    if isinstance(spec, str):
        kwargs: dict[str, Any] = dict(parse_url(spec))
        cls: type[AbstractConnection] = kwargs.pop("connection_class", Connection)
        return cls, _passable(kwargs)
    pool = spec.connection_pool
    return pool.connection_class, _passable(dict(pool.connection_kwargs))


def sentinel_service(spec: Redis) -> str | None:
    """The service name of a Sentinel-managed client, else ``None``."""
    service = getattr(spec.connection_pool, "service_name", None)
    return service if isinstance(service, str) else None


def adopt_transport(conn: AbstractConnection) -> asyncio.StreamWriter | None:
    """Detach the stream of a connected ``conn``: it neither closes it nor warns.

    Returns the writer (whose transport is now the caller's; the writer closes it
    when garbage-collected, so keep it), or ``None`` if there is no stream.
    """
    writer: asyncio.StreamWriter | None = getattr(conn, "_writer", None)
    # redis-py's own attributes: this module is the one that touches them.
    conn._writer = conn._reader = None  # type: ignore[attr-defined,unused-ignore]  # noqa: SLF001
    return writer


def cluster_addresses(client: RedisCluster) -> list[tuple[str, int]]:
    """The ``(host, port)`` of each server a cluster client starts from."""
    nodes = client.nodes_manager.startup_nodes.values()
    return [(node.host, int(node.port)) for node in nodes]


def cluster_connection(
    client: RedisCluster, address: tuple[str, int]
) -> tuple[str, type[AbstractConnection], dict[str, Any]]:
    """How to connect to the server at ``address`` of ``client``'s cluster.

    The client's settings (TLS, credentials, timeouts), its address remapping applied
    (a cluster that announces addresses behind a NAT). Returns a name, the connection
    class and its keyword arguments.
    """
    template = next(iter(client.nodes_manager.startup_nodes.values()))
    kwargs = _passable(dict(template.connection_kwargs))
    host, port = address
    remap = getattr(client.nodes_manager, "address_remap", None)
    if remap is not None:
        host, port = remap((host, port))
    kwargs["host"], kwargs["port"] = host, port
    return f"redis://{host}:{port}", template.connection_class, kwargs
