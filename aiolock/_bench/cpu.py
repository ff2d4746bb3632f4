"""CPU per lock cycle: the client's (this process) and the servers' (their main threads).

A busy service runs many cycles at once: here 64 tasks each run acquire + release
cycles, every cycle on a fresh name, and the figure is this process's CPU time over the
cycles done (``time.process_time``: the servers are other processes). The servers' is
the CPU time their main threads spent (``INFO cpu``), over the same cycles.
redis-py's own asyncio ``Lock`` on one node runs in the same rounds, as the yardstick.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import redis.asyncio as redis

from .._manager import LockManager
from ._common import servers_or

#: Tasks cycling at once; rounds, interleaved.
TASKS = 64
ROUNDS = 3

_Cycle = Callable[[str], Awaitable[None]]


@dataclass
class CpuFigure:
    """Median CPU µs per cycle over the rounds: the client's and the servers'."""

    name: str
    cycles: int
    client_us: float
    server_us: float
    #: ``client_us`` over redis-py's 1-node Lock's, measured in the same rounds.
    ratio: float = 0.0

    def row(self) -> str:
        """A table row."""
        return (
            f"{self.name:<28} {self.cycles:>7} {self.client_us:>10.1f} {self.server_us:>10.1f}"
            f" {self.ratio:>8.2f}"
        )


async def _server_usec(clients: Sequence[redis.Redis]) -> float:
    """The servers' CPU time so far, in µs: their main threads' (commands, scripts, I/O).

    Not ``INFO commandstats``: it counts each command a script calls again, beside the
    script's own call, whose time already includes it (a script of a SET and a GET
    read 10.2 µs per call, and its SET and GET 2.1 µs more).
    """
    total = 0.0
    for client in clients:
        cpu = await client.info("cpu")
        user = cpu.get("used_cpu_user_main_thread", cpu["used_cpu_user"])
        system = cpu.get("used_cpu_sys_main_thread", cpu["used_cpu_sys"])
        total += (float(user) + float(system)) * 1e6
    return total


async def _round(
    cycle: _Cycle, side: str, cycles: int, clients: Sequence[redis.Redis]
) -> tuple[float, float]:
    """``cycles`` cycles on ``TASKS`` tasks: client and server CPU µs per cycle."""
    per_task = max(1, cycles // TASKS)

    async def task(i: int) -> None:
        for n in range(per_task):
            await cycle(f"bench:cpu:{side}:{i}:{n}")

    server = await _server_usec(clients)
    start = time.process_time()
    await asyncio.gather(*(task(i) for i in range(TASKS)))
    client_us = (time.process_time() - start) / (per_task * TASKS) * 1e6
    return client_us, (await _server_usec(clients) - server) / (per_task * TASKS)


@contextlib.asynccontextmanager
async def _sides(nodes: Sequence[str]) -> AsyncIterator[list[tuple[str, _Cycle]]]:
    one = LockManager(nodes[:1], restart_grace=0)
    many = LockManager(nodes, restart_grace=0)
    client = redis.Redis.from_url(nodes[0], max_connections=TASKS)

    def ours(locks: LockManager) -> _Cycle:
        async def cycle(name: str) -> None:
            lock = locks.lock(name, ttl=10, auto_renew=False)
            if await lock.acquire(timeout=0):
                await lock.release()

        return cycle

    async def redis_py(name: str) -> None:
        lock = client.lock(name, timeout=10)
        if await lock.acquire(blocking=False):
            await lock.release()

    try:
        yield [
            ("redis-py Lock, 1 node", redis_py),
            ("aiolock, 1 node", ours(one)),
            (f"aiolock, {len(nodes)} nodes", ours(many)),
        ]
    finally:
        await one.aclose()
        await many.aclose()
        await client.aclose()


async def run_cpu(urls: Sequence[str] | None = None, *, cycles: int = 2000) -> list[CpuFigure]:
    """CPU per cycle of redis-py's Lock and of aiolock on 1 and 5 nodes, interleaved."""
    async with servers_or(urls, 5) as nodes, _sides(nodes) as sides:
        clients = [redis.Redis.from_url(url) for url in nodes]
        try:
            samples: dict[str, list[tuple[float, float]]] = {}
            for _side, cycle in sides:  # warm-up: connections, scripts loaded
                await _round(cycle, "warm", TASKS, clients)
            for _ in range(ROUNDS):
                for side, cycle in sides:
                    samples.setdefault(side, []).append(await _round(cycle, side, cycles, clients))
        finally:
            for client in clients:
                await client.aclose()
    done = max(1, cycles // TASKS) * TASKS
    figures = [
        CpuFigure(
            side,
            done * ROUNDS,
            statistics.median(c for c, _ in rounds),
            statistics.median(s for _, s in rounds),
        )
        for side, rounds in samples.items()
    ]
    for figure in figures:
        figure.ratio = figure.client_us / figures[0].client_us
    return figures


def format_cpu(figures: Sequence[CpuFigure]) -> str:
    """The figures as a text table."""
    head = (
        f"{'CPU per cycle, ' + str(TASKS) + ' tasks':<28} {'cycles':>7} {'client µs':>10}"
        f" {'server µs':>10} {'x redis-py':>8}"
    )
    return "\n".join([head, "-" * len(head), *(f.row() for f in figures)])
