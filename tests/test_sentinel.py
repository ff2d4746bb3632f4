"""A Sentinel-managed client as one node (its current master)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as redis
from redis.asyncio.sentinel import Sentinel

from aiolock import LockManager, QuorumError
from aiolock.testing import Servers, find_server_binary, redis_servers
from aiolock.testing._servers import free_port, ping

from .conftest import key


@contextlib.asynccontextmanager
async def run_sentinel(master_port: int, directory: Path, *settings: str) -> AsyncIterator[int]:
    """A sentinel watching the server on ``master_port`` as service "mymaster"."""
    binary = find_server_binary()
    assert binary is not None
    port = free_port()
    conf = directory / "sentinel.conf"
    lines = [
        f"port {port}",
        "bind 127.0.0.1",
        f"dir {directory}",
        f"sentinel monitor mymaster 127.0.0.1 {master_port} 1",
        *(f"sentinel {setting}" for setting in settings),
    ]
    conf.write_text("\n".join(lines) + "\n")
    process = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        [binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(500):
            if await ping(port):
                break
            await asyncio.sleep(0.02)
        yield port
    finally:
        process.kill()
        process.wait()


@pytest.fixture
async def sentinel_port(servers: Servers, tmp_path: Path) -> AsyncIterator[int]:
    """A sentinel watching servers[0] as the master of service "mymaster"."""
    async with run_sentinel(int(servers[0].rsplit(":", 1)[1]), tmp_path) as port:
        yield port


@contextlib.asynccontextmanager
async def master_and_replica() -> AsyncIterator[Servers]:
    """Two servers: the first a master, the second its replica, in sync."""
    async with redis_servers(2, args=["--repl-diskless-sync-delay", "0"]) as own:
        master_port = own.servers[0].port
        async with redis.Redis.from_url(own[1], socket_timeout=2) as replica:
            await replica.replicaof("127.0.0.1", master_port)
            deadline = time.monotonic() + 15
            while (await replica.info("replication")).get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica did not sync"
                await asyncio.sleep(0.05)
        yield own


async def test_sentinel_managed_client_is_one_node(
    servers: Servers, sentinel_port: int, clients: list[redis.Redis], name: str
) -> None:
    sentinel = Sentinel([("127.0.0.1", sentinel_port)], socket_timeout=1)
    master = sentinel.master_for("mymaster")
    try:
        async with LockManager([master, servers[1], servers[2]]) as locks:
            assert "sentinel://mymaster" in repr(locks)
            async with locks.lock(name, ttl=5) as lock:
                assert lock.fencing_token is not None
                # The sentinel's master (servers[0]) holds the key, like the others.
                assert [await c.exists(key(name)) for c in clients[:3]] == [1, 1, 1]
        await master.ping()  # the caller's client is not closed by the manager
    finally:
        await master.aclose()
        for client in sentinel.sentinels:
            await client.aclose()


async def test_a_sentinel_failover_is_followed(tmp_path: Path, name: str) -> None:
    async with master_and_replica() as own:
        old = own.servers[0]
        replica_port = own.servers[1].port
        settings = ("down-after-milliseconds mymaster 300", "failover-timeout mymaster 2000")
        async with run_sentinel(old.port, tmp_path, *settings) as port:
            sentinel = Sentinel([("127.0.0.1", port)], socket_timeout=1)
            master = sentinel.master_for("mymaster")
            try:
                async with LockManager([master], node_timeout=0.2) as locks:
                    async with locks.lock(name, ttl=5) as before:
                        token = before.fencing_token
                        assert token is not None
                    old.kill()
                    # Until the replica is promoted the node is down (an outage);
                    # then the node's connection follows the sentinel to it.
                    deadline = time.monotonic() + 30
                    while True:
                        try:
                            async with locks.lock(name, ttl=5) as after:
                                assert after.fencing_token is not None
                                assert after.fencing_token > token
                                # (Sentinel kills the clients of a server it promotes.)
                                async with redis.Redis(port=replica_port) as promoted:
                                    assert await promoted.exists(key(name)) == 1
                                    role = await promoted.execute_command("ROLE")
                                    assert role[0] == b"master"
                            break
                        except QuorumError:
                            assert time.monotonic() < deadline, "no failover in 30 s"
                            await asyncio.sleep(0.1)
            finally:
                await master.aclose()
                for client in sentinel.sentinels:
                    await client.aclose()


async def test_a_lock_is_held_through_a_sentinel_failover(
    servers: Servers, tmp_path: Path, name: str
) -> None:
    async with master_and_replica() as own:
        old = own.servers[0]
        settings = ("down-after-milliseconds mymaster 300", "failover-timeout mymaster 2000")
        async with run_sentinel(old.port, tmp_path, *settings) as port:
            sentinel = Sentinel([("127.0.0.1", port)], socket_timeout=1)
            master = sentinel.master_for("mymaster")
            nodes = [master, servers[1], servers[2]]
            try:
                async with (
                    LockManager(nodes, node_timeout=0.2) as locks,
                    LockManager(nodes, node_timeout=0.2) as others,
                    locks.lock(name, ttl=2.0) as lock,
                ):
                    token = lock.fencing_token
                    old.kill()
                    # Renewed on the two other nodes meanwhile: held, and exclusive.
                    deadline = time.monotonic() + 30
                    while await _role(own[1]) != b"master":
                        assert time.monotonic() < deadline, "no failover in 30 s"
                        assert lock.owned
                        with contextlib.suppress(QuorumError):
                            assert not await others.lock(name).acquire(timeout=0)
                        await asyncio.sleep(0.2)
                    await asyncio.sleep(2.5)  # renewals after the promotion
                    assert lock.owned
                    assert lock.lost is None
                    assert lock.fencing_token == token
                    # The renewal followed the sentinel to the promoted server: its copy
                    # of the key is fresh (a copy replicated before the kill would have
                    # expired by now, ttl 2 s).
                    async with redis.Redis.from_url(own[1], socket_timeout=2) as promoted:
                        assert await promoted.pttl(key(name)) > 1000
            finally:
                await master.aclose()
                for client in sentinel.sentinels:
                    await client.aclose()


async def _role(url: str) -> bytes | None:
    """The server's role, on a connection of its own (a promotion kills the clients)."""
    try:
        async with redis.Redis.from_url(url, socket_timeout=1) as client:
            role: list[bytes] = await client.execute_command("ROLE")
            return role[0]
    except redis.ConnectionError:
        return None
