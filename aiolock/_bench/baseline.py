"""Contention figures of this code and of a baseline, interleaved in one run.

``python -m aiolock bench --baseline PATH`` runs the contention benchmark (16 tasks in
one process, then 4 processes x 4 tasks, on 5 nodes) alternately with this code and
with the baseline's, on the same servers, ``rounds`` times each (each side first in every
other round: an even number of rounds is balanced), and reports the medians
and their ratios: a change's effect from one run, not from two runs on a VM whose load
moves. ``PATH`` is a checkout (a directory with ``aiolock/``: a ``git worktree`` of the
commit to compare with) or a Python interpreter that has another aiolock installed.
Both sides run the same way: a subprocess that prints its figures as JSON.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import names
from ._common import pinger, servers_or, timed

__all__ = ["BaselineFigures", "run_baseline"]

#: What a side runs: the contention benchmark of whichever aiolock it imports, then
#: this code's many-names run (public API only) with that aiolock.
_SIDE = (
    "from __future__ import annotations\nimport asyncio, time\nfrom aiolock import LockManager\n"
    + f"TASKS = {names.TASKS}\n"
    + inspect.getsource(names.many_names)
    + """
import json, sys
from dataclasses import asdict
from aiolock._bench.contention import run_contention
seconds, nodes = float(sys.argv[1]), sys.argv[2:]
figures = [asdict(f) for f in asyncio.run(run_contention(nodes, seconds=seconds))]
figures.append(asyncio.run(many_names(nodes, seconds)))
print(json.dumps(figures))
"""
)

#: The figures compared, by (run index, field).
FIGURES = (
    ("16 tasks, 1 process: critical sections/s", 0, "per_second"),
    ("16 tasks, 1 process: scripts per section", 0, "scripts_per_section"),
    ("4 x 4 tasks: sections/s", 1, "per_second"),
    ("4 x 4 tasks: handoff between processes p50 (x PING)", 1, "cross_process_p50_us"),
    ("4 x 4 tasks: scripts per section", 1, "scripts_per_section"),
    ("4 x 4 tasks: fairness (fewest / mean)", 1, "fairness"),
    (f"{names.TASKS} tasks on {names.TASKS} names, 1 process: cycles/s", 2, "per_second"),
    ("overlaps (all runs)", -1, "overlaps"),
)


@dataclass
class BaselineFigures:
    """The medians of each figure, this code's and the baseline's."""

    baseline: str
    rounds: int
    ping_us: float
    rows: list[dict[str, object]]

    def table(self) -> str:
        """The comparison as text."""
        lines = [
            f"# this code against {self.baseline}, {self.rounds} interleaved rounds, "
            f"PING {self.ping_us:.0f} µs",
            f"{'figure':<52} {'this':>9} {'baseline':>9} {'ratio':>7}",
        ]
        lines.extend(
            f"{row['figure']!s:<52} {row['this']:>9.2f} {row['baseline']:>9.2f} "
            f"{row['ratio']:>7.2f}"
            for row in self.rows
        )
        return "\n".join(lines)


def _side_command(baseline: str | None) -> tuple[list[str], dict[str, str], str | None]:
    env = dict(os.environ)
    if baseline is None:  # this code: the package this module belongs to
        root = str(Path(__file__).resolve().parent.parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        return [sys.executable], env, root
    path = Path(baseline)
    if path.is_dir():
        if not (path / "aiolock" / "__init__.py").is_file():
            raise ValueError(f"--baseline {baseline}: no aiolock/ package in that directory")
        env["PYTHONPATH"] = str(path.resolve())
        return [sys.executable], env, str(path.resolve())
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ValueError(f"--baseline {baseline}: neither a checkout nor a Python interpreter")
    return [str(path)], env, None


async def _side(
    baseline: str | None, nodes: Sequence[str], seconds: float
) -> list[dict[str, float]]:
    command, env, cwd = _side_command(baseline)
    proc = await asyncio.create_subprocess_exec(
        *command, "-c", _SIDE, str(seconds), *nodes,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=cwd,
    )  # fmt: skip
    out, err = await proc.communicate()
    if proc.returncode:
        side = baseline or "this code"
        raise RuntimeError(f"contention run of {side} failed:\n{err.decode()[-2000:]}")
    runs: list[dict[str, float]] = json.loads(out)
    return runs


def _value(runs: list[dict[str, float]], index: int, field: str, ping: float) -> float:
    if index < 0:
        return sum(run[field] for run in runs)
    value = runs[index][field]
    return value / ping if field.endswith("_us") else value


async def run_baseline(
    baseline: str, urls: Sequence[str] | None = None, *, seconds: float = 3.0, rounds: int = 4
) -> BaselineFigures:
    """Alternate contention runs of this code and of ``baseline``; medians and ratios."""
    import redis.asyncio as redis  # noqa: PLC0415 - as the other benchmarks

    async with servers_or(urls, 5) as nodes:
        client = redis.Redis.from_url(nodes[0])
        try:
            pings = await timed(pinger(client), 500, 50)
        finally:
            await client.aclose()
        ping = statistics.median(pings) * 1e6
        this: list[list[dict[str, float]]] = []
        base: list[list[dict[str, float]]] = []
        for i in range(rounds):
            # Each side goes first in every other round: whichever runs second in a round
            # measured 5 to 7 % more sections a second, whichever code it was.
            if i % 2:
                base.append(await _side(baseline, nodes, seconds))
                this.append(await _side(None, nodes, seconds))
            else:
                this.append(await _side(None, nodes, seconds))
                base.append(await _side(baseline, nodes, seconds))
    rows: list[dict[str, object]] = []
    for label, index, field in FIGURES:
        mine = statistics.median(_value(runs, index, field, ping) for runs in this)
        theirs = statistics.median(_value(runs, index, field, ping) for runs in base)
        rows.append(
            {
                "figure": label,
                "this": mine,
                "baseline": theirs,
                "ratio": mine / theirs if theirs else float("nan"),
                "this_runs": [_value(runs, index, field, ping) for runs in this],
                "baseline_runs": [_value(runs, index, field, ping) for runs in base],
            }
        )
    exact = [all(run["counter_exact"] for runs in side for run in runs) for side in (this, base)]
    rows.append(
        {"figure": "counter exact (all runs)", "this": float(exact[0]), "baseline": float(exact[1]),
         "ratio": 1.0}
    )  # fmt: skip
    return BaselineFigures(baseline, rounds, ping, rows)
