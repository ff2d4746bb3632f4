"""Server-side cost of fencing: CPU per acquire+release, with and without the counter.

    python benchmarks/fencing_cost.py [--calls 5000] [--rounds 3]

Runs the acquire script with fencing (aiolock's) and a plain SET NX PX script on one
embedded node and reads the server's own accounting (INFO commandstats): unlike
latency, this does not depend on how busy the machine is.
"""

from __future__ import annotations

import argparse
import asyncio

import redis.asyncio as redis

from aiolock._lua import ACQUIRE_SCRIPT, RELEASE_SCRIPT
from aiolock.testing import redis_servers

PLAIN = b"""\
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, 0} end
return {0, redis.call('pttl', KEYS[1])}
"""


async def cost(
    client: redis.Redis, script: bytes, keys: list[str], args: list[object], calls: int
) -> float:
    await client.config_resetstat()
    sha = await client.script_load(script)
    release = await client.script_load(RELEASE_SCRIPT.source)
    for _ in range(calls):
        await client.evalsha(sha, len(keys), *keys, *args)
        await client.evalsha(release, 1, keys[0], args[0])
    stats = await client.info("commandstats")
    return float(stats["cmdstat_evalsha"]["usec"]) / calls


async def main(calls: int, rounds: int) -> None:
    token = "t" * 20
    async with redis_servers(1) as urls:
        client = redis.Redis.from_url(urls[0])
        try:
            for _ in range(rounds):
                plain = await cost(client, PLAIN, ["k"], [token, 10000], calls)
                fenced = await cost(
                    client,
                    ACQUIRE_SCRIPT.source,
                    ["k", "k:fence"],
                    [token, 10000, 3600000, 1795000000000000],
                    calls,
                )
                print(
                    f"server µs per acquire+release: plain {plain:.1f}, with fencing "
                    f"{fenced:.1f} (+{fenced - plain:.1f})"
                )
        finally:
            await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=5000, help="cycles per round")
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.calls, arguments.rounds))
