"""Fencing tokens: a model check of the quorum algorithm, and real servers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
import secrets
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from aiolock import LockManager
from aiolock._core.calls import Callback, Record
from aiolock._core.votes import fence_of
from aiolock._lua import (
    ACQUIRE_SCRIPT,
    EXTEND_SCRIPT,
    RAISE_FENCE_SCRIPT,
    RELEASE_SCRIPT,
    Script,
)
from aiolock._quorum.quorum import Quorum
from aiolock.testing import Server, Servers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from fenced_store import FencedStore, StaleTokenError

# -- a model of the nodes --------------------------------------------------------------
#
# Each fake node runs the semantics of aiolock's scripts on a dict, with expiry on a
# shared fake clock. The acquirers' wall clock (the floor of tokens) is frozen at 0,
# so that only the counters (and the majority-intersection argument) keep tokens
# increasing: the worst case for the algorithm.


class ModelNode:
    def __init__(self, name: str, now: list[float]) -> None:
        self.spec = self.name = name
        self.data: dict[bytes, tuple[bytes, float]] = {}  # key -> (value, expires at)
        self.down = False
        self._now = now

    def _get(self, key: bytes) -> bytes | None:
        entry = self.data.get(key)
        if entry is None or entry[1] <= self._now[0]:
            self.data.pop(key, None)
            return None
        return entry[0]

    def _set(self, key: bytes, value: bytes, ms: bytes) -> None:
        self.data[key] = (value, self._now[0] + int(ms) / 1000)

    def call(self, args: tuple[bytes, ...], callback: Callback) -> None:  # pragma: no cover
        raise AssertionError("aiolock sends scripts only")

    set_ifeq = False

    def call_script(self, script: Script, args: tuple[bytes, ...], callback: Callback) -> None:
        loop = asyncio.get_running_loop()
        if self.down:
            loop.call_soon(callback, ConnectionError(f"{self.name} is down"))
            return
        loop.call_soon(callback, self._run(script, args))

    def call_for_vote(
        self, script: Script, args: tuple[bytes, ...], record: Record, index: int
    ) -> None:
        self.call_script(script, args, functools.partial(record, index))

    def _run(self, script: Script, args: tuple[bytes, ...]) -> Any:
        if script is ACQUIRE_SCRIPT:
            _n, key, fence_key, token, ttl_ms, keep_ms, floor = args
            if self._get(key) is not None:
                return [0, 1000]
            self._set(key, token, ttl_ms)
            last = self._get(fence_key)
            fence = int(floor)
            if last is not None and int(last) >= fence:
                fence = int(last) + 1
            self._set(fence_key, b"%d" % fence, keep_ms)
            return fence
        if script is RELEASE_SCRIPT:
            _n, key, token = args
            if self._get(key) == token:
                del self.data[key]
                return 1
            return 0
        if script is RAISE_FENCE_SCRIPT:
            _n, fence_key, fence, keep_ms = args
            last = self._get(fence_key)
            if last is None or int(last) < int(fence):
                self._set(fence_key, fence, keep_ms)
            return 1
        if script is EXTEND_SCRIPT:
            _n, key, token, ms = args
            if self._get(key) == token:
                self._set(key, token, ms)
                return 1
            return 0
        raise AssertionError("unknown script")  # pragma: no cover


N = 5
MINORITY = N // 2
TTL = 10.0


class FencingModel(RuleBasedStateMachine):
    """Random interleavings of acquire, release, expiry, restarts and outages."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.now = [0.0]
        self.nodes = [ModelNode(f"n{i}", self.now) for i in range(N)]
        self.quorum = Quorum(
            self.nodes,
            node_timeout=0.05,
            drift_factor=0.01,
            clock=lambda: self.now[0],
            wall_clock=lambda: 0.0,
        )
        self.holder: bytes | None = None
        self.tokens: list[int] = []
        # Nodes that failed (down, or restarted empty) since the last acquisition
        # began: the promise holds while they are a minority (see safety.md, "Fencing tokens").
        self.failed: set[int] = set()

    def teardown(self) -> None:
        self.loop.close()

    @rule()
    def acquire(self) -> None:
        token = secrets.token_bytes(20)
        attempt = self.loop.run_until_complete(self.quorum.acquire(b"k", token, TTL))
        if attempt.acquired:
            assert self.holder is None, "two holders at once"
            assert attempt.fence is not None
            if self.tokens:
                assert attempt.fence > self.tokens[-1], (self.tokens, attempt.fence)
            self.tokens.append(attempt.fence)
            self.holder = token
            self.failed = {i for i, node in enumerate(self.nodes) if node.down}

    @precondition(lambda self: self.holder is not None)
    @rule()
    def release(self) -> None:
        assert self.holder is not None
        self.loop.run_until_complete(self.quorum.release(b"k", self.holder))
        self.holder = None

    @rule()
    def expire(self) -> None:
        self.now[0] += TTL + 1
        self.holder = None

    @rule(i=st.integers(0, N - 1))
    def restart_empty(self, i: int) -> None:
        if len(self.failed | {i}) <= MINORITY:
            self.nodes[i].data.clear()
            self.failed.add(i)

    @rule(i=st.integers(0, N - 1))
    def go_down(self, i: int) -> None:
        if len(self.failed | {i}) <= MINORITY:
            self.nodes[i].down = True
            self.failed.add(i)

    @rule(i=st.integers(0, N - 1))
    def come_back(self, i: int) -> None:
        self.nodes[i].down = False

    @invariant()
    def tokens_strictly_increase(self) -> None:
        assert all(a < b for a, b in itertools.pairwise(self.tokens))


FencingModel.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_fencing_model = FencingModel.TestCase


def test_model_catches_a_broken_algorithm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model is not vacuous: taking the first fence instead of the largest
    (a plausible bug) is caught."""
    from aiolock._quorum import quorum as _quorum

    original = _quorum.Quorum._settle_fence

    async def first_not_max(self: Quorum, votes: Any, fence_key: bytes, retention: bytes) -> int:
        for i in range(self.n):
            if votes.verdicts[i]:
                return fence_of(votes.replies[i])
        raise AssertionError  # pragma: no cover

    monkeypatch.setattr(_quorum.Quorum, "_settle_fence", first_not_max)
    machine = FencingModel()
    try:
        machine.acquire()
        machine.expire()
        machine.go_down(0)
        machine.acquire()  # nodes 1-4 move on; node 0 lags
        machine.expire()
        machine.come_back(0)
        machine.failed.clear()
        with pytest.raises(AssertionError):
            machine.acquire()  # node 0 answers first with its lagging counter
    finally:
        machine.teardown()
        monkeypatch.setattr(_quorum.Quorum, "_settle_fence", original)


# -- real servers ----------------------------------------------------------------------


async def test_token_is_an_int_while_held_and_none_after(locks: LockManager, name: str) -> None:
    lock = locks.lock(name, ttl=5)
    assert lock.fencing_token is None
    async with lock:
        token = lock.fencing_token
        assert isinstance(token, int)
        assert token > 0
    assert lock.fencing_token is None


async def test_tokens_increase_across_holders_and_managers(urls: list[str], name: str) -> None:
    async with LockManager(urls) as one, LockManager(urls[::-1]) as two:
        tokens = []
        for i in range(20):
            manager = one if i % 2 else two
            async with manager.lock(name, ttl=5) as lock:
                tokens.append(lock.fencing_token)
        assert tokens == sorted(set(tokens))


async def test_tokens_increase_while_minority_nodes_restart_empty(
    servers: Servers, name: str
) -> None:
    rng = random.Random(1234)
    managers = [LockManager(servers, node_timeout=0.2) for _ in range(3)]
    tokens: list[int] = []
    try:
        for turn in range(300):
            if turn % 25 == 12:
                victim = servers.servers[rng.randrange(len(servers))]
                assert isinstance(victim, Server)
                await victim.restart()  # one node at a time: always a minority
            manager = managers[turn % 3]
            async with manager.lock(name, ttl=5, timeout=10) as lock:
                assert lock.fencing_token is not None
                tokens.append(lock.fencing_token)
    finally:
        for manager in managers:
            await manager.aclose()
    assert len(tokens) == 300
    assert all(a < b for a, b in itertools.pairwise(tokens))


async def test_uncontended_acquire_needs_no_extra_round_trip(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    async def calls() -> int:
        total = 0
        for client in clients:
            stats = await client.info("commandstats")
            total += int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
        return total

    for _ in range(3):
        before = await calls()
        lock = locks.lock(name, ttl=5, auto_renew=False)
        assert await lock.acquire(timeout=0)
        await lock.release()
        await asyncio.sleep(0.05)  # the releases still in flight land
        # One acquire and one release per node: no fence raise.
        assert await calls() - before == 10


async def test_lagging_node_is_brought_up_to_date(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    fence_key = f"aiolock:{{{name}}}:fence"
    async with LockManager(servers) as locks:
        async with locks.lock(name, ttl=5) as lock:
            first = lock.fencing_token
        for client in clients[:2]:
            await client.delete(fence_key)  # two nodes lost their counter
        await clients[0].set(fence_key, 1)
        async with locks.lock(name, ttl=5) as lock:
            second = lock.fencing_token
        assert first is not None
        assert second is not None
        assert second > first
        await asyncio.sleep(0.1)  # the raise of the lagging nodes is in flight
        assert all([int(await c.get(fence_key) or 0) >= second for c in clients])


async def test_stored_counter_above_the_clock_is_respected(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    # A counter ahead of our clock (another acquirer's clock ran fast, or the floor
    # was raised): the next token must still exceed it, not fall back to our clock.
    planted = int(time.time() * 1_000_000) + 10**12
    for client in clients:
        await client.set(f"aiolock:{{{name}}}:fence", planted)
    async with locks.lock(name, ttl=5) as lock:
        assert lock.fencing_token is not None
        assert lock.fencing_token > planted


async def test_fence_counters_expire_after_retention(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    async with locks.lock(name, ttl=5):
        pass
    pttl = await clients[0].pttl(f"aiolock:{{{name}}}:fence")
    assert 3000_000 < pttl <= 3600_000


async def test_paused_holder_is_refused_by_fenced_store(
    locks: LockManager, name: str, tmp_path: Path
) -> None:
    store = FencedStore(tmp_path / "store.db")
    try:
        slow = locks.lock(name, ttl=0.3, auto_renew=False)
        assert await slow.acquire()
        slow_token = slow.fencing_token
        assert slow_token is not None
        await asyncio.sleep(0.5)  # "paused" past its validity: the lock expired
        async with locks.lock(name, ttl=5, timeout=2) as fast:
            assert fast.fencing_token is not None
            store.write("balance", "100", fast.fencing_token)
        with pytest.raises(StaleTokenError):
            store.write("balance", "0", slow_token)  # the paused holder wakes up
        assert store.read("balance") == "100"
    finally:
        store.close()


def test_fenced_store_accepts_increasing_tokens(tmp_path: Path) -> None:
    store = FencedStore(tmp_path / "s.db")
    try:
        store.write("a", "1", 10)
        store.write("a", "2", 11)
        with pytest.raises(StaleTokenError):
            store.write("a", "3", 11)
        assert store.read("a") == "2"
        assert store.read("missing") is None
        # (closing(): sqlite3's own context manager commits but does not close, and
        # CPython 3.13 warns about the connection left open.)
        with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
            assert db.execute("select token from fenced where key = 'a'").fetchone() == (11,)
    finally:
        store.close()
