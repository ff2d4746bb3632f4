"""Task reentrancy: opt-in sharing, and RuntimeError instead of a self-wait."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as redis

from aiolock import LockLost, LockManager, LockNotOwned

from . import seam
from .conftest import elsewhere, key, settled_keys


async def test_a_task_acquiring_a_name_it_holds_gets_runtime_error_at_once(
    locks: LockManager, name: str
) -> None:
    async with locks.lock(name, ttl=10) as outer:
        again = locks.lock(name, ttl=10)
        started = time.monotonic()
        with pytest.raises(
            RuntimeError,
            match=r"^lock '[^']+' is already held by this task through this manager: "
            r"acquiring it again would wait for itself \(reentrant=True on both handles "
            r"shares the acquisition instead\)$",
        ):
            await again.acquire(timeout=5)  # would have waited 5 s for itself
        assert time.monotonic() - started < 1.0
        assert not again.owned
        assert outer.owned
        # Another task waits as usual (and here gives up).
        assert await elsewhere(locks.lock(name).acquire(timeout=0)) is False
    # Released: the same task may acquire the name again.
    async with locks.lock(name, ttl=10) as later:
        assert later.owned


async def test_reentrant_levels_share_one_acquisition_with_no_io(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    async with locks.lock(name, ttl=10, reentrant=True) as outer:
        token = await clients[0].get(key(name))
        for client in clients:
            await client.config_resetstat()
        inner = locks.lock(name, ttl=10, reentrant=True)
        assert await inner.acquire(timeout=0)
        calls = [(await c.info("commandstats")).get("cmdstat_evalsha") for c in clients]
        assert calls == [None] * 5  # no script ran for the inner level
        assert inner.owned
        assert inner.fencing_token == outer.fencing_token
        assert abs(inner.remaining() - outer.remaining()) < 0.05
        await inner.release()  # undoes its own level only
        assert not inner.owned
        assert outer.owned
        assert [await c.get(key(name)) for c in clients] == [token] * 5
    assert await settled_keys(clients, name, [False] * 5) == [False] * 5


async def test_levels_released_in_the_wrong_order_release_the_nodes_with_the_last(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    outer = locks.lock(name, ttl=10, reentrant=True)
    inner = locks.lock(name, ttl=10, reentrant=True)
    assert await outer.acquire()
    assert await inner.acquire(timeout=0)
    await outer.release()  # first in, first out: the inner level still holds
    assert inner.owned
    assert all([await c.exists(key(name)) for c in clients])
    await asyncio.sleep(0.1)
    assert inner.owned  # still renewed
    await inner.release()
    assert await settled_keys(clients, name, [False] * 5) == [False] * 5


async def test_a_child_task_does_not_share_and_waits(locks: LockManager, name: str) -> None:
    async with locks.lock(name, ttl=10, reentrant=True):
        child = locks.lock(name, ttl=10, reentrant=True)
        assert await elsewhere(child.acquire(timeout=0.1)) is False


async def test_reentrant_only_shares_with_a_reentrant_outer_handle(
    locks: LockManager, name: str
) -> None:
    async with locks.lock(name, ttl=10):
        with pytest.raises(RuntimeError, match="already held by this task"):
            await locks.lock(name, reentrant=True).acquire(timeout=0)


async def test_synchronized_functions_on_one_name_call_each_other_when_reentrant(
    locks: LockManager, name: str
) -> None:
    order = name
    done: list[str] = []

    @locks.synchronized("order:{order_id}", ttl=10, timeout=5, reentrant=True)
    async def refund(order_id: str) -> None:
        done.append("refund")

    @locks.synchronized("order:{order_id}", ttl=10, timeout=5, reentrant=True)
    async def cancel(order_id: str) -> None:
        await refund(order_id)
        done.append("cancel")

    @locks.synchronized("order:{order_id}", ttl=10, timeout=5)
    async def audit(order_id: str) -> None:
        done.append("audit")

    @locks.synchronized("order:{order_id}", ttl=10, timeout=5)
    async def close(order_id: str) -> None:
        await audit(order_id)

    await cancel(order)
    assert done == ["refund", "cancel"]
    with pytest.raises(RuntimeError, match="already held by this task"):
        await close(order)  # not reentrant: an error at once, not a 5 s self-wait
    assert not await locks.locked(f"order:{order}")


async def test_a_shared_acquisition_lost_cancels_every_level(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    reached: list[str] = []
    with pytest.raises(LockLost):
        async with locks.lock(name, ttl=0.6, reentrant=True):
            async with locks.lock(name, ttl=0.6, reentrant=True):
                for client in clients:
                    await client.delete(key(name))
                try:
                    await asyncio.sleep(5)
                finally:
                    reached.append("inner cancelled")
            reached.append("outer body went on")  # must not: the outer level is lost too
    assert reached == ["inner cancelled"]


async def test_a_lock_released_from_another_task_frees_the_name_for_its_task(
    locks: LockManager, name: str
) -> None:
    lock = locks.lock(name, ttl=10)
    assert await lock.acquire()
    await elsewhere(lock.release())  # a handle may be released from any task
    again = locks.lock(name, ttl=10)
    assert await again.acquire(timeout=0)
    await again.release()


async def test_released_names_are_forgotten_by_the_task_bookkeeping(
    locks: LockManager, name: str
) -> None:
    held = seam.engine(locks).tasks._held  # a long-lived task must not accumulate entries
    task = asyncio.current_task()
    assert task is not None

    def of_task() -> list[bytes]:
        return [key for holder, key in held if holder is task]

    for i in range(5):
        async with locks.lock(f"{name}-{i}", ttl=10):
            assert len(of_task()) == 1
    many = locks.lock_many([f"{name}-a", f"{name}-b"], ttl=10)
    assert await many.acquire()
    assert len(of_task()) == 2
    await many.release()
    assert not of_task()  # (nor the task itself, once it holds nothing)


@pytest.mark.parametrize("call", ["extend", "release"])
async def test_an_inner_level_that_finds_the_lock_expired_leaves_only_its_own_level(
    locks: LockManager, clients: list[redis.Redis], name: str, call: str
) -> None:
    # Without renewal the shared acquisition expires. The inner level's extend() or
    # release() finds it so: it gives up its level only, and raises LockNotOwned as the
    # contract says for a lock no longer held (not quietly). The outer level still holds
    # its part (and learns of the expiry at its own release); the nodes are cleaned with
    # the last.
    outer = locks.lock(name, ttl=0.3, auto_renew=False, reentrant=True)
    inner = locks.lock(name, ttl=0.3, auto_renew=False, reentrant=True)
    assert await outer.acquire()
    assert await inner.acquire()
    await asyncio.sleep(0.4)
    with pytest.raises(LockNotOwned, match="had expired"):
        await getattr(inner, call)()
    with pytest.raises(LockNotOwned, match="had expired before release"):
        await outer.release()
    # Nothing is left of either level: the task may take the name again.
    again = locks.lock(name, ttl=5)
    assert await again.acquire(timeout=0)
    await again.release()


async def test_every_level_of_a_lost_shared_acquisition_reads_the_loss(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    # The loss is raised out of the outermost `async with` (the inner level's body is
    # cancelled with it, see above); every handle that shared the acquisition reads
    # the same loss in `lost`, and its wait_lost() returns it.
    outer = locks.lock(name, ttl=0.6, reentrant=True)
    inner = locks.lock(name, ttl=0.6, reentrant=True)
    with pytest.raises(LockLost) as loss:
        async with outer, inner:
            for client in clients:
                await client.delete(key(name))
            await asyncio.sleep(5)
    assert outer.lost is loss.value
    assert inner.lost is loss.value
    assert await inner.wait_lost() is loss.value
