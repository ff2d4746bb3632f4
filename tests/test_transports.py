"""Renewal and pub/sub wake-ups over every transport a node URL may name: TLS, unix sockets.

The hot path (acquire, release) over these is tested elsewhere; here the two background
connections of a manager, the renewal's and the subscriber's, must work over them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from aiolock import LockManager
from aiolock.testing import redis_servers

from .faults import tls_proxies


async def _renewal_and_wakeup(nodes: Sequence[str], name: str) -> None:
    """A short-ttl lock outlives its ttl (renewed), and a waiter of another manager is
    woken by its release (pub/sub) rather than by the fallback wait (the holder's ttl).

    node_timeout is 4 x the default: the TLS proxies run in the test's own event loop,
    and on a loaded 2-core machine a round trip through them has taken over 50 ms (a
    renewal refused for lateness is a correct loss, not what this test is about)."""
    managers = [LockManager(nodes, node_timeout=0.2) for _ in range(2)]
    async with managers[0] as holder_side, managers[1] as waiter_side:
        lock = holder_side.lock(name, ttl=0.6)
        assert await lock.acquire(timeout=5)
        await asyncio.sleep(1.5)  # several renewals over the transport
        assert lock.owned
        assert lock.lost is None
        await lock.extend(30)  # a lost wake-up message would cost the waiter 30 s

        async def wait_then_take() -> float:
            took = waiter_side.lock(name, ttl=5)
            assert await took.acquire(timeout=10)
            at = time.monotonic()
            await took.release()
            return at

        waiter = asyncio.create_task(wait_then_take())
        await asyncio.sleep(0.3)  # the waiter tried once and listens
        released_at = time.monotonic()
        await lock.release()
        woken_at = await asyncio.wait_for(waiter, 15)
        assert woken_at - released_at < 2.0, "woken by the fallback, not by pub/sub"


@pytest.fixture
async def tls_urls(urls: list[str], tmp_path: Path) -> AsyncIterator[list[str]]:
    async with tls_proxies(urls[:3], tmp_path) as tls:
        yield tls


async def test_renewal_and_wakeups_over_tls(tls_urls: list[str], name: str) -> None:
    assert all(url.startswith("rediss://") for url in tls_urls)
    await _renewal_and_wakeup(tls_urls, name)


async def test_renewal_and_wakeups_over_unix_sockets(tmp_path: Path, name: str) -> None:
    sockets = [tmp_path / f"node{i}.sock" for i in range(3)]
    async with contextlib.AsyncExitStack() as stack:
        for path in sockets:
            await stack.enter_async_context(
                redis_servers(1, args=["--unixsocket", str(path), "--unixsocketperm", "700"])
            )
        await _renewal_and_wakeup([f"unix://{path}" for path in sockets], name)
