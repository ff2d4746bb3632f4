"""Handoffs within a process that send nothing: the lease (see _waiting/handoff.py).

A handoff to a waiter of the same process (``PASS_ON``) reserves fencing tokens for
the waiters queued behind the taker. While the lock is fresh, the next handoffs hand
out those tokens and the lock's validity, with no script at all.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, cast

import pytest
import redis.asyncio as redis

from aiolock import Lock, LockManager, _lua
from aiolock._core.votes import Attempt, Votes, is_taken
from aiolock._waiting.handoff import reserved
from aiolock._waiting.waiting import Outcome, Taker

from . import seam
from .conftest import TurnScripts, elsewhere, key, scripts_run, settled_keys

if TYPE_CHECKING:
    from aiolock._quorum.quorum import Quorum

QUORUM = 3


async def _pttls(clients: list[redis.Redis], name: str) -> list[int]:
    return [await client.pttl(key(name)) for client in clients]


async def _within_what_a_quorum_holds(lock: Lock, clients: list[redis.Redis], name: str) -> bool:
    """The holder's validity is no longer than a quorum of nodes still keep its key.

    The PTTLs are read first: ``remaining()`` read after them can only be smaller than
    it was when each was read, so a busy loop between the reads never fails the check.
    """
    pttls = await _pttls(clients, name)
    return sorted(pttls, reverse=True)[QUORUM - 1] >= lock.remaining() * 1000 - 1


async def test_handoffs_in_a_row_send_nothing_while_the_lock_is_fresh(
    locks: LockManager, clients: list[redis.Redis], name: str, turn_scripts: TurnScripts
) -> None:
    turn_scripts.watch(locks)
    for client in clients:
        await client.config_resetstat()
    fences: list[int] = []
    inside = 0
    checked = 0

    async def task() -> None:
        nonlocal inside, checked
        lock = locks.lock(name, ttl=30, auto_renew=False)
        for _ in range(10):
            assert await lock.acquire(timeout=20)
            inside += 1
            assert inside == 1
            assert lock.fencing_token is not None
            fences.append(lock.fencing_token)
            if checked < 20:  # the validity never outlives the key on a quorum
                checked += 1
                assert await _within_what_a_quorum_holds(lock, clients, name)
            await asyncio.sleep(0)
            inside -= 1
            await lock.release()

    await asyncio.gather(*(task() for _ in range(8)))
    assert len(fences) == 80
    assert fences == sorted(set(fences))  # strictly increasing in the order held
    # One script per node per handoff (5 per section) when each handoff is PASS_ON;
    # with the leases, far fewer.
    per_section = sum(await scripts_run(clients, leaving_out=turn_scripts)) / len(fences)
    assert per_section <= 2.0, per_section
    assert await settled_keys(clients, name, [False] * 5) == [False] * 5


async def _passed_on(
    locks: LockManager, name: str, *, ttl: float, ttls: tuple[float, ...] = ()
) -> tuple[list[Lock], list[asyncio.Task[bool]]]:
    """Three waiters of the same manager queued behind a holder of ``name`` (with
    ``ttls``, else ``ttl`` as the holder), and the first given the lock by the holder's
    release: a ``PASS_ON``, which reserves two more fencing tokens for the others."""
    holder = locks.lock(name, ttl=ttl, auto_renew=False)
    assert await holder.acquire()
    waiters = [locks.lock(name, ttl=t, auto_renew=False) for t in ttls or (ttl,) * 3]
    tasks = []
    for waiter in waiters:
        tasks.append(asyncio.create_task(elsewhere(waiter.acquire(timeout=10))))
        await asyncio.sleep(0.05)
    await holder.release()
    assert await tasks[0]
    return waiters, tasks


async def _in_turn(holding: list[Lock], queued: list[asyncio.Task[bool]]) -> None:
    """Each of ``holding`` releases in turn, and the next one's acquire returns."""
    for i, lock in enumerate(holding):
        await lock.release()
        if i < len(queued):
            assert await queued[i]


async def test_a_lease_hands_out_reserved_tokens_above_any_later_holder_s_floor(
    locks: LockManager, urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # The lease's tokens are reserved on a quorum by the PASS_ON before them: a holder
    # after the last lease holder died gets a greater token, even with a clock so far
    # behind that its floor counts for nothing (safety.md, "Fencing tokens"). A 30 s ttl: a lease
    # is made only within 1 % of it (300 ms) of the PASS_ON, which a busy box can take.
    waiters, tasks = await _passed_on(locks, name, ttl=30.0)
    passed_on = {await client.get(key(name)) for client in clients}
    fences = [waiters[0].fencing_token or 0]
    for i in (1, 2):  # two leases
        await waiters[i - 1].release()
        assert await tasks[i]
        fences.append(waiters[i].fencing_token or 0)
    assert fences == sorted(set(fences))
    last = fences[-1]
    # Leases: the key still holds the token the PASS_ON set.
    assert {await client.get(key(name)) for client in clients} == passed_on
    assert len(passed_on) == 1
    # The last holder "dies" holding the lock: no release, its key expires (deleted
    # here, as expiry would; the counters stay).
    for client in clients:
        await client.delete(key(name))
    async with LockManager(urls) as later:
        seam.engine(later).quorum.wall_clock = lambda: 0.0
        lock = later.lock(name, ttl=5, auto_renew=False)
        assert await lock.acquire(timeout=5)
        assert (lock.fencing_token or 0) > last
        await lock.release()


async def test_a_lock_held_too_long_is_passed_on_with_a_fresh_ttl_not_leased(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    waiters, tasks = await _passed_on(locks, name, ttl=1.0)
    await asyncio.sleep(0.3)  # a lease would leave the next holder 0.7 s
    sent = time.monotonic()
    await waiters[0].release()
    assert await tasks[1]
    assert waiters[1].remaining() > 0.9 - (time.monotonic() - sent)
    assert await _within_what_a_quorum_holds(waiters[1], clients, name)
    await _in_turn(waiters[1:], tasks[2:])


async def test_a_waiter_with_a_shorter_ttl_is_passed_the_lock_with_its_own(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    # Leased, it would hold the lock for the holder's 30 s: should its process die, the
    # others would wait 30 s, not the 1 s it asked for.
    waiters, tasks = await _passed_on(locks, name, ttl=30.0, ttls=(30, 1, 30))
    await waiters[0].release()
    assert await tasks[1]
    assert waiters[1].remaining() <= 1.0
    assert max(await _pttls(clients, name)) <= 1000
    await _in_turn(waiters[1:], tasks[2:])


async def test_a_lock_with_an_extension_in_flight_is_not_leased(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    # The nodes may apply the extension (here a shorter ttl) after the lease: the next
    # holder's validity would not be what they keep. PASS_ON goes after it instead.
    waiters, tasks = await _passed_on(locks, name, ttl=30.0)
    extend = asyncio.create_task(waiters[0].extend(0.5))
    await asyncio.sleep(0)  # its requests are written
    await waiters[0].release()
    assert await tasks[1]
    await extend
    assert waiters[1].remaining() > 25
    assert await _within_what_a_quorum_holds(waiters[1], clients, name)
    await _in_turn(waiters[1:], tasks[2:])


async def test_a_waiter_cancelled_after_a_lease_gives_the_lock_back(
    locks: LockManager, clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiters, tasks = await _passed_on(locks, name, ttl=30.0)
    deliver = Taker.deliver
    leased: list[Outcome] = []

    def deliver_then_cancel(taker: Taker, outcome: Outcome) -> bool:
        delivered = deliver(taker, outcome)
        leased.append(outcome)
        tasks[1].cancel()  # before its wake-up runs: cancelled with a lock it never took
        return delivered

    monkeypatch.setattr(Taker, "deliver", deliver_then_cancel)
    await waiters[0].release()
    monkeypatch.undo()
    assert len(leased) == 1
    assert getattr(leased[0], "token", None) is not None  # a lease's: the key's token
    # The third waiter gets it: from the give-back's release message.
    assert await asyncio.wait_for(tasks[2], 5)
    assert waiters[2].owned
    await waiters[2].release()
    assert await settled_keys(clients, name, [False] * 5) == [False] * 5


async def test_pass_on_reserves_tokens_above_the_one_it_returns(
    clients: list[redis.Redis], name: str
) -> None:
    client, lock_key, fence_key = clients[0], key(name), key(name) + ":fence"
    try:
        for reserve, counter in ((0, 5_001), (3, 5_004)):
            await client.set(lock_key, b"old", px=5000)
            await client.set(fence_key, 5_000)
            args = [b"new", 20_000, 60_000, 1_000, b"old", reserve]
            reply = await client.eval(_lua.PASS_ON_SCRIPT.source, 2, lock_key, fence_key, *args)
            assert reply == [1, 5_001, 0]
            assert int(await client.get(fence_key)) == counter
            assert 50_000 < await client.pttl(fence_key) <= 60_000
    finally:
        await client.delete(lock_key, fence_key)


class _FiveNodes:
    n = 5
    quorum = QUORUM


async def test_a_reserve_counts_only_when_a_quorum_returned_the_token_itself() -> None:
    def attempt(fences: list[int | None]) -> Attempt:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        votes = Votes(5, QUORUM, is_taken, waiter, early=False)
        for i, fence in enumerate(fences):
            votes.record(i, [1, fence] if fence is not None else [0, 500, b"other"])
        return Attempt(votes, 10.0, max(f for f in fences if f is not None), 0.0)

    quorum = cast("Quorum", _FiveNodes())
    # The counters of the nodes that returned the token are at token + 4.
    assert reserved(quorum, attempt([7, 7, 7, 6, None]), 4) == 11
    assert reserved(quorum, attempt([7, 7, 7, 7, 7]), 4) == 11
    # Two nodes at the token (the others lag; raised to it, not above): no reserve.
    assert reserved(quorum, attempt([7, 7, 6, 6, 6]), 4) is None
    assert reserved(quorum, attempt([7, 7, None, None, 6]), 4) is None
    assert reserved(quorum, attempt([7, 7, 7, 7, 7]), 0) is None  # none asked
