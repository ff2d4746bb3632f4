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

__all__ = ["Figure", "run_latency"]


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


def to_json(figures: Sequence[Figure]) -> str:
    """The figures as JSON."""
    return json.dumps([asdict(f) for f in figures], indent=2)


def main(urls: Sequence[str] | None, *, count: int, as_json: bool) -> int:
    """Run the benchmarks and print them."""
    figures = asyncio.run(run_latency(urls, count=count, warmup=max(10, count // 10)))
    print(to_json(figures) if as_json else format_table(figures))
    return 0
