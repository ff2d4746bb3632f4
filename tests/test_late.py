"""Messages that arrive late: through the delay nemesis, never two holders.

The rule every test here checks: *no command of ours, arriving at a node at any later
time, shortens or deletes a key that a holder of ours believes valid*. A holder's
belief is ``remaining()``; what the nodes keep is the key's PTTL. So while a handle
reads ``owned``, a quorum of nodes must hold its key at least ``remaining()`` longer
(:class:`Watch`), and another manager never acquires meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import zlib
from collections.abc import AsyncIterator, Sequence

import pytest
import redis.asyncio as redis

import aiolock
import aiolock._waiting.lease
from aiolock import LockManager, QuorumError
from aiolock.testing import Servers, nemesis, script

from . import seam
from .conftest import in_line, key

pytestmark = pytest.mark.timeout(60)

NODE_TIMEOUT = 0.05


class Watch:
    """Samples a handle's belief against the nodes until stopped; records violations."""

    def __init__(self, clients: list[redis.Redis], name: str) -> None:
        self._clients = clients
        self._name = name
        self.handles: list[aiolock.Lock] = []
        self.violations: list[str] = []
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        quorum = len(self._clients) // 2 + 1
        while True:
            # The holds as they were before the nodes were read: a sample is kept only if
            # no extension won meanwhile (it would raise both the PTTLs and remaining()).
            before = [(handle, handle._hold, self._valid_from(handle)) for handle in self.handles]
            pttls = await asyncio.gather(*(c.pttl(key(self._name)) for c in self._clients))
            tokens = await asyncio.gather(*(c.get(key(self._name)) for c in self._clients))
            for handle, hold, valid_from in before:
                if hold is None or handle._hold is not hold:
                    continue
                if self._valid_from(handle) != valid_from:
                    continue
                # Read after the nodes: the key's PTTL only shrank since, as did remaining().
                left = handle.remaining()
                if left <= 0.0:
                    continue
                self.samples += 1
                kept = sum(1 for p in pttls if p / 1000 >= left - 0.005)
                if kept < quorum:
                    mine = [t == hold.token for t in tokens]
                    self.violations.append(
                        f"{handle!r} reads {left:.3f}s left; the nodes keep "
                        f"{[p / 1000 for p in pttls]} (its token there: {mine})"
                    )
            await asyncio.sleep(0.005)

    @staticmethod
    def _valid_from(handle: aiolock.Lock) -> float | None:
        hold = handle._hold
        return None if hold is None else hold.valid_from

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@contextlib.asynccontextmanager
async def watching(clients: list[redis.Redis], name: str) -> AsyncIterator[Watch]:
    watch = Watch(clients, name)
    watch.start()
    try:
        yield watch
    finally:
        await watch.stop()


async def rival_never_acquires_while_owned(
    rival: aiolock.Lock, holders: list[aiolock.Lock], seconds: float
) -> bool:
    """Try ``rival`` every 10 ms for ``seconds``; fail if it wins while a holder is owned."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await rival.acquire(timeout=0):
            owned = [h for h in holders if h.owned]
            assert not owned, f"two holders: {rival!r} acquired while {owned!r} still read owned"
            await rival.release()
            return True
        await asyncio.sleep(0.01)
    return False


async def test_a_shorter_extend_given_up_and_landing_late_never_cuts_a_renewed_lock(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    """extend(0.2) held back 0.3 s on 3 of 5 nodes, renewal on.

    A renewal sent on connections of its own would win (2.5 s left), then the EXTEND
    would land and the key expire 0.2 s later on 3 nodes: a second client would acquire
    while the first read 2.5 s left.
    """
    async with (
        nemesis(servers) as net,
        LockManager(net.urls, node_timeout=NODE_TIMEOUT) as locks,
        LockManager(list(servers), node_timeout=NODE_TIMEOUT) as others,
    ):
        lock = locks.lock(name, ttl=3.0)
        assert await lock.acquire(timeout=0)
        async with watching(clients, name) as watch:
            watch.handles.append(lock)
            held = [node.hold(script("EXTEND"), 0.3, count=1) for node in net[:3]]
            with pytest.raises(QuorumError):
                await lock.extend(0.2)
            assert [rule.matched for rule in held] == [1, 1, 1]
            await rival_never_acquires_while_owned(others.lock(name, ttl=3.0), [lock], 1.5)
            assert watch.samples > 0
        assert watch.violations == [], watch.violations[:3]
        with contextlib.suppress(aiolock.LockError):
            await lock.release()


async def test_a_late_extend_never_cuts_the_key_of_a_lease_taker(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    """Break 1 through the lease: the holder passes the lock on with no I/O after its
    renewal won; the held-back EXTEND of its given-up extend(0.2) must not cut the
    taker's key."""
    async with (
        nemesis(servers) as net,
        LockManager(net.urls, node_timeout=NODE_TIMEOUT) as locks,
        LockManager(list(servers), node_timeout=NODE_TIMEOUT) as others,
    ):
        holder = locks.lock(name, ttl=3.0)
        assert await holder.acquire(timeout=0)
        takers = [locks.lock(name, ttl=3.0) for _ in range(3)]
        waiting = [asyncio.create_task(t.acquire(timeout=5)) for t in takers]
        await asyncio.sleep(0.05)
        # A PASS_ON with waiters behind reserves tokens: the next handoff may be a lease.
        await holder.release()
        # The first in line takes it: the takers' first attempts race (each tries before
        # it queues), so that may be any of them (under load, not always takers[0]).
        done, _ = await asyncio.wait(waiting, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        assert next(iter(done)).result()
        i = waiting.index(next(iter(done)))
        first, others_waiting = takers[i], [w for j, w in enumerate(waiting) if j != i]
        async with watching(clients, name) as watch:
            watch.handles.extend(takers)
            held = [node.hold(script("EXTEND"), 0.3, count=1) for node in net[:3]]
            with pytest.raises(QuorumError):
                await first.extend(0.2)
            assert [rule.matched for rule in held] == [1, 1, 1]
            # Once the renewal has won again (on the holder's ordered connections), hand
            # the lock on at once: a lease, while the EXTEND is still held back.
            deadline = time.monotonic() + 0.25
            while first.remaining() < 2.0 and first.owned and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            with contextlib.suppress(aiolock.LockError):
                await first.release()
            done, _ = await asyncio.wait(others_waiting, timeout=5)
            assert done
            holders = [t for t in takers if t is not first and t.owned]
            await rival_never_acquires_while_owned(others.lock(name, ttl=3.0), holders, 1.2)
        assert watch.violations == [], watch.violations[:3]
        for task in waiting:
            task.cancel()
        for taker in takers:
            with contextlib.suppress(aiolock.LockError):
                await taker.release()


async def test_a_lease_never_leaves_the_key_longer_than_its_takers_ttl(
    servers: Servers, clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command of the holder's that lands after a lease must not keep the key longer
    than the taker asked for: should the taker's process die, the key would outlive it.

    Found by the simulation's outlives rule (seed 549759013951, a delay fault): a
    renewal of a 0.58-s holder, slow on one node, landed there after the lock was
    leased to a task that had asked for 0.49 s, and kept the key 0.58 s from then. The
    lease checked the validity it passed on, not what the holder's commands in flight
    may still set. Here a holder of 2 s, as its taker, has an extend() to 3 s on its
    way, held back on 3 of 5 nodes, when it releases.
    """
    # Whatever the timing, the holder's validity is one a lease may pass on (the slack
    # below a fresh acquire's; the bound above, the taker's ttl, is the library's).
    monkeypatch.setattr(aiolock._waiting.lease, "lease_slack", lambda ttl: 1.5)
    async with (
        nemesis(servers) as net,
        LockManager(net.urls, node_timeout=1.0) as locks,
    ):
        first = locks.lock(name, ttl=3.0, auto_renew=False)
        assert await first.acquire(timeout=0)
        holder = locks.lock(name, ttl=2.0, auto_renew=False)
        holder_waits = asyncio.create_task(holder.acquire(timeout=5))
        taker = locks.lock(name, ttl=2.0, auto_renew=False)
        taker_waits = asyncio.create_task(taker.acquire(timeout=10))
        await asyncio.sleep(0.05)
        # A PASS_ON with a waiter behind reserves a token: the next handoff may be a lease.
        await first.release()
        assert await holder_waits
        while holder.remaining() > 1.9:  # (well inside what a lease may pass on)
            await asyncio.sleep(0.005)
        held = [node.hold(script("EXTEND"), 0.3, count=1) for node in net[:3]]
        extending = asyncio.create_task(holder.extend(3.0))
        await asyncio.sleep(0.02)  # on its way, not landed
        await holder.release()
        assert await taker_waits
        with contextlib.suppress(aiolock.LockError):
            await extending
        await asyncio.sleep(0.5)  # the held-back EXTENDs have landed
        assert [rule.matched for rule in held] == [1, 1, 1]
        kept = [await client.pttl(key(name)) for client in clients]
        # At most the taker's 2 s from now on every node (broken: about 2.5 s
        # on nodes 0 to 2: the EXTEND set the key for 3 s when it landed, after the
        # lease; the same on the others, where it landed before the lease).
        assert max(kept) <= 2000, kept
        await taker.release()


async def test_a_late_grant_of_a_token_still_held_and_forgotten_is_left_alone(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    """A release's grant from node 5 reaches the waiting process late, after 1,024 or
    more other handoffs there made it forget the token (``_taken`` keeps 1,024). Given
    back on every node then, the token's key would be deleted under its live holder, and
    another manager would acquire while it read 28 s left."""
    async with (
        nemesis(servers) as net,
        LockManager(list(servers), node_timeout=0.5) as releasing,
        LockManager(net.urls, node_timeout=0.5) as waiting,
        LockManager(list(servers), node_timeout=0.5) as others,
    ):
        first = releasing.lock(name, ttl=30.0)
        assert await first.acquire(timeout=0)
        taker = waiting.lock(name, ttl=30.0)
        task = asyncio.create_task(taker.acquire(timeout=10))
        await in_line(clients, name, 1)
        await asyncio.sleep(0.2)  # subscribed to its grants on every node
        # Node 5's grant message (and anything else it publishes to the waiting
        # process) is held back until the churn below is over.
        net[4].delay_replies(math.inf, links=lambda link: link.kind == "pubsub")
        await first.release()
        assert await task
        grants = seam.engine(waiting).grants
        assert grants is not None
        # Churn: handoffs within the waiting process on another name, each a PASS_ON
        # whose taker's token is remembered as taken, until the grant's is forgotten.
        # (Listened to on nodes 2 to 4 only: node 5's pub/sub is the one held back.)
        churn = next(
            c
            for i in range(1000)
            if zlib.crc32(key(c := f"{name}-churn{i}").encode()) % len(servers) == 1
        )
        count = 0
        assert taker._hold is not None
        token = taker._hold.token
        assert token in grants._taken

        async def churner() -> None:
            nonlocal count
            lock = waiting.lock(churn, ttl=30.0)
            while token in grants._taken:
                async with lock:
                    count += 1
                    await asyncio.sleep(0)

        async with watching(clients, name) as watch:
            watch.handles.append(taker)
            await asyncio.wait_for(asyncio.gather(churner(), churner()), 30)
            assert count >= 1024
            assert taker.owned
            # The late grant arrives now; the holder keeps its key.
            net[4].delay_replies(0.0)
            net[4].flush()
            rival = others.lock(name, ttl=30.0)
            won = await rival_never_acquires_while_owned(rival, [taker], 1.0)
            assert not won
            assert taker.owned
            assert watch.samples > 0
        assert watch.violations == [], watch.violations[:3]
        tokens = [await c.get(key(name)) for c in clients]
        assert sum(1 for t in tokens if t is not None and t == tokens[0]) >= 4, tokens
        await taker.release()


async def test_grants_undone_by_the_heads_own_failed_attempt_never_count(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    """Found by the simulation (seed 574, shrunk to 2 faults): a release's
    grants reached 2 of 5 nodes, the rest of its scripts came late. The head's own
    attempt, with the same token, failed (3 nodes still held the old key) and its
    clean-up deleted the 2 grants; when a third grant came, the head counted all three
    and took the lock, held on one node: another process acquired with it."""
    async with (
        nemesis(servers) as net,
        LockManager(net.urls, node_timeout=0.5) as releasing,
        LockManager(list(servers), node_timeout=0.5) as waiting,
    ):
        first = releasing.lock(name, ttl=30.0, auto_renew=False)
        assert await first.acquire(timeout=0)
        taker = waiting.lock(name, ttl=30.0)
        task = asyncio.create_task(taker.acquire(timeout=10))
        await in_line(clients, name, 1)
        await asyncio.sleep(0.2)  # subscribed to its grants on every node
        for proxy in net[2:]:
            proxy.hold(script("RELEASE_TURN"), math.inf)
        release = asyncio.create_task(first.release())  # 2 of 5: a QuorumError
        # The grants of nodes 1 and 2 come, then the head's own attempt, which fails
        # (nodes 3 to 5 hold the old key for 30 s) and releases its token on 1 and 2.
        await asyncio.sleep(0.5)
        assert not task.done()
        assert [await c.get(key(name)) for c in clients[:2]] == [None, None]
        net[2].flush()  # node 3's grant now
        assert await task
        token = taker._hold.token if taker._hold is not None else None
        tokens = [await c.get(key(name)) for c in clients]
        # Held where the head believes it is: on a quorum, not on node 3 alone.
        assert sum(1 for t in tokens if t == token) >= 3, tokens
        with contextlib.suppress(QuorumError, aiolock.LockNotOwned):
            await release
        for proxy in net:
            proxy.clear()
        await taker.release()


# -- bounded memories forget safely ------------------------------------------------------


async def _taken_through_the_queue(
    locks: LockManager, name: str, ttl: float, *, auto_renew: bool = False
) -> aiolock.Lock:
    """A handle that took ``name`` as a waiter (its token is then noted as held)."""
    holder = locks.lock(name, ttl=ttl)
    assert await holder.acquire(timeout=0)
    waiter = locks.lock(name, ttl=ttl, auto_renew=auto_renew)
    task = asyncio.create_task(waiter.acquire(timeout=5))
    await asyncio.sleep(0.01)
    await holder.release()
    assert await task
    return waiter


async def test_tokens_held_are_forgotten_when_detached_or_left_to_expire(
    locks: LockManager, name: str
) -> None:
    # Grants._held is exact (late grants of a token in it are never given back), so it
    # must not keep what is no longer held here: a detached lock (else it grows
    # without bound), and a lock left to expire whose handle acquires again.
    grants = seam.engine(locks).grants
    assert grants is not None
    for _ in range(20):
        waiter = await _taken_through_the_queue(locks, name, ttl=5.0)
        assert len(grants._held) == 1
        ticket = waiter.detach()
        assert grants._held == set()
        attached = await locks.attach(ticket)
        await attached.release()
    waiter = await _taken_through_the_queue(locks, name, ttl=0.3)
    assert len(grants._held) == 1
    await asyncio.sleep(0.4)
    assert await waiter.acquire(timeout=0)
    assert grants._held == set()
    await waiter.release()


async def test_a_lost_locks_token_is_forgotten_though_its_handle_is_dropped(
    locks: LockManager, clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation's "at rest" rule (tests/sim/live.py, seed 137438990545):
    # a renewed lock lost (there, a stall past its validity), whose handle was then
    # dropped after detach() said LockNotOwned, stayed in Grants._held for good: a token
    # leaked per such loss, and a late grant of it would have been kept (left on the
    # node until its ttl) instead of given back.
    grants = seam.engine(locks).grants
    assert grants is not None
    waiter = await _taken_through_the_queue(locks, name, ttl=1.0, auto_renew=True)
    assert len(grants._held) == 1
    for client in clients:
        await client.delete(key(name))  # gone everywhere: the next renewal fails
    await asyncio.wait_for(waiter.wait_lost(), 5)
    with pytest.raises(aiolock.LockNotOwned):
        waiter.detach()
    assert grants._held == set()


async def test_offers_forgotten_cost_a_wait_never_a_second_holder(
    servers: Servers, clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Turns keeps the last 4,096 offers; a grant naming one it forgot cannot be read.
    # Overflowed at once here (it keeps none): every grant goes unread, the granted key
    # waits on the nodes, and the waiter takes the lock with its own attempt (ACQUIRE
    # on its own token says yes) once it tries: later, never alongside the holder.
    monkeypatch.setattr(aiolock._waiting.turns, "_OFFERS_KEPT", 0)
    async with (
        LockManager(list(servers)) as first,
        LockManager(list(servers)) as second,
    ):
        holder = first.lock(name, ttl=1.0)
        assert await holder.acquire(timeout=0)
        waiter = second.lock(name, ttl=1.0)
        task = asyncio.create_task(waiter.acquire(timeout=10))
        await in_line(clients, name, 1)
        assert seam.engine(second).turns is not None
        assert seam.engine(second).turns._offers == {}
        async with watching(clients, name) as watch:
            watch.handles.extend([holder, waiter])
            await holder.release()
            assert await asyncio.wait_for(task, 10)
            assert not holder.owned
        assert watch.violations == [], watch.violations[:3]
        await waiter.release()


async def test_a_renewal_batch_sends_one_chunk_at_a_time_on_the_shared_connection(
    servers: Servers, name: str
) -> None:
    # The renewal shares each node's connection with acquires and releases (so that
    # nothing of ours overtakes anything of ours): a big batch is sent a chunk at a
    # time, and a request written meanwhile waits for one chunk, not the whole batch.
    from aiolock._core.batch import BATCH_LIMIT
    from aiolock.testing import script

    # (The last chunk, one lock, is SET ... IFEQ where the server has it.)
    renewal, acquire = script("EXTEND_MANY"), script("ACQUIRE")
    async with nemesis(list(servers)[:1]) as net, LockManager(net.urls) as locks:
        assert await locks.lock(name, ttl=5).acquire(timeout=0)  # connected
        sent: list[str] = []

        def note(words: Sequence[bytes]) -> bool:
            if renewal(words):
                sent.append("extend_many")
            elif acquire(words):
                sent.append("acquire")
            return False

        net[0].hold(note, 0.0)
        items = [(f"{name}:{i}".encode(), b"t", 5.0) for i in range(2 * BATCH_LIMIT + 1)]
        batch = asyncio.create_task(seam.engine(locks).renewal_quorum.extend_many(items, budget=5))
        await asyncio.sleep(0)  # the first chunk is written
        assert (await locks.lock(f"{name}-other", ttl=5).acquire(timeout=0)) is True
        await batch
        assert sent == ["extend_many", "acquire", "extend_many", "extend_many"], sent


async def test_a_handle_stops_reading_owned_once_its_release_is_on_its_way(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    """A release in flight: 3 of 5 nodes have deleted the key (their replies late), the
    RELEASE held back on the other 2. A rival takes the name on those 3 meanwhile, so the
    releasing handle must not read ``owned`` from then on (the late table's handover
    row would see a handle read owned while another held the name)."""
    async with (
        nemesis(servers) as net,
        LockManager(net.urls, node_timeout=2.0) as locks,
        LockManager(list(servers), node_timeout=NODE_TIMEOUT) as others,
    ):
        lock = locks.lock(name, ttl=5.0)
        assert await lock.acquire(timeout=0)
        releases = script("RELEASE", "RELEASE_TURN", "RELEASE_EITHER")
        held = [node.hold(releases, math.inf, count=1) for node in net[3:]]
        for node in net[:3]:
            node.delay_replies(0.6)
        async with watching(clients, name) as watch:
            watch.handles.append(lock)
            releasing = asyncio.create_task(lock.release())
            try:
                deadline = time.monotonic() + 1.0
                while sum(await asyncio.gather(*(c.exists(key(name)) for c in clients))) > 2:
                    assert time.monotonic() < deadline, "the release never reached 3 nodes"
                    await asyncio.sleep(0.005)
                assert not releasing.done()
                assert not lock.owned
                assert lock.remaining() == 0.0
                # Meanwhile the handle is neither free to acquire nor held to extend.
                with pytest.raises(RuntimeError):
                    await lock.acquire(timeout=0)
                with pytest.raises(aiolock.LockNotOwned, match="being released"):
                    await lock.extend()
                with pytest.raises(aiolock.LockNotOwned, match="being released"):
                    await lock.release()
                rival = others.lock(name, ttl=5.0)
                assert await rival_never_acquires_while_owned(rival, [lock], 0.3)
                assert [rule.matched for rule in held] == [1, 1]
            finally:
                for node in net:
                    node.delay_replies(0)
                    node.flush()
                await releasing  # 3 of 5 deleted it: a won release
        assert watch.violations == [], watch.violations[:3]
