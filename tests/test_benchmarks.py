"""Every script in ``benchmarks/`` runs to its end, on the smallest work it takes.

A benchmark that nobody runs for a while breaks without a sound (a manager left with
the restart quarantine on fresh servers, say): each one runs here, briefly, and must
exit cleanly having printed its figures. Two are only started: ``instructions.py``
runs its client under callgrind (a minute even for one cycle) and ``peers.py`` needs
the peers' libraries; ``nox -s peers`` runs the latter whole.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

#: Each script's arguments for a short run, and a word its output must hold.
RUNS: dict[str, tuple[list[str], str]] = {
    "contention_shapes.py": (["--seconds", "0.3", "1x2", "2x1"], "across processes"),
    "fencing_cost.py": (["--calls", "50", "--rounds", "1"], "with fencing"),
    "grant_cost.py": (["--calls", "10"], "a grant"),
    "instructions.py": (["--help"], "callgrind"),
    "latency.py": (["--count", "10", "--contention-seconds", "0", "--waiters", "0"], "cycle5"),
    "loss_margin.py": (["0.5"], "guard"),
    "path.py": (["--nodes", "1"], "acquire on 1 nodes"),
    "peers.py": (["--help"], "--rounds"),
    "renewal_command.py": (["--calls", "50"], "IFEQ"),
    "renewal_hol.py": (["50", "0.5"], "still owned"),
    "server_cost.py": (["--cycles", "100"], "in the scripts"),
    "service.py": (["--seconds", "0.3", "--rounds", "1"], "req/s"),
}


def test_every_benchmark_script_has_a_short_run() -> None:
    assert sorted(RUNS) == sorted(path.name for path in BENCHMARKS.glob("*.py"))


@pytest.mark.parametrize("script", sorted(RUNS))
def test_a_benchmark_script_runs_to_its_end(script: str) -> None:
    args, word = RUNS[script]
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert word in result.stdout, result.stdout[-3000:]
