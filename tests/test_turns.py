"""Turns across processes (issue 17, see aiolock/_waiting/turns.py): a release names the waiting
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
import itertools
import json
import math
import os
import signal
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as redis

import aiolock
import aiolock._lua
import aiolock._waiting.queue
import aiolock._waiting.turns
import aiolock._waiting.waiting
from aiolock import LockManager
from aiolock._core.keys import turn_keys
from aiolock._lua import TURN_LEAVE_SCRIPT
from aiolock._waiting.waiting import LOCAL_STREAK
from aiolock.testing import command, nemesis

from .conftest import count_attempts, in_line, key, scripts_run, two_in_line
from .test_failures import MINIMAL_ACL

WORKER = Path(__file__).parent / "turns_worker.py"


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


@pytest.mark.usefixtures("naming_only")
async def test_processes_take_turns_in_the_order_they_queued(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nobody falls back to trying out of turn during this test, however slow the machine.
    monkeypatch.setattr(aiolock._waiting.turns, "FALLBACK", 30.0)
    async with contextlib.AsyncExitStack() as stack:
        holder_side = await stack.enter_async_context(LockManager(urls))
        waiting = [await stack.enter_async_context(LockManager(urls)) for _ in range(3)]
        holder = holder_side.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        order: list[int] = []

        async def wait_then_hold(i: int) -> None:
            lock = waiting[i].lock(name, ttl=30, auto_renew=False)
            assert await lock.acquire(timeout=20)
            order.append(i)
            await asyncio.sleep(0.05)
            await lock.release()

        tasks = []
        for i in range(3):
            tasks.append(asyncio.create_task(wait_then_hold(i)))
            await in_line(clients, name, i + 1)  # joined behind the ones before
            await asyncio.sleep(0.01)  # a later place, also by the millisecond
        members = await in_line(clients, name, 3)
        assert members == [m._engine.turns.member for m in waiting if m._engine.turns]
        attempts = [count_attempts(manager) for manager in waiting]
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert order == [0, 1, 2]
    # Each process tried once, when named: none lost a race (before turns, every
    # release woke every waiting process: 3 + 2 + 1 attempts).
    assert [count[0] for count in attempts] == [1, 1, 1]
    assert [await client.exists(key(name) + ":turns") for client in clients] == [0] * 5


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


async def test_a_waiter_process_killed_first_in_line_delays_the_others_about_one_refresh(
    urls: list[str], clients: list[redis.Redis], name: str, naming_only: dict[str, str]
) -> None:
    async with LockManager(urls) as holder_side, LockManager(urls) as waiter_side:
        holder = holder_side.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        worker = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), name, "1", *urls, stdout=PIPE, env=naming_only
        )
        try:
            assert worker.stdout is not None
            assert await asyncio.wait_for(worker.stdout.readline(), 30) == b"waiting\n"
            [dead] = await in_line(clients, name, 1)
            waiter = asyncio.create_task(
                waiter_side.lock(name, ttl=30, auto_renew=False).acquire(timeout=20)
            )
            assert (await in_line(clients, name, 2))[0] == dead  # behind the worker
        finally:
            worker.send_signal(signal.SIGKILL)
            await worker.wait()
        message = await _released_message(clients[0], name)
        released = time.monotonic()
        await holder.release()
        assert await message() == dead  # its turn: the other process does not try yet
        assert await asyncio.wait_for(waiter, 20)
        waited = time.monotonic() - released
    # It tried after FALLBACK, not at once, nor after the holder's 30 s PTTL.
    assert aiolock._waiting.turns.FALLBACK * 0.9 < waited < aiolock._waiting.turns.FALLBACK + 2.5


def _intercept(manager: LockManager, hook: Callable[[bytes, bytes], None]) -> Callable[..., None]:
    """Route ``manager``'s release messages through ``hook``; returns the original handler."""
    waiting = manager._engine.waiting
    on_message = waiting._on_message
    waiting._on_message = hook  # type: ignore[method-assign]
    for subscriber in waiting._subscribers:
        subscriber._on_message = hook  # type: ignore[attr-defined]
    return on_message


@pytest.mark.usefixtures("naming_only")
async def test_a_lost_turn_message_costs_about_one_refresh_interval(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        line = await two_in_line(stack, urls, clients, name)
        first, first_lock, first_waits = line.first, line.first_lock, line.first_waits
        second_lock, second_waits = line.second_lock, line.second_waits
        # The first in line loses the next release message on every node it hears.
        lost: list[bytes] = []

        def losing(channel: bytes, message: bytes) -> None:
            if len(lost) < 3:
                lost.append(message)
                return
            on_message(channel, message)

        on_message = _intercept(first, losing)
        released = time.monotonic()
        await line.holder.release()
        assert await asyncio.wait_for(second_waits, 20)
        waited = time.monotonic() - released
        assert set(lost) == {first._engine.turns.member if first._engine.turns else b""}
        assert not first_waits.done()
        # The second tried after FALLBACK: not at once, nor after the holder's PTTL.
        assert (
            aiolock._waiting.turns.FALLBACK * 0.9 < waited < aiolock._waiting.turns.FALLBACK + 2.5
        )
        # The first one was moved to the back: the next release is its turn.
        released = time.monotonic()
        await second_lock.release()
        assert await asyncio.wait_for(first_waits, 20)
        assert time.monotonic() - released < 2.0
        await first_lock.release()


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


async def test_a_thousand_waiting_tasks_over_four_processes_take_turns_at_a_constant_cost(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    many, sections = await _run_workers(urls, clients, name, 250)
    sections.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(sections))  # no overlap
    assert len({pid for _, _, pid in sections}) == 4
    # Turns go round: a process hands the lock to its own waiters at most LOCAL_STREAK
    # times in a row, then to the next process (the first in line every time would
    # let one process run all its tasks before the next one's turn: 3 changes).
    changes = sum(1 for a, b in itertools.pairwise(sections) if a[2] != b[2])
    assert changes >= len(sections) / (LOCAL_STREAK + 1) * 0.8, changes
    assert os.getpid() not in {pid for _, _, pid in sections}
    # Per critical section on 5 nodes: a local handoff is one script per node, a
    # handoff between processes a release and one attempt per node (4 of 5 handoffs
    # are local, see LOCAL_STREAK): about 6 whatever the number of tasks (a process is
    # one entry in line, and only its head tries); losing races would add 5 each (11.8
    # before turns).
    assert many <= 7.5, many


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


@pytest.mark.parametrize(
    "emptied_by", ["taking", "leaving", "stale-release", "stale-release-queued"]
)
async def test_a_process_whose_waiters_come_one_at_a_time_gives_way_after_its_streak(
    urls: list[str], clients: list[redis.Redis], name: str, emptied_by: str
) -> None:
    # Found by the simulation's liveness rules (tests/sim/live.py, seed 68719476742:
    # one process held a name 13 times in a row while two others waited for seconds;
    # seed 137438990719, its queue emptied by a waiter that timed out). Here each task
    # of the busy process queues only while the one before holds: its local queue
    # empties at every handoff ("taking"), and before it a waiter gives up ("leaving"),
    # or after it a handle of the process whose lock had expired long before releases
    # it ("stale-release": seed 139297437666; it said LockNotOwned, and the lock stayed
    # with the process). The streak of handoffs must survive each, or it starts again
    # and the other process never gets its turn. "stale-release-queued" (seed
    # 138506569770): such a release while a waiter of the process is queued, its streak
    # at the limit, gave way though it released nothing, and the streak began again.
    async with LockManager(urls) as busy, LockManager(urls) as other:
        stales = []
        stale_count = {"stale-release": 2 * LOCAL_STREAK + 1, "stale-release-queued": 1}
        for _ in range(stale_count.get(emptied_by, 0)):
            stale = busy.lock(name, ttl=0.2, auto_renew=False)
            assert await stale.acquire(timeout=5)
            stales.append(stale)
            await asyncio.sleep(0.25)  # expired, never released
        holder = busy.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        other_lock = other.lock(name, ttl=30, auto_renew=False)
        other_waits = asyncio.create_task(other_lock.acquire(timeout=20))
        await in_line(clients, name, 1)
        queue = key(name).encode()
        handoffs = 0
        while not other_waits.done() and handoffs <= 2 * LOCAL_STREAK:
            if emptied_by == "leaving":
                quitter = busy.lock(name, ttl=30, auto_renew=False)
                assert not await asyncio.create_task(quitter.acquire(timeout=0.05))
            successor = busy.lock(name, ttl=30, auto_renew=False)
            takes = asyncio.create_task(successor.acquire(timeout=20))
            while busy._engine.waiting.waiters(queue) == 0:
                await asyncio.sleep(0.001)
            if emptied_by == "stale-release-queued" and handoffs == LOCAL_STREAK:
                with contextlib.suppress(aiolock.LockNotOwned):
                    await stales.pop().release()
            await holder.release()
            handoffs += await _handed_on(takes, other_waits, other_lock)
            if stales and emptied_by == "stale-release":
                with contextlib.suppress(aiolock.LockNotOwned):
                    await stales.pop().release()
            holder = successor
        await holder.release()
        # The busy process handed the lock to its own waiters LOCAL_STREAK times, then
        # the release named the other process (on the old code: never, in 9 handoffs).
        assert handoffs == LOCAL_STREAK, handoffs
        assert other_waits.done()
        assert other_waits.result()


@pytest.mark.parametrize("handed", ["passed-on", "woken"])
async def test_a_process_that_saw_nobody_in_line_gives_way_once_others_join(
    urls: list[str], clients: list[redis.Redis], name: str, handed: str
) -> None:
    # Found by the simulation's streak rule (seed 139912374606, no fault: one process
    # held a name 8 times in a row while another waited 2 s). A handoff that finds no
    # other process in line lets the process's streak run to LONE_STREAK; the handoffs
    # after it must notice one that joins the line since. "passed-on": a handoff to a
    # taker that was the last waiter of the process read the line, but the taker had
    # left the queue (its streak kept aside) before the replies were read, and what
    # they said was dropped. "woken": a release that wakes a head busy with its own
    # attempt reads no line at all, and the process went on believing it was alone.
    # Either way the streak ran on to LONE_STREAK while the other process waited.
    async with LockManager(urls) as busy, LockManager(urls) as other:
        queue = key(name).encode()
        real_attempt = busy._engine.quorum.acquire
        attempts = blocked = 0
        passes = math.inf  # how many more attempts go through before the gate shuts
        gate = asyncio.Event()

        async def gated(*args: Any, **kwargs: Any) -> Any:
            nonlocal attempts, blocked, passes
            own = "script" not in kwargs  # a waiter's own attempt (not a handoff)
            if own and passes <= 0:
                blocked += 1
                await gate.wait()
            passes -= own
            try:
                return await real_attempt(*args, **kwargs)
            finally:
                attempts += own

        busy._engine.quorum.acquire = gated  # type: ignore[method-assign]

        async def tried(count: int) -> None:
            while attempts < count:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0)  # (the waiter back to waiting: its taker idle)

        holder = busy.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        first = busy.lock(name, ttl=30, auto_renew=False)
        first_takes = asyncio.create_task(first.acquire(timeout=20))
        await tried(2)
        second = busy.lock(name, ttl=30, auto_renew=False)
        second_takes = asyncio.create_task(second.acquire(timeout=20))
        while busy._engine.waiting.waiters(queue) < 2:
            await asyncio.sleep(0.001)
        await in_line(clients, name, 1)  # the busy process's head, nobody else
        if handed == "woken":
            passes = 0  # the second waiter's attempt, once it is head, waits for a release
        # Passed on to a first waiter with a second behind it: the line is read, and
        # nobody else is in it.
        await holder.release()
        assert await asyncio.wait_for(first_takes, 20)
        if handed == "passed-on":
            await tried(3)  # the second waiter's attempt failed: its taker is idle
        other_lock = other.lock(name, ttl=30, auto_renew=False)
        other_waits = asyncio.create_task(other_lock.acquire(timeout=20))
        await in_line(clients, name, 2)
        holder, successor, takes = first, second, second_takes
        handoffs = 0
        while not other_waits.done() and handoffs <= 2 * LOCAL_STREAK:
            if successor is None:  # one waiter of ours at a time: it empties the queue
                successor = busy.lock(name, ttl=30, auto_renew=False)
                tries = attempts + 2  # its first try, and its first as head
                takes = asyncio.create_task(successor.acquire(timeout=20))
                if handed == "passed-on":
                    await tried(tries)
                else:  # its first try fails; its next, as head, waits for the release
                    waits = blocked + 1
                    passes = 1
                    while blocked < waits:
                        await asyncio.sleep(0.001)
                while busy._engine.waiting.waiters(queue) == 0:
                    await asyncio.sleep(0.001)
            assert takes is not None
            await holder.release()
            gate.set()
            handoffs += await _handed_on(takes, other_waits, other_lock)
            gate.clear()
            holder, successor, takes = successor, None, None
        passes = math.inf
        gate.set()
        await holder.release()
        # The streak began before the other process joined the line; with the other
        # process in it, its handoffs come to LOCAL_STREAK (on the old code: 9, the
        # loop's limit).
        assert handoffs == LOCAL_STREAK - 1, handoffs
        assert other_waits.done()
        assert other_waits.result()


async def test_a_grant_to_an_offer_already_taken_and_let_go_is_given_back(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's orphan rule (tests/sim/live.py's nudges, seed
    # 140222441248, no fault): a waiter took the lock with its own attempt, so its
    # process's offer in line still named its token after it let the lock go (local
    # handoffs do not refresh it); another process's release granted that offer, the
    # process knew the token as taken and let go, and ignored the grant on the nodes
    # it had taken it on: the key stayed with a token nobody held until the offer's
    # ttl, and every waiter waited.
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 5.0)  # the offer stays as it is
    monkeypatch.setattr(aiolock._waiting.turns, "ENTRY_TTL", 10.0)
    async with LockManager(urls) as side_a, LockManager(urls) as side_b:
        first = side_b.lock(name, ttl=0.3, auto_renew=False)
        assert await first.acquire(timeout=0)
        taker = side_a.lock(name, ttl=30, auto_renew=False)
        takes = asyncio.create_task(taker.acquire(timeout=10))
        await in_line(clients, name, 1)  # A's offer: the taker's token
        cancelled = side_a.lock(name, ttl=30, auto_renew=False)
        cancelled_waits = asyncio.create_task(cancelled.acquire(timeout=20))
        last = side_a.lock(name, ttl=30, auto_renew=False)
        last_waits = asyncio.create_task(last.acquire(timeout=20))
        # first expires unreleased: the taker's own attempt takes it, no grant, so
        # A's offer in line still names the taker's token.
        assert await asyncio.wait_for(takes, 10)
        other = side_b.lock(name, ttl=30, auto_renew=False)
        other_waits = asyncio.create_task(other.acquire(timeout=10))
        await in_line(clients, name, 2)
        # The taker hands the lock to the next waiter of A, cancelled before it wakes:
        # the lock is given back and B's waiter takes it (A's offer unchanged). The
        # give-back names nobody, so A's last waiter, first now, may race B's for it
        # (fair: A's streak had room); its own attempts wait until B's waiter has it,
        # or the test would fail about 1 run in 15 on a busy machine.
        attempt = side_a._engine.quorum.acquire
        b_took = asyncio.Event()

        async def after_b(*args: Any, **kwargs: Any) -> Any:
            if "script" not in kwargs:  # an attempt of its own (not a handoff)
                await b_took.wait()
            return await attempt(*args, **kwargs)

        side_a._engine.quorum.acquire = after_b  # type: ignore[method-assign]
        releasing = asyncio.create_task(taker.release())
        await asyncio.sleep(0)
        cancelled_waits.cancel()
        await releasing
        assert await asyncio.wait_for(other_waits, 10)
        b_took.set()
        released = time.monotonic()
        await other.release()  # names A, and grants its offer: the taker's old token
        assert await asyncio.wait_for(last_waits, 30)
        # At once: not when that grant's key expires (30 s; on the old code the last
        # waiter waited out its timeout).
        assert time.monotonic() - released < 2.0
        await last.release()


@pytest.mark.usefixtures("naming_only")
async def test_a_release_that_finds_its_lock_expired_still_names_the_next_in_line(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's "idle" rule (tests/sim/live.py, seed 140000002136): a
    # holder shortened its lock with extend() after a waiter's attempt had learnt the
    # longer PTTL, and released it just after it expired. The release deleted nothing
    # and announced nothing, and the waiter slept on until that PTTL, the lock free.
    # (The shortening announces itself now: here that message is lost, as a message
    # may be, and the release is what is left to wake the waiter.)
    hear = aiolock._waiting.waiting.Waiting._on_message

    def deaf_to_shortening(
        waiting: aiolock._waiting.waiting.Waiting, channel: bytes, message: bytes
    ) -> None:
        if message != aiolock._lua.SHORTENED:
            hear(waiting, channel, message)

    monkeypatch.setattr(aiolock._waiting.waiting.Waiting, "_on_message", deaf_to_shortening)
    async with LockManager(urls) as holder_side, LockManager(urls) as waiter_side:
        holder, waiter, waits = await _waiting_behind(
            holder_side, waiter_side, clients, name, wait=10
        )  # (its attempt failed: it sleeps until the PTTL)
        await holder.extend(0.2)
        await asyncio.sleep(0.5)  # expired on every node
        released = time.monotonic()
        with contextlib.suppress(aiolock.LockNotOwned):
            await holder.release()
        # Named by the release, the waiter tries at once: not after its PTTL (30 s),
        # nor its timeout (10 s; on the old code it returned False then).
        assert await asyncio.wait_for(waits, 20)
        assert time.monotonic() - released < aiolock._waiting.turns.FALLBACK * 0.6
        await waiter.release()


@pytest.mark.parametrize("how", ["extend", "handed-on"])
async def test_a_lock_shortened_and_left_to_expire_wakes_the_other_processes_waiters(
    urls: list[str], clients: list[redis.Redis], name: str, how: str
) -> None:
    # Found by the simulation's "idle" rule (tests/sim/live.py): a holder shortened its
    # lock after a waiter of another process had learnt the longer PTTL, and the lock
    # expired unreleased. No release announced it, and the waiter slept until that
    # PTTL, the lock free. "extend": with extend() (seed 4398046531387, no fault);
    # "handed-on": by a handoff within its process (PASS_ON) to a task with a shorter
    # ttl, which never released it (seed 281474996725057, no fault, on clusters).
    async with LockManager(urls) as holder_side, LockManager(urls) as waiter_side:
        holder, waiter, waits = await _waiting_behind(
            holder_side, waiter_side, clients, name, wait=10
        )  # (its attempt failed: it sleeps until the PTTL)
        if how == "extend":
            shortened = time.monotonic()
            await holder.extend(0.3)  # and never released: it expires
        else:
            taker = holder_side.lock(name, ttl=0.3, auto_renew=False)
            takes = asyncio.create_task(taker.acquire(timeout=10))
            await asyncio.sleep(0.1)  # (queued behind the holder, in its process)
            shortened = time.monotonic()
            await holder.release()  # handed on within the process: the key lives 0.3 s
            assert await takes
            assert taker.fencing_token is not None  # (held, and never released)
        # The waiter learns the shorter PTTL and takes the lock once it expired: not
        # after the PTTL it had learnt (30 s), nor its timeout (10 s; on the old code
        # it returned False then).
        assert await asyncio.wait_for(waits, 20)
        assert 0.3 <= time.monotonic() - shortened < 0.3 + aiolock._waiting.turns.FALLBACK
        await waiter.release()


@pytest.mark.usefixtures("naming_only")
async def test_a_process_that_leaves_in_its_turn_announces_the_lock_free(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        line = await two_in_line(stack, urls, clients, name)
        first_waits, second_lock, second_waits = (
            line.first_waits,
            line.second_lock,
            line.second_waits,
        )
        # The first in line is cancelled as its turn comes (the message heard, its
        # attempt not yet made): leaving, it tells every process the lock is free.

        def cancelling(channel: bytes, message: bytes) -> None:
            on_message(channel, message)
            first_waits.cancel()

        on_message = _intercept(line.first, cancelling)
        released = time.monotonic()
        await line.holder.release()
        assert await asyncio.wait_for(second_waits, 20)
        # At once: not after FALLBACK (0.5 s), nor the holder's 30 s PTTL.
        assert time.monotonic() - released < aiolock._waiting.turns.FALLBACK * 0.6
        assert first_waits.cancelled()
        await second_lock.release()


async def test_a_head_cancelled_while_subscribing_leaves_its_place_in_line_to_the_next(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    async with LockManager(urls) as holder_side, LockManager(urls) as locks:
        holder = holder_side.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        waiting = locks._engine.waiting
        subscribe = waiting._subscribe
        gate = asyncio.Event()

        async def slow_subscribe(queue: Any, grants: bytes | None) -> None:
            await subscribe(queue, grants)
            await gate.wait()  # the first head is cancelled here, before it joins

        waiting._subscribe = slow_subscribe  # type: ignore[method-assign]
        first = asyncio.create_task(locks.lock(name, ttl=30).acquire(timeout=20))
        await asyncio.sleep(0.2)
        second_lock = locks.lock(name, ttl=30, auto_renew=False)
        second = asyncio.create_task(second_lock.acquire(timeout=20))
        await asyncio.sleep(0.2)
        first.cancel()
        # The next head joins the turn queue in its place.
        assert len(await in_line(clients, name, 1)) == 1
        released = time.monotonic()
        await holder.release()
        assert await asyncio.wait_for(second, 20)
        assert time.monotonic() - released < aiolock._waiting.turns.FALLBACK * 0.6  # its turn
        await second_lock.release()


@pytest.mark.usefixtures("naming_only")
async def test_a_head_that_leaves_as_its_process_gives_way_does_not_beat_the_process_named(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 549756914144, no fault; and, where
    # pub/sub is refused, seed 549755934222). A release at the end of its process's
    # streak named another process; in that instant the process's head was cancelled
    # (its operation's timeout), and the waiter after it, head now, tried at once: its
    # attempt followed the release on every connection and won, before the process
    # named had heard it was its turn. The streak began again: 8 holdings in a row.
    monkeypatch.setattr(aiolock._waiting.waiting, "LOCAL_STREAK", 0)  # each release gives way
    async with LockManager(urls) as busy, LockManager(urls) as other:
        queue = key(name).encode()
        holder = busy.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        head = asyncio.create_task(busy.lock(name, ttl=30).acquire(timeout=20))
        while busy._engine.waiting.waiters(queue) < 1:
            await asyncio.sleep(0.001)
        behind = busy.lock(name, ttl=30, auto_renew=False)
        behind_waits = asyncio.create_task(behind.acquire(timeout=20))
        while busy._engine.waiting.waiters(queue) < 2:
            await asyncio.sleep(0.001)
        named = other.lock(name, ttl=30, auto_renew=False)
        named_waits = asyncio.create_task(named.acquire(timeout=20))
        await in_line(clients, name, 2)  # both processes in line
        # The process named hears its turn 10 ms late (a network further away), so
        # that a waiter of the busy process trying at once wins every time; waiting
        # 50 ms first, it loses every time (without the delay: a race).
        _hears_late(other, 0.01)
        waiting = busy._engine.waiting
        released = waiting.released

        def gives_way(*args: Any, **kwargs: Any) -> Any:
            local = released(*args, **kwargs)
            assert local is False  # the release names the other process
            head.cancel()  # and the busy process's head leaves in that instant
            return local

        waiting.released = gives_way  # type: ignore[method-assign]
        await holder.release()
        with pytest.raises(asyncio.CancelledError):
            await head
        # The process named takes the lock (on the old code the waiter behind the head
        # took it, and the named one timed out).
        assert await asyncio.wait_for(named_waits, 20)
        assert not behind_waits.done()
        await named.release()
        assert await asyncio.wait_for(behind_waits, 20)
        await behind.release()


def _no_refresh_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries refreshed every 5 s (living 10 s): none comes back during the test."""
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 5.0)
    monkeypatch.setattr(aiolock._waiting.turns, "ENTRY_TTL", 10.0)


@pytest.mark.usefixtures("naming_only")
async def test_a_named_process_that_holds_past_the_fallback_stays_in_line(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule, in its first schedules focused on turns
    # (seed 549755813917, no fault). A release named a process, which took the lock and
    # held it longer than FALLBACK; the other waiting process heard no later release,
    # "passed over" the process holding the lock and took it out of the line. Until it
    # refreshed its entry, handoffs found nobody else in line: the other process, next
    # to hold, handed the lock to its own waiters 7 times while the first one waited
    # (the promise is at most LOCAL_STREAK).
    _no_refresh_meanwhile(monkeypatch)
    # A process taken out of line joins again at once since (it is told): that it was
    # never taken out is read from what it was told, too.
    told: list[aiolock._waiting.turns.TurnEntry] = []
    taken_out = aiolock._waiting.turns.TurnEntry.taken_out

    def noted(entry: aiolock._waiting.turns.TurnEntry) -> None:
        told.append(entry)
        taken_out(entry)

    monkeypatch.setattr(aiolock._waiting.turns.TurnEntry, "taken_out", noted)
    async with contextlib.AsyncExitStack() as stack:
        line = await two_in_line(stack, urls, clients, name)
        named = line.first._engine.turns
        assert named is not None
        # The first process has a second waiter: it wants the lock after this holding.
        again = line.first.lock(name, ttl=30, auto_renew=False)
        again_waits = asyncio.create_task(again.acquire(timeout=20))
        while line.first._engine.waiting.waiters(key(name).encode()) < 2:
            await asyncio.sleep(0.001)
        await line.holder.release()  # names the first process, which takes the lock
        assert await asyncio.wait_for(line.first_waits, 20)
        # Held for twice the fallback: the second process's fallback has fired.
        await asyncio.sleep(2 * aiolock._waiting.turns.FALLBACK * 1.1)
        assert not line.second_waits.done()  # (its attempt failed: the lock is held)
        turns = key(name) + ":turns"
        for client in clients:
            # Still in line on every node (on the old code: taken out on all three).
            assert await client.zscore(turns, named.member) is not None
        assert not told  # (and never taken out meanwhile)
        await line.first_lock.release()
        assert await asyncio.wait_for(again_waits, 20)
        await again.release()
        assert await asyncio.wait_for(line.second_waits, 20)
        await line.second_lock.release()


@pytest.mark.usefixtures("naming_only")
async def test_a_named_process_taken_out_of_line_as_its_lock_expired_joins_again_at_once(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 35184372089874, no fault). A release
    # named a process, which took the lock and held it, unrenewed, past its ttl: it
    # expired just before the other process's fallback fired, and the next waiter of the
    # process named, which had read the holder's PTTL, was to try a little later. The
    # other process found the lock free, took the one named out of the line (as far as
    # it could tell, it had not used its turn) and took the lock. The one named, alive
    # and waiting, was out of line until its next refresh: the other handed the lock to
    # its own waiters 8 times in a row meanwhile. A process taken out of line is told,
    # and joins again at its place at once.
    _no_refresh_meanwhile(monkeypatch)
    # The waiter of the process named tries after the other's fallback (0.5 s), though
    # the holder's key expired before it (0.3 s).
    monkeypatch.setattr(aiolock._waiting.waiting, "EXPIRY_SLACK", 1.0)
    async with contextlib.AsyncExitStack() as stack:
        line = await two_in_line(stack, urls, clients, name, first_ttl=0.3)
        named, short, other_lock = line.first, line.first_lock, line.second_lock
        await line.holder.release()  # names the process first in line, which takes it
        assert await asyncio.wait_for(line.first_waits, 20)
        # The process named waits again, in line, while its lock runs out.
        again = named.lock(name, ttl=30, auto_renew=False)
        again_waits = asyncio.create_task(again.acquire(timeout=20))
        await in_line(clients, name, 2)
        # The other's fallback finds the lock free, takes the process named out of the
        # line, and takes the lock.
        assert await asyncio.wait_for(line.second_waits, 20)
        assert not again_waits.done()
        turns = key(name) + ":turns"
        member = named._engine.turns.member if named._engine.turns is not None else b""
        deadline = time.monotonic() + 2.0  # (the next refresh is 5 s away)
        while True:
            scores = [await client.zscore(turns, member) for client in clients]
            if all(score is not None for score in scores):
                break  # back in line on every node (on the old code: out until refresh)
            assert time.monotonic() < deadline, scores
            await asyncio.sleep(0.01)
        await other_lock.release()  # names the process back in line
        assert await asyncio.wait_for(again_waits, 20)
        await again.release()
        with contextlib.suppress(aiolock.LockNotOwned):
            await short.release()


async def test_a_process_that_learns_late_that_pubsub_is_refused_stops_offering(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 4398046823285, every node refusing
    # pub/sub): a head joined the turn queue before the refusals of its subscriptions
    # came back (the head before it had been cancelled), and its process went on
    # offering to take grants it could never hear. A release granted it the lock, heard
    # nobody, undid the grant and took the process out of line; the other process, alone
    # in line as far as its handoffs could see, kept the lock 8 times in a row.
    learnt = False
    refused = aiolock._waiting.queue.Queue.polling

    def polling(queue: aiolock._waiting.queue.Queue) -> bool:  # the refusals come back late
        return learnt and refused(queue)

    monkeypatch.setattr(aiolock._waiting.queue.Queue, "polling", polling)
    offers = key(name) + ":turns:offers"
    async with (
        _pubsub_refused(clients, urls) as limited,
        LockManager(limited) as holder_side,
        LockManager(limited) as waiter_side,
    ):
        holder, _, waits = await _waiting_behind(holder_side, waiter_side, clients, name)
        assert [await c.zcard(offers) for c in clients] == [1] * 5  # offered, unaware
        learnt = True
        await asyncio.sleep(aiolock._waiting.turns.REFRESH * 1.5)  # its entry refreshed since
        # No offer left, none made again (on the old code its refresh made it anew).
        assert [await c.zcard(offers) for c in clients] == [0] * 5
        waits.cancel()  # (it slept on the PTTL, believing it would hear the release)
        with contextlib.suppress(asyncio.CancelledError):
            await waits
        await holder.release()


async def test_a_head_that_learns_pubsub_is_refused_after_offering_withdraws_the_offer_at_once(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 17592186151447, every node refusing
    # pub/sub, no fault): a head joined the line before the refusals of its
    # subscriptions came back, and offered to take grants. The refusals withdrew its
    # offers only at the entry's next refresh (0.5 s later). Meanwhile the other
    # process's release, at the end of its streak, granted the lock to that offer,
    # heard nobody, undid the grant and took the process out of line: the other
    # process, alone in line as its handoffs saw it, held the name 8 times in a row.
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 5.0)  # (a refresh withdraws it too)
    offers = key(name) + ":turns:offers"
    async with (
        _pubsub_refused(clients, urls) as refused,
        nemesis(urls) as net,
        LockManager(refused) as holder_side,
        LockManager(_as_refused(net.urls), node_timeout=0.05) as waiter_side,
    ):
        for proxy in net:  # the refusals come 0.3 s late; the head waits 0.1 s for them
            proxy.delay_replies(0.3, links=lambda link: link.kind == "pubsub")
        holder, waiter, waits = await _waiting_behind(holder_side, waiter_side, clients, name)
        assert [await c.zcard(offers) for c in clients] == [1] * 5  # offered, unaware
        await asyncio.sleep(0.8)
        # Withdrawn once the refusals came (on the old code: at the refresh, 5 s on).
        assert [await c.zcard(offers) for c in clients] == [0] * 5
        assert not waits.done()
        await holder.release()
        assert await asyncio.wait_for(waits, 20)  # (it polls)
        await waiter.release()


async def test_a_grant_unheard_because_our_subscription_is_not_in_place_yet_keeps_us_in_line(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 17592196048300, subscriptions held
    # back, no message lost): a process offered in the same instant it subscribed to
    # its grants. A release granted the lock to the offer before the nodes had that
    # subscription: nobody heard it, so it was undone and the process taken out of
    # line, as a dead one is; the other process, alone in line as its handoffs saw
    # it, then held the name 8 times in a row. An offer sent before every node
    # confirmed the subscription is tentative: its grant, unheard, is undone, but the
    # process stays in line.
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 5.0)  # (a refresh puts it back too)
    turns = key(name) + ":turns"

    async with (
        nemesis(urls) as net,
        LockManager(urls) as holder_side,
        LockManager(net.urls, node_timeout=0.05) as waiter_side,
    ):
        # A wait for another name keeps the pub/sub connections open: each channel
        # below is then subscribed by a command of its own.
        _, _, elsewhere = await _waiting_behind(holder_side, waiter_side, clients, name + "-x")
        for proxy in net:  # the grants' subscriptions do not get through (yet)
            proxy.hold(_grant_subscription, math.inf)
        holder, first, first_waits = await _waiting_behind(holder_side, waiter_side, clients, name)
        second = waiter_side.lock(name, ttl=30, auto_renew=False)
        second_waits = asyncio.create_task(second.acquire(timeout=20))
        offers = [await c.zrange(turns + ":offers", 0, -1) for c in clients]
        assert all(len(o) == 1 and o[0].split(b" ")[1].endswith(b"*") for o in offers), offers
        member = waiter_side._engine.turns.member  # type: ignore[union-attr]
        await holder.release()  # grants to the offer: nobody hears it, undone
        assert await asyncio.wait_for(first_waits, 20)  # (the release let all try)
        # Still in line on every node (on the old code: taken out of every line,
        # until its refresh).
        assert [await c.zrange(turns, 0, -1) for c in clients] == [[member]] * 5
        for proxy in net:
            proxy.clear()
            proxy.flush()
        await first.release()
        assert await asyncio.wait_for(second_waits, 20)
        await second.release()
        elsewhere.cancel()


async def test_a_process_subscribes_to_its_grants_before_it_joins_the_line(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # The subscription to the grants goes out with the release channels, before the
    # wait for their confirmations and the head's first attempt, so that every node
    # normally has it by the time the process joins: its first TURN_JOIN then carries a
    # firm offer (one script per node, as before the fix for seed 17592196048300).
    # Subscribed only as it joined, its offer would be tentative every time, and sent
    # again once confirmed.
    async with LockManager(urls) as holder_side, LockManager(urls) as waiter_side:
        waiting = waiter_side._engine.waiting
        join = waiting._join
        subscribed: list[bool] = []  # as it joins: already subscribed to the grants?

        def noted(lock_key: bytes, queue: Any) -> None:
            subscribed.append(queue.grants is not None)
            join(lock_key, queue)

        waiting._join = noted  # type: ignore[method-assign]
        holder, waiter, waits = await _waiting_behind(holder_side, waiter_side, clients, name)
        assert subscribed == [True], subscribed
        await holder.release()
        assert await asyncio.wait_for(waits, 20)
        await waiter.release()


async def test_a_tentative_offer_is_made_firm_as_soon_as_every_node_confirms(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tentative offer (see above) waits for no refresh: once the last node confirms
    # the subscription, the process sends its entry again with the offer firm, so that
    # a process killed in between is taken out of line by a grant it cannot hear.
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 5.0)
    async with (
        nemesis(urls) as net,
        LockManager(urls) as holder_side,
        LockManager(net.urls, node_timeout=0.05) as waiter_side,
    ):
        _, _, elsewhere = await _waiting_behind(holder_side, waiter_side, clients, name + "-x")
        net[2].hold(_grant_subscription, 0.3)  # one node confirms 0.3 s late
        holder, waiter, waits = await _waiting_behind(holder_side, waiter_side, clients, name)
        seqs = await _offer_seqs(clients, name)
        assert all(seq.endswith(b"*") for seq in seqs), seqs
        await asyncio.sleep(0.6)
        # Firm on every node (on the old code: tentative until the refresh, 5 s on).
        seqs = await _offer_seqs(clients, name)
        assert not any(seq.endswith(b"*") for seq in seqs), seqs
        await holder.release()
        assert await asyncio.wait_for(waits, 20)
        await waiter.release()
        elsewhere.cancel()


@pytest.mark.parametrize("refused", ["connections-dropped", "open-connections"])
async def test_a_head_whose_pubsub_is_refused_after_its_offer_was_firm_withdraws_it(
    urls: list[str],
    clients: list[redis.Redis],
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    refused: str,
) -> None:
    # As above, but pub/sub is refused only after the offer was made firm (an ACL
    # changed): no confirmation is pending any more to send the entry again, and the
    # head withdraws the offer before its attempt. The refusal comes on connections
    # that dropped and came back (which, since they ask for the grants again,
    # Queue.reset, also send the entry again without the offer as the refusal confirms
    # them), or as a reply on the open connections (the next SUBSCRIBE, for another
    # name, is refused): there only the head's withdrawal takes the offer back.
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 5.0)
    offers = key(name) + ":turns:offers"
    for client in clients:
        await client.execute_command("ACL", "SETUSER", "aiolock", *MINIMAL_ACL.split())
    try:
        async with (
            nemesis(urls) as net,
            LockManager(urls) as holder_side,
            LockManager(_as_refused(net.urls), node_timeout=0.05) as waiter_side,
        ):
            holder, waiter, waits = await _waiting_behind(holder_side, waiter_side, clients, name)
            await _until_firm(clients, name)
            elsewhere = holder_side.lock(name + "-x", ttl=30, auto_renew=False)
            assert await elsewhere.acquire(timeout=0)
            other = waiter_side.lock(name + "-x", ttl=30, auto_renew=False)
            for client in clients:
                await client.execute_command("ACL", "SETUSER", "aiolock", "-subscribe")
            other_waits = None
            if refused == "connections-dropped":
                for proxy in net:
                    for link in proxy.links:
                        if link.kind == "pubsub" and not link.closed:
                            link.drop()
            else:  # (its SUBSCRIBE is refused)
                other_waits = asyncio.create_task(other.acquire(timeout=20))
            await asyncio.sleep(0.8)
            # Withdrawn at the head's attempt after the refusal (on the old code: at the
            # refresh, 5 s on).
            assert [await c.zcard(offers) for c in clients] == [0] * 5
            assert not waits.done()
            await holder.release()
            assert await asyncio.wait_for(waits, 20)  # (it polls)
            await waiter.release()
            await elsewhere.release()
            if other_waits is not None:
                assert await asyncio.wait_for(other_waits, 20)
                await other.release()
    finally:
        for client in clients:
            await client.execute_command("ACL", "DELUSER", "aiolock")


async def test_where_pubsub_is_refused_a_process_that_gave_way_lets_the_one_named_try_first(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 1099511628058, every node refusing
    # pub/sub: an ACL without +subscribe). There every head polls, and hears no release:
    # at the end of its process's streak, a release named the other process, and the
    # process's own head, its poll due just then, tried and won; the process named,
    # whose poll came later, never had its turn (8 holdings in a row).
    monkeypatch.setattr(aiolock._waiting.waiting, "LOCAL_STREAK", 0)  # each release gives way
    poll = aiolock._waiting.queue.POLL_INTERVAL
    async with (
        _pubsub_refused(clients, urls) as limited,
        LockManager(limited) as busy,
        LockManager(limited) as other,
    ):
        holder = busy.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        named = other.lock(name, ttl=30, auto_renew=False)
        named_waits = asyncio.create_task(named.acquire(timeout=20))
        await in_line(clients, name, 1)
        tries = _attempt_times(busy)
        head = busy.lock(name, ttl=30, auto_renew=False)
        head_waits = asyncio.create_task(head.acquire(timeout=20))
        while not tries:  # its first tries fail: then it polls, every POLL_INTERVAL
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.3 * poll)
        # Released just before the head's next poll: at once, it would win nearly
        # every time (the process named polls on a phase of its own).
        await asyncio.sleep(max(0.0, tries[-1] + 0.95 * poll - time.monotonic()))
        released_at = time.monotonic()
        await holder.release()
        assert await asyncio.wait_for(named_waits, 20)
        assert not head_waits.done()
        # The head let a whole poll of the process named go by before it tried (on
        # the old code it tried at its poll, 5 to 15 ms after the release).
        early = [t - released_at for t in tries if 0 < t - released_at < 1.1 * poll]
        assert not early, early
        await named.release()
        assert await asyncio.wait_for(head_waits, 20)
        await head.release()


async def test_where_pubsub_is_refused_an_expired_holds_late_release_leaves_the_turn_given(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 70368841183464, every node refusing
    # pub/sub, no fault). A task's manual lock expired; another task of its process
    # took the name at the expiry's race and, at the end of the streak, released it
    # naming the other process. Then the expired hold's release came: counted as a
    # release of ours with the streak begun anew, it woke our head, which tried at
    # once and won before the process named polled (8 holdings in a row).
    monkeypatch.setattr(aiolock._waiting.turns, "FALLBACK", 30.0)  # nobody tries out of turn
    async with (
        _pubsub_refused(clients, urls) as limited,
        LockManager(limited) as busy,
        LockManager(limited) as other,
    ):
        stale, taker, named, named_waits, tries, head, head_waits = await _expired_then_taken(
            busy, other, clients, name
        )
        released_at = time.monotonic()
        await taker.release()  # names the other process
        with contextlib.suppress(aiolock.LockNotOwned):
            await stale.release()  # the expired hold's, late
        # The process named takes the lock (on the old code the head, woken by the
        # expired hold's release, tried at once and took it).
        early = [round(t - released_at, 4) for t in tries if t > released_at]
        await _named_first(named_waits, head_waits, f"the head took it; its tries: {early}")
        await named.release()
        assert await asyncio.wait_for(head_waits, 20)
        await head.release()


async def test_where_pubsub_is_refused_a_head_holding_back_holds_back_again_if_we_give_way_again(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation (seed 9007199254748187, runs focused on lone streaks,
    # every node refusing pub/sub): an expired hold's late release gave way, and the
    # polling head held back for it; 0.11 s later, another task of the process
    # released the name, naming the other process again. The head, still holding back
    # for the first, tried when that wait ended, 50 ms after the second release, not
    # after a poll of the process named.
    monkeypatch.setattr(aiolock._waiting.queue, "GAVE_WAY_POLL", 3.0)  # the window, made wide
    monkeypatch.setattr(aiolock._waiting.turns, "FALLBACK", 30.0)  # nobody tries out of turn
    async with (
        _pubsub_refused(clients, urls) as limited,
        LockManager(limited) as busy,
        LockManager(limited) as other,
    ):
        stale, taker, named, named_waits, tries, head, head_waits = await _expired_then_taken(
            busy, other, clients, name
        )
        with contextlib.suppress(aiolock.LockNotOwned):
            await stale.release()  # the expired hold's, late: it gives way
        await asyncio.sleep(1.0)  # the head holds back (until 3 s after that release)
        released_at = time.monotonic()
        await taker.release()  # it gives way again: the head holds back for this one
        assert await asyncio.wait_for(named_waits, 20)
        after = [round(t - released_at, 3) for t in tries if t > released_at]
        while not after:
            await asyncio.sleep(0.05)
            after = [round(t - released_at, 3) for t in tries if t > released_at]
        # Its first try after our second release: once that release's window is over
        # (on the old code, when the first's was: 2 s after the second).
        assert after[0] > 2.9, after
        await named.release()
        assert await asyncio.wait_for(head_waits, 20)
        await head.release()


@pytest.mark.usefixtures("naming_only", "giving_way")
async def test_a_head_whose_subscription_is_confirmed_as_its_process_gives_way_does_not_try(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation's streak rule (seed 17592266044573, subscriptions held
    # back). A head whose subscription a node confirmed only after its first attempt
    # tries again when the confirmation comes (a release in between went unheard). One
    # came just as its process's release, at the streak's end, named the other
    # process: the head tried at once, its attempt followed the release on every
    # connection and won, and its process held the name 8 times in a row.
    async with (
        nemesis(urls) as net,
        LockManager(net.urls) as busy,
        LockManager(urls) as other,
    ):
        holder = busy.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        named = other.lock(name, ttl=30, auto_renew=False)
        named_waits = asyncio.create_task(named.acquire(timeout=20))
        await in_line(clients, name, 1)
        for proxy in net:  # the head's subscriptions to the releases wait
            proxy.hold(_release_subscription, math.inf)
        head = busy.lock(name, ttl=30, auto_renew=False)
        head_waits = asyncio.create_task(head.acquire(timeout=20))
        await in_line(clients, name, 2)  # the confirmations' wait timed out; it joined
        # The process named hears its turn 10 ms late (a network further away): a head
        # that tries as the confirmations come wins (without the delay: a race).
        _hears_late(other, 0.01)
        await holder.release()  # names the other process
        for proxy in net:  # and the confirmations come
            proxy.flush()
        # The process named takes the lock (on the old code the head took it).
        await _named_first(named_waits, head_waits, "the head took the lock first")
        net.clear()
        await named.release()
        assert await asyncio.wait_for(head_waits, 20)
        await head.release()


@pytest.mark.usefixtures("naming_only", "giving_way")
async def test_a_head_woken_before_its_process_gives_way_does_not_try_again_after_it(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation's streak rule (seed 17592286046564, no fault). A head's
    # attempt was under way when a second message woke it again (a shortening
    # extend() announced by three nodes; the first had started the attempt), and
    # meanwhile its process's release, at the streak's end, named the other process.
    # The attempt failed (the lock was still ours when it arrived); woken already,
    # the head tried again at once, after our release on every connection, and won:
    # its process held the name 8 times in a row. Whatever woke it came before our
    # release, and is stale after it.
    channel = (key(name) + ":released").encode()
    async with (
        nemesis(urls) as net,
        LockManager(net.urls, node_timeout=2.0) as busy,
        LockManager(urls) as other,
    ):
        holder, line = await _holder_and_line(busy, other, clients, name)
        _, named_waits, _, head_waits = line
        tries = _attempt_times(busy)
        # The process named hears its turn 1 s late: a head that tries again when its
        # attempt returns wins (without the delay: a race).
        _hears_late(other, 1.0)
        heard: list[bytes] = []  # what the busy process heard

        def noted(channel: bytes, message: bytes) -> None:
            heard.append(message)
            on_busy(channel, message)

        on_busy = _intercept(busy, noted)
        for proxy in net:  # the busy process's replies take 0.3 s
            proxy.delay_replies(0.3, links=lambda link: link.kind == "commands")
        for client in clients:  # wakes the head, on the first node it listens on
            if await client.publish(channel, aiolock._lua.SHORTENED):
                break
        while not tries:
            await asyncio.sleep(0.001)
        for client in clients:  # wakes it again while its attempt is under way
            await client.publish(channel, aiolock._lua.SHORTENED)
        while len(heard) < 1 + 3:  # (it listens on 3 nodes of 5: n - quorum + 1)
            await asyncio.sleep(0.001)
        assert tries[-1] > time.monotonic() - 0.2  # (its attempt is still under way)
        await holder.release()  # names the other process; returns after the attempt
        # The process named takes the lock (on the old code the head took it, trying
        # again 0.3 s after our release).
        await _named_first(named_waits, head_waits, f"the head took it; its tries: {tries}")
        net.clear()
        await _then_the_head(line)


@pytest.mark.usefixtures("naming_only", "giving_way")
async def test_a_shortening_heard_after_its_process_gives_way_does_not_wake_the_head(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation's streak rule (seed 140737492368453, no fault). A holder
    # shortened its lock with extend() and released it at once, its release ending
    # its process's streak (naming the other process). The nodes' announcement of the
    # shortening reached the process only after its release had gone out (pub/sub is
    # another connection): it woke the head, whose attempt followed the release on
    # every connection and won. Its process held the name 8 times in a row. The
    # shortening came before our release, and is stale after it.
    async with LockManager(urls) as busy, LockManager(urls) as other:
        holder, line = await _holder_and_line(busy, other, clients, name)
        _, named_waits, _, head_waits = line
        # The process named hears its turn 0.5 s late: a head woken at our release
        # wins (without the delay: a race).
        _hears_late(other, 0.5)
        held_back: list[tuple[bytes, bytes]] = []  # the busy process's shortenings

        def holding(channel: bytes, message: bytes) -> None:
            if message == aiolock._lua.SHORTENED:
                held_back.append((channel, message))
            else:
                on_busy(channel, message)

        on_busy = _intercept(busy, holding)
        await holder.extend(20)  # announced: the head would learn the new PTTL
        while len(held_back) < 3:  # (it listens on 3 nodes of 5: n - quorum + 1)
            await asyncio.sleep(0.001)
        await holder.release()  # names the other process
        for message in held_back:  # and the shortening is heard only now
            on_busy(*message)
        # The process named takes the lock (on the old code the head took it at once).
        await _named_first(named_waits, head_waits, "the head took the lock first")
        await _then_the_head(line)


async def test_a_head_holding_back_that_a_release_of_ours_hands_the_lock_sends_nothing_of_its_own(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation (seed 8796103035398: exclusion, fencing, kept). Where
    # pub/sub is refused, a head that polls holds back after its process gave way. A
    # release of ours in that window claimed the head's offer and passed the lock to its
    # token; woken, the head tried with the same token all the same. Its attempt failed
    # (the lock was still the releaser's), and its clean-up, sent after the handoff on
    # the nodes that had not answered yet, deleted the key the handoff had set there:
    # the head took the handoff's outcome and held a lock kept on one node of five.
    monkeypatch.setattr(aiolock._waiting.queue, "GAVE_WAY_POLL", 3.0)  # the window, made wide
    async with (
        _pubsub_refused(clients, urls),
        nemesis(urls) as net,
        LockManager(_as_refused(net.urls), node_timeout=1.0) as ours,
    ):
        first = ours.lock(name, ttl=30, auto_renew=False)
        assert await first.acquire(timeout=0)
        head = ours.lock(name, ttl=30, auto_renew=False)
        head_waits = asyncio.create_task(head.acquire(timeout=20))
        await in_line(clients, name, 1)
        monkeypatch.setattr(aiolock._waiting.waiting, "LOCAL_STREAK", 0)
        await first.release()  # gives way (to nobody): the head holds back from its poll
        monkeypatch.setattr(aiolock._waiting.waiting, "LOCAL_STREAK", LOCAL_STREAK)
        await asyncio.sleep(3 * aiolock._waiting.queue.POLL_INTERVAL)
        assert not head_waits.done()
        second = ours.lock(name, ttl=30, auto_renew=False)
        assert await second.acquire(timeout=0)  # (timeout=0 tries at once)
        # Nodes 4 and 5 hold another token; nodes 2 and 3 answer us 0.2 s late. The
        # handoff wins on nodes 1 to 3; an attempt of the head's own would be decided
        # (lost) by nodes 1, 4 and 5 and clean up on 2 and 3, after the handoff there.
        for client in clients[3:]:
            await client.set(key(name), b"another", xx=True, px=30_000)
        for proxy in net[1:3]:
            proxy.delay_replies(0.2, links=lambda link: link.kind == "commands")
        await second.release()
        assert await asyncio.wait_for(head_waits, 20)
        assert head._hold is not None
        tokens = [await c.get(key(name)) for c in clients]
        # Held where the head believes it is: on nodes 1 to 3 (on the old code, node 1).
        assert tokens[:3] == [head._hold.token] * 3, tokens
        for client in clients[3:]:
            await client.delete(key(name))
        net.clear()
        await head.release()


async def test_a_process_whose_pubsub_connections_drop_joins_the_line_again_at_once(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation (seed 281474983711000, pub/sub connections dropped): a
    # release granted the lock to the other process as its pub/sub connections
    # dropped. No node had its subscription any more: each gave the grant back and
    # took that process out of line, telling nobody. Out of line until its entry's
    # next refresh (0.5 s), it let the holder's process hand the lock to its own
    # waiters 15 times in a row. A process that loses a pub/sub connection now joins
    # again at its place at once (what it missed may have taken it out).
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 30.0)  # no refresh during the test
    monkeypatch.setattr(aiolock._waiting.turns, "ENTRY_TTL", 60.0)
    async with LockManager(urls) as busy, LockManager(urls) as other:
        holder = busy.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        waiter = other.lock(name, ttl=30, auto_renew=False)
        waits = asyncio.create_task(waiter.acquire(timeout=20))
        [member] = await in_line(clients, name, 1)
        for client in clients:  # what an unheard grant does on each node
            await client.eval(TURN_LEAVE_SCRIPT.source, 3, *turn_keys(key(name).encode()), member)
        await in_line(clients, name, 0)
        for client in clients:
            await client.client_kill_filter(_type="pubsub")
        # Back at its place (on the old code, only at its next refresh).
        assert await in_line(clients, name, 1) == [member]
        await holder.release()
        assert await asyncio.wait_for(waits, 20)
        await waiter.release()


async def test_a_process_whose_pubsub_connections_drop_offers_tentatively_until_they_are_back(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 281474985869760, one pub/sub drop,
    # no other fault): the process joined the line again at once (above), its offer
    # firm, and a release granted it the lock before its new connections had
    # subscribed again. Nobody heard the grant: each node undid it and took the
    # process out of line, telling nobody, until its entry's refresh (0.5 s); the
    # holder's process, alone in line as its handoffs saw it, held the name 8 times in
    # a row. Its subscriptions are asked for again on the new connections: until each
    # node confirms, its offer is tentative (an unheard grant keeps it in line), and
    # the confirmations wake its head (a release may have gone unheard meanwhile).
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 30.0)  # no refresh during the test
    monkeypatch.setattr(aiolock._waiting.turns, "ENTRY_TTL", 60.0)
    turns = key(name) + ":turns"
    async with (
        nemesis(urls) as net,
        LockManager(urls) as holder_side,
        LockManager(net.urls, node_timeout=0.05) as waiter_side,
    ):
        holder, waiter, waits = await _waiting_behind(holder_side, waiter_side, clients, name)
        member = waiter_side._engine.turns.member  # type: ignore[union-attr]
        await _until_firm(clients, name)
        for proxy in net:  # the new connections' subscriptions do not get through (yet)
            proxy.hold(_grant_subscription, math.inf)
            for link in proxy.links:
                if link.kind == "pubsub" and not link.closed:
                    link.drop()
        # In line again at once, its offer tentative (on the old code: firm).
        deadline = time.monotonic() + 5
        while not all(seq.endswith(b"*") for seq in await _offer_seqs(clients, name)):
            assert time.monotonic() < deadline, await _offer_seqs(clients, name)
            await asyncio.sleep(0.01)
        await holder.release()  # grants to the offer: nobody hears it, undone
        # Still in line on every node (on the old code: taken out of every line).
        assert [await c.zrange(turns, 0, -1) for c in clients] == [[member]] * 5
        assert not waits.done()
        for proxy in net:
            proxy.clear()
            proxy.flush()
        # Subscribed again: the confirmations wake the head, which finds the lock free
        # (on the old code it slept on the holder's 30-s PTTL).
        assert await asyncio.wait_for(waits, 10)
        await waiter.release()


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


async def test_a_process_whose_queue_fills_again_as_its_confirmations_lag_stays_in_line(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation's streak rule (seed 2251799813703477, subscriptions held
    # back). A process's queue for a name emptied while the nodes' confirmations of its
    # subscriptions were on their way, and a new waiter subscribed again at once. The
    # old confirmations came first and were taken for the new ones: its offer went
    # firm while the nodes, past the UNSUBSCRIBE and not yet at the new SUBSCRIBE, had
    # it on no channel. The release that named it granted the lock to nobody: undone,
    # and the process taken out of line (its rival then held the name 8 times in a
    # row). Until its own confirmations come, its offer stays tentative: a grant
    # unheard is undone, and the process stays in line.
    turns = key(name) + ":turns"

    def pubsub(link: Any) -> bool:
        return link.kind == "pubsub"

    async with nemesis(urls) as net, LockManager(net.urls) as lagging, LockManager(urls) as other:
        holder = other.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        for proxy in net:  # the nodes' confirmations reach the lagging process 0.3 s late
            proxy.delay_replies(0.3, links=pubsub)
        first = asyncio.create_task(lagging.lock(name, ttl=30).acquire(timeout=20))
        pattern = key(name) + ":turn:*"
        for _ in range(500):  # until every node has its subscription to its grants
            if all([await c.pubsub_channels(pattern) for c in clients]):
                break
            await asyncio.sleep(0.01)
        for proxy in net:  # a subscription from now on reaches the node 2 s late
            proxy.hold(command("SUBSCRIBE"), 2.0, links=pubsub)
        first.cancel()  # its queue empties (UNSUBSCRIBE) and fills again (SUBSCRIBE)
        waiter = lagging.lock(name, ttl=30, auto_renew=False)
        waits = asyncio.create_task(waiter.acquire(timeout=20))
        await in_line(clients, name, 1)
        await asyncio.sleep(0.6)  # the replies to the first subscriptions have come
        # The nodes have it on no channel of its grants (the new SUBSCRIBEs are held).
        assert [await c.pubsub_channels(pattern) for c in clients] == [[]] * len(clients)
        assert all(seq.endswith(b"*") for seq in await _offer_seqs(clients, name)), (
            "its offer went firm on the replies to the subscriptions before"
        )
        await holder.release()  # names it: the grant, unheard, is undone
        assert [await c.zcard(turns) for c in clients] == [1] * len(clients), (
            "its unheard grant took it out of line"
        )
        assert await asyncio.wait_for(waits, 20)  # woken by its own confirmations
        await waiter.release()


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
    queues = busy._engine.waiting._queues
    while not tries or key(name).encode() not in queues:  # it failed: then it polls
        await asyncio.sleep(0.001)
    queue = queues[key(name).encode()]
    queue.local_streak, queue.alone = LOCAL_STREAK, False  # the next release gives way
    return stale, taker, named, named_waits, tries, head, head_waits


def _attempt_times(manager: aiolock.LockManager) -> list[float]:
    """The times (``time.monotonic()``) of the acquire attempts ``manager`` sends."""
    quorum = manager._engine.quorum
    attempt = quorum.acquire
    times: list[float] = []

    async def timed(*args: Any, **kwargs: Any) -> Any:
        times.append(time.monotonic())
        return await attempt(*args, **kwargs)

    quorum.acquire = timed  # type: ignore[method-assign]
    return times
