"""What contention on one name costs, by its shape: processes x tasks per process.

    python benchmarks/contention_shapes.py [--seconds S] [SHAPE ...]

SHAPE is ``PxT`` (default: 1x2 1x4 1x16 2x1 4x1 2x4 4x4). On 5 embedded nodes, P
processes of T tasks each take one name in turn for S seconds (3 by default), each
critical section one loop iteration long, as ``python -m aiolock bench``'s contention
runs do (``aiolock/_bench/contention.py``). For each shape: critical sections a second,
the scripts the nodes ran per section and per node (``INFO commandstats``), and, across
processes, the handoff's p50 beside its floor (a PUBLISH heard, then a script's
fan-out, measured right after on the same nodes) and beside the same floor carrying
the handoff's own script (``RELEASE_TURN`` granting the lock, heard by a majority).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

import redis.asyncio as redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiolock._bench._common import evalsha_calls, p50_p99
from aiolock._bench.contention import _analyse, _read
from aiolock._bench.floor import Floor
from aiolock.testing import redis_servers

#: One worker process: contend with T tasks, then write its sections to a file.
WORKER = (
    "import asyncio, json, sys\n"
    "from aiolock._bench.contention import _contend\n"
    "seconds, counter, output, tasks, name, *nodes = sys.argv[1:]\n"
    "sections = asyncio.run(_contend(nodes, name, int(tasks), float(seconds), counter))\n"
    "json.dump(sections, open(output, 'w'))\n"
)


#: The shapes run when none is named.
SHAPES = ["1x2", "1x4", "1x16", "2x1", "4x1", "2x4", "4x4"]


def _files(tmp: str, processes: int) -> tuple[str, list[str]]:
    """The shared counter (empty) and each worker's output file."""
    counter = os.path.join(tmp, "counter")
    Path(counter).write_bytes(b"")
    return counter, [os.path.join(tmp, f"sections-{i}.json") for i in range(processes)]


def _sections(outputs: list[str]) -> list[tuple[float, float, int]]:
    """Every worker's critical sections: (entered, left, process id)."""
    return [(a, b, c) for out in outputs for a, b, c in json.loads(Path(out).read_text())]


async def shape(nodes: list[str], processes: int, tasks: int, seconds: float) -> str:
    """One run of ``processes`` x ``tasks``, as a line of figures."""
    clients = [redis.Redis.from_url(url) for url in nodes]
    name = f"shape:{processes}x{tasks}"
    with tempfile.TemporaryDirectory(prefix="aiolock-shapes-") as tmp:
        counter, outputs = _files(tmp, processes)
        before = sum([await evalsha_calls(client) for client in clients])
        workers = [
            await asyncio.create_subprocess_exec(
                sys.executable, "-c", WORKER, str(seconds), counter, output, str(tasks), name,
                *nodes,
            )
            for output in outputs
        ]  # fmt: skip
        for worker in workers:
            if await worker.wait():
                raise RuntimeError(f"a worker of {processes}x{tasks} failed")
        scripts = sum([await evalsha_calls(client) for client in clients]) - before
        sections = _sections(outputs)
        figures = _analyse(name, processes, tasks, sections, _read(counter))
    for client in clients:
        await client.aclose()
    line = (
        f"{processes}x{tasks:<3} {figures.per_second:>6.0f} sections/s, "
        f"{scripts / len(nodes) / max(1, figures.sections):.2f} scripts per section per node, "
        f"{figures.overlaps} overlaps"
    )
    if processes > 1:
        floor = await Floor.open(nodes)
        try:
            floor_us = p50_p99(await floor.handoffs(nodes[0], 300))[0]
            await floor.load_scripts()
            grants_us = p50_p99(await floor.grants(300))[0]
        finally:
            floor.close()
        line += (
            f"; across processes {figures.cross_process_handoffs} handoffs, p50 "
            f"{figures.cross_process_p50_us:.0f} µs = {figures.cross_process_p50_us / floor_us:.2f}"
            f" x its floor ({floor_us:.0f} µs), {figures.cross_process_p50_us / grants_us:.2f}"
            f" x with its script ({grants_us:.0f} µs), fairness {figures.fairness:.2f}"
        )
    return line


async def main(shapes: list[tuple[int, int]], seconds: float) -> None:
    async with redis_servers(5) as nodes:
        for processes, tasks in shapes:
            print(await shape(nodes, processes, tasks, seconds), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("shapes", nargs="*", default=SHAPES)
    args = parser.parse_args()
    chosen = [tuple(int(n) for n in text.split("x")) for text in args.shapes]
    asyncio.run(main([(p, t) for p, t in chosen], args.seconds))
