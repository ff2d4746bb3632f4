"""A Sentinel-managed client as one node (its current master)."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as redis
from redis.asyncio.sentinel import Sentinel

from aiolock import LockManager
from aiolock.testing import Servers, _free_port, _ping, find_server_binary

from .conftest import key


@pytest.fixture
async def sentinel_port(servers: Servers, tmp_path: Path) -> AsyncIterator[int]:
    """A sentinel watching servers[0] as the master of service "mymaster"."""
    binary = find_server_binary()
    assert binary is not None
    master_port = int(servers[0].rsplit(":", 1)[1])
    port = _free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor mymaster 127.0.0.1 {master_port} 1\n"
    )
    process = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        [binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(500):
            if await _ping(port):
                break
            await asyncio.sleep(0.02)
        yield port
    finally:
        process.kill()
        process.wait()


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
