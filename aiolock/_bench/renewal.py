"""Renewal at scale: many locks held with auto-renewal by one process."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as redis

from .._manager import LockManager
from ._common import evalsha_calls, servers_or


@dataclass
class RenewalFigures:
    """Cost of holding many auto-renewed locks in one process."""

    locks: int
    ttl: float
    seconds: float
    cpu_percent: float
    rss_mb: float
    commands_per_node: float
    all_owned: bool

    def table(self) -> str:
        """A text report."""
        return (
            f"{self.locks} auto-renewed locks (ttl {self.ttl:g}s) held {self.seconds:.0f}s: "
            f"CPU {self.cpu_percent:.2f}% of one core, RSS {self.rss_mb:.1f} MB, "
            f"{self.commands_per_node:.0f} renewal commands per node, "
            f"all still owned: {self.all_owned}"
        )


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")  # pragma: no cover - not Linux


async def run_renewal(
    urls: Sequence[str] | None = None,
    *,
    locks: int = 10_000,
    ttl: float = 30.0,
    seconds: float = 60.0,
) -> RenewalFigures:
    """Hold ``locks`` auto-renewed locks for ``seconds``; measure CPU, RSS and commands."""
    async with servers_or(urls, 5) as nodes, LockManager(nodes, restart_grace=0) as manager:
        held = [manager.lock(f"bench:renew:{i}", ttl=ttl) for i in range(locks)]
        for start in range(0, locks, 500):
            results = await asyncio.gather(
                *(lock.acquire(timeout=5) for lock in held[start : start + 500])
            )
            if not all(results):  # pragma: no cover - the nodes are ours alone
                raise RuntimeError("could not acquire the benchmark's locks")
        clients = [redis.Redis.from_url(url) for url in nodes]
        try:
            before = [await evalsha_calls(c) for c in clients]
            cpu0, wall0 = time.process_time(), time.monotonic()
            await asyncio.sleep(seconds)
            cpu = time.process_time() - cpu0
            wall = time.monotonic() - wall0
            after = [await evalsha_calls(c) for c in clients]
        finally:
            for client in clients:
                await client.aclose()
        figures = RenewalFigures(
            locks=locks,
            ttl=ttl,
            seconds=wall,
            cpu_percent=100 * cpu / wall,
            rss_mb=_rss_mb(),
            commands_per_node=statistics.mean(a - b for a, b in zip(after, before, strict=True)),
            all_owned=all(lock.owned for lock in held),
        )
        for start in range(0, locks, 500):
            await asyncio.gather(
                *(lock.release() for lock in held[start : start + 500] if lock.owned)
            )
        return figures
