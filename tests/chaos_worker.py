"""A chaos test worker process: contend for a few names, record every critical section.

    python tests/chaos_worker.py SECONDS TASKS NAME,NAME URL [URL ...]

Prints one JSON object per line: each critical section (name, entered, valid_until,
left, token, pid) on the system-wide monotonic clock, then a summary of errors.
Now and then a holder blocks its event loop past its lock's validity (a "paused
holder"); its section may then overlap the next holder's, which the checker allows
only after its validity ended and with a lower fencing token.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time

from aiolock import LockError, LockManager, LockNotOwned, QuorumError

TTL = 1.0


async def main(seconds: float, tasks: int, names: list[str], urls: list[str]) -> None:
    pid = os.getpid()
    errors: dict[str, int] = {}
    stop_at = time.monotonic() + seconds
    rng = random.Random(pid)

    async with LockManager(urls, node_timeout=0.05) as locks:

        async def task() -> None:
            while time.monotonic() < stop_at:
                name = rng.choice(names)
                lock = locks.lock(name, ttl=TTL, timeout=5, auto_renew=False)
                try:
                    if not await lock.acquire():
                        errors["timeout"] = errors.get("timeout", 0) + 1
                        continue
                except QuorumError:
                    errors["quorum"] = errors.get("quorum", 0) + 1
                    await asyncio.sleep(0.05)
                    continue
                entered = time.monotonic()
                valid_until = entered + lock.remaining()
                token = lock.fencing_token
                if rng.random() < 0.01:
                    time.sleep(TTL * 1.3)  # a paused holder: the whole process stalls
                else:
                    await asyncio.sleep(rng.uniform(0.001, 0.01))
                left = time.monotonic()
                print(
                    json.dumps(
                        {
                            "name": name,
                            "entered": entered,
                            "valid_until": valid_until,
                            "left": left,
                            "token": token,
                            "pid": pid,
                        }
                    ),
                    flush=True,
                )
                try:
                    await lock.release()
                except LockNotOwned:
                    errors["expired"] = errors.get("expired", 0) + 1
                except LockError as exc:
                    kind = type(exc).__name__
                    errors[kind] = errors.get(kind, 0) + 1

        await asyncio.gather(*(task() for _ in range(tasks)))
    print(json.dumps({"summary": errors, "pid": pid}), flush=True)


if __name__ == "__main__":
    seconds, tasks, names, *urls = sys.argv[1:]
    asyncio.run(main(float(seconds), int(tasks), names.split(","), urls))
