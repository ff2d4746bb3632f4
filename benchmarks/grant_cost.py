"""Server time of a release that grants the lock to the next process in line.

    python benchmarks/grant_cost.py [--calls 2000] [--baseline PATH]

On the path of a handoff between processes each node runs ``RELEASE_TURN``: the
releasing process ("aa", first in line, still waiting: it leaves an offer for its next
head) names the next ("bb"), whose offer is fresh, and the key is granted to it and
the grant published to it. One embedded node; before each call the key and the turn
queue are set up again, and ``INFO commandstats`` gives the script's server time
(its own commands included). ``--baseline``: a checkout whose ``RELEASE_TURN`` runs in
the same rounds, interleaved. The median is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys

import redis.asyncio as redis

from aiolock._bench.floor import GRANTEE, GRANTEE_TOKEN, grant
from aiolock._core.keys import lock_key
from aiolock._lua import RELEASE_TURN_SCRIPT
from aiolock.testing import redis_servers

ROUNDS = 5
NAME = "bench:grant"
KEY = lock_key(b"aiolock:", NAME)


def _source_in(checkout: str) -> bytes:
    """``RELEASE_TURN`` as the aiolock of ``checkout`` sends it."""
    code = (
        "import sys; from aiolock._lua import RELEASE_TURN_SCRIPT as s; "
        "sys.stdout.buffer.write(s.source)"
    )
    env = {**os.environ, "PYTHONPATH": checkout}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, check=True, env=env, cwd=checkout
    ).stdout


async def _grant(client: redis.Redis, sha: str) -> float:
    """One grant, set up afresh: the script's µs on the server."""
    setup, args = grant(NAME, b"aa-token")
    pipe = client.pipeline(transaction=False)
    for command in setup:
        pipe.execute_command(*command)
    await pipe.execute()
    await client.config_resetstat()
    released = await client.evalsha(sha, int(args[0]), *args[1:])
    stats = await client.info("commandstats")
    if released != 1 or await client.get(KEY) != GRANTEE_TOKEN:
        raise RuntimeError("the release did not grant the lock to bb")
    return float(stats["cmdstat_evalsha"]["usec"])


async def main(calls: int, baseline: str | None) -> None:
    sources = {"this": RELEASE_TURN_SCRIPT.source}
    if baseline is not None:
        sources["baseline"] = _source_in(baseline)
    async with redis_servers(1) as urls:
        client = redis.Redis.from_url(urls[0])
        listener = redis.Redis.from_url(urls[0]).pubsub()
        await listener.subscribe(KEY + b":turn:" + GRANTEE)  # (a grant nobody hears is undone)
        shas = {name: await client.script_load(source) for name, source in sources.items()}
        figures: dict[str, list[float]] = {name: [] for name in shas}
        per_round = max(1, calls // ROUNDS)
        for _ in range(ROUNDS):
            for name, sha in shas.items():
                figures[name].extend([await _grant(client, sha) for _ in range(per_round)])
        for name, values in figures.items():
            median = statistics.median(values)
            print(f"{name:8s} RELEASE_TURN, a grant: {median:5.1f} µs on the server")
        await listener.aclose()
        await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--baseline", metavar="PATH", help="another aiolock checkout")
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.baseline))
