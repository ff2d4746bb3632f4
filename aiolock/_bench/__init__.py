"""Latency benchmarks behind ``python -m aiolock bench`` and ``benchmarks/``.

The benchmarks live in this subpackage, imported only by ``python -m aiolock bench``
(never by ``import aiolock``): ``latency``, ``contention`` (tasks, processes and
waiters on one name), ``names`` (many tasks on names of their own), ``renewal``,
``semaphore`` and ``baseline`` (contention against another checkout, interleaved);
``_common`` has what they share.

Every figure is also given as a ratio to the raw PING round trip (redis-py asyncio
client) measured in the same run, so that runs on different machines compare, and each
lock cycle as a ratio to its floor (``floor``: the same round trips with nothing of a
lock in them). ``cpu`` gives the client's and the servers' CPU per cycle, next to
redis-py's own Lock.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ._common import UVLOOP_ENV, Figure, format_table, runner
from .baseline import BaselineFigures, run_baseline
from .contention import ContentionFigures, WaitersFigures, run_contention, run_waiters
from .cpu import CpuFigure, format_cpu, run_cpu
from .latency import run_latency
from .names import TASKS, run_names
from .renewal import RenewalFigures, run_renewal
from .semaphore import SemaphoreFigures, run_semaphore

__all__ = [
    "BaselineFigures",
    "ContentionFigures",
    "CpuFigure",
    "Figure",
    "RenewalFigures",
    "SemaphoreFigures",
    "main",
    "run_baseline",
    "run_contention",
    "run_cpu",
    "run_latency",
    "run_names",
    "run_renewal",
    "run_semaphore",
    "run_waiters",
]


def main(
    urls: Sequence[str] | None,
    *,
    count: int,
    as_json: bool,
    contention_seconds: float = 3.0,
    waiters: int = 1000,
    renewal_locks: int = 0,
    renewal_seconds: float = 60.0,
    semaphore_limits: Sequence[int] = (),
    use_uvloop: bool = False,
    baseline: str | None = None,
    baseline_rounds: int = 4,
) -> int:
    """Run the benchmarks and print them (only the comparison, given a ``baseline``)."""
    run = runner(use_uvloop)
    if use_uvloop:
        os.environ[UVLOOP_ENV] = "1"  # for the contention worker processes
    if baseline is not None:
        compared = run(
            run_baseline(baseline, urls, seconds=contention_seconds or 3.0, rounds=baseline_rounds)
        )
        print(json.dumps(asdict(compared), indent=2) if as_json else compared.table())
        return 0
    figures = run(run_latency(urls, count=count, warmup=max(10, count // 10)))
    ping = figures[0].median_us
    cpu = run(run_cpu(urls, cycles=count))
    contention: list[ContentionFigures] = []
    if contention_seconds > 0:
        contention = run(run_contention(urls, seconds=contention_seconds))
        for figure in contention:
            figure.ratio = figure.handoff_p50_us / ping
            figure.cross_process_ratio = figure.cross_process_p50_us / ping
    names = run(run_names(urls, seconds=contention_seconds)) if contention_seconds > 0 else None
    waiting = run(run_waiters(urls, waiters=waiters)) if waiters else None
    renewal = None
    if renewal_locks:
        renewal = run(run_renewal(urls, locks=renewal_locks, seconds=renewal_seconds))
    semaphore = run(run_semaphore(urls, limits=semaphore_limits)) if semaphore_limits else []
    report = _Report(figures, cpu, contention, names, waiting, renewal, semaphore)
    print(json.dumps(report.as_dict(), indent=2) if as_json else report.table())
    return 0


@dataclass
class _Report:
    """What one ``bench`` run measured (absent: not run)."""

    latency: list[Figure]
    cpu: list[CpuFigure]
    contention: list[ContentionFigures]
    names: float | None
    waiters: WaitersFigures | None
    renewal: RenewalFigures | None
    semaphore: list[SemaphoreFigures]

    def as_dict(self) -> dict[str, object]:
        """The figures as JSON objects."""
        out: dict[str, object] = {
            "latency": [asdict(f) for f in self.latency],
            "cpu": [asdict(f) for f in self.cpu],
            "contention": [asdict(f) for f in self.contention],
        }
        if self.names is not None:
            out["names"] = {"tasks": TASKS, "cycles_per_second": self.names}
        if self.waiters is not None:
            out["waiters"] = asdict(self.waiters)
        if self.renewal is not None:
            out["renewal"] = asdict(self.renewal)
        if self.semaphore:
            out["semaphore"] = [asdict(f) for f in self.semaphore]
        return out

    def table(self) -> str:
        """The figures as the table a person reads."""
        lines = [
            format_table(self.latency),
            format_cpu(self.cpu),
            *(figure.row() for figure in self.contention),
        ]
        if self.names is not None:
            lines.append(f"{TASKS} tasks on {TASKS} names, 1 process: {self.names:.0f} cycles/s")
        if self.waiters is not None:
            lines.append(self.waiters.row())
        if self.renewal is not None:
            lines.append(self.renewal.table())
        lines.extend(one.row() for one in self.semaphore)
        return "\n".join(lines)
