"""Lock behaviour on five real nodes: acquire, release, extend, async with."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as redis

import aiolock
from aiolock import LockManager, LockNotOwned, LockTimeout, QuorumError
from aiolock._core.hold import Extension, Hold
from aiolock.testing import Server, Servers

from . import seam
from .conftest import elsewhere, key, settled, settled_keys, tokens_on
from .faults import proxies


async def test_acquire_and_release_sets_and_deletes_key_on_every_node(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    lock = locks.lock(name, ttl=10)
    drift = 10 * 0.01 + 0.002
    started = time.monotonic()
    assert await lock.acquire(timeout=0) is True
    assert lock.owned
    # Validity is ttl - elapsed - drift: bounded by the time measured around it, not
    # by a fixed guess of how fast a loaded machine is (9.0 < remaining flaked).
    remaining, elapsed = lock.remaining(), time.monotonic() - started
    assert 10.0 - drift - elapsed <= remaining <= 10.0 - drift
    assert await settled_keys(clients, name, [True] * 5) == [True] * 5
    ttls = [await c.pttl(key(name)) for c in clients]
    elapsed_ms = (time.monotonic() - started) * 1000
    assert all(10000 - elapsed_ms - 1 <= t <= 10000 for t in ttls), ttls
    await lock.release()
    assert not lock.owned
    assert lock.remaining() == 0.0
    assert await settled_keys(clients, name, [False] * 5) == [False] * 5


async def test_token_on_nodes_is_random_and_at_least_20_bytes(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    tokens = set()
    for _ in range(3):
        lock = locks.lock(name, ttl=10)
        assert await lock.acquire(timeout=0)
        # (acquire() returns on a quorum: the other nodes' SETs land a moment later.)
        on_nodes = await settled(lambda: tokens_on(clients, name), lambda t: None not in t)
        values = set(on_nodes)
        assert len(values) == 1  # the same token on every node
        token = values.pop()
        assert token is not None
        assert len(token) >= 20
        tokens.add(token)
        await lock.release()
    assert len(tokens) == 3


async def test_timeout_zero_on_held_name_returns_false_fast(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    holder = locks.lock(name, ttl=10)
    assert await holder.acquire()
    other = locks.lock(name, ttl=10)
    started = time.monotonic()
    assert await elsewhere(other.acquire(timeout=0)) is False
    assert time.monotonic() - started < 1.0
    assert not other.owned
    assert other.fencing_token is None
    # The holder's key is untouched.
    assert await settled_keys(clients, name, [True] * 5) == [True] * 5
    await holder.release()


async def test_acquire_waits_for_release_within_timeout(locks: LockManager, name: str) -> None:
    holder = locks.lock(name, ttl=10)
    assert await holder.acquire()

    async def release_soon() -> None:
        await asyncio.sleep(0.2)
        await holder.release()

    task = asyncio.create_task(release_soon())
    waiter = locks.lock(name, ttl=10)
    assert await elsewhere(waiter.acquire(timeout=5)) is True
    await task
    await waiter.release()


async def test_acquire_returns_false_when_time_is_up(locks: LockManager, name: str) -> None:
    holder = locks.lock(name, ttl=10)
    assert await holder.acquire()
    started = time.monotonic()
    assert await elsewhere(locks.lock(name).acquire(timeout=0.3)) is False
    elapsed = time.monotonic() - started
    assert 0.25 < elapsed < 3.0
    await holder.release()


async def test_async_with_timeout_raises_lock_timeout(locks: LockManager, name: str) -> None:
    holder = locks.lock(name, ttl=10)
    assert await holder.acquire()

    async def enter() -> None:
        async with locks.lock(name, timeout=0.2):
            pytest.fail("the body must not run")

    with pytest.raises(LockTimeout, match=rf"^lock {name!r} not acquired within 0.2s$"):
        await elsewhere(enter())
    assert issubclass(LockTimeout, TimeoutError)
    await holder.release()


async def test_async_with_holds_during_body_and_releases_after(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    async with locks.lock(name, ttl=10, timeout=1) as lock:
        assert lock.owned
        assert await settled_keys(clients, name, [True] * 5) == [True] * 5
    assert not lock.owned
    assert await settled_keys(clients, name, [False] * 5) == [False] * 5


async def test_async_with_releases_on_exception(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    lock = locks.lock(name, ttl=10)
    with pytest.raises(ZeroDivisionError):
        async with lock:
            _ = 1 / 0
    assert not lock.owned
    assert await settled_keys(clients, name, [False] * 5) == [False] * 5


async def test_async_with_releases_on_cancellation(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    entered = asyncio.Event()

    async def body() -> None:
        async with locks.lock(name, ttl=10):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await settled_keys(clients, name, [False] * 5) == [False] * 5


async def test_exit_after_body_released_raises_not_owned(locks: LockManager, name: str) -> None:
    with pytest.raises(LockNotOwned):
        async with locks.lock(name, ttl=10) as lock:
            await lock.release()


async def test_exit_after_expiry_without_renewal_raises_not_owned(
    locks: LockManager, name: str
) -> None:
    with pytest.raises(LockNotOwned):
        async with locks.lock(name, ttl=0.2, auto_renew=False):
            await asyncio.sleep(0.4)


async def test_release_after_expiry_raises_and_keeps_new_holders_key(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    first = locks.lock(name, ttl=0.2, auto_renew=False)
    assert await first.acquire()
    await asyncio.sleep(0.35)
    assert not first.owned
    second = locks.lock(name, ttl=10)
    assert await second.acquire(timeout=1)
    token = await clients[0].get(key(name))
    with pytest.raises(LockNotOwned):
        await first.release()
    assert [await c.get(key(name)) for c in clients] == [token] * 5
    assert second.owned
    await second.release()


async def test_release_of_never_acquired_lock_raises_not_owned(
    locks: LockManager, name: str
) -> None:
    with pytest.raises(LockNotOwned):
        await locks.lock(name).release()


async def test_double_release_raises_not_owned(locks: LockManager, name: str) -> None:
    lock = locks.lock(name)
    assert await lock.acquire()
    await lock.release()
    with pytest.raises(LockNotOwned):
        await lock.release()


async def test_release_of_key_deleted_behind_back_raises_not_owned(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    lock = locks.lock(name, ttl=10, auto_renew=False)
    assert await lock.acquire()
    for client in clients[:3]:
        await client.delete(key(name))
    with pytest.raises(LockNotOwned):
        await lock.release()
    assert await settled_keys(clients, name, [False] * 5) == [False] * 5


async def test_extend_resets_validity_and_node_ttl(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    lock = locks.lock(name, ttl=2, auto_renew=False)
    assert await lock.acquire()
    await asyncio.sleep(0.3)
    await lock.extend(20)
    assert lock.remaining() > 19
    assert all([await c.pttl(key(name)) > 19000 for c in clients])
    await lock.extend()
    assert 1.5 < lock.remaining() <= 2
    assert lock.ttl == 2
    await lock.release()


async def test_extend_counts_the_drift_allowance_off_the_new_validity(
    locks: LockManager, name: str
) -> None:
    lock = locks.lock(name, ttl=2, auto_renew=False)
    assert await lock.acquire()
    drift = 20 * locks.drift_factor + 0.002  # 0.202 s at the default drift_factor
    await lock.extend(20)
    # Measured from before the requests went out, less the drift allowance.
    assert 20 - drift - 1.0 < lock.remaining() <= 20 - drift
    await lock.release()


async def test_extend_to_a_shorter_ttl_keeps_an_auto_renewed_lock_exclusive(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    other = locks.lock(name, ttl=5)
    async with locks.lock(name, ttl=9) as lock:
        await lock.extend(1.0)
        assert lock.remaining() <= 1.0
        # Past the shortened validity: the renewal must have come sooner than ttl/3
        # of the lock's own ttl (3 s), or the keys expire and another takes the lock.
        for _ in range(6):
            await asyncio.sleep(0.3)
            assert lock.owned
            assert not await elsewhere(other.acquire(timeout=0))
        assert all([await c.pttl(key(name)) > 5000 for c in clients])


async def test_cancelled_extend_leaves_validity_as_the_nodes_hold_it(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # A generous node_timeout: on a loaded machine a node may miss 50 ms, and then the
    # extension is (rightly) not believed, which is not what this test is about.
    async with LockManager(urls, node_timeout=0.5) as locks:
        lock = locks.lock(name, ttl=10, auto_renew=False)
        assert await lock.acquire()
        for new_ttl in (1.0, 20.0):
            task = asyncio.create_task(lock.extend(new_ttl))
            await asyncio.sleep(0)  # its requests are out
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            pttls = sorted([await c.pttl(key(name)) for c in clients])
            # A majority (3 of 5) holds the key at least as long as the validity we believe.
            assert 0.0 < lock.remaining() <= pttls[2] / 1000 + 0.002, (new_ttl, pttls)
            # And the extension completed (README: extend() completes even if cancelled).
            assert lock.remaining() > new_ttl * 0.75
        await lock.release()


async def test_extend_after_expiry_raises_and_does_not_recreate_key(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    lock = locks.lock(name, ttl=0.2, auto_renew=False)
    assert await lock.acquire()
    await asyncio.sleep(0.35)
    with pytest.raises(LockNotOwned, match=r"had expired; it is not re-created"):
        await lock.extend()
    assert await settled_keys(clients, name, [False] * 5) == [False] * 5
    assert not lock.owned


async def test_an_extend_confirmed_after_its_validity_ran_out_says_so(
    urls: list[str], name: str
) -> None:
    # The extension goes out, then a task blocks the loop for longer than its new ttl:
    # every node applied it, but by the time the replies are read the validity it
    # gave has run out. It fails, and says why: it once said "0 of 5 nodes failed, a
    # quorum needs 3" (found by the simulation's runs focused on short blocks).
    loop = asyncio.get_running_loop()
    async with LockManager(urls, node_timeout=0.1) as locks:
        lock = locks.lock(name, ttl=10, auto_renew=False)
        assert await lock.acquire()
        task = asyncio.create_task(lock.extend(0.3))
        await asyncio.sleep(0)  # its requests are out
        loop.call_soon(time.sleep, 0.5)
        with pytest.raises(QuorumError, match=r"confirmed only after .* had run out") as info:
            await task
        assert info.value.errors == {}
        assert not lock.owned


async def test_extend_of_key_taken_over_raises_and_keeps_other_token(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    lock = locks.lock(name, ttl=10, auto_renew=False)
    assert await lock.acquire()
    for client in clients:
        await client.set(key(name), b"someone-else", px=10000)
    message = r"not held any more on a majority of nodes \(taken over or deleted\)"
    with pytest.raises(LockNotOwned, match=message):
        await lock.extend()
    assert [await c.get(key(name)) for c in clients] == [b"someone-else"] * 5
    assert not lock.owned


async def test_extend_of_never_acquired_lock_raises_not_owned(
    locks: LockManager, name: str
) -> None:
    with pytest.raises(LockNotOwned, match=r"lock '.+' is not held"):
        await locks.lock(name).extend()


@pytest.mark.parametrize("ttl", [30.0, 0.5], ids=["ttl-30s", "ttl-under-1s"])
async def test_acquiring_a_held_handle_raises_runtime_error(
    locks: LockManager, name: str, ttl: float
) -> None:
    lock = locks.lock(name, ttl=ttl)
    assert await lock.acquire()
    with pytest.raises(RuntimeError):
        await lock.acquire()
    await lock.release()


async def test_handle_may_be_released_from_another_task(locks: LockManager, name: str) -> None:
    lock = locks.lock(name)
    assert await lock.acquire()
    await asyncio.create_task(lock.release())
    assert not lock.owned
    assert await locks.lock(name).acquire(timeout=0)


async def test_cancelled_waiting_acquire_leaves_no_key(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    holder = locks.lock(name, ttl=10)
    assert await holder.acquire()
    holder_token = await clients[0].get(key(name))
    waiter = locks.lock(name, ttl=10)
    task = asyncio.create_task(waiter.acquire(timeout=None))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not waiter.owned
    assert [await c.get(key(name)) for c in clients] == [holder_token] * 5
    await holder.release()
    assert await settled_keys(clients, name, [False] * 5) == [False] * 5


async def test_acquire_cancelled_during_handoff_holds_or_leaves_nothing(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    for delay in (0, 0.0002, 0.0005, 0.001, 0.002, 0.005):
        holder = locks.lock(name, ttl=10)
        assert await holder.acquire()
        waiter = locks.lock(name, ttl=10)
        task = asyncio.create_task(waiter.acquire(timeout=None))
        await asyncio.sleep(0.05)
        release = asyncio.create_task(holder.release())
        await asyncio.sleep(delay)
        task.cancel()
        try:
            held = await task
        except asyncio.CancelledError:
            held = False
        await release
        # Either the waiter got the lock (and holds it on every node) or nothing
        # of it remains anywhere.
        assert waiter.owned is held
        assert await settled_keys(clients, name, [held] * 5) == [held] * 5
        if held:
            await waiter.release()


async def test_cancelled_acquire_mid_request_leaves_no_key(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Cancel many acquires right after they were sent, before the replies come.
    async with LockManager(urls) as locks:
        for delay in (0, 0, 0.0001, 0.0002, 0.0005, 0.001):
            lock = locks.lock(name, ttl=10)
            task = asyncio.create_task(lock.acquire(timeout=0))
            if delay:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)
            task.cancel()
            try:
                held = await task
            except asyncio.CancelledError:
                held = False
            if held:
                await lock.release()
            assert await settled_keys(clients, name, [False] * 5) == [False] * 5


async def test_prefix_isolates_managers(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    async with LockManager(urls, prefix="app1:") as one, LockManager(urls, prefix="app2:") as two:
        a = one.lock(name)
        b = two.lock(name)
        assert await a.acquire(timeout=0)
        assert await b.acquire(timeout=0)
        assert await clients[0].exists(key(name, "app1:"), key(name, "app2:")) == 2
        await a.release()
        await b.release()


async def test_single_node_manager_is_a_plain_lock(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    async with LockManager(urls[:1]) as locks:
        assert locks.quorum == 1
        lock = locks.lock(name, ttl=5)
        assert await lock.acquire(timeout=0)
        assert await elsewhere(locks.lock(name).acquire(timeout=0)) is False
        assert await clients[0].exists(key(name)) == 1
        assert await clients[1].exists(key(name)) == 0
        await lock.release()


async def test_redis_client_nodes_are_not_closed_by_manager(urls: list[str], name: str) -> None:
    made = [redis.Redis.from_url(url) for url in urls[:3]]
    try:
        async with LockManager(made) as locks, locks.lock(name, ttl=5):
            pass
        assert all([await c.ping() for c in made])
    finally:
        for client in made:
            await client.aclose()


async def test_closed_manager_refuses_acquire(urls: list[str], name: str) -> None:
    locks = LockManager(urls)
    lock = locks.lock(name)
    assert await lock.acquire(timeout=0)
    await lock.release()
    await locks.aclose()
    assert locks.closed
    with pytest.raises(RuntimeError, match="closed"):
        await lock.acquire(timeout=0)
    with pytest.raises(RuntimeError, match="closed"):
        await locks.inspect(name)
    with pytest.raises(RuntimeError, match="closed"):
        async with locks:
            pass


async def test_manager_usable_without_async_with_connects_lazily(
    urls: list[str], name: str
) -> None:
    locks = LockManager(urls)
    try:
        lock = locks.lock(name)
        assert await lock.acquire(timeout=1)
        await lock.release()
    finally:
        await locks.aclose()


async def test_exclusive_under_task_contention(locks: LockManager, name: str) -> None:
    counter = 0
    inside = 0
    overlaps = 0

    async def worker() -> None:
        nonlocal counter, inside, overlaps
        for _ in range(10):
            async with locks.lock(name, ttl=5, timeout=30):
                inside += 1
                overlaps += inside > 1
                value = counter
                await asyncio.sleep(0)
                counter = value + 1
                inside -= 1

    await asyncio.gather(*(worker() for _ in range(8)))
    assert counter == 80
    assert overlaps == 0


def test_public_names_are_exported() -> None:
    assert set(aiolock.__all__) >= {
        "LockManager", "Lock", "LockError", "LockTimeout", "LockNotOwned", "LockLost",
        "QuorumError",
    }  # fmt: skip
    assert issubclass(aiolock.QuorumError, aiolock.LockError)
    assert issubclass(aiolock.LockLost, aiolock.LockError)


def test_works_on_uvloop(urls: list[str]) -> None:
    # uvicorn (FastAPI) runs on uvloop when installed: its transports differ.
    uvloop = pytest.importorskip("uvloop")

    async def main() -> None:
        async with LockManager(urls) as locks:
            async with locks.lock("uvloop-test", ttl=5) as lock:
                assert lock.fencing_token is not None
                waiter = asyncio.create_task(locks.lock("uvloop-test", ttl=5).acquire(timeout=5))
                await asyncio.sleep(0.05)
            assert await waiter

    uvloop.run(main())


async def test_first_acquires_of_an_unentered_manager_wait_for_connections(
    urls: list[str], name: str
) -> None:
    # No `async with`, and connecting takes longer than node_timeout: the first
    # acquires must wait for the connections, not count the nodes as failed votes.
    async with proxies(urls) as slow:
        for proxy in slow:
            proxy.accept_delay = 0.3
        locks = LockManager([p.url for p in slow], node_timeout=0.1)
        try:
            results = await asyncio.gather(
                *(locks.lock(f"{name}-{i}", ttl=5).acquire(timeout=5) for i in range(20))
            )
            assert all(results)
        finally:
            await locks.aclose()


# -- extensions racing each other: the validity believed is the earlier (pure logic) -------


def _held(locks: LockManager, expires_in: float) -> Hold:
    now = seam.engine(locks).clock()
    return Hold(
        "n",
        b"k",
        b"t",
        ttl=9.0,
        fence=1,
        valid_from=now,
        expires_at=now + expires_in,
        acquired_at=now,
    )


def test_two_extensions_in_flight_leave_the_earlier_expiry_whatever_the_order() -> None:
    locks = LockManager(["redis://127.0.0.1:1"])  # no I/O here
    drift = 9.0 * locks.drift_factor + 0.002
    expiry = seam.engine(locks).quorum.expiry  # start + ttl - drift

    def settle(hold: Hold, extension: Extension, start: float, ttl: float, *, won: bool) -> None:
        hold.end_extension(extension, start, expiry(start, ttl), ttl, won=won)

    for first in ("renewal", "extend"):
        hold = _held(locks, 9.0)
        start = seam.engine(locks).clock()
        in_flight = {"renewal": (hold.begin_extension(), 9.0)}
        in_flight["extend"] = (hold.begin_extension(), 1.0)
        for which in (first, "extend" if first == "renewal" else "renewal"):
            extension, ttl = in_flight[which]
            settle(hold, extension, start, ttl, won=True)
        # The nodes may have applied either PEXPIRE last: believe the earlier expiry.
        assert hold.expires_at <= start + 1.0, first
    # The later of two extensions, settling first, does not lengthen the validity while
    # the other is still in flight (the nodes may apply that one last); then the other
    # settles, and the validity is the earlier of the two.
    hold = _held(locks, 2.0)
    before = hold.expires_at
    start = seam.engine(locks).clock()
    shorter, longer = hold.begin_extension(), hold.begin_extension()
    settle(hold, longer, start, 9.0, won=True)
    assert hold.expires_at == before
    settle(hold, shorter, start, 1.0, won=True)
    assert hold.expires_at <= start + 1.0
    # An extension settles once: a second report of it (a late callback) changes nothing.
    settled_at = hold.expires_at
    settle(hold, shorter, start, 9.0, won=True)
    assert hold.expires_at == settled_at
    assert hold.extensions == []
    # Alone, a confirmed extension sets the validity, shorter or longer.
    hold = _held(locks, 9.0)
    start = seam.engine(locks).clock()
    settle(hold, hold.begin_extension(), start, 1.0, won=True)
    assert hold.expires_at == pytest.approx(start + 1.0 - (1.0 * locks.drift_factor + 0.002))
    settle(hold, hold.begin_extension(), start, 9.0, won=True)
    assert hold.expires_at == pytest.approx(start + 9.0 - drift)
    # Not confirmed: never longer than before, shorter if the nodes may hold it so.
    settle(hold, hold.begin_extension(), start, 20.0, won=False)
    assert hold.expires_at == pytest.approx(start + 9.0 - drift)
    settle(hold, hold.begin_extension(), start, 2.0, won=False)
    assert hold.expires_at < start + 2.0
    # Released meanwhile: an extension settling late changes nothing.
    hold.ended = True
    before = hold.expires_at
    settle(hold, hold.begin_extension(), start, 1.0, won=True)
    assert hold.expires_at == before


async def test_repr_shows_name_ttl_and_whether_held_never_the_token(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    lock = locks.lock(name, ttl=7.5)
    assert repr(lock) == f"<Lock {name!r} ttl=7.5 not held>"
    assert await lock.acquire()
    await settled_keys(clients, name, [True] * 5)  # node 0's request may land last
    token = await clients[0].get(key(name))
    assert token is not None
    shown = repr(lock)
    assert shown.startswith(f"<Lock {name!r} ttl=7.5 held, ")
    left = float(shown.removeprefix(f"<Lock {name!r} ttl=7.5 held, ").removesuffix("s left>"))
    assert 6.0 < left <= 7.5
    assert token.hex() not in shown
    await lock.release()
    assert repr(lock) == f"<Lock {name!r} ttl=7.5 not held>"


async def test_a_second_acquire_of_a_handle_while_its_first_waits_raises(
    locks: LockManager, name: str
) -> None:
    holder = locks.lock(name, ttl=5)
    assert await holder.acquire()
    lock = locks.lock(name, ttl=5)
    first = asyncio.create_task(lock.acquire(timeout=5))  # waits for the holder
    await asyncio.sleep(0.1)
    with pytest.raises(RuntimeError, match=r"acquire\(\) already in progress on this handle"):
        await lock.acquire(timeout=0)
    await holder.release()
    assert await first  # the first acquire was not disturbed
    await lock.release()


async def test_a_release_does_not_wait_for_a_hung_node(servers: Servers, name: str) -> None:
    # The outcome is decided by a quorum: a hung node costs a release nothing, even with
    # a node_timeout long enough to see the difference.
    async with LockManager(servers, node_timeout=3.0) as locks:
        lock = locks.lock(name, ttl=10)
        assert await lock.acquire()
        server = servers.servers[4]
        assert isinstance(server, Server)
        server.pause()
        try:
            started = time.monotonic()
            await lock.release()
            assert time.monotonic() - started < 1.5
        finally:
            server.resume()


async def test_a_majority_restarted_a_moment_ago_does_not_vote_within_its_grace(
    servers: Servers, name: str
) -> None:
    # Restart quarantine: three servers restarted empty a moment ago may have
    # lost a lock someone holds; their yes does not count until restart_grace passed.
    for server in servers.servers[:3]:
        assert isinstance(server, Server)
        await server.restart()
    async with LockManager(servers, node_timeout=0.1, restart_grace=30) as locks:
        with pytest.raises(QuorumError, match="quarantined"):
            await locks.lock(name).acquire(timeout=0)
