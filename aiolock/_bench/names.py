"""Many tasks on many names: a node's requests crowd each loop iteration.

A busy service takes a lock per request, each of its own name: here 100 tasks run
acquire + release cycles on 100 names of 5 nodes, with no contention. This is where a
node's writes are coalesced (see ``_io/node.py``). :func:`many_names` uses the public API
only, so that ``bench --baseline`` runs this very function with the other aiolock too
(baseline.py puts its source after ``from aiolock import LockManager``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from .._manager import LockManager
from ._common import servers_or

#: Tasks, each with a name of its own.
TASKS = 100


async def many_names(nodes: Sequence[str], seconds: float, tasks: int = TASKS) -> dict[str, float]:
    """``tasks`` tasks, each acquiring and releasing a lock of its own, for ``seconds``.

    Returns the cycles per second, as a run of the contention benchmark would
    (``per_second``; no overlaps possible, the counter exact by construction).
    """
    cycles = 0
    # A throughput figure, not a failover's: on a loaded machine (the test suite beside
    # it) a loop stalled past the default 50 ms would fail a release and end the run.
    async with LockManager(nodes, restart_grace=0, node_timeout=1.0) as locks:
        stop = time.monotonic() + seconds

        async def task(i: int) -> None:
            nonlocal cycles
            lock = locks.lock(f"bench:names:{i}", ttl=10, auto_renew=False)
            while time.monotonic() < stop:
                if await lock.acquire(timeout=5):
                    await lock.release()
                    cycles += 1

        await asyncio.gather(*(task(i) for i in range(tasks)))
    return {"per_second": cycles / seconds, "tasks": tasks, "overlaps": 0, "counter_exact": True}


async def run_names(urls: Sequence[str] | None = None, *, seconds: float = 3.0) -> float:
    """:func:`many_names` on ``urls`` (default: 5 embedded nodes); cycles per second."""
    async with servers_or(urls, 5) as nodes:
        return (await many_names(nodes, seconds))["per_second"]
