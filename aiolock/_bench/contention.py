"""Contention: tasks and processes on one name; many waiters on one name."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as redis

from .._manager import LockManager
from ._common import UVLOOP_ENV, evalsha_calls, p50_p99, runner, servers_or
from .floor import Floor

#: Handoff floors measured after the contention runs (their p50 is the figure's).
HANDOFF_FLOORS = 300


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
    #: The floor of a handoff between processes (floor.py: a PUBLISH heard, then a
    #: script's fan-out), p50 on the same nodes, and the handoff's ratio to it.
    cross_process_floor_us: float = 0.0
    cross_process_floor_ratio: float = 0.0
    #: The same floor carrying the servers' work (floor.py: ``RELEASE_TURN`` granting
    #: the lock, heard by a majority), p50, and the handoff's ratio to it: what the
    #: client and the machine's load add.
    cross_process_scripts_us: float = 0.0
    cross_process_scripts_ratio: float = 0.0

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
                f"p50 {self.cross_process_p50_us:.0f} µs ({self.cross_process_ratio:.2f} x ping, "
                f"{self.cross_process_floor_ratio:.2f} x its floor of "
                f"{self.cross_process_floor_us:.0f} µs, {self.cross_process_scripts_ratio:.2f} x "
                f"its scripts' of {self.cross_process_scripts_us:.0f} µs) "
                f"p99 {self.cross_process_p99_us:.0f} µs; fairness {self.fairness:.2f}"
            )
        return row


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
    p50, p99 = p50_p99(handoffs)
    cross_p50, cross_p99 = p50_p99(crossing)
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
    async with servers_or(urls, 5) as nodes:
        clients = [redis.Redis.from_url(url) for url in nodes]

        async def scripts() -> int:
            return sum([await evalsha_calls(client) for client in clients])

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
            # Each worker writes its sections (often over 64 KiB of JSON) to a file of its
            # own, read whole once it has exited: no pipe through the event loop's
            # subprocess transport, whichever loop runs the bench.
            outputs = [os.path.join(tmp, f"sections-{i}.json") for i in range(4)]
            procs = [
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "aiolock._bench",
                    "contend",
                    str(seconds),
                    counter,
                    output,
                    *nodes,
                )
                for output in outputs
            ]
            sections = []
            for proc, output in zip(procs, outputs, strict=True):
                if await proc.wait():  # pragma: no cover
                    raise RuntimeError("a contention worker process failed")
                with open(output, "rb") as f:  # noqa: ASYNC230
                    sections.extend((a, b, c) for a, b, c in json.load(f))
            out.append(_analyse("4 processes x 4 tasks", 4, 4, sections, _read(counter)))
            out[-1].scripts_per_section = (await scripts() - before) / max(1, len(sections))
        floor = await Floor.open(nodes)
        try:
            floor_us = p50_p99(await floor.handoffs(nodes[0], HANDOFF_FLOORS))[0]
            await floor.load_scripts()
            scripts_us = p50_p99(await floor.grants(HANDOFF_FLOORS))[0]
        finally:
            floor.close()
        crossing = out[-1]
        crossing.cross_process_floor_us = floor_us
        crossing.cross_process_floor_ratio = crossing.cross_process_p50_us / floor_us
        crossing.cross_process_scripts_us = scripts_us
        crossing.cross_process_scripts_ratio = crossing.cross_process_p50_us / scripts_us
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
    async with servers_or(urls, 5) as nodes, LockManager(nodes, restart_grace=0) as locks:
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
            before = sum([await evalsha_calls(c) for c in clients])
            started = time.monotonic()
            await holder.release()
            await asyncio.gather(*tasks)
            seconds = time.monotonic() - started
            after = sum([await evalsha_calls(c) for c in clients])
        finally:
            for client in clients:
                await client.aclose()
        return WaitersFigures(
            waiters=waiters,
            handoffs=waiters,
            commands_per_handoff_per_node=(after - before) / waiters / len(nodes),
            seconds=seconds,
        )


def worker_main(argv: Sequence[str]) -> int:
    """One worker of the 4 x 4 run: contend, then write the sections to ``output``."""
    seconds, counter, output, *nodes = argv
    run = runner(os.environ.get(UVLOOP_ENV) == "1")
    sections = run(_contend(nodes, "bench:contention:4", 4, float(seconds), counter))
    with open(output, "w") as f:
        json.dump(sections, f)
    return 0
