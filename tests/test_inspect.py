"""Read-only queries: ``locks.locked(name)`` and ``locks.inspect(name)``."""

from __future__ import annotations

import hashlib

import pytest
import redis.asyncio as redis

import aiolock
from aiolock import LockManager, QuorumError
from aiolock._core.info import summarize
from aiolock.testing import Server, Servers

from .conftest import key


def digest(token: bytes) -> str:
    return hashlib.sha1(token).hexdigest()[:12]  # noqa: S324 - what the script shows


async def test_a_free_lock_is_not_held_on_any_node(locks: LockManager, name: str) -> None:
    info = await locks.inspect(name)
    assert isinstance(info, aiolock.LockInfo)
    assert info.name == name
    assert info.held is False
    assert info.holder is None
    assert info.remaining is None
    assert info.fencing_counter is None  # never acquired
    assert len(info.nodes) == 5
    assert all(isinstance(node, aiolock.NodeInfo) for node in info.nodes)
    views = [(n.held, n.pttl, n.holder, n.error) for n in info.nodes]
    assert views == [(False, None, None, None)] * 5
    assert [n.node for n in info.nodes] == list(locks.nodes)  # URLs without a password
    assert await locks.locked(name) is False


async def test_a_held_lock_shows_its_holder_by_digest_never_its_token(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    async with locks.lock(name, ttl=20) as lock:
        token = await clients[0].get(key(name))
        assert token is not None
        fence = lock.fencing_token
        info = await locks.inspect(name)
        assert await locks.locked(name) is True
    assert info.held is True
    assert info.holder == digest(token)
    assert all(node.held and node.holder == digest(token) for node in info.nodes)
    assert all(node.pttl is not None and 19_000 < node.pttl <= 20_000 for node in info.nodes)
    assert info.remaining is not None
    assert 20 - 1.0 < info.remaining <= 20 - 20 * locks.drift_factor
    assert fence is not None
    assert info.fencing_counter == fence
    shown = repr(info) + str(info)
    assert token.hex() not in shown
    assert repr(token) not in shown
    # Released: free again; the counter stays (the last token issued).
    after = await locks.inspect(name)
    assert after.held is False
    assert after.fencing_counter == info.fencing_counter
    assert await locks.locked(name) is False


async def test_the_fencing_counter_is_the_last_token_issued(locks: LockManager, name: str) -> None:
    tokens = []
    for _ in range(3):
        async with locks.lock(name, ttl=5) as lock:
            tokens.append(lock.fencing_token)
    assert (await locks.inspect(name)).fencing_counter == tokens[-1]


async def test_remaining_is_what_a_quorum_of_nodes_still_holds(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    lock = locks.lock(name, ttl=30, auto_renew=False)
    assert await lock.acquire()
    for client, ms in zip(clients, [30_000, 10_000, 5_000, 5_000, 5_000], strict=True):
        await client.pexpire(key(name), ms)
    info = await locks.inspect(name)
    # The third-longest PTTL (a quorum of 3 holds at least that long), less drift.
    assert info.remaining is not None
    assert 4.0 < info.remaining <= 5.0 - 5.0 * locks.drift_factor
    await lock.release()


async def test_a_minority_holder_is_shown_but_does_not_hold_the_lock(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    for client in clients[:2]:
        await client.set(key(name), b"a-minority-token", px=10_000)
    for client in clients[2:4]:
        await client.set(key(name), b"another-token", px=10_000)
    info = await locks.inspect(name)
    assert info.held is False  # two holders with two nodes each: no quorum
    assert info.remaining is None
    assert [n.holder for n in info.nodes] == [digest(b"a-minority-token")] * 2 + [
        digest(b"another-token")
    ] * 2 + [None]
    assert await locks.locked(name) is False  # 5 answered: nobody can have a quorum


async def test_failed_nodes_are_reported_and_locked_says_when_it_cannot_tell(
    servers: Servers, name: str
) -> None:
    hung = [server for server in servers.servers if isinstance(server, Server)][:3]
    async with LockManager(servers, node_timeout=0.05) as locks:
        lock = locks.lock(name, ttl=20, auto_renew=False)
        assert await lock.acquire()
        hung[0].pause()
        hung[1].pause()
        info = await locks.inspect(name)
        assert info.held is True  # three nodes still hold it
        assert [n.error is not None for n in info.nodes] == [True, True, False, False, False]
        assert "no reply within" in str(info.nodes[0].error)
        assert await locks.locked(name) is True
        hung[2].pause()
        # Two nodes say "held", three do not answer: it may or may not be held.
        with pytest.raises(QuorumError, match=r"locked\(.*\): 3 of 5 nodes failed"):
            await locks.locked(name)
        assert (await locks.inspect(name)).held is False
        for server in hung:
            server.resume()
        await lock.release()


async def test_a_bad_name_is_refused_before_any_io(locks: LockManager) -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        await locks.inspect("")
    with pytest.raises(TypeError):
        await locks.locked(b"bytes")  # type: ignore[arg-type]


def test_the_summary_counts_a_holder_only_with_a_quorum() -> None:
    names = [f"n{i}" for i in range(5)]
    held = [10_000, b"abc", b"7"]
    free = [-2, None, b"7"]
    info = summarize(
        "x", names, [held, held, held, free, TimeoutError("t")], elapsed=0.5, drift_factor=0.01
    )
    assert info.held is True
    assert info.holder == "abc"
    assert info.fencing_counter == 7
    assert info.remaining == pytest.approx(10.0 - 0.5 - (10.0 * 0.01 + 0.002))
    assert [n.error is not None for n in info.nodes] == [False, False, False, False, True]
    info = summarize("x", names, [held, held, free, free, free], elapsed=0.0, drift_factor=0.01)
    assert info.held is False
    assert info.holder is None
    assert info.remaining is None
