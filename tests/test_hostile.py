"""Hostile input: one caller's bad argument never becomes an outage.

A bad argument is refused with ``TypeError``/``ValueError`` before any I/O; the
biggest legitimate requests leave other tasks' cycles alone; the scripts stay fast
at the largest arguments allowed.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import aiolock
from aiolock import LockManager, LockNotOwned
from aiolock._core.batch import BATCH_LIMIT
from aiolock._core.checks import MAX_NAME_BYTES, MAX_SEMAPHORE_LIMIT, MAX_TTL

from . import seam

#: Five times the default: generous enough for a busy 2-core box (a test must not flake),
#: far below what an oversized request would hold the others up for (0.3 s).
NODE_TIMEOUT = 0.25

# -- the oracle: what the API documents as valid, written independently of the code ------


def valid_name(name: object) -> bool:
    if not isinstance(name, str) or not name:
        return False
    try:
        return len(name.encode()) <= MAX_NAME_BYTES
    except UnicodeEncodeError:
        return False


def valid_ttl(ttl: object) -> bool:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        return False
    return math.isfinite(ttl) and NODE_TIMEOUT < ttl <= MAX_TTL


def valid_timeout(timeout: object) -> bool:
    if timeout is None:
        return True
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return False
    return not math.isnan(timeout) and timeout >= 0


def valid_limit(limit: object) -> bool:
    return type(limit) is int and 1 <= limit <= MAX_SEMAPHORE_LIMIT


NAMES = st.one_of(
    st.text(max_size=40),  # any str: empty, NUL, newline, braces, lone surrogates
    st.builds(
        lambda n, c: c * n,
        st.integers(MAX_NAME_BYTES // 2 - 3, MAX_NAME_BYTES + 3),
        st.sampled_from(["ab", "é", "}{", "\x00\n"]),
    ),  # around the byte bound, in 1- and 2-byte characters
    st.binary(max_size=4),
    st.integers(),
    st.none(),
)
TTLS = st.one_of(
    st.floats(0.06, 5.0),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-3, 10**17),
    st.sampled_from([MAX_TTL, MAX_TTL + 1, NODE_TIMEOUT, True, "1", None]),
)
TIMEOUTS = st.one_of(
    st.none(),
    st.floats(0.0, 0.5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-2, 1),
    st.sampled_from([True, "0", b"1"]),
)
LIMITS = st.one_of(
    st.integers(-2, MAX_SEMAPHORE_LIMIT + 3),
    st.sampled_from([True, 2.0, None, "3"]),
)


class Background:
    """Ordinary cycles on another manager and prefix, counted, for the whole test."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.cycles = 0
        self.failures: list[BaseException] = []
        self._stop = asyncio.Event()

    async def _run(self, i: int) -> None:
        async with LockManager(self.urls, prefix="bg:", node_timeout=NODE_TIMEOUT) as locks:
            while not self._stop.is_set():
                try:
                    async with locks.lock(f"ordinary-{i}", ttl=10, timeout=5):
                        await asyncio.sleep(0)
                    self.cycles += 1
                except Exception as exc:  # every failure is a finding
                    self.failures.append(exc)
                await asyncio.sleep(0.002)

    async def __aenter__(self) -> Background:
        self._tasks = [asyncio.ensure_future(self._run(i)) for i in range(2)]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


@pytest.fixture
async def background(urls: list[str]) -> AsyncIterator[Background]:
    async with Background(urls) as running:
        yield running
    assert running.failures == []
    assert running.cycles > 0


async def settled(locks: LockManager) -> None:
    """Every node has run what ``locks`` sent it. A release returns once a quorum said
    yes; the other nodes' deletes may still be on their way (seen on a loaded box: the
    key read on one node, just after the release returned)."""
    loop = asyncio.get_running_loop()
    replies: list[asyncio.Future[Any]] = []
    for node in seam.nodes(locks):  # (each node's connection is ordered)
        reply: asyncio.Future[Any] = loop.create_future()
        node.call((b"PING",), reply.set_result)
        replies.append(reply)
    await asyncio.wait_for(asyncio.gather(*replies), 10)


async def leftovers(clients: list[redis.Redis]) -> list[bytes]:
    """The lock keys of the test's manager left on any node (fencing counters stay)."""
    found: list[bytes] = []
    for client in clients:
        found.extend([k async for k in client.scan_iter(match="aiolock:*", count=1000)])
    return [key for key in found if not key.endswith(b":fence")]


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Each bound, just inside and just outside, whatever the draw.
@example(kind="semaphore", name="s", ttl=1.0, wait=0, limit=MAX_SEMAPHORE_LIMIT)
@example(kind="semaphore", name="s", ttl=1.0, wait=0, limit=MAX_SEMAPHORE_LIMIT + 1)
@example(kind="lock", name="t", ttl=MAX_TTL, wait=0, limit=1)
@example(kind="lock", name="t", ttl=MAX_TTL + 1, wait=0, limit=1)
@example(kind="lock", name="é" * (MAX_NAME_BYTES // 2), ttl=1.0, wait=0, limit=1)
@example(kind="lock_many", name="n" * (MAX_NAME_BYTES + 1), ttl=1.0, wait=0, limit=1)
@given(
    kind=st.sampled_from(["lock", "semaphore", "lock_many"]),
    name=NAMES,
    ttl=TTLS,
    wait=TIMEOUTS,
    limit=LIMITS,
)
async def test_any_argument_gives_a_clean_cycle_or_an_error_before_any_io(  # noqa: PLR0917
    urls: list[str],
    clients: list[redis.Redis],
    background: Background,
    kind: str,
    name: Any,
    ttl: Any,
    wait: Any,
    limit: Any,
) -> None:
    async with LockManager(urls, node_timeout=NODE_TIMEOUT) as locks:
        sent = 0
        quorum = seam.engine(locks).quorum
        original = quorum.acquire

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal sent
            sent += 1
            return await original(*args, **kwargs)

        quorum.acquire = counted  # type: ignore[method-assign]
        valid = valid_name(name) and valid_ttl(ttl) and valid_timeout(wait)
        if kind == "semaphore":
            valid = valid and valid_limit(limit)
        handle: aiolock.Lock | aiolock.Semaphore | aiolock.LockMany
        refused: Exception | None = None
        try:
            if kind == "lock":
                handle = locks.lock(name, ttl=ttl)
            elif kind == "semaphore":
                handle = locks.semaphore(name, limit, ttl=ttl)
            else:
                handle = locks.lock_many([name, "and-another"], ttl=ttl)
            acquired = await handle.acquire(timeout=wait)
        except (TypeError, ValueError) as exc:
            refused = exc
        if refused is not None:
            assert not valid, f"refused a valid argument: {refused}"
            assert sent == 0, "refused after I/O"
            assert len(str(refused)) < 400, "the message must cut a long name"
            return
        assert valid, "accepted an argument the API documents as invalid"
        assert acquired  # nobody else holds it: a correct cycle
        assert handle.fencing_token is not None
        await handle.release()
        # Messages (and reprs) cut a long name to a readable length.
        with pytest.raises(LockNotOwned) as not_held:
            await handle.release()
        assert len(str(not_held.value)) < 400
        assert len(repr(handle)) < 400
        await settled(locks)
    assert await leftovers(clients) == []


async def test_big_legitimate_requests_leave_other_tasks_cycles_alone(
    urls: list[str], background: Background
) -> None:
    async with LockManager(urls, node_timeout=NODE_TIMEOUT) as locks:
        # The biggest name allowed.
        async with locks.lock("n" * MAX_NAME_BYTES, ttl=5, timeout=5) as lock:
            assert lock.owned
        # A big lock_many (each name is a request of its own).
        async with locks.lock_many([f"many-{i}" for i in range(300)], ttl=30, timeout=30):
            pass
        # A renewal batch of BATCH_LIMIT locks with the biggest names, renewed twice.
        held = [
            locks.lock(f"{i:04d}".ljust(MAX_NAME_BYTES, "r"), ttl=3.0) for i in range(BATCH_LIMIT)
        ]
        for one in held:
            assert await one.acquire(timeout=5)
        await asyncio.sleep(2.5)  # renewed at least once (every ttl / 3)
        assert all(one.owned for one in held)
        assert all(one.lost is None for one in held)
        for one in held:
            await one.release()
    # (the background fixture asserts that none of the ordinary cycles failed)


async def test_each_script_stays_fast_at_the_largest_arguments(urls: list[str]) -> None:
    client = redis.Redis.from_url(urls[0])
    try:
        # (The server's time is measured, not the round trip: a generous node_timeout.)
        async with LockManager(urls[:1], node_timeout=2.0) as locks:
            held = [
                locks.lock(f"{i:04d}".ljust(MAX_NAME_BYTES, "s"), ttl=600)
                for i in range(BATCH_LIMIT)
            ]
            for one in held:
                assert await one.acquire(timeout=5)
            # A renewal batch of BATCH_LIMIT of the biggest names, as the renewer sends it.
            items = [(one._hold.key, one._hold.token, 600.0) for one in held if one._hold]
            await client.config_resetstat()
            batch = await seam.engine(locks).renewal_quorum.extend_many(items, budget=5.0)
            assert batch.yes == [1] * BATCH_LIMIT
            renewal = (await client.info("commandstats"))["cmdstat_evalsha"]
            # Acquire, extend and release of the biggest name.
            await client.config_resetstat()
            for one in held[:20]:
                await one.extend()
                await one.release()
                assert await one.acquire(timeout=5)
            others = (await client.info("commandstats"))["cmdstat_evalsha"]
            for one in held:
                await one.release()
            # A semaphore of the biggest name at its largest limit, nearly full: the tries
            # that find its one free slot, then that there is none.
            big = "s".ljust(MAX_NAME_BYTES, "s")
            slots = [locks.semaphore(big, MAX_SEMAPHORE_LIMIT, ttl=600, auto_renew=False)
                     for _ in range(MAX_SEMAPHORE_LIMIT + 1)]  # fmt: skip
            for one in slots[:-1]:
                assert await one.acquire(timeout=5)
            await slots[MAX_SEMAPHORE_LIMIT // 2].release()
            await client.config_resetstat()
            assert await slots[-1].acquire(timeout=0)
            assert await slots[MAX_SEMAPHORE_LIMIT // 2].acquire(timeout=0) is False
            semaphore = (await client.info("commandstats"))["cmdstat_evalsha"]
            for one in slots:
                if one.owned:
                    await one.release()
        # One script runs at a time on a node, and every other client waits meanwhile.
        for what, stats in (
            ("renewal", renewal),
            ("acquire/extend/release", others),
            ("semaphore", semaphore),
        ):
            assert stats["usec_per_call"] < 3000, f"{what}: {stats}"
    finally:
        await client.aclose()
