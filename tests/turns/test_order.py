"""The order of turns: the next process is named, a streak gives way, a lost turn costs little."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import signal
import sys
import time
from asyncio.subprocess import PIPE
from typing import Any

import pytest
import redis.asyncio as redis

import aiolock
import aiolock._lua
import aiolock._waiting.turns
import aiolock._waiting.waiting
from aiolock import LockManager
from aiolock._waiting.waiting import LOCAL_STREAK

from .. import seam
from ..conftest import count_attempts, in_line, key, two_in_line
from .conftest import (
    WORKER,
    _handed_on,
    _intercept,
    _released_message,
    _run_workers,
    _waiting_behind,
)


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
        assert members == [seam.member(m) for m in waiting if seam.engine(m).turns]
        attempts = [count_attempts(manager) for manager in waiting]
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert order == [0, 1, 2]
    # Each process tried once, when named: none lost a race (before turns, every
    # release woke every waiting process: 3 + 2 + 1 attempts).
    assert [count[0] for count in attempts] == [1, 1, 1]
    assert [await client.exists(key(name) + ":turns") for client in clients] == [0] * 5


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
        assert set(lost) == {seam.member(first) if seam.engine(first).turns else b""}
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
            while seam.waiters(busy, queue) == 0:
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
        # the release named the other process (broken: never, in 9 handoffs).
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
        real_attempt = seam.engine(busy).quorum.acquire
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

        seam.engine(busy).quorum.acquire = gated  # type: ignore[method-assign]

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
        while seam.waiters(busy, queue) < 2:
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
                while seam.waiters(busy, queue) == 0:
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
        # process in it, its handoffs come to LOCAL_STREAK (broken: 9, the
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
        attempt = seam.engine(side_a).quorum.acquire
        b_took = asyncio.Event()

        async def after_b(*args: Any, **kwargs: Any) -> Any:
            if "script" not in kwargs:  # an attempt of its own (not a handoff)
                await b_took.wait()
            return await attempt(*args, **kwargs)

        seam.engine(side_a).quorum.acquire = after_b  # type: ignore[method-assign]
        releasing = asyncio.create_task(taker.release())
        await asyncio.sleep(0)
        cancelled_waits.cancel()
        await releasing
        assert await asyncio.wait_for(other_waits, 10)
        b_took.set()
        released = time.monotonic()
        await other.release()  # names A, and grants its offer: the taker's old token
        assert await asyncio.wait_for(last_waits, 30)
        # At once: not when that grant's key expires (30 s; broken: the last
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
        # nor its timeout (10 s; broken: it returned False then).
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
        # after the PTTL it had learnt (30 s), nor its timeout (10 s; broken,
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
