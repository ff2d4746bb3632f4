"""A try on a full semaphore, by ``limit``: what a caller pays to learn there is no slot."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._manager import LockManager
from ._common import evalsha_calls, servers_or

__all__ = ["SemaphoreFigures", "run_semaphore"]


@dataclass
class SemaphoreFigures:
    """A try (``acquire(timeout=0)``) on a full semaphore of ``limit`` slots, 5 nodes."""

    limit: int
    tries: int
    median_ms: float
    scripts_per_try: float

    def row(self) -> str:
        """One line of the text report."""
        return (
            f"full semaphore, limit {self.limit:>5}: a try takes {self.median_ms:8.2f} ms "
            f"(median of {self.tries}), {self.scripts_per_try:7.1f} scripts"
        )


async def run_semaphore(
    urls: Sequence[str] | None = None, *, limits: Sequence[int] = (10, 100, 1000), tries: int = 5
) -> list[SemaphoreFigures]:
    """Fill a semaphore of each ``limit``, then time tries that find no free slot."""
    import redis.asyncio as redis  # noqa: PLC0415 - as the other benchmarks

    out = []
    async with servers_or(urls, 5) as nodes, LockManager(nodes, restart_grace=0) as locks:
        clients = [redis.Redis.from_url(url) for url in nodes]
        try:
            out.extend([await _full_semaphore(locks, clients, lim, tries) for lim in limits])
        finally:
            for client in clients:
                await client.aclose()
    return out


async def _full_semaphore(
    locks: LockManager, clients: list[Any], limit: int, tries: int
) -> SemaphoreFigures:
    """Fill a semaphore of ``limit`` slots, then time ``tries`` tries that find none free."""
    name = f"bench:semaphore:{limit}"
    holders = [locks.semaphore(name, limit, ttl=60) for _ in range(limit)]
    for holder in holders:
        if not await holder.acquire(timeout=5):  # pragma: no cover
            raise RuntimeError("semaphore benchmark: could not fill it")
    probe = locks.semaphore(name, limit, ttl=60)
    samples = []
    before = sum([await evalsha_calls(c) for c in clients])
    for _ in range(tries):
        started = time.perf_counter()
        if await probe.acquire(timeout=0):  # pragma: no cover
            raise RuntimeError("semaphore benchmark: a full semaphore had a slot")
        samples.append((time.perf_counter() - started) * 1000)
    after = sum([await evalsha_calls(c) for c in clients])
    for holder in holders:
        await holder.release()
    return SemaphoreFigures(limit, tries, statistics.median(samples), (after - before) / tries)
