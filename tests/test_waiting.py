"""Waiting for a held lock: local FIFO, pub/sub wake-ups, lost messages, processes."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import redis.asyncio as redis

from aiolock import Lock, LockLost, LockManager, LockNotOwned, _lua
from aiolock._io.pubsub import Subscriber
from aiolock._waiting.waiting import Outcome, Taker
from aiolock.testing import Server, Servers, command, nemesis, script

from . import seam
from .conftest import TurnScripts, count_attempts, elsewhere, key, scripts_run, settled_keys


async def _calls(clients: list[redis.Redis], leaving_out: TurnScripts | None = None) -> int:
    """Scripts run on all nodes (see ``scripts_run``)."""
    return sum(await scripts_run(clients, leaving_out=leaving_out))


async def test_waiters_acquire_in_fifo_order(locks: LockManager, name: str) -> None:
    holder = locks.lock(name, ttl=10)
    assert await holder.acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        async with locks.lock(name, ttl=10, timeout=20):
            order.append(i)
            await asyncio.sleep(0.01)

    tasks = []
    for i in range(8):
        tasks.append(asyncio.create_task(waiter(i)))
        await asyncio.sleep(0.02)  # queue them in a known order
    assert seam.waiters(locks, seam.engine(locks).key(name)) == 8
    await holder.release()
    await asyncio.gather(*tasks)
    assert order == list(range(8))
    assert seam.waiters(locks, seam.engine(locks).key(name)) == 0


async def test_release_wakes_waiter_in_another_manager_at_once(urls: list[str], name: str) -> None:
    # Two managers: the wake-up must come from pub/sub, not from a local release.
    async with LockManager(urls) as one, LockManager(urls) as two:
        holder = one.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire()
        waiter = two.lock(name, ttl=30)
        task = asyncio.create_task(waiter.acquire(timeout=20))
        await asyncio.sleep(0.2)
        released_at = time.monotonic()
        await holder.release()
        assert await task
        # Far less than the holder's 30 s ttl, which bounds the fallback wait.
        assert time.monotonic() - released_at < 2.0
        await waiter.release()


async def test_lost_release_message_costs_at_most_the_holders_ttl(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    async with LockManager(urls) as one, LockManager(urls) as two:
        holder = one.lock(name, ttl=1.0, auto_renew=False)
        assert await holder.acquire()
        waiter = two.lock(name, ttl=5)
        task = asyncio.create_task(waiter.acquire(timeout=20))
        await asyncio.sleep(0.1)
        # The key goes away without a release message: deleted behind the back
        # (as if the message were lost). The waiter must not hang until its timeout.
        for client in clients:
            await client.delete(key(name))
        started = time.monotonic()
        assert await task
        assert time.monotonic() - started < 3.0
        await waiter.release()


async def test_a_waiter_wakes_when_a_quorum_is_free_not_at_a_rivals_longer_ttl(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation's idle rule (seed 70368944185082, each node a cluster, so
    # no turn queue's fallback): a failed attempt read "held" on every node, a holder's
    # key with 0.69 s left on a majority and a rival's fresh one (an attempt that lost,
    # cleaned up just after without a word) on the rest; the waiter slept the longest
    # ttl, 2.2 s, while the name was free from 0.69 s on. A majority frees the name.
    assert len(clients) == 5
    for client in clients[:3]:
        await client.set(key(name), b"the-holder", px=500)
    for client in clients[3:]:
        await client.set(key(name), b"a-rival", px=8000)
    async with LockManager(urls) as locks:
        waiter = locks.lock(name, ttl=5)
        started = time.monotonic()
        # Broken: the waiter slept 8 s, past its timeout.
        assert await waiter.acquire(timeout=4)
        assert time.monotonic() - started < 2.0
        await waiter.release()


async def test_a_waiter_whose_subscriptions_are_not_confirmed_tries_at_the_fallback(
    urls: list[str], name: str
) -> None:
    """Found by the simulation (seed v2:27489202677045, subscriptions held back): a
    waiter's SUBSCRIBEs reached the nodes only 0.85 to 1.5 s after it sent them. Its
    attempt had failed meanwhile and it slept toward the holder's expiry; the release
    came before any node had its subscription, and the name stayed free 0.62 s, until
    a late confirmation woke it. A waiter that may not hear a release yet tries again
    at least every fallback (0.5 s), as one named in vain does."""
    async with nemesis(urls) as net, LockManager(urls) as one, LockManager(net.urls) as two:
        holder = one.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire()
        for node in net:
            node.hold(command("SUBSCRIBE"), math.inf)  # no node confirms
        waiter = two.lock(name, ttl=5)
        task = asyncio.create_task(waiter.acquire(timeout=8))
        await asyncio.sleep(0.4)  # its attempt failed; it sleeps, deaf
        released = time.monotonic()
        await holder.release()
        assert await task, "slept toward the holder's 30 s expiry"
        assert time.monotonic() - released < 2.0
        await waiter.release()


async def test_killed_pubsub_connections_do_not_hang_waiters(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    async with LockManager(urls) as one, LockManager(urls) as two:
        holder = one.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire()
        waiter = two.lock(name, ttl=5)
        task = asyncio.create_task(waiter.acquire(timeout=20))
        await asyncio.sleep(0.2)
        for client in clients:
            await client.client_kill_filter(_type="pubsub")
        await asyncio.sleep(0.3)  # reconnected and resubscribed meanwhile
        started = time.monotonic()
        await holder.release()
        assert await task
        assert time.monotonic() - started < 3.0
        await waiter.release()


async def test_waiter_timeout_leaves_queue_and_others_proceed(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    holder = locks.lock(name, ttl=10)
    assert await holder.acquire()
    holder_token = await clients[0].get(key(name))
    patient = asyncio.create_task(locks.lock(name, ttl=10).acquire(timeout=20))
    await asyncio.sleep(0.05)
    impatient = locks.lock(name, ttl=10)
    started = time.monotonic()
    assert await elsewhere(impatient.acquire(timeout=0.3)) is False
    assert 0.25 < time.monotonic() - started < 3.0
    assert not impatient.owned
    assert seam.waiters(locks, seam.engine(locks).key(name)) == 1
    assert [await c.get(key(name)) for c in clients] == [holder_token] * 5
    await holder.release()
    assert await patient


async def test_cancelled_head_passes_its_turn_on(locks: LockManager, name: str) -> None:
    holder = locks.lock(name, ttl=10)
    assert await holder.acquire()
    first = asyncio.create_task(locks.lock(name, ttl=10).acquire(timeout=20))
    await asyncio.sleep(0.05)
    second_lock = locks.lock(name, ttl=10)
    second = asyncio.create_task(second_lock.acquire(timeout=20))
    await asyncio.sleep(0.05)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await holder.release()
    assert await asyncio.wait_for(second, 5)
    assert second_lock.owned
    await second_lock.release()
    assert seam.waiters(locks, seam.engine(locks).key(name)) == 0


async def test_commands_per_handoff_do_not_grow_with_waiters(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    async def per_handoff(waiters: int) -> float:
        lock_name = f"{name}-{waiters}"
        holder = locks.lock(lock_name, ttl=10, auto_renew=False)
        assert await holder.acquire()
        done = 0

        async def waiter() -> None:
            nonlocal done
            lock = locks.lock(lock_name, ttl=10, auto_renew=False)
            assert await lock.acquire(timeout=60)
            done += 1
            await asyncio.sleep(0.001)
            await lock.release()

        tasks = [asyncio.create_task(waiter()) for _ in range(waiters)]
        await asyncio.sleep(0.2)  # all queued
        before = await _calls(clients)
        await holder.release()
        await asyncio.gather(*tasks)
        after = await _calls(clients)
        assert done == waiters
        return (after - before) / waiters

    few = await per_handoff(5)
    many = await per_handoff(200)
    # Each handoff: one release and one acquire per node (10 on 5 nodes), plus a
    # failed attempt now and then; never one attempt per waiter.
    assert many <= 2 * 10, many
    assert many <= few * 1.5 + 2, (few, many)


WORKER = """
import asyncio, json, sys, time
from aiolock import LockManager
from aiolock.testing import Servers

async def main(counter, nodes):
    inside = []
    # restart_grace=0: the suite's servers, started (and restarted) empty by it.
    async with LockManager(nodes, restart_grace=0) as locks:
        async def task():
            for _ in range(15):
                async with locks.lock("cross-process", ttl=5, timeout=60):
                    entered = time.monotonic()
                    with open(counter, "r+b") as f:
                        value = int(f.read() or b"0")
                        await asyncio.sleep(0.001)
                        f.seek(0); f.write(b"%d" % (value + 1)); f.truncate()
                    inside.append((entered, time.monotonic()))
        await asyncio.gather(*(task() for _ in range(3)))
    print(json.dumps(inside))

asyncio.run(main(sys.argv[1], sys.argv[2:]))
"""


async def test_exclusive_across_processes(urls: list[str], tmp_path: Path) -> None:
    counter = tmp_path / "counter"
    counter.write_bytes(b"0")
    args = ["-c", WORKER, str(counter), *urls]
    pipe = asyncio.subprocess.PIPE
    procs = [
        await asyncio.create_subprocess_exec(sys.executable, *args, stdout=pipe, stderr=pipe)
        for _ in range(4)
    ]
    sections: list[tuple[float, float]] = []
    for proc in procs:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        sections.extend((a, b) for a, b in json.loads(out))
    assert int(counter.read_bytes()) == 4 * 3 * 15
    sections.sort()
    overlaps = [(a, b) for a, b in itertools.pairwise(sections) if b[0] < a[1]]
    assert overlaps == []


def test_subprocess_module_is_usable() -> None:
    # Guard for the cross-process test: the worker imports the installed package.
    result = subprocess.run(
        [sys.executable, "-c", "import aiolock; print(aiolock.__version__)"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


async def test_waiters_listen_on_n_minus_quorum_plus_one_nodes_and_hear_every_release(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    async with LockManager(servers) as holder_side, LockManager(servers) as waiter_side:
        listened = [s.name for s in seam.engine(waiter_side).waiting._listeners(key(name).encode())]
        assert len(listened) == 3  # of 5: any quorum of 3 shares one of them
        holder = holder_side.lock(name, ttl=30)
        assert await holder.acquire(timeout=0)
        # acquire() returned on a quorum; the test needs the key on all five (killing
        # two, the other three must all confirm the release). A node still connecting
        # after the previous test's restart once missed it (CI: QuorumError, one
        # live node said "not held").
        assert await settled_keys(clients, name, [True] * 5) == [True] * 5
        waiter = asyncio.create_task(waiter_side.lock(name, ttl=30).acquire(timeout=10))
        await asyncio.sleep(0.3)  # subscribed; asleep on the holder's 30 s PTTL
        channels = [await c.pubsub_numsub(key(name) + ":released") for c in clients]
        assert sum(count for [(_channel, count)] in channels) == 3
        # Two of the three listened nodes go down: the release still reaches a
        # quorum, which includes the third, and its message wakes the waiter.
        for server in servers.servers:
            if server.url in listened[:2]:
                server.kill()
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await holder.release()
        assert await waiter
        assert time.monotonic() - started < 5  # not the 10 s timeout or 30 s PTTL


async def test_a_local_handoff_does_not_wake_other_processes(
    urls: list[str], clients: list[redis.Redis], name: str, turn_scripts: TurnScripts
) -> None:
    async with LockManager(urls) as here, LockManager(urls) as elsewhere:
        holder = here.lock(name, ttl=30)
        assert await holder.acquire(timeout=0)
        local_lock = here.lock(name, ttl=30)
        local = asyncio.create_task(local_lock.acquire(timeout=10))
        remote = asyncio.create_task(elsewhere.lock(name, ttl=30).acquire(timeout=10))
        await asyncio.sleep(0.3)  # both tried once and sleep on the 30 s PTTL
        turn_scripts.watch(here, elsewhere)
        before = await _calls(clients, turn_scripts)
        await holder.release()  # handed to the local waiter: the message says so
        assert await local
        await asyncio.sleep(0.3)
        # One script per node passed the lock on (not a release and an acquire per
        # node, 10): the other process did not try.
        assert await _calls(clients, turn_scripts) - before == 5
        assert not remote.done()
        # A release with no local waiter left is open to all: the other one takes
        # it at once (not after the 30 s PTTL, nor its 10 s timeout).
        started = time.monotonic()
        await local_lock.release()
        assert await remote
        assert time.monotonic() - started < 5


async def test_a_local_handoff_nobody_took_is_announced_as_free(
    locks: LockManager, name: str
) -> None:
    holder = locks.lock(name, ttl=30)
    assert await holder.acquire(timeout=0)
    waiter = asyncio.create_task(locks.lock(name, ttl=30).acquire(timeout=10))
    await asyncio.sleep(0.2)  # queued, tried once, asleep
    announced: list[bytes] = []
    seam.engine(locks).waiting._announce = announced.append  # type: ignore[method-assign]
    channel = key(name).encode() + b":released"
    # The lock is promised to the local waiter, which leaves before trying.
    assert seam.engine(locks).waiting.released(key(name).encode())
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    assert announced == [channel]
    # A promise kept is not announced.
    announced.clear()
    second = asyncio.create_task(locks.lock(name, ttl=30).acquire(timeout=10))
    await asyncio.sleep(0.2)
    await holder.release()
    assert await second
    assert announced == []


async def _cleanup_message(
    urls: list[str], clients: list[redis.Redis], name: str, holders: list[bytes | None]
) -> bytes:
    """The release message of a failed attempt's clean-up, with ``holders`` per node."""
    free = holders.index(None)
    for client, holder in zip(clients, holders, strict=True):
        if holder is not None:
            await client.set(key(name), holder, px=30_000)
    listener = clients[free].pubsub()
    await listener.subscribe(key(name) + ":released")
    assert (await listener.get_message(timeout=2))["type"] == "subscribe"  # type: ignore[index]
    try:
        async with LockManager(urls) as locks:
            # Granted on the free node only: a lost attempt, cleaned up there.
            assert not await locks.lock(name, ttl=30).acquire(timeout=0)
        message = await listener.get_message(timeout=5)
        assert message is not None
        assert message["type"] == "message"
        data: bytes = message["data"]
        return data
    finally:
        await listener.aclose()


async def test_a_race_lost_to_a_quorum_holder_is_cleaned_up_quietly(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # The lock is someone's on 4 nodes: the clean-up frees nothing for others.
    holders: list[bytes | None] = [b"A" * 20] * 4 + [None]
    assert await _cleanup_message(urls, clients, name, holders) == b"l"


async def test_a_split_vote_clean_up_wakes_the_waiters(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Two holders with two nodes each: nobody has the lock, everyone must retry.
    holders: list[bytes | None] = [b"A" * 20, b"A" * 20, b"C" * 20, b"C" * 20, None]
    assert await _cleanup_message(urls, clients, name, holders) == b""


async def test_waiters_that_split_the_vote_back_off_and_one_of_them_wins(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation (seed 140737491357076, stopped as busy: 300,000 messages
    # in 3 s). A stale key held 2 nodes of 5; three processes, each nearer another of
    # the 3 free nodes, took one each: a split vote. Its clean-up wakes every waiter,
    # and all tried again at once, each first on its own node again: they split the
    # vote for as long as the stale key lasted, a few thousand scripts a second. A
    # waiter whose attempt split the vote now tries again after a random pause.
    # The free nodes are those the waiters listen on (n - quorum + 1, by the key), so
    # that each clean-up wakes them all.
    first = zlib.crc32(key(name).encode()) % len(urls)
    free = [(first + i) % len(urls) for i in range(3)]
    for i, client in enumerate(clients):
        if i not in free:
            await client.set(key(name), b"S" * 20, px=6000)
    async with contextlib.AsyncExitStack() as stack:
        managers: list[LockManager] = []
        for near in free:  # each process nearer one free node than the others
            net = await stack.enter_async_context(nemesis(urls))
            for i, proxy in enumerate(net):
                if i != near:  # (natural jitter cannot make up 0.1 s)
                    proxy.hold(script("ACQUIRE"), 0.1)
            managers.append(
                await stack.enter_async_context(LockManager(net.urls, node_timeout=1.0))
            )
        counts = [count_attempts(manager) for manager in managers]
        started = time.monotonic()
        handles = [manager.lock(name, ttl=30, auto_renew=False) for manager in managers]
        waits = [asyncio.create_task(handle.acquire(timeout=20)) for handle in handles]
        done, _ = await asyncio.wait(waits, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        took = time.monotonic() - started
        attempts = sum(count[0] for count in counts)
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        # Broken: nobody won until the stale key expired (6 s), after 174
        # attempts, 3 runs of 3; now one wins after 6 to 11 (0.2 to 0.6 s).
        assert done, f"nobody won in {took:.2f} s, {attempts} attempts"
        assert [wait.result() for wait in done] == [True]
        assert took < 3.0, f"nobody won in {took:.2f} s, {attempts} attempts"
        [winner] = [handle for handle, wait in zip(handles, waits, strict=True) if wait in done]
        await winner.release()


async def test_waiters_that_nobody_can_win_back_off_further_at_every_split_vote(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation (seed 9007199254741396, stopped as busy: 300,000 messages
    # in 4 s of its time). A stale key held 2 nodes of 5 and a third had restarted
    # (quarantined: its yes does not count), so nobody could win: two waiters took the
    # 2 free nodes, failed, and each clean-up's message ("free": a split vote) woke the
    # other at once. The split pause (up to twice the attempt's time) was a millisecond
    # or two: they tried about 500 times a second each for as long as the stale key or
    # the quarantine lasted. Now the pause doubles at every split vote of the wait.
    grace = 6.0
    deadline = time.monotonic() + grace + 10
    while min([(await c.info("server"))["uptime_in_seconds"] for c in clients]) <= grace:
        assert time.monotonic() < deadline, "the servers stayed young"  # (restarted before)
        await asyncio.sleep(0.2)
    async with contextlib.AsyncExitStack() as stack:
        managers = [
            await stack.enter_async_context(LockManager(servers, restart_grace=grace))
            for _ in range(2)
        ]
        for manager in managers:  # each knows every server's run_id, none quarantined
            lock = manager.lock(name + "-warm", ttl=1.0, auto_renew=False)
            assert await lock.acquire(timeout=0)
            await lock.release()
        restarted = servers.servers[2]
        assert isinstance(restarted, Server)
        await restarted.restart()  # quarantined for the grace (its uptime is less)
        for client in clients[:2]:
            await client.set(key(name), b"S" * 20, px=10_000)
        counts = [count_attempts(manager) for manager in managers]
        handles = [manager.lock(name, ttl=5, auto_renew=False) for manager in managers]
        took = await asyncio.gather(*(handle.acquire(timeout=3) for handle in handles))
        attempts = [count[0] for count in counts]
    assert took == [False, False], attempts
    # Broken: 3,078 to 3,293 attempts (2 idle cores; 1,729 with both busy);
    # now 71 to 83.
    assert sum(attempts) < 300, attempts


async def test_a_failed_attempt_clean_up_says_not_free_only_when_one_holder_has_a_quorum(
    locks: LockManager, urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    """The clean-up of a race lost to a holder with a quorum tells other processes'
    waiters not to try (NOT_FREE); after a split vote nobody holds the lock, and its
    clean-up must wake them (an empty message)."""
    listener = redis.Redis.from_url(urls[4])
    pubsub = listener.pubsub()
    await pubsub.subscribe(key(name) + ":released")
    assert await pubsub.get_message(timeout=2)  # the confirmation

    async def clean_up_message(planted: dict[int, bytes]) -> bytes:
        for i, token in planted.items():
            await clients[i].set(key(name), token, px=10_000)
        assert await locks.lock(name, ttl=5).acquire(timeout=0) is False
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2)
        for client in clients:
            await client.delete(key(name))
        assert message is not None, "the clean-up on node 4 published nothing"
        data: bytes = message["data"]
        return data

    try:
        one_holder = dict.fromkeys(range(3), b"AAAAAAAA-holder")  # a quorum of 5
        assert await clean_up_message(one_holder) == b"l"
        split = {0: b"AAAAAAAA-one", 1: b"AAAAAAAA-one", 2: b"BBBBBBBB-two", 3: b"BBBBBBBB-two"}
        assert await clean_up_message(split) == b""
    finally:
        await pubsub.aclose()
        await listener.aclose()


async def test_a_lost_lock_dropped_with_a_local_waiter_says_so_in_its_message(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    # The exit of a lost lock deletes what may remain of it; a waiter of the same
    # process takes it next, so the message tells other processes not to race.
    listener = clients[4].pubsub()  # a node that still holds the key: it publishes
    await listener.subscribe(key(name) + ":released")
    assert (await listener.get_message(timeout=2))["type"] == "subscribe"  # type: ignore[index]
    try:
        waiter = locks.lock(name, ttl=30)
        with pytest.raises(LockLost):
            async with locks.lock(name, ttl=0.6):
                queued = asyncio.create_task(waiter.acquire(timeout=10))
                await asyncio.sleep(0.05)
                for client in clients[:3]:
                    await client.delete(key(name))  # gone on a majority: lost
                await asyncio.sleep(5)
        assert await queued
        message = await listener.get_message(timeout=5)
        assert message is not None
        assert message["data"] == b"l"
        await waiter.release()
    finally:
        await listener.aclose()


# -- handoff within a process ------------------------------------------------------------


async def _held_and_awaited(
    locks: LockManager, name: str, *, ttl: float = 30.0, waiter_ttl: float = 30.0
) -> tuple[Lock, Lock, asyncio.Task[bool]]:
    """A holder of ``name`` and a waiter of the same manager queued behind it, asleep
    after its first attempt failed: the release may pass the lock to it."""
    holder = locks.lock(name, ttl=ttl, auto_renew=False)
    assert await holder.acquire()
    waiter = locks.lock(name, ttl=waiter_ttl, auto_renew=False)
    queued = asyncio.create_task(elsewhere(waiter.acquire(timeout=10)))
    await asyncio.sleep(0.1)
    return holder, waiter, queued


async def test_a_local_handoff_is_one_script_per_node(
    locks: LockManager, clients: list[redis.Redis], name: str, turn_scripts: TurnScripts
) -> None:
    holder, waiter, queued = await _held_and_awaited(locks, name, ttl=5, waiter_ttl=20)
    first_token = holder.fencing_token
    assert first_token is not None
    turn_scripts.watch(locks)
    for client in clients:
        await client.config_resetstat()
    sent = time.monotonic()
    await holder.release()
    assert await queued
    # One script per node passed the lock: no release and acquire, no failed attempt.
    assert await scripts_run(clients, leaving_out=turn_scripts) == [1] * len(clients)
    # It is the waiter's, with its own ttl, counted from when the handoff was sent, and
    # the next fencing token.
    assert (waiter.fencing_token or 0) > first_token
    assert 19.0 < waiter.remaining() <= 20.0 - (time.monotonic() - sent) + 0.001
    values = {await client.get(key(name)) for client in clients}
    assert len(values) == 1
    pttls = [await client.pttl(key(name)) for client in clients]
    assert all(10_000 < pttl <= 20_000 for pttl in pttls), pttls
    await waiter.release()
    assert await elsewhere(locks.lock(name, ttl=5).acquire(timeout=0))


async def _sections(
    locks: LockManager, name: str, tasks: int, each: int, done: asyncio.Event | None = None
) -> list[tuple[float, int]]:
    """``tasks`` tasks of ``locks`` take ``name`` in turn, ``each`` times (or, given
    ``done``, until it is set); returns each section's (start, task)."""
    sections: list[tuple[float, int]] = []

    async def task(i: int) -> None:
        lock = locks.lock(name, ttl=10, auto_renew=False)
        for _ in range(each):
            if done is not None and done.is_set():
                return
            assert await lock.acquire(timeout=20)
            sections.append((time.monotonic(), i))
            await asyncio.sleep(0)
            await lock.release()

    await asyncio.gather(*(task(i) for i in range(tasks)))
    return sections


async def test_a_process_alone_in_line_passes_the_lock_on_without_releasing_it(
    locks: LockManager, clients: list[redis.Redis], name: str, turn_scripts: TurnScripts
) -> None:
    # Nobody else waits (the turn queue says so): the lock goes from task to
    # task of this process in one script per node, LONE_STREAK times before a release
    # lets in a process that waits without being in line. With LOCAL_STREAK's 4 (as when
    # others are in line), every fifth handoff would be a release and an attempt: 6.0
    # scripts per section on 5 nodes.
    turn_scripts.watch(locks)
    for client in clients:
        await client.config_resetstat()
    sections = await _sections(locks, name, tasks=8, each=25)
    assert len(sections) == 200
    per_section = await _calls(clients, turn_scripts) / len(sections)
    assert per_section <= 5.5, per_section


async def test_a_waiter_not_in_line_gets_the_lock_from_a_process_alone_in_line(
    urls: list[str], name: str
) -> None:
    # A process that waits without taking turns (one whose manager has none: a Redis
    # Cluster's, or an older aiolock's) is not in the turn queue: the local handoffs of
    # a process alone in line stop after LONE_STREAK, and it gets its chance.
    async with LockManager(urls) as busy, LockManager(urls) as outside:
        seam.engine(outside).turns = None
        seam.engine(outside).waiting._turns = None
        done = asyncio.Event()
        running = asyncio.create_task(_sections(busy, name, tasks=4, each=100_000, done=done))
        try:
            await asyncio.sleep(0.3)
            assert not running.done()
            lock = outside.lock(name, ttl=10, auto_renew=False)
            assert await lock.acquire(timeout=10)
            await lock.release()
        finally:
            done.set()
            await running


async def test_a_handoff_without_a_quorum_is_cleaned_up_and_the_waiter_tries_itself(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    holder, waiter, queued = await _held_and_awaited(locks, name)
    for client in clients[:3]:  # taken over on a majority (say, by an operator)
        await client.set(key(name), b"intruder", px=1500)
    with pytest.raises(LockNotOwned):
        await holder.release()
    # The two nodes that still had the holder's token have neither token any more.
    assert [await client.get(key(name)) for client in clients] == [b"intruder"] * 3 + [None] * 2
    assert not queued.done()
    assert await queued  # once the intruder's keys expire
    assert waiter.owned
    await waiter.release()


async def test_a_waiter_cancelled_during_a_handoff_leaves_nothing_held(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    for _ in range(5):
        holder, _, waiter = await _held_and_awaited(locks, name)
        release = asyncio.create_task(holder.release())
        await asyncio.sleep(0)  # the release is on its way
        waiter.cancel()
        await release
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        assert await settled_keys(clients, name, [False] * 5) == [False] * 5
        other = locks.lock(name, ttl=5)
        assert await elsewhere(other.acquire(timeout=0))
        await other.release()


async def test_a_handoff_says_whether_another_process_is_in_the_turn_queue(
    clients: list[redis.Redis], name: str
) -> None:
    client, lock_key, fence_key = clients[0], key(name), key(name) + ":fence"
    turns = lock_key + ":turns"
    args = [b"new", 20_000, 60_000, 1_000, b"old", 0, b"ours"]  # reserving no token
    try:
        for line, others in (
            ({}, 0),
            ({b"ours": 1}, 0),
            ({b"theirs": 1}, 1),
            ({b"ours": 1, b"theirs": 2}, 1),
            ({b"theirs": 1, b"ours": 2}, 1),
            ({b"a": 1, b"b": 2, b"ours": 3}, 1),
        ):
            await client.delete(turns)
            if line:
                await client.zadd(turns, line)
            await client.set(lock_key, b"old", px=5000)
            reply = await client.eval(
                _lua.PASS_ON_SCRIPT.source, 3, lock_key, fence_key, turns, *args
            )
            assert reply[0] == 1, (line, reply)
            assert reply[2] == others, (line, reply)
            assert await client.zcard(turns) == len(line)  # only read
    finally:
        await client.delete(lock_key, fence_key, turns)


async def test_the_handoff_scripts_touch_only_the_tokens_they_are_given(
    clients: list[redis.Redis], name: str
) -> None:
    client, lock_key, fence_key = clients[0], key(name), key(name) + ":fence"
    listener = client.pubsub()
    await listener.subscribe(lock_key + ":released")
    assert (await listener.get_message(timeout=2))["type"] == "subscribe"  # type: ignore[index]
    try:
        # PASS_ON: only from the old token, with the waiter's ttl and the next fence.
        args = [b"new", 20_000, 60_000, 1_000]
        for value in (None, b"other"):
            await client.delete(lock_key)
            if value is not None:
                await client.set(lock_key, value, px=5000)
            reply = await client.eval(
                _lua.PASS_ON_SCRIPT.source, 2, lock_key, fence_key, *args, b"old", 0
            )
            assert reply[0] == 0
            assert await client.get(lock_key) == value
        await client.set(lock_key, b"old", px=5000)
        await client.set(fence_key, 5_000)
        reply = await client.eval(
            _lua.PASS_ON_SCRIPT.source, 2, lock_key, fence_key, *args, b"old", 0
        )
        assert reply == [1, 5_001, 0]  # (no turn queue given: no other process said)
        assert await client.get(lock_key) == b"new"
        assert 15_000 < await client.pttl(lock_key) <= 20_000
        # RELEASE_EITHER: either token, never a third.
        for value, deleted in ((b"new", 1), (b"old", 1), (b"other", 0)):
            await client.set(lock_key, value, px=5000)
            assert (
                await client.eval(_lua.RELEASE_EITHER_SCRIPT.source, 1, lock_key, b"new", b"old")
                == deleted
            )
            assert await client.exists(lock_key) == 1 - deleted
        # Only the two releases announced anything; the handoff did not.
        messages = [await listener.get_message(timeout=0.5) for _ in range(3)]
        assert [m["data"] for m in messages if m] == [b"", b""]
    finally:
        await listener.aclose()
        await client.delete(lock_key, fence_key)


async def test_a_release_cancelled_during_a_handoff_still_passes_the_lock_on(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    # release() completes even if its caller is cancelled: the handoff too, and the
    # waiter it was for gets the lock (it waits for the handoff's outcome meanwhile).
    for _ in range(3):
        holder, waiter, queued = await _held_and_awaited(locks, name)
        release = asyncio.create_task(holder.release())
        await asyncio.sleep(0)  # the handoff is sent
        release.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await release
        assert await asyncio.wait_for(queued, 5)
        assert waiter.owned
        assert not holder.owned
        await waiter.release()
        assert await settled_keys(clients, name, [False] * 5) == [False] * 5


async def test_a_waiter_cancelled_after_the_lock_was_passed_to_it_gives_it_back(
    locks: LockManager, clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = locks.lock(name, ttl=30, auto_renew=False)
    assert await holder.acquire()
    waiter = asyncio.create_task(locks.lock(name, ttl=30).acquire(timeout=10))
    await asyncio.sleep(0.1)
    deliver = Taker.deliver

    def deliver_then_cancel(taker: Taker, outcome: Outcome) -> bool:
        delivered = deliver(taker, outcome)
        waiter.cancel()  # before its wake-up runs: cancelled with a lock it never took
        return delivered

    monkeypatch.setattr(Taker, "deliver", deliver_then_cancel)
    await holder.release()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await settled_keys(clients, name, [False] * 5) == [False] * 5
    other = locks.lock(name, ttl=5)
    assert await other.acquire(timeout=0)
    await other.release()


@pytest.mark.parametrize("how", ["attempted", "handed-on"])
async def test_a_local_waiter_wakes_when_its_process_shortens_the_lock(
    locks: LockManager, name: str, how: str
) -> None:
    """A waiter of the holder's own process sleeps on what it learnt of the lock (its
    attempt's PTTL, or the validity its queue's previous head took); the holder then
    shortens the lock with extend() and never releases it. The waiter must not sleep
    on the longer time (~3 s, the name free after 0.3 s: the simulation's idle rule,
    seed 276328346926)."""
    holder = locks.lock(name, ttl=3.0, auto_renew=False)
    if how == "handed-on":
        first = locks.lock(name, ttl=3.0, auto_renew=False)
        assert await first.acquire(timeout=0)
        taking = asyncio.create_task(holder.acquire(timeout=5))
        await asyncio.sleep(0.05)
        waiter = locks.lock(name, ttl=3.0)
        waiting = asyncio.create_task(waiter.acquire(timeout=10))
        await asyncio.sleep(0.05)
        await first.release()  # handed on: the next head sleeps on what the taker took
        assert await taking
    else:
        assert await holder.acquire(timeout=0)
        waiter = locks.lock(name, ttl=3.0)
        waiting = asyncio.create_task(waiter.acquire(timeout=10))
    await asyncio.sleep(0.1)  # it tried, failed and sleeps
    assert not waiting.done()
    await holder.extend(0.3)
    started = time.monotonic()
    assert await waiting
    took = time.monotonic() - started
    assert took < 1.5, f"the waiter slept {took:.2f} s on the longer validity"
    await waiter.release()


async def _subscribed(client: redis.Redis, channel: bytes, count: int, *, sharded: bool) -> None:
    """Until the node has ``count`` subscribers on ``channel`` (its own view)."""
    for _ in range(500):
        word = "SHARDNUMSUB" if sharded else "NUMSUB"
        _, now = await client.execute_command("PUBSUB", word, channel)
        if now == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{channel!r} never had {count} subscribers")


@pytest.mark.parametrize("sharded", [False, True], ids=["subscribe", "ssubscribe"])
async def test_a_subscription_made_again_waits_for_its_own_confirmation(
    urls: list[str], name: str, sharded: bool
) -> None:
    """Found by the simulation (seed 2251799813703477, subscriptions held back): a
    process's queue for a name emptied while a node's confirmation of its SUBSCRIBE
    was on its way, and a new waiter subscribed again at once (UNSUBSCRIBE, then
    SUBSCRIBE, on the one connection). The old confirmation came first and was taken
    for the new one: the process offered firmly to take the lock while the node, past
    the UNSUBSCRIBE and not yet at the SUBSCRIBE, had it on no channel. Its grant went
    unheard, was undone, and the process was dropped from the line (its rival then
    held the name 8 times in a row). Each request's reply comes in order: only the
    last one's confirms. Sharded (a cluster's, SSUBSCRIBE on Redis 7+), the reply to
    our own SUNSUBSCRIBE, read after we subscribed again, was taken for the server
    dropping the channel (its slot moved): the channel was handed on as moved."""
    channel = f"aiolock-test:{name}".encode()
    moved: list[bytes] = []
    async with nemesis(urls[:1]) as net, redis.Redis.from_url(urls[0]) as client:
        subscriber = Subscriber(
            net.urls[0],
            on_message=lambda *_: None,
            on_reset=lambda: None,
            sharded=sharded,
            on_moved=lambda channel, _: moved.append(channel),
        )
        try:
            net[0].delay_replies(0.3)  # the node's confirmations take 0.3 s
            first = subscriber.subscribe(channel)
            await _subscribed(client, channel, 1, sharded=sharded)
            verb = "SSUBSCRIBE" if sharded else "SUBSCRIBE"
            net[0].hold(command(verb), math.inf, count=1)  # the next one waits
            subscriber.unsubscribe(channel)
            again = subscriber.subscribe(channel)
            await _subscribed(client, channel, 0, sharded=sharded)  # it read the UNSUBSCRIBE
            await asyncio.sleep(0.6)  # and both replies came (the first SUBSCRIBE's too)
            assert first.cancelled()
            assert not again.done(), "confirmed by the reply to the SUBSCRIBE before"
            assert not moved
            net[0].flush()
            await asyncio.wait_for(again, 5)
            await _subscribed(client, channel, 1, sharded=sharded)
            assert subscriber.channels == {channel}
            assert not moved
        finally:
            await subscriber.aclose()
