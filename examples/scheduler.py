"""A campaigning scheduler: of several instances, only the elected leader runs the jobs.

    python examples/scheduler.py                      # embedded servers
    python examples/scheduler.py redis://h1:6379 ...   # your nodes

Three instances campaign for "scheduler"; the leader ticks (runs its periodic jobs)
and stamps each with its term, the lock's fencing token. One instance is shut down
while leading, and another takes over. At the end the ticks are checked: never two
leaders at once, and terms only grow.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time

import aiolock
from aiolock.testing import redis_servers

TICK = 0.05


async def instance(
    urls: list[str],
    who: str,
    ticks: list[tuple[float, str, int]],
    stop: asyncio.Event,
    grace: float | None,
) -> None:
    async def lead(term: aiolock.Lock) -> None:
        assert term.fencing_token is not None
        print(f"{who} elected, term {term.fencing_token}", flush=True)
        while True:  # the scheduler's loop: runs until leadership is lost or we stop
            ticks.append((time.monotonic(), who, term.fencing_token))
            await asyncio.sleep(TICK)

    async with aiolock.LockManager(urls, restart_grace=grace) as locks:
        campaign = asyncio.create_task(locks.campaign("scheduler", lead, ttl=1.0))
        await stop.wait()
        campaign.cancel()  # shutting down: the leader releases on the way out
        await asyncio.gather(campaign, return_exceptions=True)


async def main(urls: list[str], grace: float | None = None) -> None:
    ticks: list[tuple[float, str, int]] = []
    stops = {who: asyncio.Event() for who in ("a", "b", "c")}
    tasks = [
        asyncio.create_task(instance(urls, who, ticks, stop, grace)) for who, stop in stops.items()
    ]
    await asyncio.sleep(1.0)
    leader = ticks[-1][1]
    print(f"shutting down {leader}, the leader", flush=True)
    stops[leader].set()
    await asyncio.sleep(1.0)
    for stop in stops.values():
        stop.set()
    await asyncio.gather(*tasks)
    leaders = [who for _, who, _ in ticks]
    terms = [term for _, _, term in ticks]
    assert terms == sorted(terms), "a tick of an older term came after a newer one"
    changes = sum(1 for x, y in itertools.pairwise(leaders) if x != y)
    assert changes >= 1, "nobody took over"
    assert leaders[-1] != leader
    print(f"{len(ticks)} ticks in {len(set(terms))} terms: never two leaders at once")


async def embedded() -> None:
    async with redis_servers(3) as urls:
        # restart_grace=0: these servers were started empty by this script a moment ago.
        await main(list(urls), grace=0)


if __name__ == "__main__":
    if sys.argv[1:]:
        asyncio.run(main(sys.argv[1:]))
    else:
        asyncio.run(embedded())
