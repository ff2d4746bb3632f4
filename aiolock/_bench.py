"""Latency benchmarks behind ``python -m aiolock bench`` and ``benchmarks/``.

Every figure is also given as a ratio to the raw PING round trip (redis-py asyncio
client) measured in the same run, so that runs on different machines compare.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar, cast

import redis.asyncio as redis

from ._manager import LockManager
from .testing import Server, Servers, redis_servers

__all__ = [
    "ContentionFigures",
    "Figure",
    "RenewalFigures",
    "run_contention",
    "run_latency",
    "run_renewal",
    "run_waiters",
]


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


ROUNDS = 10


async def run_latency(
    urls: Sequence[str] | None = None, *, count: int = 2000, warmup: int = 200
) -> list[Figure]:
    """PING, cycle1, cycle5, and cycle5 with one node hung (embedded nodes only).

    The figures are measured in interleaved rounds, so that a slow spell of a shared
    machine weighs on all of them alike and their ratios stay meaningful.
    """
    per_round = max(1, count // ROUNDS)
    samples: dict[str, list[float]] = {}
    async with _nodes(urls, 5) as nodes:
        client = redis.Redis.from_url(nodes[0])
        # (A benchmark measures locks, not a restart's quarantine: no restart_grace.)
        one = LockManager(nodes[:1], restart_grace=0)
        many = LockManager(nodes, restart_grace=0)
        hung: Server | None = None
        if isinstance(nodes, Servers) and len(nodes) >= 3:
            server = nodes.servers[-1]
            assert isinstance(server, Server)  # noqa: S101
            hung = server
        try:
            lock1 = one.lock("bench:cycle", ttl=10, auto_renew=False)
            lock5 = many.lock("bench:cycle", ttl=10, auto_renew=False)

            async def cycle1() -> None:
                await lock1.acquire(timeout=0)
                await lock1.release()

            async def cycle5() -> None:
                await lock5.acquire(timeout=0)
                await lock5.release()

            name5 = f"cycle{len(nodes)}"
            for op in (client.ping, cycle1, cycle5):
                await _timed(op, warmup, 0)
            for _ in range(ROUNDS):
                for name, op in (
                    ("ping (redis-py)", client.ping),
                    ("cycle1 acquire+release", cycle1),
                    (f"{name5} acquire+release", cycle5),
                ):
                    samples.setdefault(name, []).extend(await _timed(op, per_round, 0))
                if hung is not None:
                    hung.pause()
                    try:
                        samples.setdefault(f"{name5}, 1 node hung", []).extend(
                            await _timed(cycle5, per_round, 0)
                        )
                    finally:
                        hung.resume()
        finally:
            await client.aclose()
            await one.aclose()
            await many.aclose()
    figures = [_figure(name, values) for name, values in samples.items()]
    ping = figures[0].median_us
    for figure in figures:
        figure.ratio = figure.median_us / ping
    return figures


def format_table(figures: Sequence[Figure]) -> str:
    """The figures as a text table, with the machine described."""
    head = f"{'figure':<28} {'samples':>7} {'median µs':>10} {'p99 µs':>10} {'x ping':>8}"
    loop = "uvloop" if os.environ.get(UVLOOP_ENV) == "1" else "asyncio"
    machine = (
        f"# {platform.python_implementation()} {platform.python_version()} on "
        f"{platform.machine()}, {os.cpu_count()} CPUs, {loop} event loop"
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
    async with _nodes(urls, 5) as nodes, LockManager(nodes, restart_grace=0) as manager:
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
    # Every command aiolock sends is a script (EVALSHA, or EVAL after a flush).
    stats = await client.info("commandstats")
    return sum(int(stats.get(n, {}).get("calls", 0)) for n in ("cmdstat_evalsha", "cmdstat_eval"))


# -- contention ------------------------------------------------------------------------


async def _contend(
    nodes: Sequence[str], name: str, tasks: int, seconds: float, counter: str
) -> list[tuple[float, float, int]]:
    """Run ``tasks`` tasks doing read-modify-write under one lock for ``seconds``.

    The counter is a file shared by every process; the critical section yields to
    the event loop between read and write, so that any overlap loses increments.
    Returns each critical section's (entered, leaving) times on the system-wide
    monotonic clock, comparable across processes of one machine, and its process id.
    """
    sections: list[tuple[float, float, int]] = []
    pid = os.getpid()
    async with LockManager(nodes, restart_grace=0) as locks:
        stop_at = time.monotonic() + seconds

        async def task() -> None:
            lock = locks.lock(name, ttl=10, auto_renew=False)
            while time.monotonic() < stop_at:
                if not await lock.acquire(timeout=30):  # pragma: no cover
                    raise RuntimeError("contention benchmark: acquire timed out")
                entered = time.monotonic()
                with open(counter, "r+b") as f:  # noqa: ASYNC230
                    value = int(f.read() or b"0")
                    await asyncio.sleep(0)
                    f.seek(0)
                    f.write(b"%d" % (value + 1))
                    f.truncate()
                sections.append((entered, time.monotonic(), pid))
                await lock.release()

        await asyncio.gather(*(task() for _ in range(tasks)))
    return sections


@dataclass
class ContentionFigures:
    """Throughput, handoff latency and correctness of one contention run."""

    name: str
    processes: int
    tasks: int
    sections: int
    per_second: float
    handoff_p50_us: float
    handoff_p99_us: float
    overlaps: int
    counter_exact: bool
    #: Handoffs from one process to another (all of them with one process).
    cross_process_handoffs: int = 0
    cross_process_p50_us: float = 0.0
    cross_process_p99_us: float = 0.0
    #: Critical sections of the process that had the fewest, over the mean.
    fairness: float = 1.0
    ratio: float = 0.0
    cross_process_ratio: float = 0.0
    #: Script calls on all nodes per critical section (10 at best on 5 nodes: one
    #: acquire and one release each); more is attempts that lost a race.
    scripts_per_section: float = 0.0

    def row(self) -> str:
        """A text row."""
        row = (
            f"{self.name:<24} {self.per_second:>6.0f}/s  handoff p50 {self.handoff_p50_us:>5.0f}"
            f" µs ({self.ratio:.2f} x ping) p99 {self.handoff_p99_us:>5.0f} µs  "
            f"overlaps {self.overlaps}  counter exact: {self.counter_exact}  "
            f"scripts/section {self.scripts_per_section:.1f}"
        )
        if self.processes > 1:
            row += (
                f"\n{'':<24} {self.cross_process_handoffs:>6} handoffs between processes: "
                f"p50 {self.cross_process_p50_us:.0f} µs ({self.cross_process_ratio:.2f} x ping)"
                f" p99 {self.cross_process_p99_us:.0f} µs; fairness {self.fairness:.2f}"
            )
        return row


def _p50_p99(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values) or [0.0]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1e6, p99 * 1e6


def _analyse(
    name: str,
    processes: int,
    tasks: int,
    sections: list[tuple[float, float, int]],
    counted: int,
) -> ContentionFigures:
    sections.sort()
    pairs = list(itertools.pairwise(sections))
    handoffs = [b[0] - a[1] for a, b in pairs]
    crossing = [b[0] - a[1] for a, b in pairs if a[2] != b[2]]
    overlaps = sum(1 for gap in handoffs if gap < 0)
    span = sections[-1][1] - sections[0][0] if sections else 1.0
    p50, p99 = _p50_p99(handoffs)
    cross_p50, cross_p99 = _p50_p99(crossing)
    per_process: dict[int, int] = {}
    for section in sections:
        per_process[section[2]] = per_process.get(section[2], 0) + 1
    counts = list(per_process.values()) + [0] * (processes - len(per_process))
    return ContentionFigures(
        name=name,
        processes=processes,
        tasks=tasks,
        sections=len(sections),
        per_second=len(sections) / span,
        handoff_p50_us=p50,
        handoff_p99_us=p99,
        overlaps=overlaps,
        counter_exact=counted == len(sections),
        cross_process_handoffs=len(crossing),
        cross_process_p50_us=cross_p50,
        cross_process_p99_us=cross_p99,
        fairness=min(counts) / statistics.mean(counts) if counts else 1.0,
    )


async def run_contention(
    urls: Sequence[str] | None = None, *, seconds: float = 3.0
) -> list[ContentionFigures]:
    """16 tasks in one process, then 4 processes x 4 tasks, on one name over 5 nodes."""
    out = []
    async with _nodes(urls, 5) as nodes:
        clients = [redis.Redis.from_url(url) for url in nodes]

        async def scripts() -> int:
            return sum([await _evalsha_calls(client) for client in clients])

        with tempfile.TemporaryDirectory(prefix="aiolock-bench-") as tmp:
            counter = os.path.join(tmp, "counter")
            with open(counter, "wb"):  # noqa: ASYNC230
                pass
            before = await scripts()
            sections = await _contend(nodes, "bench:contention:1", 16, seconds, counter)
            out.append(_analyse("16 tasks, 1 process", 1, 16, sections, _read(counter)))
            out[-1].scripts_per_section = (await scripts() - before) / max(1, len(sections))

            with open(counter, "wb"):  # noqa: ASYNC230
                pass
            before = await scripts()
            args = ["-m", "aiolock._bench", "contend", str(seconds), counter, *nodes]
            procs = [
                await asyncio.create_subprocess_exec(
                    sys.executable, *args, stdout=asyncio.subprocess.PIPE
                )
                for _ in range(4)
            ]
            sections = []
            for proc in procs:
                stdout, _ = await proc.communicate()
                if proc.returncode:  # pragma: no cover
                    raise RuntimeError("a contention worker process failed")
                sections.extend((a, b, c) for a, b, c in json.loads(stdout))
            out.append(_analyse("4 processes x 4 tasks", 4, 4, sections, _read(counter)))
            out[-1].scripts_per_section = (await scripts() - before) / max(1, len(sections))
        for client in clients:
            await client.aclose()
    return out


def _read(path: str) -> int:
    with open(path, "rb") as f:
        return int(f.read() or b"0")


@dataclass
class WaitersFigures:
    """Redis commands per handoff with many waiters on one name."""

    waiters: int
    handoffs: int
    commands_per_handoff_per_node: float
    seconds: float

    def row(self) -> str:
        """A text row."""
        return (
            f"{self.waiters} waiters on one name: {self.handoffs} handoffs in "
            f"{self.seconds:.2f}s, {self.commands_per_handoff_per_node:.2f} commands "
            "per handoff per node"
        )


async def run_waiters(urls: Sequence[str] | None = None, *, waiters: int = 1000) -> WaitersFigures:
    """``waiters`` tasks queue for one held name; count commands until all had it."""
    async with _nodes(urls, 5) as nodes, LockManager(nodes, restart_grace=0) as locks:
        name = "bench:waiters"
        holder = locks.lock(name, ttl=30, auto_renew=False)
        if not await holder.acquire(timeout=5):  # pragma: no cover
            raise RuntimeError("could not acquire the benchmark's lock")

        async def waiter() -> None:
            lock = locks.lock(name, ttl=30, auto_renew=False)
            if not await lock.acquire(timeout=120):  # pragma: no cover
                raise RuntimeError("waiters benchmark: acquire timed out")
            await lock.release()

        tasks = [asyncio.create_task(waiter()) for _ in range(waiters)]
        await asyncio.sleep(0.5)
        clients = [redis.Redis.from_url(url) for url in nodes]
        try:
            before = sum([await _evalsha_calls(c) for c in clients])
            started = time.monotonic()
            await holder.release()
            await asyncio.gather(*tasks)
            seconds = time.monotonic() - started
            after = sum([await _evalsha_calls(c) for c in clients])
        finally:
            for client in clients:
                await client.aclose()
        return WaitersFigures(
            waiters=waiters,
            handoffs=waiters,
            commands_per_handoff_per_node=(after - before) / waiters / len(nodes),
            seconds=seconds,
        )


def _worker_main(argv: Sequence[str]) -> int:
    seconds, counter, *nodes = argv
    run = _runner(os.environ.get(UVLOOP_ENV) == "1")
    sections = run(_contend(nodes, "bench:contention:4", 4, float(seconds), counter))
    print(json.dumps(sections))
    return 0


UVLOOP_ENV = "AIOLOCK_BENCH_UVLOOP"
_T = TypeVar("_T")


def _runner(use_uvloop: bool) -> Callable[[Coroutine[Any, Any, _T]], _T]:
    """``asyncio.run``, or ``uvloop.run`` (``pip install uvloop``)."""
    if not use_uvloop:
        return asyncio.run
    import uvloop  # noqa: PLC0415 - optional

    return cast(Callable[[Coroutine[Any, Any, _T]], _T], uvloop.run)


def main(
    urls: Sequence[str] | None,
    *,
    count: int,
    as_json: bool,
    contention_seconds: float = 3.0,
    waiters: int = 1000,
    renewal_locks: int = 0,
    renewal_seconds: float = 60.0,
    use_uvloop: bool = False,
) -> int:
    """Run the benchmarks and print them."""
    run = _runner(use_uvloop)
    if use_uvloop:
        os.environ[UVLOOP_ENV] = "1"  # for the contention worker processes
    figures = run(run_latency(urls, count=count, warmup=max(10, count // 10)))
    ping = figures[0].median_us
    contention: list[ContentionFigures] = []
    if contention_seconds > 0:
        contention = run(run_contention(urls, seconds=contention_seconds))
        for figure in contention:
            figure.ratio = figure.handoff_p50_us / ping
            figure.cross_process_ratio = figure.cross_process_p50_us / ping
    waiting = run(run_waiters(urls, waiters=waiters)) if waiters else None
    renewal = None
    if renewal_locks:
        renewal = run(run_renewal(urls, locks=renewal_locks, seconds=renewal_seconds))
    if as_json:
        out: dict[str, object] = {
            "latency": [asdict(f) for f in figures],
            "contention": [asdict(f) for f in contention],
        }
        if waiting is not None:
            out["waiters"] = asdict(waiting)
        if renewal is not None:
            out["renewal"] = asdict(renewal)
        print(json.dumps(out, indent=2))
    else:
        print(format_table(figures))
        for figure in contention:
            print(figure.row())
        if waiting is not None:
            print(waiting.row())
        if renewal is not None:
            print(renewal.table())
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["contend"]:
        sys.exit(_worker_main(sys.argv[2:]))
