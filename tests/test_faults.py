"""Node failures on real servers: killed, hung (SIGSTOP), restarted, script cache flushed."""

from __future__ import annotations

import asyncio
import os
import sys
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


async def _live_keys(
    servers: Servers, name: str, live: list[int], expected: list[bool]
) -> list[bool]:
    """Whether the live servers have the key, once it is as expected (or after 2 s):
    a quorum's answer returns before the other nodes' requests land."""
    deadline = time.monotonic() + 2.0
    while True:
        out = []
        for i in live:
            client = redis.Redis.from_url(servers[i], socket_timeout=2)
            try:
                out.append(bool(await client.exists(key(name))))
            finally:
                await client.aclose()
        if out == expected or time.monotonic() > deadline:
            return out
        await asyncio.sleep(0.01)


async def test_two_of_five_nodes_killed_still_acquires(servers: Servers, name: str) -> None:
    async with LockManager(servers) as locks:
        _server(servers, 0).kill()
        _server(servers, 1).kill()
        lock = locks.lock(name, ttl=5)
        assert await lock.acquire(timeout=1)
        assert await _live_keys(servers, name, [2, 3, 4], [True] * 3) == [True] * 3
        await lock.release()
        assert await _live_keys(servers, name, [2, 3, 4], [False] * 3) == [False] * 3


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
        # Says what failed, of which lock, and how many nodes a quorum needs.
        assert str(info.value).startswith(f"acquire of lock {name!r}: 3 of 5 nodes failed")
        assert "a quorum needs 3" in str(info.value)
        assert not lock.owned
        assert await _live_keys(servers, name, [3, 4], [False, False]) == [False, False]
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
            assert await _live_keys(servers, name, [0, 1, 2, 3], [False] * 4) == [False] * 4
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
        assert await _live_keys(servers, name, [0, 1, 2, 3, 4], [False] * 5) == [False] * 5


async def test_extend_with_two_nodes_saying_gone_and_three_hung_is_an_outage(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    """Two "not held" of five do not make a loss (three more could still say yes): the
    hung majority makes it an outage, a QuorumError naming each node's failure."""
    async with LockManager(servers, node_timeout=0.1) as locks:
        lock = locks.lock(name, ttl=10, auto_renew=False)
        assert await lock.acquire()
        for client in clients[:2]:
            await client.delete(key(name))
        for i in (2, 3, 4):
            _server(servers, i).pause()
        try:
            with pytest.raises(
                QuorumError, match=r"^extend of lock .+: 3 of 5 nodes failed"
            ) as info:
                await lock.extend()
            assert len(info.value.errors) == 3
            assert all(isinstance(e, TimeoutError) for e in info.value.errors.values())
        finally:
            for i in (2, 3, 4):
                _server(servers, i).resume()


async def test_script_flush_does_not_break_release_or_extend(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    async with LockManager(servers) as locks:
        lock = locks.lock(name, ttl=5, auto_renew=False)
        assert await lock.acquire()
        for client in clients:
            await client.script_flush()
        await lock.extend(8)
        # A quorum confirmed at once; the re-sent EVALs of the others land a moment later.
        deadline = time.monotonic() + 2
        while not all([await c.pttl(key(name)) > 7000 for c in clients]):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        for client in clients:
            await client.script_flush()
        await lock.release()
        # release() returns once a quorum confirmed; the other nodes' re-sent EVALs
        # land a moment later.
        deadline = time.monotonic() + 2
        while [await c.exists(key(name)) for c in clients] != [0] * 5:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)


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


async def test_name_collision_with_another_key_type_is_a_node_error(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    for client in clients:
        await client.rpush(key(name), b"x")
    async with LockManager(servers) as locks:
        # Not "held by someone else" (which would wait forever): a clear error.
        with pytest.raises(QuorumError, match="WRONGTYPE") as info:
            await locks.lock(name).acquire(timeout=5)
        assert len(info.value.errors) == 5
        assert all("127.0.0.1" in str(e) for e in info.value.errors.values())
        assert [await c.type(key(name)) for c in clients] == [b"list"] * 5


async def test_servers_die_with_the_process_that_started_them() -> None:
    code = (
        "import asyncio, os\n"
        "from aiolock.testing import redis_servers\n"
        "async def main():\n"
        "    async with redis_servers(2) as s:\n"
        "        print(' '.join(str(x.process.pid) for x in s.servers), flush=True)\n"
        "        await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    pids = [int(p) for p in line.split()]
    assert len(pids) == 2
    proc.kill()  # SIGKILL: no clean-up code runs
    await proc.wait()
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "orphaned servers"
        await asyncio.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too (reaped by init eventually).
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
