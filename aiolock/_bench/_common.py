"""What the benchmarks share: figures, timing, the servers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import redis.asyncio as redis

from ..testing import redis_servers


@dataclass
class Figure:
    """One measured latency: median and p99 in microseconds, and its ratios.

    ``ratio`` is to PING; ``floor_ratio``, for a lock cycle (and the floor with its
    scripts), to the floor of the same round trips; ``scripts_ratio``, for a lock cycle,
    to the same round trips carrying its scripts: what the client adds (floor.py).
    """

    name: str
    samples: int
    median_us: float
    p99_us: float
    ratio: float = 0.0
    floor_ratio: float | None = None
    scripts_ratio: float | None = None

    def row(self) -> str:
        """A table row."""
        return (
            f"{self.name:<28} {self.samples:>7} {self.median_us:>10.1f} {self.p99_us:>10.1f}"
            f" {self.ratio:>8.2f}"
            + (f" {self.floor_ratio:>8.2f}" if self.floor_ratio is not None else "")
            + (f" {self.scripts_ratio:>9.2f}" if self.scripts_ratio is not None else "")
        )


def make_figure(name: str, samples: Sequence[float]) -> Figure:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return Figure(name, len(ordered), statistics.median(ordered) * 1e6, p99 * 1e6)


def pinger(client: redis.Redis) -> Callable[[], Awaitable[object]]:
    """``client.ping`` as an op for :func:`timed`.

    Some redis-py lines annotate it ``Awaitable | bool`` (the sync and asyncio clients
    share the command's signature): awaited through ``Any``, it types on every line.
    """

    async def ping() -> None:
        reply: Any = client.ping()
        await reply

    return ping


async def timed(op: Callable[[], Awaitable[object]], count: int, warmup: int) -> list[float]:
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
async def servers_or(urls: Sequence[str] | None, n: int) -> AsyncIterator[Sequence[str]]:
    if urls:
        yield urls
    else:
        async with redis_servers(n) as servers:
            yield servers


def format_table(figures: Sequence[Figure]) -> str:
    """The figures as a text table, with the machine described."""
    head = (
        f"{'figure':<28} {'samples':>7} {'median µs':>10} {'p99 µs':>10} {'x ping':>8}"
        f" {'x floor':>8} {'x scripts':>9}"
    )
    loop = "uvloop" if os.environ.get(UVLOOP_ENV) == "1" else "asyncio"
    machine = (
        f"# {platform.python_implementation()} {platform.python_version()} on "
        f"{platform.machine()}, {os.cpu_count()} CPUs, {loop} event loop"
    )
    return "\n".join([machine, head, "-" * len(head), *(f.row() for f in figures)])


def p50_p99(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values) or [0.0]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1e6, p99 * 1e6


async def evalsha_calls(client: redis.Redis) -> int:
    # Every command aiolock sends is a script (EVALSHA, or EVAL after a flush).
    stats = await client.info("commandstats")
    return sum(int(stats.get(n, {}).get("calls", 0)) for n in ("cmdstat_evalsha", "cmdstat_eval"))


# -- contention ------------------------------------------------------------------------


UVLOOP_ENV = "AIOLOCK_BENCH_UVLOOP"
_T = TypeVar("_T")


def runner(use_uvloop: bool) -> Callable[[Coroutine[Any, Any, _T]], _T]:
    """``asyncio.run``, or ``uvloop.run`` (``pip install uvloop``)."""
    if not use_uvloop:
        return asyncio.run
    import uvloop  # noqa: PLC0415 - optional

    return cast(Callable[[Coroutine[Any, Any, _T]], _T], uvloop.run)
