"""Background renewal, loss detection and cancellation of the holder, on real servers."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import sys
import time
from typing import Any

import pytest
import redis.asyncio as redis

import aiolock._core.batch
import aiolock._io.node
from aiolock import LockLost, LockManager, LockNotOwned, QuorumError
from aiolock._quorum.renewal import Renewal
from aiolock.testing import Server, Servers

from . import seam
from .conftest import key, renewals_run
from .faults import Mode, proxies


async def _commandstat(clients: list[redis.Redis], command: str) -> list[int]:
    out = []
    for client in clients:
        stats = await client.info("commandstats")
        out.append(int(stats.get(f"cmdstat_{command}", {}).get("calls", 0)))
    return out


# ttl 0.8: a renewal leaves less than a second of validity, and still counts as won.
@pytest.mark.parametrize(("ttl", "body"), [(1.2, 3.0), (0.8, 2.0)])
async def test_short_ttl_lock_stays_held_for_long_body(
    locks: LockManager, clients: list[redis.Redis], name: str, ttl: float, body: float
) -> None:
    async with locks.lock(name, ttl=ttl) as lock:
        for client in clients:
            await client.config_resetstat()
        started = time.monotonic()
        while time.monotonic() - started < body:
            assert lock.owned
            await asyncio.sleep(0.1)
        # The key's PTTL on the nodes is refreshed, not running down.
        assert all([await c.pttl(key(name)) > 100 for c in clients])
        assert lock.lost is None
        # Renewed about every ttl / 3 (7.5 times here), not every retry interval as if
        # each renewal had failed.
        assert all(n <= body / (ttl / 3) * 1.6 + 1 for n in await renewals_run(clients))
    assert not lock.owned


async def test_key_deleted_on_majority_cancels_body_and_raises_lock_lost(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    reached_end = False
    deleted_at = 0.0
    with pytest.raises(LockLost) as info:
        async with locks.lock(name, ttl=0.6):
            for client in clients[:3]:
                await client.delete(key(name))
            deleted_at = time.monotonic()
            await asyncio.sleep(10)
            reached_end = True
    # Cancelled within about one renewal period (ttl/3), generous bound.
    assert time.monotonic() - deleted_at < 2.0
    assert not reached_end
    assert isinstance(info.value.__cause__, LockNotOwned)
    reason = "lost: the key is gone or held by another token on a majority of nodes"
    assert str(info.value) == f"lock {name!r} {reason}"
    assert str(info.value.__cause__) == f"lock {name!r} not held on a majority of nodes"
    # Whatever remained of the lock on the other nodes was cleaned up.
    assert [await c.exists(key(name)) for c in clients] == [0] * 5


async def test_one_lock_lost_in_a_renewal_batch_leaves_the_others_renewed(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    first = locks.lock(f"{name}-1", ttl=0.9)
    second = locks.lock(f"{name}-2", ttl=0.9)
    assert await first.acquire()
    assert await second.acquire()  # due together: renewed in one batch
    for client in clients:
        await client.delete(key(f"{name}-1"))
    lost = await asyncio.wait_for(first.wait_lost(), 5)
    assert "majority" in str(lost)
    await asyncio.sleep(1.5)  # past the second's ttl: renewed meanwhile
    assert second.owned
    assert second.lost is None
    await second.release()


async def test_key_taken_over_is_lost(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    with pytest.raises(LockLost):
        async with locks.lock(name, ttl=0.6):
            for client in clients:
                await client.set(key(name), b"thief", px=5000)
            await asyncio.sleep(10)
    # The thief's key is left alone.
    assert [await c.get(key(name)) for c in clients] == [b"thief"] * 5


def _has_set_ifeq(info: dict[str, Any]) -> bool:
    """Valkey from 8.1, Redis from 8.4 (their release notes): ``SET ... IFEQ``."""
    if info.get("server_name") == "valkey":
        return tuple(map(int, str(info["valkey_version"]).split("."))) >= (8, 1)
    return tuple(map(int, str(info["redis_version"]).split("."))) >= (8, 4)


@pytest.mark.parametrize("detected", [True, False], ids=["as-the-server-says", "detection-off"])
async def test_one_lock_is_renewed_by_set_ifeq_where_the_server_has_it_else_by_the_script(
    urls: list[str],
    clients: list[redis.Redis],
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    detected: bool,
) -> None:
    # Where the server has SET ... IFEQ (Valkey 8.1, Redis 8.4: told by its INFO on
    # connect), a renewal of one lock is that command, the same compare-and-set as
    # EXTEND_MANY's without a script; elsewhere it is the script. Either way the lock
    # stays held, and a key taken over is lost.
    if not detected:
        monkeypatch.setattr(aiolock._io.node, "has_set_ifeq", lambda _info: False)
    native = detected and _has_set_ifeq(await clients[0].info("server"))
    async with LockManager(urls) as locks:
        lock = locks.lock(name, ttl=0.6)
        assert await lock.acquire(timeout=5)
        for client in clients:
            await client.config_resetstat()
        await asyncio.sleep(1.2)  # two ttls: renewed every 0.2 s
        assert lock.owned
        for client in clients:
            stats = await client.info("commandstats")
            sets, scripts = (
                int(stats.get(f"cmdstat_{verb}", {}).get("calls", 0)) for verb in ("set", "evalsha")
            )
            assert (
                (sets >= 3, scripts) == (True, 0) if native else (sets, scripts >= 3) == (0, True)
            )
        for client in clients:
            await client.set(key(name), b"thief", px=5000)
        assert "majority" in str(await asyncio.wait_for(lock.wait_lost(), 5))
    assert [await c.get(key(name)) for c in clients] == [b"thief"] * 5


async def test_majority_hung_cancels_holder_before_validity_runs_out(
    servers: Servers, name: str
) -> None:
    async with LockManager(servers, node_timeout=0.05) as locks:
        lock = locks.lock(name, ttl=1.0)
        left_at_cancel: list[float] = []
        paused: list[Server] = []
        started = time.monotonic()
        try:
            with pytest.raises(LockLost) as info:
                async with lock:
                    for server in servers.servers[:3]:
                        assert isinstance(server, Server)
                        server.pause()
                        paused.append(server)
                    try:
                        await asyncio.sleep(10)
                    finally:
                        # Validity the lock still had when the body was cancelled.
                        left_at_cancel.append(lock._hold.expires_at - time.monotonic())
                        ended = sys.exc_info()[1]  # (seen once under mutmut: still held)
                        assert not lock.owned, f"the body ended with {ended!r}, lock held"
                        assert lock.remaining() == 0.0
        finally:
            for server in paused:
                server.resume()
        assert time.monotonic() - started < 3.0
        assert len(left_at_cancel) == 1
        assert left_at_cancel[0] > 0.0, "the holder was cancelled only after expiry"
        # Told at least half the promised guard before expiry, not merely before it;
        # and not earlier than the guard (the deadline's timer never fires early): a
        # longer guard would give up validity the holder still had.
        assert left_at_cancel[0] >= _guard(1.0) / 2, left_at_cancel
        assert left_at_cancel[0] <= _guard(1.0) + 0.02, left_at_cancel
        assert isinstance(info.value.__cause__, QuorumError)
        reason = "lost: no quorum confirmed the renewal before validity ran out"
        assert str(info.value).endswith(reason), str(info.value)
        assert str(info.value.__cause__).startswith(f"renewal of lock {name!r}: 3 of 5 nodes")
        # The cause names each hung node and what happened: no reply in time.
        errors = info.value.__cause__.errors
        assert set(errors) == set(servers[:3])
        for url, error in errors.items():
            assert isinstance(error, TimeoutError)
            assert str(error).startswith(f"{url}: no reply within"), error
        # Told once, and still told after the exit: wait_lost() returns the same loss.
        assert await asyncio.wait_for(lock.wait_lost(), 1) is info.value


async def test_wait_lost_returns_before_validity_ends(servers: Servers, name: str) -> None:
    async with LockManager(servers, node_timeout=0.05) as locks:
        lock = locks.lock(name, ttl=1.0)
        assert await lock.acquire()
        paused = [s for s in servers.servers[:3] if isinstance(s, Server)]
        for server in paused:
            server.pause()
        try:
            lost = await asyncio.wait_for(lock.wait_lost(), 5)
            assert lock._hold.expires_at - time.monotonic() > 0.0
            assert isinstance(lost, LockLost)
            assert lock.lost is lost
            assert not lock.owned
        finally:
            for server in paused:
                server.resume()
        with pytest.raises(LockNotOwned):
            await lock.release()


async def test_renewal_subtracts_the_drift_allowance_from_validity(
    urls: list[str], name: str
) -> None:
    drift_factor, ttl = 0.3, 1.5
    ceiling = ttl - (ttl * drift_factor + 0.002)  # README: validity after each extension
    most = 0.0
    locks = LockManager(urls, drift_factor=drift_factor)
    async with locks, locks.lock(name, ttl=ttl) as lock:
        started = time.monotonic()
        while time.monotonic() - started < 2.0:  # several renewals (every ttl/3)
            most = max(most, lock.remaining())
            await asyncio.sleep(0.005)
        assert lock.owned
    assert 0.5 * ceiling < most <= ceiling + 0.001, (most, ceiling)


async def test_release_stops_renewal(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    lock = locks.lock(name, ttl=1.0)
    assert await lock.acquire()
    await asyncio.sleep(0.7)  # a renewal or two happened
    assert lock.owned
    await lock.release()
    before = await _commandstat(clients, "pexpire")
    await asyncio.sleep(0.5)
    after = await _commandstat(clients, "pexpire")
    assert after == before


async def test_handle_without_async_with_is_renewed_until_release(
    locks: LockManager, name: str
) -> None:
    lock = locks.lock(name, ttl=1.2)
    assert await lock.acquire()
    await asyncio.sleep(1.5)
    assert lock.owned
    assert lock.lost is None
    await lock.release()


async def test_locks_taken_one_at_a_time_do_not_wake_the_renewer_each(
    locks: LockManager, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no lock held the renewer sleeps until the lock started last was due, not
    for good: each lock of a stream taken one at a time would wake its task (a loop
    iteration and a task step per lock cycle). Nor until the latest due of all: after
    one long lock, each shorter one would. Then, that due passed, for good."""
    renewer = seam.engine(locks).renewer
    lock = locks.lock(name, ttl=30)
    assert await lock.acquire()  # (the first lock starts the renewer's task)
    await lock.release()
    await asyncio.sleep(0.01)
    woken: list[bool] = []
    wake = renewer._wake.set

    def counted() -> None:
        woken.append(True)
        wake()

    monkeypatch.setattr(renewer._wake, "set", counted)
    for _ in range(20):
        lock = locks.lock(name, ttl=0.6)
        assert await lock.acquire()
        await lock.release()
        await asyncio.sleep(0)
    assert len(woken) <= 1  # (the first of them: due before the long one)
    await asyncio.sleep(0.4)  # the last was due 0.2 s after it started
    assert renewer._sleep_until == math.inf


async def test_locks_taken_while_the_renewer_sleeps_with_none_held_are_renewed_in_time(
    locks: LockManager, name: str
) -> None:
    """The renewer, with no lock held, sleeps until the lock started last was due
    (here 1.3 s on): one taken meanwhile with a shorter ttl, due sooner, wakes it; one
    with the same ttl is due after that, and renewed when it wakes."""
    first = locks.lock(f"{name}-first", ttl=4.0)
    assert await first.acquire()
    await first.release()
    await asyncio.sleep(0.1)
    shorter = locks.lock(f"{name}-shorter", ttl=0.8)
    same = locks.lock(f"{name}-same", ttl=4.0)
    assert await shorter.acquire()
    assert await same.acquire()
    await asyncio.sleep(2.0)
    for lock in (shorter, same):
        assert lock.owned
        assert lock.lost is None
        await lock.release()


async def test_wait_lost_without_renewal_is_an_error(locks: LockManager, name: str) -> None:
    lock = locks.lock(name, ttl=5, auto_renew=False)
    assert await lock.acquire()
    with pytest.raises(LockNotOwned, match=r"is not held with auto_renew"):
        await lock.wait_lost()
    await lock.release()


async def test_auto_renew_false_lets_lock_expire(locks: LockManager, name: str) -> None:
    lock = locks.lock(name, ttl=0.3, auto_renew=False)
    assert await lock.acquire()
    await asyncio.sleep(0.5)
    assert not lock.owned
    assert await locks.lock(name).acquire(timeout=0)


async def test_max_hold_ends_renewal_and_cancels_body(locks: LockManager, name: str) -> None:
    started = time.monotonic()
    with pytest.raises(LockLost, match="max_hold"):
        async with locks.lock(name, ttl=0.8, max_hold=1.2):
            await asyncio.sleep(10)
    assert 1.1 < time.monotonic() - started < 4.0


async def test_max_hold_on_a_plain_handle_reports_the_loss_and_frees_the_name(
    locks: LockManager, name: str
) -> None:
    lock = locks.lock(name, ttl=0.6, max_hold=1.0)
    assert await lock.acquire()
    started = time.monotonic()
    lost = await asyncio.wait_for(lock.wait_lost(), 5)
    assert 0.9 < time.monotonic() - started < 3.0
    assert str(lost).endswith("lost: max_hold reached"), str(lost)
    assert lock.lost is lost
    assert not lock.owned
    assert lock.fencing_token is not None  # the token stays until release
    # Renewal stopped: the name is free once the last renewal's ttl ran out.
    other = locks.lock(name, ttl=5)
    assert await other.acquire(timeout=2)
    with pytest.raises(LockNotOwned):
        await lock.release()
    assert other.owned  # the old handle's release did not touch the new holder's key
    await other.release()


async def test_many_locks_renew_with_one_command_per_node_per_tick(
    urls: list[str], clients: list[redis.Redis]
) -> None:
    # A generous node_timeout: this test counts commands, it does not time them,
    # and a loaded 2-core machine may answer slowly.
    async with LockManager(urls, node_timeout=0.5) as locks:
        await _hold_many_and_count(locks, clients)


async def _hold_many_and_count(locks: LockManager, clients: list[redis.Redis]) -> None:
    # A ttl with room for a loaded 2-core machine: this counts commands, it does not
    # time the renewals.
    held = [locks.lock(f"many-{i}", ttl=1.2) for i in range(1000)]
    for lock in held:
        assert await lock.acquire(timeout=5)
    before = await _commandstat(clients, "evalsha")
    started = time.monotonic()
    await asyncio.sleep(2.4)  # about six renewal periods of 0.4 s
    after = await _commandstat(clients, "evalsha")
    elapsed = time.monotonic() - started
    assert all(lock.owned for lock in held)
    per_node = [a - b for a, b in zip(after, before, strict=True)]
    # Each lock was renewed about every 0.2-0.4 s: one command per lock would be
    # thousands per node. Batched, it is one per tick, a tick at most every ttl/6
    # (plus slack for a busy machine).
    bound = 1.5 * elapsed / 0.2 + 3
    assert all(0 < calls <= bound for calls in per_node), (per_node, bound)
    for lock in held:
        await lock.release()


async def test_outer_cancellation_is_not_turned_into_lock_lost(
    locks: LockManager, name: str
) -> None:
    entered = asyncio.Event()

    async def body() -> None:
        async with locks.lock(name, ttl=0.5):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await locks.lock(name).acquire(timeout=0)


async def test_outer_cancellation_is_kept_even_when_the_release_fails(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    # Without renewal there is no loss scope: the exit must still tell an outside
    # cancellation (kept) from the body's own error (replaced by the lock's).
    entered = asyncio.Event()

    async def body() -> None:
        async with locks.lock(name, ttl=5, auto_renew=False):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(body())
    await entered.wait()
    for client in clients:
        await client.delete(key(name))  # the release at exit will fail: not held
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_body_error_with_a_failed_release_raises_the_release_error(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    with pytest.raises(LockNotOwned) as info:
        async with locks.lock(name, ttl=5, auto_renew=False):
            for client in clients:
                await client.delete(key(name))
            raise ValueError("the body's own error")
    assert isinstance(info.value.__context__, ValueError)  # kept, as the context


async def test_a_renewal_with_a_minority_gone_and_nodes_hung_is_not_a_majority_gone(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    async with LockManager(servers, node_timeout=0.05) as locks:
        lock = locks.lock(name, ttl=1.0)
        assert await lock.acquire()
        for client in clients[:2]:
            await client.delete(key(name))  # 2 of 5 say "gone"
        hung = servers.servers[2]
        assert isinstance(hung, Server)
        hung.pause()  # 1 of 5 hung; 2 of 5 still hold it: no quorum either way
        try:
            lost = await asyncio.wait_for(lock.wait_lost(), 5)
        finally:
            hung.resume()
    # Lost by the clock, not as "gone on a majority": two nodes are not a majority.
    assert str(lost).endswith("no quorum confirmed the renewal before validity ran out")


def _first_batch_fails(locks: LockManager, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Make the first renewal batch raise; returns the list of when batches were sent."""
    quorum = seam.engine(locks).renewal_quorum
    original = quorum.extend_many
    sent: list[float] = []

    async def flaky(*args: object, **kwargs: object) -> object:
        sent.append(time.monotonic())
        if len(sent) == 1:
            raise RuntimeError("a bug in one tick")
        return await original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(quorum, "extend_many", flaky)
    return sent


def _failed_ticks(caplog: pytest.LogCaptureFixture) -> list[str]:
    failed = [r for r in caplog.records if "a renewal tick failed" in r.getMessage()]
    return [str(r.exc_info[1]) for r in failed if r.exc_info]


async def test_a_failing_renewal_retries_every_retry_interval_not_in_a_loop(
    servers: Servers, urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # 3 of 5 nodes refuse: every renewal fails at once. It is tried again after
    # retry_interval (max(ttl / 10, 2 x node_timeout) = 0.3 s here), not at once: an
    # outage must not turn each holder into a loop hammering the nodes that are left.
    async with LockManager(urls, node_timeout=0.05) as locks:
        lock = locks.lock(name, ttl=3.0)
        assert await lock.acquire(timeout=5)
        for server in servers.servers[:3]:
            assert isinstance(server, Server)
            server.kill()
        healthy = clients[3:]
        for client in healthy:
            await client.config_resetstat()
        await asyncio.sleep(2.0)  # renewals due at 1 s (ttl / 3), then 1.3, 1.6, 1.9 s
        tries = await renewals_run(healthy)
        # (At least 3, 4 measured: a pace of half the time left, as if retry_interval
        # were long, makes 2 tries in these 2 s: at 1 s and about 1.9 s.)
        assert all(3 <= n <= 8 for n in tries), tries
        assert lock.lost is None  # its validity (about 2.8 s) has not run out yet
        with contextlib.suppress(LockLost, QuorumError):
            await lock.release()


@pytest.mark.renewal_tick_may_fail  # (a renewal that spins is stopped by failing a tick)
async def test_a_renewal_failing_at_once_past_its_deadline_is_given_up_not_retried(
    servers: Servers, urls: list[str], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every node refuses (an outage, or the one Redis of a single-node manager
    # restarting) and is in its reconnect back-off: a renewal fails at once, without
    # awaiting anything (a node in back-off answers from its last error). One batch's
    # answer is read late, past the lock's give-up time, with the deadline's timer not
    # yet run: the loop was busy elsewhere (a stall, stood in for by a blocking sleep).
    # Found by the simulation (seed 8018443683, nodes restarting): the renewer retried
    # that lock at once, and again, each pass failing without an await, so the loop
    # never ran the deadline: it spun at 100 % CPU while the back-off lasted (up to
    # 0.5 s; for ever in virtual time), the holder told that much late (10,000 to
    # 12,500 passes in one stall of a few milliseconds).
    async with LockManager(urls, node_timeout=0.05) as locks:
        lock = locks.lock(name, ttl=1.0)
        assert await lock.acquire(timeout=5)
        assert lock._hold is not None
        renewal = lock._hold.renewal
        assert isinstance(renewal, Renewal)
        quorum = seam.engine(locks).renewal_quorum
        for node in quorum.nodes:  # a back-off that outlasts the test: failing at once
            monkeypatch.setattr(node, "_backoff", 30.0)
        passes: list[float] = []  # when each renewal pass began, on the renewer's clock
        stalled: list[bool] = []
        extend_many = quorum.extend_many

        async def late_read(*args: Any, **kwargs: Any) -> Any:
            now = quorum.clock()
            passes.append(now)
            if sum(t >= renewal.give_up_at for t in passes) > 1000:
                raise RuntimeError("spinning: stopped after 1000 passes")
            batch = await extend_many(*args, **kwargs)
            if not stalled and renewal.give_up_at - quorum.clock() < 0.15:
                stalled.append(True)
                time.sleep(max(0.0, renewal.give_up_at - quorum.clock()) + 0.002)
            return batch

        monkeypatch.setattr(quorum, "extend_many", late_read)
        for server in servers.servers:
            assert isinstance(server, Server)
            server.kill()
        lost = await asyncio.wait_for(lock.wait_lost(), 5)
        assert stalled
        late = [t for t in passes if t >= renewal.give_up_at]
        assert late == [], f"{len(late)} renewal passes after the give-up time"
        # Nor ever more often as the deadline nears: a retry waits a node_timeout at least.
        gaps = [round(b - a, 4) for a, b in itertools.pairwise(passes)]
        assert min(gaps) >= 0.05 * 0.95, gaps
        assert str(lost).endswith("no quorum confirmed the renewal before validity ran out")
        assert isinstance(lost.__cause__, QuorumError)
        with contextlib.suppress(LockNotOwned, QuorumError):
            await lock.release()


async def test_an_extend_that_finds_the_lock_gone_on_a_majority_cancels_the_renewed_body(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation (seed 17592226047226, two restarts: the key gone from 2
    # of 3 nodes). A body's extend() learnt that the lock was not held on a majority
    # any more and dropped it, raising LockNotOwned; the caller had wrapped extend() in
    # a deadline of its own, which fired during the drop, so what it saw was its own
    # TimeoutError. The renewal was stopped without a word: the body ran on, untold,
    # with remaining() == 0. A lock that cannot be kept is lost, whoever learns it
    # first: the body is cancelled and the exit raises LockLost (API.md), as when the
    # renewal learns it. Here the caller ignores extend()'s error, which is the same to
    # the body as never seeing it.
    async with LockManager(urls) as locks:
        lock = locks.lock(name, ttl=30)
        went_on = False
        with pytest.raises(LockLost) as lost:
            async with lock:
                for client in clients[:3]:  # taken from under it on a majority
                    await client.delete(key(name))
                with contextlib.suppress(LockNotOwned):
                    await lock.extend(20)
                await asyncio.sleep(5)  # (cancelled: broken, it slept on)
                went_on = True
        assert not went_on
        assert lock.lost is lost.value
        assert isinstance(lost.value.__cause__, LockNotOwned)
        assert lock.remaining() == 0.0
        assert [await c.get(key(name)) for c in clients] == [None] * 5


async def test_a_renewal_confirmed_past_its_deadline_does_not_bring_the_lock_back(
    urls: list[str], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A renewal's replies are read, but the loop is blocked (a stall, stood in for by a
    # blocking sleep) until the lock's give-up time and its validity have passed, with
    # the deadline's timer not yet run. Meanwhile the holder may have read remaining()
    # == 0 and acted on it (detach() said LockNotOwned). Found by the simulation (seed
    # 35359738591, its loop releasing one timer at a time): the confirmation moved the
    # deadline, so the lock came back to life, renewed on, and still counted as held by
    # the task: its next acquire of the name raised RuntimeError. Loss is decided by the
    # clock: a deadline that has passed is final.
    async with LockManager(urls, node_timeout=0.05) as locks:
        quorum = seam.engine(locks).renewal_quorum
        extend_many = quorum.extend_many
        seen: list[float] = []  # the remaining() the holder read in the stall's last instant

        async def read_late(*args: Any, **kwargs: Any) -> Any:
            batch = await extend_many(*args, **kwargs)
            if not seen:
                time.sleep(max(0.0, lock.remaining()) + 0.01)
                seen.append(lock.remaining())
            return batch

        monkeypatch.setattr(quorum, "extend_many", read_late)
        lock = locks.lock(name, ttl=1.0)
        with pytest.raises(LockLost) as lost:
            async with lock:
                await asyncio.sleep(3.0)  # three renewals' worth: cancelled by the loss
        assert seen == [0.0]
        assert str(lost.value).endswith("no quorum confirmed the renewal before validity ran out")
        assert lock.remaining() == 0.0
        # Not held by this task any more: acquiring the name again is no RuntimeError.
        again = locks.lock(name, ttl=1.0)
        assert await again.acquire(timeout=5)
        await again.release()


@pytest.mark.renewal_tick_may_fail
async def test_a_failing_renewal_tick_does_not_end_renewal(
    locks: LockManager, name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sent = _first_batch_fails(locks, monkeypatch)
    async with locks.lock(name, ttl=1.2) as lock:
        assert lock._hold is not None
        expires_at = lock._hold.expires_at
        while not sent:
            await asyncio.sleep(0.01)
        # The failed batch changed nothing: the validity is the acquisition's.
        assert lock._hold.expires_at == expires_at
        await asyncio.sleep(2.0)
        assert lock.owned
    assert len(sent) >= 3
    # The tick failed with the injected error, and only with it (its clean-up is sound).
    assert _failed_ticks(caplog) == ["a bug in one tick"]


@pytest.mark.renewal_tick_may_fail
async def test_a_failed_renewal_after_a_longer_extend_keeps_the_shorter_validity(
    locks: LockManager, name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # extend(5) then a renewal by the lock's own ttl (1.2 s) that fails midway: the
    # nodes may have applied its PEXPIRE, so the validity must shrink to it, and the
    # renewal schedule follow (the tick fails with the injected error only).
    sent = _first_batch_fails(locks, monkeypatch)
    async with locks.lock(name, ttl=1.2) as lock:
        await lock.extend(5.0)
        while not sent:
            await asyncio.sleep(0.01)
        assert lock._hold is not None
        assert lock._hold.expires_at <= sent[0] + 1.2
        await asyncio.sleep(1.5)  # renewed again, on the 1.2 s schedule
        assert lock.owned
    assert _failed_ticks(caplog) == ["a bug in one tick"]


# -- the holder is told before its validity ends, whatever the nodes do ------------------

HANDLE_KINDS = ("lock", "lock_many", "semaphore", "read", "write")


def _guard(ttl: float, node_timeout: float = 0.05) -> float:
    # README: the holder is told this long before its lock expires.
    return min(ttl / 5, max(3 * node_timeout, 0.05))


def _handle(locks: LockManager, kind: str, name: str, ttl: float) -> Any:
    if kind == "lock":
        return locks.lock(name, ttl=ttl)
    if kind == "lock_many":
        return locks.lock_many([f"{name}:a", f"{name}:b"], ttl=ttl)
    if kind == "semaphore":
        return locks.semaphore(name, 2, ttl=ttl)
    rw = locks.rwlock(name, ttl=ttl)
    return rw.read() if kind == "read" else rw.write()


async def _margin_when_told(handle: Any, entered: asyncio.Event) -> float:
    """Seconds between the moment the body is cancelled and its validity estimate's end.

    A sampler in the body keeps ``now + remaining()``, as a careful user would; the
    margin is that estimate minus the moment the cancellation reached the body.
    """
    valid_until = 0.0
    told = math.inf
    with pytest.raises(LockLost):
        async with handle:
            entered.set()
            try:
                while True:
                    left = handle.remaining()
                    if left > 0.0:
                        valid_until = time.monotonic() + left
                    await asyncio.sleep(0.005)
            except asyncio.CancelledError:
                told = time.monotonic()
                raise
    return valid_until - told


async def _margins_under(
    servers: Servers, fault: str, ttls: tuple[float, ...], prefix: str
) -> dict[tuple[str, float], float]:
    """Hold one handle of each kind and ttl, then hang or kill 3 of the 5 servers."""
    async with LockManager(servers, node_timeout=0.05) as locks:
        jobs = {}
        events = []
        for kind in HANDLE_KINDS:
            for ttl in ttls:
                entered = asyncio.Event()
                events.append(entered)
                handle = _handle(locks, kind, f"{prefix}-{kind}-{ttl}", ttl)
                jobs[kind, ttl] = asyncio.create_task(_margin_when_told(handle, entered))
        for entered in events:
            await asyncio.wait_for(entered.wait(), 10)
        faulty = [s for s in servers.servers[:3] if isinstance(s, Server)]
        try:
            for server in faulty:
                server.pause() if fault == "hang" else server.kill()
            done = await asyncio.wait_for(asyncio.gather(*jobs.values()), max(ttls) + 20)
        finally:
            for server in faulty:
                server.resume()
        return dict(zip(jobs, done, strict=True))


@pytest.mark.first
@pytest.mark.parametrize(
    ("fault", "ttls"),
    [
        ("hang", (0.5, 3.0, 10.0)),
        ("refuse", (0.5, 3.0, 10.0)),
        # 30 s of waiting: in `nox -s chaos`, to keep the default run within 10 minutes
        pytest.param("hang", (30.0,), marks=pytest.mark.slow),
    ],
)
async def test_every_holder_is_told_a_guard_before_its_validity_ends(
    servers: Servers, name: str, fault: str, ttls: tuple[float, ...]
) -> None:
    margins = await _margins_under(servers, fault, ttls, name)
    late = {
        f"{kind} ttl={ttl:g}": round(margin, 3)
        for (kind, ttl), margin in margins.items()
        if margin < _guard(ttl) / 2
    }
    assert not late, f"told less than guard/2 before validity ended: {late}"


# -- the batch budget: renewal is not latency-bound ------------------------------------------


async def test_a_slow_majority_still_renews_within_the_batch_budget(
    urls: list[str], name: str
) -> None:
    # Every node answers, but slower than node_timeout: 0.12 s each way through the
    # proxies, against node_timeout 0.1. A renewal batch may wait up to ttl / 6 (0.5 s
    # here), so the lock stays held past its first validity; a batch held to
    # node_timeout would fail every renewal and lose it.
    async with (
        proxies(urls) as slow,
        LockManager([p.url for p in slow], node_timeout=0.1) as locks,
        locks.lock(name, ttl=3.0) as lock,
    ):
        for proxy in slow:
            proxy.delay, proxy.mode = 0.12, Mode.DELAY
        await asyncio.sleep(3.5)
        assert lock.owned
        assert lock.lost is None
        for proxy in slow:
            proxy.mode = Mode.PASS


async def test_a_slow_majority_renews_every_call_of_a_split_batch_within_the_budget(
    urls: list[str], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same with the batch split into script calls (one lock each here, as with over
    # 1,000 locks: BATCH_LIMIT), sent one after the other on each node's connection, a
    # round trip each: 0.3 s through the proxies, two calls 0.6 s, against a budget of
    # ttl / 6 = 0.5 s. The budget was the whole batch's: the second call's replies came
    # after it, every round, and its lock was lost (found by the simulation's runs
    # focused on lag, seed 70369244182651). Each call gets it now.
    monkeypatch.setattr(aiolock._core.batch, "BATCH_LIMIT", 1)
    async with (
        proxies(urls) as slow,
        LockManager([p.url for p in slow], node_timeout=0.1) as locks,
        locks.lock(f"{name}:0", ttl=3.0) as first,
        locks.lock(f"{name}:1", ttl=3.0) as second,
    ):
        for proxy in slow:
            proxy.delay, proxy.mode = 0.15, Mode.DELAY
        await asyncio.sleep(3.5)
        assert first.lost is None
        assert second.lost is None
        assert first.owned
        assert second.owned
        for proxy in slow:
            proxy.mode = Mode.PASS
        await asyncio.sleep(0.5)  # (what the proxies hold back goes through first)


# -- a renewal batch split into several script calls ----------------------------------------


async def test_a_renewal_batch_split_into_several_calls_counts_each_reply_for_its_locks(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    # 40 locks with 3,000-byte names: about 120 KB of keys, so each renewal goes out as
    # two script calls per node (at most 64 KB each). Each call's reply must be counted
    # for its own locks: every lock stays held, and when 3 of 5 nodes die each loss
    # names 3 failed nodes, not a count of both calls' failures.
    async with LockManager(servers, node_timeout=0.1) as locks:
        held = [locks.lock(f"{name}-{i:02d}".ljust(3000, "x"), ttl=1.2) for i in range(40)]
        # Acquired together, renewed together: one batch of 40 (of two calls a node).
        assert all(await asyncio.gather(*(one.acquire(timeout=5) for one in held)))
        await asyncio.sleep(1.6)  # past the first validity: renewed in split batches
        assert all(one.owned for one in held)
        # The counts of one such batch, lock by lock (a reply credited to the wrong locks
        # would be rescued by the retry that follows, at the cost of a script call).
        # (Someone else's key on node 0 for lock 30: the background renewal leaves it.)
        assert held[30]._hold is not None
        await clients[0].set(held[30]._hold.key, b"someone-else")
        items = [(one._hold.key, one._hold.token, 1.2) for one in held if one._hold]
        batch = await seam.engine(locks).renewal_quorum.extend_many(items, budget=1.0)
        assert batch.yes == [5] * 30 + [4] + [5] * 9
        assert batch.missing == {30: [0]}
        assert batch.failed == [0] * 40
        for server in servers.servers[:3]:
            assert isinstance(server, Server)
            server.kill()
        lost = await asyncio.wait_for(asyncio.gather(*(one.wait_lost() for one in held)), 5)
        for one, loss in zip(held, lost, strict=True):
            cause = str(loss.__cause__)
            assert cause.startswith(f"renewal of lock '{one.name[:20]}"), cause
            assert cause.endswith(" (3000 bytes): 3 of 5 nodes failed"), cause
            with contextlib.suppress(LockLost, LockNotOwned, QuorumError):
                await one.release()


# -- repair: a minority that lost the key gets it back (in mutmut's selection) ------------


async def test_a_renewal_that_wins_puts_the_key_back_where_a_minority_lost_it(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    # As after a restart empty, without one: node 0 lost the key and its counter,
    # node 1 holds someone else's key. A renewal still wins on nodes 2-4; it gives
    # node 0 our key (its ttl the lock's) and our fencing token, and leaves node 1's.
    ttl = 1.5
    async with locks.lock(name, ttl=ttl) as lock:
        fence = lock.fencing_token
        assert fence is not None
        ours = await clients[2].get(key(name))
        assert ours is not None
        fence_key = f"{key(name)}:fence"
        await clients[0].delete(key(name), fence_key)
        await clients[1].set(key(name), b"someone-else", px=10_000)
        await asyncio.sleep(ttl / 3 * 2.5)  # two renewals
        assert lock.owned
        held = [await c.get(key(name)) for c in clients]
        assert held == [ours, b"someone-else", ours, ours, ours], held
        assert 0 < await clients[0].pttl(key(name)) <= ttl * 1000
        assert int(await clients[0].get(fence_key) or 0) == fence
        # The counter outlives the lock, as every acquire's does (_core/keys.py).
        assert await clients[0].pttl(fence_key) > 100 * ttl * 1000 - 5_000
        # Renewed, not only re-created: the repaired key's ttl is refreshed too.
        await asyncio.sleep(ttl)
        assert 0 < await clients[0].pttl(key(name)) <= ttl * 1000
        assert lock.owned


async def test_a_repair_leaves_a_higher_counter_as_it_is(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    # A node whose counter went on (a later holder's acquisition reached it) keeps it:
    # repair only ever raises a counter.
    async with locks.lock(name, ttl=1.2) as lock:
        fence = lock.fencing_token
        assert fence is not None
        fence_key = f"{key(name)}:fence"
        await clients[0].delete(key(name))
        await clients[0].set(fence_key, fence + 1000)
        await asyncio.sleep(1.0)
        assert await clients[0].get(key(name)) == await clients[1].get(key(name))
        assert int(await clients[0].get(fence_key) or 0) == fence + 1000


async def test_a_read_lock_is_not_repaired(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    # A reader is also a member of the readers' set: re-creating its key alone would
    # not make it a reader again, so the renewal leaves a node that lost it alone.
    async with locks.rwlock(name, ttl=1.2).read() as reader:
        before = [sorted(await c.keys(f"*{name}*")) for c in clients]
        assert before[0], "the read lock keeps keys on the nodes"
        for k in before[0]:
            await clients[0].delete(k)
        await asyncio.sleep(1.0)  # two renewals
        assert reader.owned
        assert await clients[0].keys(f"*{name}*") == []
        assert [sorted(await c.keys(f"*{name}*")) for c in clients[1:]] == before[1:]
