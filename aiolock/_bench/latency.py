"""Uncontended latency: acquire + release cycles on 1 and 5 nodes, against the floor."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import redis.asyncio as redis

from .._manager import LockManager
from ..testing import Server, Servers
from ._common import Figure, make_figure, pinger, servers_or, timed
from .floor import Floor

ROUNDS = 10
_PINGS = "(2 PING fan-outs)"
_SCRIPTS = "(2 script fan-outs)"


async def run_latency(
    urls: Sequence[str] | None = None, *, count: int = 2000, warmup: int = 200
) -> list[Figure]:
    """PING, the floors, cycle1, cycle5, and cycle5 with one node hung (embedded nodes).

    The figures are measured in interleaved rounds, so that a slow spell of a shared
    machine weighs on all of them alike and their ratios stay meaningful. Each cycle's
    ``floor_ratio`` is to the floor on as many nodes, its ``scripts_ratio`` to those
    round trips carrying its scripts (floor.py); the hung one's to those of all nodes
    answering.
    """
    per_round = max(1, count // ROUNDS)
    samples: dict[str, list[float]] = {}
    async with servers_or(urls, 5) as nodes:
        client = redis.Redis.from_url(nodes[0])
        # (A benchmark measures locks, not a restart's quarantine: no restart_grace.)
        one = LockManager(nodes[:1], restart_grace=0)
        many = LockManager(nodes, restart_grace=0)
        floor1, floor = await Floor.open(nodes[:1]), await Floor.open(nodes)
        await floor.load_scripts()  # (floor1's node is one of them)
        hung: Server | None = None
        if isinstance(nodes, Servers) and len(nodes) >= 3:
            server = nodes.servers[-1]
            assert isinstance(server, Server)  # noqa: S101
            hung = server
        try:
            lock1 = one.lock("bench:cycle", ttl=10, auto_renew=False)
            lock5 = many.lock("bench:cycle", ttl=10, auto_renew=False)

            async def cycle1() -> None:
                await lock1.acquire(timeout=0)
                await lock1.release()

            async def cycle5() -> None:
                await lock5.acquire(timeout=0)
                await lock5.release()

            n = len(nodes)
            ops = (
                ("ping (redis-py)", pinger(client)),
                (f"floor1 {_PINGS}", floor1.cycle),
                (f"scripts1 {_SCRIPTS}", floor1.scripts),
                ("cycle1 acquire+release", cycle1),
                (f"floor{n} {_PINGS}", floor.cycle),
                (f"scripts{n} {_SCRIPTS}", floor.scripts),
                (f"cycle{n} acquire+release", cycle5),
            )
            for _, op in ops:
                await timed(op, warmup, 0)
            for _ in range(ROUNDS):
                for name, op in ops:
                    samples.setdefault(name, []).extend(await timed(op, per_round, 0))
                if hung is not None:
                    samples.setdefault(f"cycle{n}, 1 node hung", []).extend(
                        await _timed_hung(hung, cycle5, per_round)
                    )
        finally:
            floor1.close()
            floor.close()
            await client.aclose()
            await one.aclose()
            await many.aclose()
    figures = [make_figure(name, values) for name, values in samples.items()]
    median = {figure.name: figure.median_us for figure in figures}
    for figure in figures:
        figure.ratio = figure.median_us / median["ping (redis-py)"]
        size = "1" if figure.name.startswith(("cycle1 ", "scripts1 ")) else str(n)
        if figure.name.startswith(("scripts", "cycle")):
            figure.floor_ratio = figure.median_us / median[f"floor{size} {_PINGS}"]
        if figure.name.startswith("cycle"):
            figure.scripts_ratio = figure.median_us / median[f"scripts{size} {_SCRIPTS}"]
    return figures


async def _timed_hung(hung: Server, op: Callable[[], Awaitable[None]], count: int) -> list[float]:
    """``op`` timed ``count`` times while the server ``hung`` is stopped (SIGSTOP)."""
    hung.pause()
    try:
        return await timed(op, count, 0)
    finally:
        hung.resume()
