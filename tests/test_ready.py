"""Servers started a moment ago: the quarantine is explained where it is met, and a
service can wait it out (``LockManager.wait_ready``) instead of failing requests."""

from __future__ import annotations

import asyncio
import time

import pytest

import aiolock
from aiolock.testing import Server, redis_servers


async def test_a_server_first_seen_young_is_told_apart_from_a_restart_and_the_remedy_named() -> (
    None
):
    async with (
        redis_servers(3) as urls,
        aiolock.LockManager(urls, restart_grace=None, node_timeout=0.2) as locks,
    ):
        with pytest.raises(aiolock.QuorumError) as raised:
            await locks.lock("job").acquire(timeout=0)
        message = str(raised.value)
        assert "server started" in message
        assert "restarted" not in message
        assert "wait_ready()" in message
        assert "restart_grace=0" in message
        assert len(raised.value.errors) == 3


async def test_wait_ready_returns_once_the_quarantine_is_over_then_acquires_count() -> None:
    async with (
        redis_servers(3) as urls,
        aiolock.LockManager(urls, restart_grace=1.5, node_timeout=0.2) as locks,
    ):
        with pytest.raises(aiolock.QuorumError, match="quarantined"):
            await locks.lock("job").acquire(timeout=0)
        started = time.monotonic()
        await locks.wait_ready(timeout=15)
        # Uptime counts in whole seconds: the quarantine may end up to 1 s early.
        assert time.monotonic() - started >= 0.3
        lock = locks.lock("job", ttl=5)
        assert await lock.acquire(timeout=0)
        await lock.release()
        await locks.wait_ready(timeout=0)  # ready stays ready


async def test_wait_ready_times_out_with_a_quorum_error_naming_each_node() -> None:
    async with (
        redis_servers(3) as urls,
        aiolock.LockManager(urls, restart_grace=60, node_timeout=0.2) as locks,
    ):
        started = time.monotonic()
        with pytest.raises(aiolock.QuorumError, match=r"not ready within 0\.3s") as raised:
            await locks.wait_ready(timeout=0.3)
        assert 0.25 <= time.monotonic() - started < 5
        assert set(raised.value.errors) == set(urls)
        assert all("quarantined" in str(e) for e in raised.value.errors.values())


async def test_wait_ready_waits_for_nodes_that_are_down_and_retries_them() -> None:
    async with redis_servers(3) as urls:
        servers = urls.servers
        for server in servers[:2]:
            assert isinstance(server, Server)
            server.kill()
        async with aiolock.LockManager(urls, restart_grace=0, node_timeout=0.2) as locks:
            with pytest.raises(aiolock.QuorumError, match="2 of 3 nodes"):
                await locks.wait_ready(timeout=0.2)
            waiting = asyncio.create_task(locks.wait_ready(timeout=20))
            await asyncio.sleep(0.5)
            assert not waiting.done()
            for server in servers[:2]:
                assert isinstance(server, Server)
                await server.restart()
            await waiting
            lock = locks.lock("job", ttl=5)
            assert await lock.acquire(timeout=0)
            await lock.release()


async def test_wait_ready_checks_its_timeout_before_any_io_and_refuses_a_closed_manager() -> None:
    locks = aiolock.LockManager(["redis://127.0.0.1:1"])
    with pytest.raises(ValueError, match="timeout"):
        await locks.wait_ready(timeout=-1)
    with pytest.raises(TypeError, match="timeout"):
        await locks.wait_ready(timeout="1")  # type: ignore[arg-type]
    await locks.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await locks.wait_ready()
