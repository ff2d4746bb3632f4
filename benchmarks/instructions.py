"""Client instructions per lock cycle, counted by callgrind: a figure that barely moves.

    python benchmarks/instructions.py [--baseline CHECKOUT] [--nodes 1 5] [--tasks 64]
                                      [--auto-renew]

CPU time per cycle moves by 15 % or more between runs on a shared machine; the
instructions the client executes much less: the same count to 0.1 % run after run on
an idle machine (a busy one changes how many replies each read of the loop finds, and
so the count, by a few per cent: compare sides measured in one run).

Each figure runs a client under ``valgrind --tool=callgrind`` (``apt-get install
valgrind``) against embedded servers (other processes: not counted). 64 tasks
(``--tasks``; 1 for the cycle on its own, as the latency figures run it) each run
acquire + release cycles on fresh names; the count of a run of 2 cycles per task is
taken from that of 12 per task, so start-up and warm-up cancel out. The floor (two
PING fan-outs per cycle, ``aiolock/_bench/floor.py``) is counted the same way.
``--baseline``: a checkout (``git worktree add``) counted beside this one.
``--auto-renew``: the locks renewed in the background, as the API's default has them
(the figures otherwise leave renewal out, as the latency figures do).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aiolock.testing import redis_servers  # noqa: E402

#: Cycles per task of the two runs whose difference is counted.
SHORT, LONG = 2, 12

_CLIENT = """
import asyncio, sys, time
sys.path.insert(0, sys.argv[1])
kind, tasks, cycles, renew = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
urls = sys.argv[6:]

async def main():
    if kind == "floor":
        from aiolock._bench.floor import Floor
        floor = await Floor.open(urls)
        cycle = lambda _name: floor.cycle()
    else:
        from aiolock import LockManager
        # (callgrind runs a client about 50 times slower: a node_timeout to match)
        locks = LockManager(urls, restart_grace=0, node_timeout=5.0)
        async def cycle(name):
            lock = locks.lock(name, ttl=30, auto_renew=renew == "renew")
            if await lock.acquire(timeout=0):
                await lock.release()
    async def task(i, k, tag):
        for n in range(k):
            await cycle(f"ir:{tag}:{i}:{n}")
    await asyncio.gather(*(task(i, 2, "warm") for i in range(tasks)))
    await asyncio.gather(*(task(i, cycles, time.time_ns()) for i in range(tasks)))
    if kind == "floor":
        floor.close()
    else:
        await locks.aclose()
asyncio.run(main())
"""


def count(
    checkout: Path, kind: str, tasks: int, cycles: int, urls: list[str], *, renew: bool = False
) -> int:
    """Instructions of one client run, as callgrind counts them."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        command += [sys.executable, "-c", _CLIENT, str(checkout), kind, str(tasks), str(cycles)]
        command.append("renew" if renew else "no-renew")
        subprocess.run([*command, *urls], capture_output=True, check=True)
        found = re.search(r"^(?:totals|summary): (\d+)", out.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError("callgrind wrote no total")
    return int(found.group(1))


def per_cycle(
    checkout: Path, kind: str, tasks: int, urls: list[str], *, renew: bool = False
) -> float:
    """Instructions per cycle: the long run's count less the short one's."""
    short = count(checkout, kind, tasks, SHORT, urls, renew=renew)
    long = count(checkout, kind, tasks, LONG, urls, renew=renew)
    return (long - short) / (tasks * (LONG - SHORT))


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="another checkout, counted beside")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--tasks", type=int, default=64, help="tasks cycling at once")
    parser.add_argument("--auto-renew", action="store_true", help="locks renewed (the default)")
    args = parser.parse_args(argv)
    sides = [("this", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    async with redis_servers(max(args.nodes)) as servers:
        urls = list(servers)
        print(f"# {args.tasks} tasks, auto_renew={args.auto_renew}")
        print(f"{'client instructions per cycle':<30} {'nodes':>5} {'count':>10} {'x floor':>8}")
        for n in args.nodes:
            floor = await asyncio.to_thread(per_cycle, ROOT, "floor", args.tasks, urls[:n])
            print(f"{'floor (2 PING fan-outs)':<30} {n:>5} {floor:>10,.0f} {1:>8.2f}", flush=True)
            for label, checkout in sides:
                figure = await asyncio.to_thread(
                    per_cycle, checkout, "lock", args.tasks, urls[:n], renew=args.auto_renew
                )
                print(f"{label:<30} {n:>5} {figure:>10,.0f} {figure / floor:>8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(asyncio.run(main()))
