"""A waiting process for tests/turns/ and tests/test_grants.py.

    python tests/turns_worker.py NAME TASKS URL [URL ...]

Runs ``TASKS`` tasks that each acquire the lock ``NAME`` once (ttl 30 s, no renewal),
leave it at once, and print one JSON line per critical section: ``[entered, left,
pid]`` on the system-wide monotonic clock. Prints ``waiting`` (and flushes) once every
task has made its first try. Restart quarantine off: the servers are the test's own.
With ``AIOLOCK_TEST_NO_OFFERS=1`` the process leaves no offer with its entry in line:
releases name it instead of granting it the lock (see aiolock/_waiting/grants.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import aiolock._waiting.turns
from aiolock import LockManager

if os.environ.get("AIOLOCK_TEST_NO_OFFERS") == "1":
    aiolock._waiting.turns.Turns.offer = lambda _self, _key, _taker, **_: ()  # type: ignore[method-assign]


async def main(name: str, tasks: int, urls: list[str]) -> None:
    pid = os.getpid()
    async with LockManager(urls, restart_grace=0) as locks:
        sections: list[tuple[float, float, int]] = []

        async def task() -> None:
            lock = locks.lock(name, ttl=30, auto_renew=False)
            if not await lock.acquire(timeout=120):
                raise RuntimeError("turns worker: acquire timed out")
            entered = time.monotonic()
            await asyncio.sleep(0)
            sections.append((entered, time.monotonic(), pid))
            await lock.release()

        running = [asyncio.create_task(task()) for _ in range(tasks)]
        await asyncio.sleep(0.3)  # every task has tried once, or queues behind one that did
        print("waiting", flush=True)
        await asyncio.gather(*running)
        for section in sections:
            print(json.dumps(section))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
