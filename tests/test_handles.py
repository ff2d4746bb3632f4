"""Every public handle has the shared API (docs/reference/contract.md): checked by mypy
and at run time.

The `typing` nox session runs `mypy --strict` on this file too: assigning a handle to a
`Handle` variable fails type-checking if its API drifted.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect

import pytest
import redis.asyncio as redis

import aiolock
from aiolock import Handle, LockManager

from .conftest import cycles_of, key


def handles(locks: LockManager, name: str) -> dict[str, Handle]:
    # Typed as Handle: mypy checks each assignment against the Protocol.
    lock: Handle = locks.lock(name)
    semaphore: Handle = locks.semaphore(name + ":s", 2)
    many: Handle = locks.lock_many([name + ":a", name + ":b"])
    read: Handle = locks.rwlock(name + ":rw").read()
    write: Handle = locks.rwlock(name + ":rw").write()
    return {"Lock": lock, "Semaphore": semaphore, "LockMany": many, "ReadLock": read,
            "WriteLock": write}  # fmt: skip


SHARED = (
    "name", "ttl", "timeout", "owned", "remaining", "fencing_token", "lost", "wait_lost",
    "acquire", "release", "extend", "__aenter__", "__aexit__",
)  # fmt: skip


async def test_every_public_handle_has_the_shared_api(locks: LockManager, name: str) -> None:
    for kind, handle in handles(locks, name).items():
        assert type(handle).__name__ == kind
        assert isinstance(handle, Handle), kind
        for attribute in SHARED:
            assert hasattr(handle, attribute), (kind, attribute)
        assert "timeout" in inspect.signature(handle.acquire).parameters, kind
        assert handle.timeout is None  # the manager's default
        assert handle.lost is None
        assert not handle.owned
        assert handle.remaining() == 0.0


async def test_lock_many_reports_a_loss_like_a_lock(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    many = locks.lock_many([name + ":a", name + ":b"], ttl=5, timeout=3)
    assert many.timeout == 3
    with pytest.raises(aiolock.LockNotOwned):
        await many.wait_lost()  # not held: nothing would ever be reported
    assert await many.acquire()
    try:
        assert many.lost is None
        for client in clients:  # one of the names is taken from under it
            await client.delete(key(name + ":b"))
        lost = await asyncio.wait_for(many.wait_lost(), 10)
        assert isinstance(lost, aiolock.LockLost)
        assert many.lost is lost
    finally:
        with contextlib.suppress(aiolock.LockError):  # the lost name cannot be released
            await many.release()


@pytest.mark.parametrize("public", sorted(set(aiolock.__all__) - {"__version__", "EventKind"}))
def test_public_classes_report_the_package_as_their_module(public: str) -> None:
    assert getattr(aiolock, public).__module__ == "aiolock"


async def test_no_handle_leaves_reference_cycles(urls: list[str], name: str) -> None:
    """Every kind of handle, taken alone, contended in a process and across managers,
    and tried in vain: what each cycle made is freed as soon as nothing refers to it,
    not by the garbage collector (whose full collections a cycle per lock would bring
    on)."""
    async with LockManager(urls) as locks, LockManager(urls) as other:
        held = other.lock(f"{name}-held", ttl=10)
        assert await held.acquire()

        async def cycles(i: int) -> None:
            async with locks.lock(f"{name}-{i}", ttl=10):
                pass
            async with (locks if i % 2 else other).lock(name, ttl=10, timeout=10):
                await asyncio.sleep(0)
            async with locks.semaphore(f"{name}-s", limit=2, ttl=10, timeout=10):
                await asyncio.sleep(0)
            rw = locks.rwlock(f"{name}-rw", ttl=10, timeout=10)
            async with rw.read() if i % 2 else rw.write():
                await asyncio.sleep(0)
            assert not await locks.lock(f"{name}-held", ttl=10).acquire(timeout=0)

        await asyncio.gather(*(cycles(i) for i in range(4)))  # (warm)
        with cycles_of(object) as cyclic:
            await asyncio.gather(*(cycles(i) for i in range(8)))
        ours = sorted(
            {type(o).__qualname__ for o in cyclic if type(o).__module__[:8] == "aiolock."}
        )
        await held.release()
    assert ours == []
