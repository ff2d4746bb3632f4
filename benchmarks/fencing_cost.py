"""Server-side cost of fencing: CPU per acquire+release, with and without the counter.

    python benchmarks/fencing_cost.py

Runs the acquire script with fencing (aiolock's) and a plain SET NX PX script on one
embedded node and reads the server's own accounting (INFO commandstats): unlike
latency, this does not depend on how busy the machine is.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as redis

from aiolock._lua import ACQUIRE_SCRIPT, RELEASE_SCRIPT
from aiolock.testing import redis_servers

PLAIN = b"""\
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, 0} end
return {0, redis.call('pttl', KEYS[1])}
"""
N = 5000


async def cost(client: redis.Redis, script: bytes, keys: list[str], args: list[object]) -> float:
    await client.config_resetstat()
    sha = await client.script_load(script)
    release = await client.script_load(RELEASE_SCRIPT.source)
    for _ in range(N):
        await client.evalsha(sha, len(keys), *keys, *args)
        await client.evalsha(release, 1, keys[0], args[0])
    stats = await client.info("commandstats")
    return float(stats["cmdstat_evalsha"]["usec"]) / N


async def main() -> None:
    token = "t" * 20
    async with redis_servers(1) as urls:
        client = redis.Redis.from_url(urls[0])
        try:
            for _ in range(3):
                plain = await cost(client, PLAIN, ["k"], [token, 10000])
                fenced = await cost(
                    client,
                    ACQUIRE_SCRIPT.source,
                    ["k", "k:fence"],
                    [token, 10000, 3600000, 1795000000000000],
                )
                print(
                    f"server µs per acquire+release: plain {plain:.1f}, with fencing "
                    f"{fenced:.1f} (+{fenced - plain:.1f})"
                )
        finally:
            await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
