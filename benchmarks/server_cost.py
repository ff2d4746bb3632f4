"""Server CPU per lock cycle, as aiolock issues it: what a busy lock server pays.

    python benchmarks/server_cost.py [--cycles 20000]

One embedded node. Runs uncontended acquire+release cycles through a LockManager and
reads the server's own CPU time (INFO cpu: user + system, so the network work is in
it) before and after; a PING loop gives the floor of one request, and INFO
commandstats the part spent in the scripts. Rounds are interleaved and the median
reported, as the figures move with how busy the machine is.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Awaitable, Callable

import redis.asyncio as redis

import aiolock
from aiolock.testing import redis_servers

ROUNDS = 5


async def server_cpu(client: redis.Redis) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def per_call(client: redis.Redis, op: Callable[[], Awaitable[object]], n: int) -> float:
    """Server CPU µs per ``op``."""
    before = await server_cpu(client)
    for _ in range(n):
        await op()
    return (await server_cpu(client) - before) / n * 1e6


async def script_usec(client: redis.Redis) -> float:
    stats = await client.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec", 0))


async def main(cycles: int) -> None:
    async with redis_servers(1) as urls:
        client = redis.Redis.from_url(urls[0])
        # A fresh server: no restart quarantine (it never held a lock).
        locks = aiolock.LockManager(urls, restart_grace=0)
        try:
            await locks.__aenter__()
            lock = locks.lock("bench:server-cost", ttl=10, auto_renew=False)

            async def cycle() -> None:
                await lock.acquire(timeout=0)
                await lock.release()

            ping: list[float] = []
            cycles_cpu: list[float] = []
            scripts: list[float] = []
            n = cycles // ROUNDS
            for _ in range(ROUNDS):
                ping.append(await per_call(client, client.ping, n))
                before = await script_usec(client)
                cycles_cpu.append(await per_call(client, cycle, n))
                scripts.append((await script_usec(client) - before) / n)
            print(f"PING (one request)          {statistics.median(ping):7.1f} µs server CPU")
            print(
                f"acquire+release (2 scripts) {statistics.median(cycles_cpu):7.1f} µs server CPU,"
                f" of which {statistics.median(scripts):.1f} µs in the scripts"
            )
        finally:
            await locks.aclose()
            await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=20000)
    asyncio.run(main(parser.parse_args().cycles))
