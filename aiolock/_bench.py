"""Latency benchmarks behind ``python -m aiolock bench`` and ``benchmarks/``.

Every figure is also given as a ratio to the raw PING round trip (redis-py asyncio
client) measured in the same run, so that runs on different machines compare.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import platform
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass

import redis.asyncio as redis

from ._manager import LockManager
from .testing import Server, Servers, redis_servers

__all__ = ["Figure", "RenewalFigures", "run_latency", "run_renewal"]


@dataclass
class Figure:
    """One measured latency: median and p99 in microseconds, and ratios to PING."""

    name: str
    samples: int
    median_us: float
    p99_us: float
    ratio: float = 0.0

    def row(self) -> str:
        """A table row."""
        return (
            f"{self.name:<28} {self.samples:>7} {self.median_us:>10.1f} {self.p99_us:>10.1f}"
            f" {self.ratio:>8.2f}"
        )


def _figure(name: str, samples: Sequence[float]) -> Figure:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return Figure(name, len(ordered), statistics.median(ordered) * 1e6, p99 * 1e6)


async def _timed(op: Callable[[], Awaitable[object]], count: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        await op()
    out = []
    clock = time.perf_counter
    for _ in range(count):
        start = clock()
        await op()
        out.append(clock() - start)
    return out


@contextlib.asynccontextmanager
async def _nodes(urls: Sequence[str] | None, n: int) -> AsyncIterator[Sequence[str]]:
    if urls:
        yield urls
    else:
        async with redis_servers(n) as servers:
            yield servers


async def _ping(url: str, count: int, warmup: int) -> list[float]:
    client = redis.Redis.from_url(url)
    try:
        return await _timed(client.ping, count, warmup)
    finally:
        await client.aclose()


async def _cycle(urls: Sequence[str], count: int, warmup: int) -> list[float]:
    async with LockManager(urls) as locks:
        lock = locks.lock("bench:cycle", ttl=10, auto_renew=False)

        async def cycle() -> None:
            await lock.acquire(timeout=0)
            await lock.release()

        return await _timed(cycle, count, warmup)


async def run_latency(
    urls: Sequence[str] | None = None, *, count: int = 2000, warmup: int = 200
) -> list[Figure]:
    """PING, cycle1, cycle5, and cycle5 with one node hung (embedded nodes only)."""
    figures: list[Figure] = []
    async with _nodes(urls, 5) as nodes:
        figures.append(_figure("ping (redis-py)", await _ping(nodes[0], count, warmup)))
        figures.append(_figure("cycle1 acquire+release", await _cycle(nodes[:1], count, warmup)))
        figures.append(
            _figure(f"cycle{len(nodes)} acquire+release", await _cycle(nodes, count, warmup))
        )
        if isinstance(nodes, Servers) and len(nodes) >= 3:
            server = nodes.servers[-1]
            assert isinstance(server, Server)  # noqa: S101
            server.pause()
            try:
                samples = await _cycle(nodes, count, warmup)
            finally:
                server.resume()
            figures.append(_figure(f"cycle{len(nodes)}, 1 node hung", samples))
    ping = figures[0].median_us
    for figure in figures:
        figure.ratio = figure.median_us / ping
    return figures


def format_table(figures: Sequence[Figure]) -> str:
    """The figures as a text table, with the machine described."""
    head = f"{'figure':<28} {'samples':>7} {'median µs':>10} {'p99 µs':>10} {'x ping':>8}"
    machine = (
        f"# {platform.python_implementation()} {platform.python_version()} on {platform.machine()}"
    )
    return "\n".join([machine, head, "-" * len(head), *(f.row() for f in figures)])


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
    async with _nodes(urls, 5) as nodes, LockManager(nodes) as manager:
        held = [manager.lock(f"bench:renew:{i}", ttl=ttl) for i in range(locks)]
        for start in range(0, locks, 500):
            results = await asyncio.gather(
                *(lock.acquire(timeout=5) for lock in held[start : start + 500])
            )
            if not all(results):  # pragma: no cover - the nodes are ours alone
                raise RuntimeError("could not acquire the benchmark's locks")
        clients = [redis.Redis.from_url(url) for url in nodes]
        try:
            before = [await _evalsha_calls(c) for c in clients]
            cpu0, wall0 = time.process_time(), time.monotonic()
            await asyncio.sleep(seconds)
            cpu = time.process_time() - cpu0
            wall = time.monotonic() - wall0
            after = [await _evalsha_calls(c) for c in clients]
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


async def _evalsha_calls(client: redis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def main(
    urls: Sequence[str] | None,
    *,
    count: int,
    as_json: bool,
    renewal_locks: int = 0,
    renewal_seconds: float = 60.0,
) -> int:
    """Run the benchmarks and print them."""
    figures = asyncio.run(run_latency(urls, count=count, warmup=max(10, count // 10)))
    renewal = None
    if renewal_locks:
        renewal = asyncio.run(run_renewal(urls, locks=renewal_locks, seconds=renewal_seconds))
    if as_json:
        out: dict[str, object] = {"latency": [asdict(f) for f in figures]}
        if renewal is not None:
            out["renewal"] = asdict(renewal)
        print(json.dumps(out, indent=2))
    else:
        print(format_table(figures))
        if renewal is not None:
            print(renewal.table())
    return 0
