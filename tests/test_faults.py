"""Node failures on real servers: killed, hung (SIGSTOP), restarted, script cache flushed."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as redis

from aiolock import LockManager, QuorumError
from aiolock.testing import Server, Servers

from .conftest import key


def _server(servers: Servers, i: int) -> Server:
    server = servers.servers[i]
    assert isinstance(server, Server)
    return server


async def _live_keys(servers: Servers, name: str, live: list[int]) -> list[bool]:
    out = []
    for i in live:
        client = redis.Redis.from_url(servers[i], socket_timeout=2)
        try:
            out.append(bool(await client.exists(key(name))))
        finally:
            await client.aclose()
    return out


async def test_two_of_five_nodes_killed_still_acquires(servers: Servers, name: str) -> None:
    async with LockManager(servers) as locks:
        _server(servers, 0).kill()
        _server(servers, 1).kill()
        lock = locks.lock(name, ttl=5)
        assert await lock.acquire(timeout=1)
        assert await _live_keys(servers, name, [2, 3, 4]) == [True] * 3
        await lock.release()
        assert await _live_keys(servers, name, [2, 3, 4]) == [False] * 3


async def test_three_of_five_killed_raises_quorum_error_fast_and_leaves_no_key(
    servers: Servers, name: str
) -> None:
    async with LockManager(servers, node_timeout=0.05) as locks:
        for i in (0, 1, 2):
            _server(servers, i).kill()
        lock = locks.lock(name, ttl=5)
        started = time.monotonic()
        with pytest.raises(QuorumError) as info:
            await lock.acquire(timeout=None)
        assert time.monotonic() - started < 2.0
        assert set(info.value.errors) == {servers[0], servers[1], servers[2]}
        assert all(isinstance(e, Exception) for e in info.value.errors.values())
        assert "127.0.0.1" in str(info.value)
        assert not lock.owned
        assert await _live_keys(servers, name, [3, 4]) == [False, False]
        # async with raises the same error rather than waiting.
        with pytest.raises(QuorumError):
            async with locks.lock(name, timeout=5):
                pytest.fail("the body must not run")


async def test_start_with_nodes_down_and_recover_when_they_come_back(
    servers: Servers, name: str
) -> None:
    for i in (0, 1, 2):
        _server(servers, i).kill()
    async with LockManager(servers) as locks:
        with pytest.raises(QuorumError):
            await locks.lock(name).acquire(timeout=0)
        for i in (0, 1, 2):
            await _server(servers, i).restart()
        lock = locks.lock(name, ttl=5)
        deadline = time.monotonic() + 5
        while True:  # the back-off of a failed node is at most a second
            try:
                if await lock.acquire(timeout=0):
                    break
            except QuorumError:
                pass
            assert time.monotonic() < deadline, "nodes did not come back"
            await asyncio.sleep(0.05)
        await lock.release()


async def test_one_hung_node_does_not_slow_acquire_and_release(servers: Servers, name: str) -> None:
    async with LockManager(servers, node_timeout=0.05) as locks:
        _server(servers, 4).pause()
        try:
            started = time.monotonic()
            for _ in range(20):
                lock = locks.lock(name, ttl=5)
                assert await lock.acquire(timeout=1)
                await lock.release()
            # Each cycle is decided by the four live nodes, not by the hung one's
            # timeout: 20 cycles stay far below 20 x node_timeout x 2.
            assert time.monotonic() - started < 2.0
            assert await _live_keys(servers, name, [0, 1, 2, 3]) == [False] * 4
        finally:
            _server(servers, 4).resume()


async def test_three_hung_nodes_fail_within_node_timeout(servers: Servers, name: str) -> None:
    async with LockManager(servers, node_timeout=0.1) as locks:
        for i in (0, 1, 2):
            _server(servers, i).pause()
        try:
            started = time.monotonic()
            with pytest.raises(QuorumError) as info:
                await locks.lock(name, ttl=5).acquire(timeout=3)
            assert time.monotonic() - started < 2.0
            assert all(isinstance(e, TimeoutError) for e in info.value.errors.values())
        finally:
            for i in (0, 1, 2):
                _server(servers, i).resume()
        # The clean-up queued behind the hung requests ran once they resumed.
        await asyncio.sleep(0.2)
        assert await _live_keys(servers, name, [0, 1, 2, 3, 4]) == [False] * 5


async def test_script_flush_does_not_break_release_or_extend(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    async with LockManager(servers) as locks:
        lock = locks.lock(name, ttl=5, auto_renew=False)
        assert await lock.acquire()
        for client in clients:
            await client.script_flush()
        await lock.extend(8)
        assert all([await c.pttl(key(name)) > 7000 for c in clients])
        for client in clients:
            await client.script_flush()
        await lock.release()
        assert [await c.exists(key(name)) for c in clients] == [0] * 5


async def test_node_restarted_empty_reconnects(servers: Servers, name: str) -> None:
    async with LockManager(servers) as locks:
        lock = locks.lock(name, ttl=5)
        assert await lock.acquire()
        await lock.release()
        for i in range(5):
            await _server(servers, i).restart()
        deadline = time.monotonic() + 5
        while True:
            try:
                if await lock.acquire(timeout=0):
                    break
            except QuorumError:
                pass
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await lock.release()


async def test_acquire_on_a_name_used_by_another_type_is_a_node_error(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    for client in clients:
        await client.rpush(key(name), b"x")
    async with LockManager(servers) as locks:
        # SET NX on an existing key of another type does nothing: held by "someone".
        assert await locks.lock(name).acquire(timeout=0) is False
        assert [await c.type(key(name)) for c in clients] == [b"list"] * 5
