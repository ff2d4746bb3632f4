"""What a big renewal tick costs the acquires of the same manager.

    python benchmarks/renewal_hol.py [LOCKS] [SECONDS]

The renewal shares each node's one ordered connection with acquires and releases (so
that nothing of ours lands after a later command of ours), and sends a big batch one
chunk (up to 1,000 locks) at a time per node. This holds LOCKS auto-renewed
locks (default 10,000, ttl 3 s: a batch every second) on 5 local nodes and times
acquire+release cycles of another lock for SECONDS (default 8): median, p99, p99.9 and
the worst, in microseconds. Run it from a checkout (``PYTHONPATH=.``) to compare two.
"""

from __future__ import annotations

import asyncio
import sys
import time

from aiolock import LockManager
from aiolock.testing import redis_servers


async def main(count: int, seconds: float) -> None:
    async with redis_servers(5) as urls, LockManager(urls, restart_grace=0) as locks:
        held = [locks.lock(f"held:{i}", ttl=3.0) for i in range(count)]
        for start in range(0, count, 500):  # not all at once: a storm of its own
            await asyncio.gather(*(h.acquire(timeout=0) for h in held[start : start + 500]))
        probe = locks.lock("probe", ttl=3.0, auto_renew=False)
        samples: list[float] = []
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            began = time.perf_counter()
            await probe.acquire(timeout=0)
            await probe.release()
            samples.append((time.perf_counter() - began) * 1e6)
        samples.sort()

        def at(share: float) -> float:
            return samples[int(share * (len(samples) - 1))]

        owned = sum(h.owned for h in held)
        print(
            f"{count} renewed locks: {len(samples)} cycles, median {at(0.5):.0f} us, "
            f"p99 {at(0.99):.0f} us, p99.9 {at(0.999):.0f} us, worst {samples[-1]:.0f} us; "
            f"{owned} of {count} still owned"
        )
        for start in range(0, count, 500):
            await asyncio.gather(*(h.release() for h in held[start : start + 500]))


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(int(args[0]) if args else 10_000, float(args[1]) if len(args) > 1 else 8.0))
