"""How long before its validity estimate ends is a holder told of a loss?

    python benchmarks/loss_margin.py [TTL ...]

5 local nodes, defaults (node_timeout 0.05 s), one auto-renewed lock in ``async with``;
then 3 of the 5 servers hang (SIGSTOP), at acquire or 0.3 x ttl later. A sampler in the
body keeps ``now + lock.remaining()``; the margin is that estimate minus the moment the
cancellation reached the body. The README promises at least the guard,
``min(ttl/5, max(3 x node_timeout, 50 ms))``: a negative margin means the body ran on
after its lock had expired.
"""

from __future__ import annotations

import asyncio
import sys
import time

from aiolock import LockLost, LockManager
from aiolock.testing import Server, redis_servers


async def margin(urls: list[str], servers: list[Server], ttl: float, hang_after: float) -> float:
    async with LockManager(urls, restart_grace=0) as locks:  # (fresh servers)
        valid_until = 0.0
        told = float("nan")
        try:
            async with locks.lock(f"margin-{ttl}-{hang_after}", ttl=ttl) as lock:
                hang_at = time.monotonic() + hang_after
                hung = False
                try:
                    while True:
                        now = time.monotonic()
                        if not hung and now >= hang_at:
                            for server in servers[:3]:
                                server.pause()
                            hung = True
                        left = lock.remaining()
                        if left > 0.0:
                            valid_until = now + left
                        await asyncio.sleep(0.002)
                except asyncio.CancelledError:
                    told = time.monotonic()
                    raise
        except LockLost:
            pass
        finally:
            for server in servers[:3]:
                server.resume()
        return valid_until - told


async def main(ttls: list[float]) -> None:
    async with redis_servers(5) as urls:
        servers = [s for s in urls.servers if isinstance(s, Server)]
        print(f"{'ttl':>6} {'hang at acquire':>16} {'hang 0.3 x ttl later':>21} {'guard':>7}")
        for ttl in ttls:
            at_acquire = await margin(list(urls), servers, ttl, 0.0)
            later = await margin(list(urls), servers, ttl, 0.3 * ttl)
            guard = min(ttl / 5, max(3 * 0.05, 0.05))
            print(
                f"{ttl:>5g}s {at_acquire * 1000:>+14.0f}ms {later * 1000:>+19.0f}ms "
                f"{guard * 1000:>5.0f}ms"
            )


if __name__ == "__main__":
    asyncio.run(main([float(a) for a in sys.argv[1:]] or [3.0, 6.0, 10.0]))
