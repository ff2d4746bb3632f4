"""The smallest useful program: three workers, one job, embedded servers.

python examples/basic.py
"""

from __future__ import annotations

import asyncio

import aiolock
from aiolock.testing import redis_servers


async def worker(locks: aiolock.LockManager, wid: int, done: list[int]) -> None:
    try:
        async with locks.lock("nightly-report", ttl=10.0, timeout=0):
            print(f"worker {wid}: building the report")
            await asyncio.sleep(0.2)
            done.append(wid)
    except aiolock.LockTimeout:
        print(f"worker {wid}: someone else is on it")


async def main() -> None:
    # restart_grace=0: the servers were started empty by this script a moment ago. Against
    # long-running servers keep the default: a restarted node then waits out its quarantine.
    async with redis_servers(3) as urls, aiolock.LockManager(urls, restart_grace=0) as locks:
        done: list[int] = []
        await asyncio.gather(*(worker(locks, w, done) for w in range(3)))
        assert len(done) == 1, done
        print(f"report built once, by worker {done[0]}")


if __name__ == "__main__":
    asyncio.run(main())
