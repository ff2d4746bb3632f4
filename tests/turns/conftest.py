"""Turns across processes: the fixtures and helpers of tests/turns/.

Turns across processes (see aiolock/_waiting/turns.py): a release names the waiting
process whose turn it is, and only that one tries; a process that does not use its turn
(killed, or its message lost) delays the others by about one refresh interval.

A release that can, grants the lock to that process instead (tests/test_grants.py);
the tests of naming here run with no offers left in line (``naming_only``), as when no
offer is fresh enough to be granted.

Each ``LockManager`` is one member of the turn queue, as a process is: managers of the
test's own process stand in for processes, except where a real process is killed or
many run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as redis

import aiolock
import aiolock._waiting.turns
import aiolock._waiting.waiting
from aiolock import LockManager
from aiolock._waiting.waiting import LOCAL_STREAK

from .. import seam
from ..conftest import in_line, key, scripts_run
from ..test_failures import MINIMAL_ACL

WORKER = Path(__file__).parent.parent / "turns_worker.py"


@pytest.fixture
def naming_only(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """No process of the test leaves an offer in line: releases name, never grant.

    Returns the environment for worker processes that do the same.
    """
    monkeypatch.setattr(aiolock._waiting.turns.Turns, "offer", lambda _self, _key, _taker, **_: ())
    return {**os.environ, "AIOLOCK_TEST_NO_OFFERS": "1"}


@pytest.fixture
def giving_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each release ends its process's streak (gives way), and nobody tries out of turn
    (the fallback of 0.5 s made 30 s)."""
    monkeypatch.setattr(aiolock._waiting.waiting, "LOCAL_STREAK", 0)
    monkeypatch.setattr(aiolock._waiting.turns, "FALLBACK", 30.0)


@pytest.fixture
def no_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """No process refreshes its place in line during the test (each entry lives 60 s)."""
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 30.0)
    monkeypatch.setattr(aiolock._waiting.turns, "ENTRY_TTL", 60.0)


async def _released_message(client: redis.Redis, name: str) -> Callable[[], Awaitable[bytes]]:
    """Subscribe to ``name``'s release channel; returns: await the next message."""
    pubsub = client.pubsub()
    await pubsub.subscribe(key(name) + ":released")

    async def next_message() -> bytes:
        try:
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
                if message is not None:
                    return bytes(message["data"])
        finally:
            await pubsub.aclose()

    return next_message


def _intercept(manager: LockManager, hook: Callable[[bytes, bytes], None]) -> Callable[..., None]:
    """Route ``manager``'s release messages through ``hook``; returns the original handler."""
    waiting = seam.engine(manager).waiting
    on_message = waiting._on_message
    waiting._on_message = hook  # type: ignore[method-assign]
    for subscriber in waiting._subscribers:
        subscriber._on_message = hook  # type: ignore[attr-defined]
    return on_message


async def _run_workers(
    urls: list[str], clients: list[redis.Redis], name: str, tasks: int
) -> tuple[float, list[list[float]]]:
    """4 worker processes of ``tasks`` tasks each take ``name`` once per task, after a
    holder lets go. Returns the scripts run on all nodes per critical section, and the
    sections."""
    async with LockManager(urls) as holder_side:
        holder = holder_side.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        args = [str(WORKER), name, str(tasks), *urls]
        workers = [
            await asyncio.create_subprocess_exec(sys.executable, *args, stdout=PIPE)
            for _ in range(4)
        ]
        for worker in workers:
            assert worker.stdout is not None
            assert await asyncio.wait_for(worker.stdout.readline(), 30) == b"waiting\n"
        await in_line(clients, name, 4)
        for client in clients:
            await client.config_resetstat()
        await holder.release()
        outputs = [await asyncio.wait_for(worker.communicate(), 120) for worker in workers]
        assert [worker.returncode for worker in workers] == [0] * 4
    total = sum(await scripts_run(clients))
    sections = [json.loads(line) for out, _ in outputs for line in out.splitlines()]
    assert len(sections) == 4 * tasks
    return total / len(sections), sections


async def _handed_on(
    takes: asyncio.Task[bool], other_waits: asyncio.Task[bool], other_lock: aiolock.Lock
) -> int:
    """After a release with a successor queued: 1 if the lock stayed in the process (a
    handoff while the other process waited), else 0 (the other's turn, then released)."""
    await asyncio.sleep(0.05)  # the other process's turn, if it has one
    stayed = 0 if other_waits.done() else 1
    if other_waits.done() and not takes.done():
        assert await other_waits
        await other_lock.release()
    assert await asyncio.wait_for(takes, 20)
    return stayed


def _no_refresh_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries refreshed every 5 s (living 10 s): none comes back during the test."""
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 5.0)
    monkeypatch.setattr(aiolock._waiting.turns, "ENTRY_TTL", 10.0)


async def _until_firm(clients: list[redis.Redis], name: str) -> None:
    """Until the one offer in ``name``'s turn queue is firm on every node (5 s at most)."""
    deadline = time.monotonic() + 5
    while any(seq.endswith(b"*") for seq in await _offer_seqs(clients, name)):
        assert time.monotonic() < deadline, await _offer_seqs(clients, name)
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def _pubsub_refused(clients: list[redis.Redis], urls: list[str]) -> AsyncIterator[list[str]]:
    """The servers' URLs for a user whose ACL refuses pub/sub (every waiter polls)."""
    no_pubsub = MINIMAL_ACL.replace(" +subscribe +unsubscribe", "")
    for client in clients:
        await client.execute_command("ACL", "SETUSER", "aiolock", *no_pubsub.split())
    try:
        yield _as_refused(urls)
    finally:
        for client in clients:
            await client.execute_command("ACL", "DELUSER", "aiolock")


async def _waiting_behind(
    holder_side: LockManager,
    waiter_side: LockManager,
    clients: list[redis.Redis],
    name: str,
    *,
    wait: float = 20,
) -> tuple[aiolock.Lock, aiolock.Lock, asyncio.Task[bool]]:
    """A 30-s lock held through ``holder_side``, and a waiter of ``waiter_side`` for it
    (``wait`` s), in line; returns both handles and the waiter's acquire."""
    holder = holder_side.lock(name, ttl=30, auto_renew=False)
    assert await holder.acquire(timeout=0)
    waiter = waiter_side.lock(name, ttl=30, auto_renew=False)
    waits = asyncio.create_task(waiter.acquire(timeout=wait))
    await in_line(clients, name, 1)
    return holder, waiter, waits


def _grant_subscription(words: Any) -> bool:
    """A SUBSCRIBE to a process's grants (``<key>:turn:<member>``), for nemesis rules."""
    return words[0].upper() == b"SUBSCRIBE" and any(b":turn:" in w for w in words[1:])


Line = tuple[aiolock.Lock, "asyncio.Task[bool]", aiolock.Lock, "asyncio.Task[bool]"]


async def _holder_and_line(
    busy: LockManager, other: LockManager, clients: list[redis.Redis], name: str
) -> tuple[aiolock.Lock, Line]:
    """``busy`` holds ``name``; ``other``'s waiter is first in line, ``busy``'s head
    second, its attempt failed: the holder, and (named, its wait, head, its wait)."""
    holder = busy.lock(name, ttl=30, auto_renew=False)
    assert await holder.acquire(timeout=0)
    named = other.lock(name, ttl=30, auto_renew=False)
    named_waits = asyncio.create_task(named.acquire(timeout=20))
    await in_line(clients, name, 1)
    head = busy.lock(name, ttl=30, auto_renew=False)
    head_waits = asyncio.create_task(head.acquire(timeout=20))
    await in_line(clients, name, 2)
    await asyncio.sleep(0.1)  # (its attempt after joining has failed: it sleeps)
    return holder, (named, named_waits, head, head_waits)


async def _then_the_head(line: Line) -> None:
    """The process named, holding the lock, releases it; the head then takes it."""
    named, _, head, head_waits = line
    await named.release()
    assert await asyncio.wait_for(head_waits, 20)
    await head.release()


def _hears_late(manager: LockManager, seconds: float) -> None:
    """``manager``'s process hears every release message ``seconds`` late."""
    loop = asyncio.get_running_loop()

    def late(channel: bytes, message: bytes) -> None:
        loop.call_later(seconds, on_message, channel, message)

    on_message = _intercept(manager, late)


async def _named_first(named: asyncio.Task[bool], head: asyncio.Task[bool], why: str) -> None:
    """The process named takes the lock while the other process's head still waits."""
    done, _ = await asyncio.wait([named, head], timeout=20, return_when=asyncio.FIRST_COMPLETED)
    assert named in done, why
    assert not head.done()


def _release_subscription(words: Any) -> bool:
    """A SUBSCRIBE to a name's releases (``<key>:released``), for nemesis rules."""
    return words[0].upper() == b"SUBSCRIBE" and any(w.endswith(b":released") for w in words[1:])


async def _offer_seqs(clients: list[redis.Redis], name: str) -> list[bytes]:
    """The sequence number of the one offer in ``name``'s turn queue, on each node."""
    offers = key(name) + ":turns:offers"
    return [(await c.zrange(offers, 0, -1))[0].split(b" ")[1] for c in clients]


def _as_refused(urls: list[str]) -> list[str]:
    """``urls`` as the user of :func:`_pubsub_refused` connects."""
    return [url.replace("redis://", "redis://aiolock:lockpass@") for url in urls]


async def _expired_then_taken(
    busy: aiolock.LockManager, other: aiolock.LockManager, clients: list[redis.Redis], name: str
) -> tuple[
    aiolock.Lock, aiolock.Lock, aiolock.Lock, asyncio.Task[bool], list[float], aiolock.Lock,
    asyncio.Task[bool],
]:  # fmt: skip
    """A manual lock of ``busy``'s left to expire (``stale``), the name then taken by
    another of its tasks (``taker``), ``other``'s waiter in line (``named``), and
    ``busy``'s polling head (``head``), whose process's next release gives way; with
    the times of ``busy``'s attempts (``tries``)."""
    stale = busy.lock(name, ttl=0.3, auto_renew=False)
    assert await stale.acquire(timeout=0)
    await asyncio.sleep(0.5)  # it expires, unreleased
    taker = busy.lock(name, ttl=30, auto_renew=False)
    assert await taker.acquire(timeout=0)
    named = other.lock(name, ttl=30, auto_renew=False)
    named_waits = asyncio.create_task(named.acquire(timeout=20))
    await in_line(clients, name, 1)
    tries = _attempt_times(busy)
    head = busy.lock(name, ttl=30, auto_renew=False)
    head_waits = asyncio.create_task(head.acquire(timeout=20))
    queues = seam.engine(busy).waiting._queues
    while not tries or key(name).encode() not in queues:  # it failed: then it polls
        await asyncio.sleep(0.001)
    queue = queues[key(name).encode()]
    queue.local_streak, queue.alone = LOCAL_STREAK, False  # the next release gives way
    return stale, taker, named, named_waits, tries, head, head_waits


def _attempt_times(manager: aiolock.LockManager) -> list[float]:
    """The times (``time.monotonic()``) of the acquire attempts ``manager`` sends."""
    quorum = seam.engine(manager).quorum
    attempt = quorum.acquire
    times: list[float] = []

    async def timed(*args: Any, **kwargs: Any) -> Any:
        times.append(time.monotonic())
        return await attempt(*args, **kwargs)

    quorum.acquire = timed  # type: ignore[method-assign]
    return times
