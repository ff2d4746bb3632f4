"""Handing a held lock to another handle or process: detach() and attach()."""

from __future__ import annotations

import asyncio
import sys

import anyio
import pytest
import redis.asyncio as redis

from aiolock import LockManager, LockNotOwned, QuorumError
from aiolock._handles.ticket import Ticket, encode_ticket
from aiolock.testing import Server, Servers

from .conftest import key, settled, tokens_on
from .faults import proxies


async def test_a_detached_lock_stays_held_and_the_handle_lets_go(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    lock = locks.lock(name, ttl=10)
    assert await lock.acquire()
    token = await clients[0].get(key(name))
    ticket = lock.detach()
    assert isinstance(ticket, str)
    assert token is not None
    assert token.hex() not in ticket  # encoded, though still a secret
    assert not lock.owned
    assert lock.fencing_token is None
    assert lock.remaining() == 0.0
    with pytest.raises(LockNotOwned):
        await lock.release()  # not this handle's any more
    assert [await c.get(key(name)) for c in clients] == [token] * 5
    assert await locks.locked(name)
    with pytest.raises(LockNotOwned):
        lock.detach()  # nothing left to hand over


async def test_another_manager_attaches_with_the_same_fencing_token_and_renews(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    async with LockManager(urls) as web, LockManager(urls) as worker:
        lock = web.lock(name, ttl=1.0)
        assert await lock.acquire()
        fence = lock.fencing_token
        old = (await settled(lambda: tokens_on(clients, name), lambda t: None not in t))[0]
        assert old is not None
        ticket = lock.detach()
        await asyncio.sleep(0.5)  # no renewal: half the validity is gone
        taken = await worker.attach(ticket)
        assert taken.owned
        assert taken.name == name
        assert taken.fencing_token == fence
        assert 0.8 < taken.remaining() <= 1.0  # counted from the attach
        # attach() returns once a quorum took the new token; the other nodes' requests
        # land a moment later (seen under mutmut's slower stats run).
        new = await settled(lambda: tokens_on(clients, name), lambda t: old not in t)
        assert old not in new  # the key now holds the new handle's token
        await asyncio.sleep(1.5)  # renewed in the background past the ttl
        assert taken.owned
        await taken.release()
    assert [await c.exists(key(name)) for c in clients] == [0] * 5


async def test_a_ticket_works_once(locks: LockManager, name: str) -> None:
    lock = locks.lock(name, ttl=10)
    assert await lock.acquire()
    ticket = lock.detach()
    first = await locks.attach(ticket)
    with pytest.raises(
        LockNotOwned,
        match=r"^lock '[^']+': the ticket's lock is not held any more \(expired, released, "
        r"taken over, or the ticket was already attached\)$",
    ):
        await locks.attach(ticket)
    assert first.owned  # the failed second attach did not disturb the first
    await first.release()


async def test_a_ticket_of_an_expired_lock_is_refused_and_nothing_is_recreated(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    lock = locks.lock(name, ttl=0.3)
    assert await lock.acquire()
    ticket = lock.detach()
    await asyncio.sleep(0.5)
    with pytest.raises(LockNotOwned):
        await locks.attach(ticket)
    assert [await c.exists(key(name)) for c in clients] == [0] * 5


async def test_detached_in_the_body_of_async_with_the_exit_leaves_the_lock_alone(
    locks: LockManager, name: str
) -> None:
    async with locks.lock(name, ttl=10) as lock:
        ticket = lock.detach()
    assert await locks.locked(name)  # not released by the exit
    taken = await locks.attach(ticket, auto_renew=False)
    assert not taken.auto_renew
    await taken.release()
    assert not await locks.locked(name)


async def test_a_failed_attach_leaves_the_ticket_usable(servers: Servers, name: str) -> None:
    hung = [s for s in servers.servers if isinstance(s, Server)][:3]
    async with LockManager(servers, node_timeout=0.05) as locks:
        lock = locks.lock(name, ttl=10)
        assert await lock.acquire()
        ticket = lock.detach()
        for server in hung:
            server.pause()
        try:
            with pytest.raises(QuorumError, match="attach of lock"):
                await locks.attach(ticket)
        finally:
            for server in hung:
                server.resume()
        taken = await locks.attach(ticket)
        assert taken.owned
        await taken.release()


@pytest.mark.parametrize("how", ["task.cancel()", "anyio cancel scope"])
async def test_a_cancelled_attach_leaves_the_lock_to_the_ticket(
    urls: list[str], clients: list[redis.Redis], name: str, how: str
) -> None:
    # (An anyio cancel scope cancels again at every await: the give-back is shielded.)
    events: list[tuple[str, str, float]] = []
    hook = lambda e: events.append((e.kind, e.name, e.seconds))  # noqa: E731
    async with LockManager(urls, on_event=hook) as locks:
        lock = locks.lock(name, ttl=10)
        assert await lock.acquire()
        token = await clients[0].get(key(name))
        ticket = lock.detach()
        events.clear()
        if how == "task.cancel()":
            attaching = asyncio.create_task(locks.attach(ticket))
            await asyncio.sleep(0)  # the take-over is sent; cancelled before any reply
            attaching.cancel()
            with pytest.raises(asyncio.CancelledError):
                await attaching
        else:
            with anyio.CancelScope() as scope:
                asyncio.get_running_loop().call_soon(scope.cancel)
                await locks.attach(ticket)
            assert scope.cancelled_caught
        # The nodes that took it over were given back to the ticket's token.
        assert [await c.get(key(name)) for c in clients] == [token] * 5
        assert events == []
        taken = await locks.attach(ticket)  # the ticket still works
        assert taken.owned
        # An attach is reported like an acquire, with the time it took.
        assert [event[:2] for event in events] == [("acquired", name)]
        assert 0.0 <= events[0][2] < 5.0
        await taken.release()


async def test_what_cannot_be_detached_is_refused_with_no_io(locks: LockManager, name: str) -> None:
    expired = locks.lock(name, ttl=0.2, auto_renew=False)
    assert await expired.acquire()
    await asyncio.sleep(0.3)  # its validity ran out: nothing to hand over
    with pytest.raises(LockNotOwned, match="is not held"):
        expired.detach()
    other = f"{name}-levels"
    async with locks.lock(other, ttl=10, reentrant=True) as outer:
        inner = locks.lock(other, ttl=10, reentrant=True)
        assert await inner.acquire()
        for level in (inner, outer):  # two levels: neither may hand the lock away
            with pytest.raises(RuntimeError, match="held at several levels"):
                level.detach()
        await inner.release()
        assert isinstance(outer.detach(), str)  # one level left: it may


async def test_bad_tickets_are_refused_before_any_io(locks: LockManager) -> None:
    with pytest.raises(TypeError):
        await locks.attach(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not an aiolock ticket"):
        await locks.attach("hello")
    with pytest.raises(ValueError, match="damaged"):
        await locks.attach("aiolock-ticket.1.!!!")
    ticket = encode_ticket(Ticket("other:", "x", b"\x01", 1, 10.0))
    with pytest.raises(ValueError, match="prefix 'other:'"):
        await locks.attach(ticket)
    ticket = encode_ticket(Ticket("aiolock:", "", b"\x01", 1, 10.0))
    with pytest.raises(ValueError, match="must not be empty"):
        await locks.attach(ticket)  # its name is checked as any name


async def test_a_lock_detached_here_is_attached_and_released_by_another_process(
    urls: list[str], locks: LockManager, name: str
) -> None:
    lock = locks.lock(name, ttl=10)
    assert await lock.acquire()
    fence = lock.fencing_token
    code = (
        "import asyncio, sys, aiolock\n"
        "async def main():\n"
        "    async with aiolock.LockManager(sys.argv[2:], restart_grace=0) as locks:\n"
        "        lock = await locks.attach(sys.argv[1])\n"
        "        print(lock.fencing_token, flush=True)\n"
        "        await lock.release()\n"
        "asyncio.run(main())\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, lock.detach(), *urls, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    assert int(out) == fence
    assert not await locks.locked(name)


async def test_an_attached_lock_is_held_by_the_attaching_task_like_an_acquired_one(
    locks: LockManager, name: str
) -> None:
    lock = locks.lock(name, ttl=10)
    assert await lock.acquire()
    taken = await locks.attach(lock.detach())
    with pytest.raises(RuntimeError, match="already held by this task"):
        await locks.lock(name).acquire(timeout=0)
    await taken.release()
    again = locks.lock(name)
    assert await again.acquire(timeout=0)
    await again.release()


async def test_a_fresh_manager_connects_before_it_attaches(
    locks: LockManager, urls: list[str], name: str
) -> None:
    # The worker that receives a ticket often has a manager that never connected (no
    # `async with`), and connecting takes longer than node_timeout: the attach must
    # wait for the connections, not count every node as a failed vote.
    lock = locks.lock(name, ttl=10)
    assert await lock.acquire()
    ticket = lock.detach()
    async with proxies(urls) as slow:
        for proxy in slow:
            proxy.accept_delay = 0.3
        worker = LockManager([p.url for p in slow], node_timeout=0.1)
        try:
            taken = await worker.attach(ticket, auto_renew=False)
            assert taken.owned
            await taken.release()
        finally:
            await worker.aclose()


async def test_an_attach_that_shortens_the_lock_wakes_the_other_processes_waiters(
    urls: list[str], name: str
) -> None:
    # attach() resets the key to the lock's ttl; after a longer extend() that shortens
    # it. A waiter of another process sleeps on the PTTL its attempt read: were the
    # attach not announced (as a shortening extend() is), a lock attached and left to
    # expire would leave it asleep until that PTTL, the name free.
    async with LockManager(urls) as web, LockManager(urls) as worker, LockManager(urls) as other:
        lock = web.lock(name, ttl=0.5, auto_renew=False)
        assert await lock.acquire()
        await lock.extend(30)  # the key lives 30 s
        waiter = other.lock(name, ttl=5, auto_renew=False)
        waits = asyncio.create_task(waiter.acquire(timeout=10))
        await asyncio.sleep(0.3)  # (its attempt failed: it sleeps on 30 s)
        assert not waits.done()
        taken = await worker.attach(lock.detach(), auto_renew=False)
        attached = asyncio.get_running_loop().time()
        assert taken.remaining() <= 0.5  # and never released: it expires
        # Broken: the waiter slept on the 30-s PTTL and timed out (10 s).
        assert await asyncio.wait_for(waits, 20)
        assert asyncio.get_running_loop().time() - attached < 3
        await waiter.release()
