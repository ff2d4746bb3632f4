"""Semaphore, lock_many and synchronized on real servers."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import math
import sys
import time

import pytest
import redis.asyncio as redis

from aiolock import Lock, LockLost, LockManager, LockNotOwned, LockTimeout, QuorumError
from aiolock.testing import Server, Servers

from .conftest import elsewhere, key, scripts_run

# -- semaphore -------------------------------------------------------------------------


async def test_semaphore_admits_up_to_limit(locks: LockManager, name: str) -> None:
    held = [locks.semaphore(name, 3, ttl=5) for _ in range(3)]
    for sem in held:
        assert await sem.acquire(timeout=0)
    assert sorted(s.slot for s in held if s.slot is not None) == [0, 1, 2]
    fourth = locks.semaphore(name, 3, ttl=5)
    assert await fourth.acquire(timeout=0) is False
    await held[0].release()
    assert await fourth.acquire(timeout=0) is True
    for sem in (*held[1:], fourth):
        await sem.release()


async def test_semaphore_waiter_is_woken_by_a_release(locks: LockManager, name: str) -> None:
    first = locks.semaphore(name, 1, ttl=30)
    assert await first.acquire()
    waiter = asyncio.create_task(locks.semaphore(name, 1, ttl=30).acquire(timeout=10))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await first.release()
    assert await waiter
    assert time.monotonic() - started < 1.0


async def test_a_failed_semaphore_try_never_leaves_its_index_without_a_ttl(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    """Found by the simulation (seed 41): the index of noted slots, gone (it expired, or a
    node restarted empty) while a slot is held, was written again by a failed try with
    no ttl, and kept forever."""
    index = key(name) + ":slots"
    holder = locks.semaphore(name, 1, ttl=5)
    assert await holder.acquire()
    for client in clients:
        await client.delete(index)
    assert not await locks.semaphore(name, 1, ttl=5).acquire(timeout=0)
    ttls = [await client.pttl(index) for client in clients]
    assert all(ttl > 0 for ttl in ttls), ttls
    await holder.release()


async def test_semaphore_timeout_and_async_with(locks: LockManager, name: str) -> None:
    async with locks.semaphore(name, 1, ttl=5) as sem:
        assert sem.owned
        assert 4.5 < sem.remaining() <= 5.0
        assert sem.fencing_token is not None
        with pytest.raises(LockTimeout):
            async with locks.semaphore(name, 1, ttl=5, timeout=0.2):
                pytest.fail("over the limit")
    assert not sem.owned
    assert sem.remaining() == 0.0
    with pytest.raises(LockNotOwned, match=r"semaphore .* is not held"):
        await sem.release()
    with pytest.raises(LockNotOwned, match="not held with auto_renew"):
        await locks.semaphore(name, 1).wait_lost()


async def test_a_semaphore_release_wakes_a_waiter_of_another_process_at_once(
    locks: LockManager, urls: list[str], name: str
) -> None:
    # Not through the local queue: through the semaphore's one channel.
    async with LockManager(urls) as elsewhere_locks:
        holder = locks.semaphore(name, 2, ttl=30)
        other = locks.semaphore(name, 2, ttl=30)
        assert await holder.acquire(timeout=0)
        assert await other.acquire(timeout=0)
        waiter = elsewhere_locks.semaphore(name, 2, ttl=30)
        queued = asyncio.create_task(waiter.acquire(timeout=10))
        await asyncio.sleep(0.3)  # it tried, and sleeps (1 s at most without a message)
        started = time.monotonic()
        await holder.release()
        assert await queued
        assert time.monotonic() - started < 0.5
        await waiter.release()
        await other.release()


async def test_semaphore_waiters_of_one_process_do_not_wait_for_each_other(
    locks: LockManager, name: str
) -> None:
    # Unlike a lock's, the next waiter tries at once after one acquired: there may be
    # a slot for it too (the holders below keep theirs for 30 s).
    holders = [locks.semaphore(name, 2, ttl=30) for _ in range(2)]
    for sem in holders:
        assert await sem.acquire(timeout=0)
    waiters = [locks.semaphore(name, 2, ttl=30) for _ in range(2)]
    queued = [asyncio.create_task(elsewhere(sem.acquire(timeout=10))) for sem in waiters]
    await asyncio.sleep(0.3)
    started = time.monotonic()
    for sem in holders:
        await sem.release()
    assert await asyncio.gather(*queued) == [True, True]
    assert time.monotonic() - started < 0.7
    for sem in waiters:
        await sem.release()


async def test_a_semaphore_waiter_sleeps_until_a_release_or_the_first_expiry(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    # A full semaphore whose holders keep their slots: the waiter is not told of any
    # release, so it tries again only when the first noted holder's key would expire,
    # capped at 1 s (not polling every few ms).
    holders = [locks.semaphore(name, 3, ttl=30) for _ in range(3)]
    for sem in holders:
        assert await sem.acquire(timeout=0)
    for client in clients:
        await client.config_resetstat()
    waiter = locks.semaphore(name, 3, ttl=30)
    assert await elsewhere(waiter.acquire(timeout=2.5)) is False
    # About 5 tries (twice at once: before queueing and as the queue's head; then about
    # every second, and at the deadline), a script per node each and a clean-up on
    # nodes that had not answered yet; polling every 50 ms would be 50 tries.
    assert all(calls <= 15 for calls in await scripts_run(clients)), await scripts_run(clients)
    for sem in holders:
        await sem.release()


async def test_expired_holder_frees_its_slot(locks: LockManager, name: str) -> None:
    crashed = locks.semaphore(name, 1, ttl=0.3, auto_renew=False)
    assert await crashed.acquire()
    other = locks.semaphore(name, 1, ttl=5)
    started = time.monotonic()
    assert await other.acquire(timeout=5)
    assert time.monotonic() - started < 3.0
    await other.release()


async def test_semaphore_slot_lost_cancels_body(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    reached_end = False
    deleted_at = math.inf
    with pytest.raises(LockLost):
        async with locks.semaphore(name, 2, ttl=0.6) as sem:
            slot_key = f"aiolock:{{{name}}}:slot:{sem.slot}"
            for client in clients:
                await client.delete(slot_key)
            deleted_at = time.monotonic()
            await asyncio.sleep(5)
            reached_end = True
    # The body was cancelled within about one renewal period, not left to finish.
    assert not reached_end
    assert time.monotonic() - deleted_at < 2.5


async def test_a_failed_semaphore_attempt_leaves_no_slot_and_no_note_behind(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    # Slot 0 of a semaphore of 1 is held on nodes 0-2 by someone else: an attempt takes
    # it on nodes 3 and 4 only, fails, and must give back both the slot's key and what
    # those nodes noted of it (the clean-up's script needs the notes' key too).
    slot = f"{key(name)}:slot:0"
    for client in clients[:3]:
        await client.set(slot, b"someone-else", px=10_000)
    sem = locks.semaphore(name, 1, ttl=5)
    assert await sem.acquire(timeout=0) is False
    await asyncio.sleep(0.2)  # the clean-up's requests have landed everywhere
    assert [await c.get(slot) for c in clients] == [b"someone-else"] * 3 + [None] * 2
    assert [await c.zscore(f"{key(name)}:slots", "0") for c in clients[3:]] == [None, None]


async def test_semaphore_outage_raises_quorum_error(servers: Servers, name: str) -> None:
    async with LockManager(servers) as locks:
        for server in servers.servers[:3]:
            assert isinstance(server, Server)
            server.kill()
        with pytest.raises(QuorumError):
            await locks.semaphore(name, 2).acquire(timeout=1)


def test_semaphore_arguments_are_checked() -> None:
    locks = LockManager(["redis://127.0.0.1:1"])
    with pytest.raises(ValueError, match="limit"):
        locks.semaphore("n", 0)
    with pytest.raises(TypeError):
        locks.semaphore("n", 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        locks.semaphore("", 2)


SEM_WORKER = """
import asyncio, json, sys, time
from aiolock import LockManager

async def main(nodes):
    out = []
    # restart_grace=0: the suite's servers, started (and restarted) empty by it.
    async with LockManager(nodes, restart_grace=0) as locks:
        async def task():
            for _ in range(8):
                async with locks.semaphore("sem-limit", 3, ttl=5, timeout=60):
                    entered = time.monotonic()
                    await asyncio.sleep(0.01)
                    out.append((entered, time.monotonic()))
        await asyncio.gather(*(task() for _ in range(3)))
    print(json.dumps(out))

asyncio.run(main(sys.argv[1:]))
"""


async def test_semaphore_never_exceeds_limit_across_processes(urls: list[str]) -> None:
    pipe = asyncio.subprocess.PIPE
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", SEM_WORKER, *urls, stdout=pipe, stderr=pipe
        )
        for _ in range(3)
    ]
    sections: list[tuple[float, float]] = []
    for proc in procs:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        sections.extend((a, b) for a, b in json.loads(out))
    assert len(sections) == 3 * 3 * 8
    events = sorted([(a, 1) for a, _ in sections] + [(b, -1) for _, b in sections])
    most = max(itertools.accumulate(delta for _, delta in events))
    assert most <= 3
    assert most >= 2  # they did overlap: a semaphore, not a lock


async def test_a_try_on_a_full_semaphore_costs_the_same_at_any_limit(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    """Finding a free slot, or learning there is none, is not a walk over slots."""
    limit = 40
    before = sum(isinstance(o, Lock) for o in gc.get_objects())
    probe = locks.semaphore(name, limit, ttl=30)
    # No handle per slot: constructing one at limit 40 builds at most the one it holds.
    assert sum(isinstance(o, Lock) for o in gc.get_objects()) - before <= 1
    holders = [locks.semaphore(name, limit, ttl=30, auto_renew=False) for _ in range(limit)]
    for sem in holders:
        assert await sem.acquire(timeout=0)
    assert sorted(s.slot for s in holders if s.slot is not None) == list(range(limit))
    for client in clients:
        await client.config_resetstat()
    tries = 5
    for _ in range(tries):
        assert await probe.acquire(timeout=0) is False
    # One script per node per try here (the nodes agree that all are held); a few at most.
    assert all(calls <= 2 * tries for calls in await scripts_run(clients))
    # The last free slot is found in a few scripts too, wherever it is.
    for gone in (holders[7], holders[33]):
        freed = gone.slot
        await gone.release()
        for client in clients:
            await client.config_resetstat()
        assert await probe.acquire(timeout=0)
        assert probe.slot == freed
        assert all(calls <= 4 for calls in await scripts_run(clients))
        await probe.release()
        assert await gone.acquire(timeout=0)
    for sem in holders:
        await sem.release()


async def test_a_semaphore_waiter_listens_on_one_channel(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    limit = 25
    holders = [locks.semaphore(name, limit, ttl=30) for _ in range(limit)]
    for sem in holders:
        assert await sem.acquire(timeout=0)
    sem = locks.semaphore(name, limit, ttl=30)
    waiter = asyncio.create_task(elsewhere(sem.acquire(timeout=10)))
    await asyncio.sleep(0.3)
    # It listens on some of the nodes (see _waiting/waiting.py): one channel on each of them.
    channels = [await client.pubsub_channels(f"*{name}*") for client in clients]
    assert {len(on_node) for on_node in channels} == {0, 1}, channels
    started = time.monotonic()
    await holders[11].release()
    assert await waiter
    assert time.monotonic() - started < 1.0
    for one in (*holders[:11], *holders[12:], sem):
        await one.release()


async def test_a_slot_freed_by_an_expired_holder_is_found_among_renewed_ones(
    locks: LockManager, name: str
) -> None:
    """Renewal leaves what an acquire noted of a slot's expiry behind; a try still finds
    the one slot whose holder died, among slots that are all held past that note."""
    limit = 20
    held = [locks.semaphore(name, limit, ttl=0.6) for _ in range(limit - 1)]
    crashed = locks.semaphore(name, limit, ttl=0.6, auto_renew=False)
    for sem in (*held[:12], crashed, *held[12:]):
        assert await sem.acquire(timeout=0)
    free_slot = crashed.slot
    await asyncio.sleep(1.5)  # the crashed one expired; the others were renewed twice
    assert all(sem.owned for sem in held)
    probe = locks.semaphore(name, limit, ttl=5)
    assert await probe.acquire(timeout=0)
    assert probe.slot == free_slot
    assert await locks.semaphore(name, limit, ttl=5).acquire(timeout=0) is False
    for sem in (*held, probe):
        await sem.release()


# -- lock_many ---------------------------------------------------------------------------


async def test_lock_many_takes_all_or_nothing(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    names = [f"{name}-b", f"{name}-a", f"{name}-c"]
    blocker = locks.lock(f"{name}-c", ttl=10)
    assert await blocker.acquire()
    many = locks.lock_many(names, ttl=10)
    assert many.names == tuple(sorted(names))
    assert await elsewhere(many.acquire(timeout=0.2)) is False
    # a and b were taken, then given back.
    for n in names[:2]:
        assert await clients[0].exists(key(n)) == 0
    await blocker.release()
    assert await many.acquire(timeout=1)
    assert many.owned
    tokens = many.fencing_tokens
    assert tokens is not None
    assert set(tokens) == set(names)
    assert many.fencing_token == max(tokens.values())
    await many.release()
    assert not many.owned
    for n in names:
        assert await clients[0].exists(key(n)) == 0


async def test_lock_many_opposite_orders_never_deadlock(locks: LockManager, name: str) -> None:
    a, b = f"{name}-a", f"{name}-b"
    done = 0

    async def worker(order: list[str]) -> None:
        nonlocal done
        for _ in range(10):
            async with locks.lock_many(order, ttl=5, timeout=10):
                await asyncio.sleep(0.001)
                done += 1

    await asyncio.wait_for(asyncio.gather(worker([a, b]), worker([b, a]), worker([a, b])), 30)
    assert done == 30


async def test_lock_many_loss_of_one_name_cancels_body(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    reached_end = False
    deleted_at = math.inf
    with pytest.raises(LockLost):
        async with locks.lock_many([f"{name}-a", f"{name}-b"], ttl=0.6):
            for client in clients:
                await client.delete(key(f"{name}-b"))
            deleted_at = time.monotonic()
            await asyncio.sleep(5)
            reached_end = True
    assert not reached_end
    assert time.monotonic() - deleted_at < 2.5
    for client in clients:
        assert await client.exists(key(f"{name}-a")) == 0


async def test_lock_many_release_cancelled_midway_still_releases_every_name(
    locks: LockManager, urls: list[str], name: str
) -> None:
    """Found by the simulation (seed 6406101): a cancellation that reached a lock_many's
    release while its last name was being released stopped there: the first name stayed
    held and renewed, by a handle that no longer owned it."""
    names = [f"{name}-a", f"{name}-b"]
    many = locks.lock_many(names, ttl=2)
    assert await many.acquire(timeout=0)
    release = asyncio.create_task(many.release())
    await asyncio.sleep(0)  # the last name's release is sent, its replies awaited
    release.cancel()
    with pytest.raises(asyncio.CancelledError):
        await release
    assert not many.owned
    # Every name is free: another manager takes both at once, not after the ttl.
    async with LockManager(urls) as others:
        assert await others.lock_many(names, ttl=2).acquire(timeout=1.0)


def test_lock_many_arguments_are_checked() -> None:
    locks = LockManager(["redis://127.0.0.1:1"])
    with pytest.raises(TypeError):
        locks.lock_many("abc")
    with pytest.raises(ValueError, match="empty"):
        locks.lock_many([])
    with pytest.raises(ValueError, match="empty"):
        locks.lock_many(["a", ""])


# -- synchronized ------------------------------------------------------------------------


async def test_synchronized_serializes_calls_per_formatted_name(
    locks: LockManager, name: str
) -> None:
    inside: dict[int, int] = {}
    overlaps = 0

    @locks.synchronized(name + ":{order_id}", ttl=5, timeout=10)
    async def charge(order_id: int, amount: int = 1) -> int:
        nonlocal overlaps
        inside[order_id] = inside.get(order_id, 0) + 1
        overlaps += inside[order_id] > 1
        await asyncio.sleep(0.01)
        inside[order_id] -= 1
        return amount

    results = await asyncio.gather(*(charge(i % 2, amount=i) for i in range(10)))
    assert results == list(range(10))
    assert overlaps == 0
    assert charge.__name__ == "charge"


async def test_synchronized_times_out(locks: LockManager, name: str) -> None:
    @locks.synchronized(name, ttl=5, timeout=0.1)
    async def job() -> None:
        return None

    async with locks.lock(name, ttl=5):
        with pytest.raises(LockTimeout):
            await elsewhere(job())


def test_synchronized_template_must_match_parameters() -> None:
    locks = LockManager(["redis://127.0.0.1:1"])
    with pytest.raises(ValueError, match="order_id"):

        @locks.synchronized("order:{order_id}")
        async def f(user_id: int) -> None:
            return None

    with pytest.raises(TypeError):
        locks.synchronized(42)  # type: ignore[arg-type]


# -- read-write lock ---------------------------------------------------------------------


async def test_readers_share_and_exclude_writers(locks: LockManager, name: str) -> None:
    rw = locks.rwlock(name, ttl=5)
    r1, r2 = rw.read(), rw.read()
    assert await r1.acquire(timeout=0)
    assert await r2.acquire(timeout=0)  # readers overlap
    writer = rw.write()
    assert await writer.acquire(timeout=0) is False
    await r1.release()
    assert await writer.acquire(timeout=0) is False  # one reader left
    await r2.release()
    assert await writer.acquire(timeout=0)
    assert writer.fencing_token is not None
    assert await rw.read().acquire(timeout=0) is False  # the writer excludes readers
    assert await rw.write().acquire(timeout=0) is False  # and writers
    await writer.release()
    assert await rw.read().acquire(timeout=0)


async def test_waiting_writer_is_not_starved_by_new_readers(
    locks: LockManager, urls: list[str], name: str
) -> None:
    rw = locks.rwlock(name, ttl=5)
    first = rw.read()
    assert await first.acquire()
    async with LockManager(urls) as other:  # a writer in another "process"
        writer = other.rwlock(name, ttl=5).write()
        writing = asyncio.create_task(writer.acquire(timeout=10))
        await asyncio.sleep(0.2)
        # A new reader is kept out while the writer waits for the first one.
        assert await rw.read().acquire(timeout=0) is False
        await first.release()
        assert await writing
        await writer.release()
    assert await rw.read().acquire(timeout=1)


async def test_expired_reader_does_not_block_writers(locks: LockManager, name: str) -> None:
    rw = locks.rwlock(name, ttl=5)
    crashed = locks.rwlock(name, ttl=0.3).read()
    crashed._auto_renew = False  # as if its process died: no renewal
    assert await crashed.acquire()
    writer = rw.write()
    started = time.monotonic()
    assert await writer.acquire(timeout=5)
    assert time.monotonic() - started < 3.0
    await writer.release()


async def test_rwlock_async_with_and_reader_writer_exclusion_under_contention(
    locks: LockManager, name: str
) -> None:
    rw = locks.rwlock(name, ttl=5, timeout=30)
    readers = writers = 0
    violations = 0
    most_readers = 0

    async def reader() -> None:
        nonlocal readers, violations, most_readers
        for _ in range(6):
            async with rw.read():
                readers += 1
                most_readers = max(most_readers, readers)
                violations += writers > 0
                await asyncio.sleep(0.005)
                readers -= 1

    async def writer() -> None:
        nonlocal writers, violations
        for _ in range(4):
            async with rw.write():
                writers += 1
                violations += writers > 1 or readers > 0
                await asyncio.sleep(0.005)
                writers -= 1

    await asyncio.wait_for(asyncio.gather(*(reader() for _ in range(4)), writer(), writer()), 60)
    assert violations == 0
    assert most_readers >= 2
