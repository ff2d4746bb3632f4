"""Leader election: ``locks.campaign(name, run)``."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import time

import pytest
import redis.asyncio as redis

from aiolock import Lock, LockManager

from .conftest import key


async def test_two_campaigners_never_lead_at_once_and_each_term_is_numbered(
    urls: list[str], name: str
) -> None:
    terms: list[tuple[str, int, float, float]] = []

    def leader(who: str):  # type: ignore[no-untyped-def]
        async def run(term: Lock) -> None:
            assert term.owned
            assert term.fencing_token is not None
            started = time.monotonic()
            await asyncio.sleep(0.15)  # a term's work; then give the others a turn
            terms.append((who, term.fencing_token, started, time.monotonic()))

        return run

    async with LockManager(urls) as one, LockManager(urls) as two:
        tasks = [
            asyncio.create_task(one.campaign(name, leader("one"), ttl=1.0)),
            asyncio.create_task(two.campaign(name, leader("two"), ttl=1.0)),
        ]
        await asyncio.sleep(2.5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert not await one.locked(name)  # cancelled: the leader released
    assert len(terms) >= 4
    assert {who for who, *_ in terms} == {"one", "two"}
    ordered = sorted(terms, key=lambda t: t[2])
    for earlier, later in itertools.pairwise(ordered):
        assert earlier[3] <= later[2], f"two leaders at once: {earlier} and {later}"
        assert earlier[1] < later[1], "fencing tokens number the terms in order"


async def test_losing_the_lock_cancels_run_and_the_campaign_goes_on(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    started: list[int] = []
    cancelled: list[int] = []

    async def run(term: Lock) -> None:
        assert term.fencing_token is not None
        started.append(term.fencing_token)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(term.fencing_token)
            raise

    task = asyncio.create_task(locks.campaign(name, run, ttl=1.0))
    for _ in range(100):
        if started:
            break
        await asyncio.sleep(0.02)
    for client in clients:  # taken from the leader behind its back
        await client.delete(key(name))
    for _ in range(200):
        if len(started) >= 2:
            break
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled[0] == started[0]  # the first term's run was cancelled
    assert len(started) >= 2
    assert started[1] > started[0]


async def test_an_exception_in_run_ends_the_campaign(locks: LockManager, name: str) -> None:
    async def run(term: Lock) -> None:
        raise KeyError("the leader's own bug")

    with pytest.raises(KeyError, match="own bug"):
        await asyncio.wait_for(locks.campaign(name, run, ttl=1.0), 5)
    assert not await locks.locked(name)  # released on the way out


async def test_a_killed_leader_is_replaced_within_one_and_a_half_ttl(
    urls: list[str], locks: LockManager, name: str
) -> None:
    ttl = 2.0
    code = (
        "import asyncio, sys, aiolock\n"
        "async def run(term):\n"
        "    print(term.fencing_token, flush=True)\n"
        "    await asyncio.sleep(3600)\n"
        "async def main():\n"
        "    async with aiolock.LockManager(sys.argv[2:], restart_grace=0) as locks:\n"
        "        await locks.campaign(sys.argv[1], run, ttl=float(" + repr(ttl) + "))\n"
        "asyncio.run(main())\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, name, *urls, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    first = int(await asyncio.wait_for(proc.stdout.readline(), 30))
    elected = asyncio.Event()
    terms: list[int] = []

    async def run(term: Lock) -> None:
        assert term.fencing_token is not None
        terms.append(term.fencing_token)
        elected.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(locks.campaign(name, run, ttl=ttl))
    await asyncio.sleep(0.3)
    assert not elected.is_set()  # the other process leads
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    await proc.wait()
    await asyncio.wait_for(elected.wait(), 10)
    assert time.monotonic() - killed < 1.5 * ttl
    assert terms[0] > first
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_bad_arguments_are_refused_before_any_io(locks: LockManager) -> None:
    async def run(term: Lock) -> None:
        return None

    with pytest.raises(ValueError, match="must not be empty"):
        await locks.campaign("", run)
    with pytest.raises(TypeError, match="run must be"):
        await locks.campaign("x", "not callable")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl"):
        await locks.campaign("x", run, ttl=0)
