"""A node as the caller names it: URL or client, its display name and identity."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection

from .redis import (
    cluster_addresses,
    connection_settings,
    sentinel_service,
)

__all__ = ["NodeSpec", "check_nodes", "connection_kwargs", "display_url", "node_key", "node_name"]


NodeSpec = str | Redis | RedisCluster


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
