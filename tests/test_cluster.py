"""A redis.asyncio.RedisCluster client as one logical node, against a real local cluster."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as redis
from redis.crc import key_slot
from redis.exceptions import ClusterCrossSlotError, MovedError

import aiolock
from aiolock._io.cluster import ClusterNode
from aiolock._lua import ACQUIRE_SCRIPT, EXTEND_MANY_SCRIPT
from aiolock.testing import Cluster, Server, Servers, redis_cluster, wait_cluster_ok

from .conftest import key


@pytest.fixture(scope="module")
async def cluster() -> AsyncIterator[Cluster]:
    """Three masters, one replica each."""
    async with redis_cluster(3, replicas=1) as started:
        yield started


@pytest.fixture
async def cluster_client(cluster: Cluster) -> AsyncIterator[Any]:
    client = cluster.client()
    yield client
    await client.aclose()


def direct(server: Server) -> redis.Redis:
    """A plain client to one server of the cluster (no redirects followed)."""
    return redis.Redis(port=server.port, socket_timeout=2)


async def exists_on(server: Server, name: str) -> bool:
    """Whether ``server`` has the lock's key (False if it does not serve its slot)."""
    client = direct(server)
    try:
        return bool(await client.exists(key(name)))
    except redis.ResponseError as exc:  # MovedError from redis-py 6 on, plain before
        if isinstance(exc, MovedError) or str(exc).startswith("MOVED"):
            return False  # the server does not serve the key's slot
        raise
    finally:
        await client.aclose()


async def on_slot_master(cluster: Cluster, name: str) -> bytes | None:
    """The lock's key as the slot's master has it now.

    Read from that server directly: redis-py's own cluster client leaks the node
    objects it replaces after a failover (7.2, 7.3: "Unclosed ClusterNode").
    """
    client = direct(await cluster.master_of(key(name)))
    try:
        value: bytes | None = await client.get(key(name))
        return value
    finally:
        await client.aclose()


async def server_id(server: Server) -> bytes:
    client = direct(server)
    try:
        node_id: bytes = await client.execute_command("CLUSTER", "MYID")
        return node_id
    finally:
        await client.aclose()


async def start_migration(source: Server, target: Server, slot: int) -> None:
    """Mark ``slot`` as moving from ``source`` to ``target`` (keys not moved yet)."""
    src, dst = direct(source), direct(target)
    try:
        source_id, target_id = await server_id(source), await server_id(target)
        await dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        await src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    finally:
        await src.aclose()
        await dst.aclose()


async def finish_migration(cluster: Cluster, source: Server, target: Server, slot: int) -> None:
    """Move the slot's remaining keys, then give the slot to ``target`` everywhere."""
    src = direct(source)
    try:
        while keys := await src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            await src.execute_command(
                "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys
            )
    finally:
        await src.aclose()
    target_id = await server_id(target)
    others = [m for m in cluster.masters if m not in (source, target)]
    for server in (target, source, *others):
        client = direct(server)
        try:
            await client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        finally:
            await client.aclose()
    await wait_cluster_ok(cluster.masters)


def names_on_every_master(count: int) -> list[str]:
    """Lock names whose slots fall in each third of the slot space."""
    found: dict[int, list[str]] = {0: [], 1: [], 2: []}
    while any(len(v) < count for v in found.values()):
        name = f"c-{uuid.uuid4().hex[:10]}"
        third = key_slot(key(name).encode()) * 3 // 16384
        if len(found[third]) < count:
            found[third].append(name)
    return [n for names in found.values() for n in names]


async def on_a_master(cluster: Cluster, index: int) -> tuple[str, int, Server]:
    """A lock name whose key lives on the ``index``-th master: the name, its slot, the master."""
    name = names_on_every_master(1)[index]
    return name, key_slot(key(name).encode()), await cluster.master_of(key(name))


async def test_a_cluster_is_one_node_and_each_name_lives_on_its_slots_master(
    cluster: Cluster, cluster_client: Any
) -> None:
    async with aiolock.LockManager([cluster_client]) as locks:
        assert locks.quorum == 1
        assert "redis-cluster://" in repr(locks)
        for name in names_on_every_master(2):
            owner = await cluster.master_of(key(name))
            async with locks.lock(name, ttl=5) as lock:
                assert lock.fencing_token > 0
                assert await exists_on(owner, name)
                for other in cluster.masters:
                    if other is not owner:
                        assert not await exists_on(other, name)
            assert not await exists_on(owner, name)


async def test_cli_inspects_and_force_releases_a_cluster_lock(
    cluster: Cluster, cluster_client: Any
) -> None:
    name = names_on_every_master(1)[2]
    url = f"redis://127.0.0.1:{cluster.masters[0].port}"
    async with aiolock.LockManager([cluster_client]) as locks:
        holder = locks.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire()
        waiter = asyncio.create_task(locks.lock(name, ttl=30).acquire(timeout=20))
        await asyncio.sleep(0.1)
        cli = (sys.executable, "-m", "aiolock")
        inspect = await asyncio.create_subprocess_exec(
            *cli, "inspect", name, "--cluster", url, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await inspect.communicate()
        assert inspect.returncode == 0
        assert "held by" in out.decode()
        # (RedisCluster has no publish() before redis-py 8: the waiters must still be
        # woken, and the node not reported unreachable.)
        release = await asyncio.create_subprocess_exec(
            *cli, "release", name, "--force", "--yes", "--cluster", url,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await release.communicate()
        assert release.returncode == 0, out
        assert "deleted" in out.decode()
        assert "unreachable" not in out.decode()
        assert await asyncio.wait_for(waiter, 10)  # woken, not left waiting for 30 s


async def server_version(server: Server) -> tuple[int, ...]:
    client = direct(server)
    try:
        info = await client.info("server")
        return tuple(int(part) for part in str(info["redis_version"]).split("."))
    finally:
        await client.aclose()


async def subscriptions(cluster: Cluster, server: Server, channel: bytes) -> tuple[int, int]:
    """(sharded subscribers of ``channel`` on ``server``, plain ones on every server)."""
    client = direct(server)
    try:
        shard = await client.execute_command("PUBSUB", "SHARDNUMSUB", channel)
        sharded = int(shard[1]) if shard else 0
    except redis.ResponseError:  # before Redis 7.0: no sharded pub/sub
        sharded = 0
    finally:
        await client.aclose()
    plain = 0
    for other in cluster.servers:
        client = direct(other)
        try:
            plain += int((await client.execute_command("PUBSUB", "NUMSUB", channel))[1])
        finally:
            await client.aclose()
    return sharded, plain


@contextlib.asynccontextmanager
async def two_managers(
    cluster: Cluster, cluster_client: Any
) -> AsyncIterator[tuple[aiolock.LockManager, aiolock.LockManager]]:
    """Two managers of one cluster, each with a client of its own (as two processes)."""
    other_client = cluster.client()
    try:
        async with (
            aiolock.LockManager([cluster_client]) as first,
            aiolock.LockManager([other_client]) as second,
        ):
            yield first, second
    finally:
        await other_client.aclose()


@contextlib.asynccontextmanager
async def held_and_awaited(
    cluster: Cluster, cluster_client: Any, name: str
) -> AsyncIterator[tuple[aiolock.Lock, aiolock.Lock, asyncio.Task[bool]]]:
    """A lock held (ttl 30 s) by one manager, and a waiter for it in another."""
    async with two_managers(cluster, cluster_client) as (holders, waiters):
        holder = holders.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire()
        waiting = waiters.lock(name, ttl=5)
        waiter = asyncio.create_task(waiting.acquire(timeout=20))
        await asyncio.sleep(0.3)
        yield holder, waiting, waiter


async def wait_woken(holder: aiolock.Lock, waiter: asyncio.Task[bool]) -> float:
    """Release ``holder``; how long until ``waiter`` got the lock."""
    started = time.monotonic()
    await holder.release()
    assert await asyncio.wait_for(waiter, 10)
    return time.monotonic() - started


async def test_waiters_use_sharded_pubsub_where_the_cluster_has_it(
    cluster: Cluster, cluster_client: Any
) -> None:
    name = names_on_every_master(1)[0]
    channel = key(name).encode() + b":released"
    master = await cluster.master_of(key(name))
    sharded = await server_version(master) >= (7, 0)
    async with held_and_awaited(cluster, cluster_client, name) as (holder, waiting, waiter):
        # SSUBSCRIBE on the slot's master only (a PUBLISH is broadcast to every server
        # of the cluster); plain SUBSCRIBE where there is no sharded kind.
        expected = (1, 0) if sharded else (0, 1)
        assert await subscriptions(cluster, master, channel) == expected
        assert await wait_woken(holder, waiter) < 3  # the message, not the 30 s ttl
        await waiting.release()


async def test_a_sharded_subscription_follows_its_slot_when_it_moves(
    cluster: Cluster, cluster_client: Any
) -> None:
    name = names_on_every_master(1)[1]
    slot = key_slot(key(name).encode())
    channel = key(name).encode() + b":released"
    source = await cluster.master_of(key(name))
    if await server_version(source) < (7, 0):
        pytest.skip("sharded pub/sub needs Redis 7.0+")
    target = next(m for m in cluster.masters if m is not source)
    async with held_and_awaited(cluster, cluster_client, name) as (holder, waiting, waiter):
        assert await subscriptions(cluster, source, channel) == (1, 0)
        await start_migration(source, target, slot)
        await finish_migration(cluster, source, target, slot)
        # The source drops the channel; the waiter subscribes again on the target.
        deadline = time.monotonic() + 5
        while await subscriptions(cluster, target, channel) != (1, 0):
            assert time.monotonic() < deadline, "not subscribed on the slot's new master"
            await asyncio.sleep(0.05)
        assert await wait_woken(holder, waiter) < 3
        await waiting.release()


async def test_two_clients_of_one_cluster_are_a_duplicate_node(cluster: Cluster) -> None:
    first, second = cluster.client(), cluster.client()
    try:
        with pytest.raises(ValueError, match="duplicate node"):
            aiolock.LockManager([first, second])
    finally:
        await first.aclose()
        await second.aclose()


async def test_exclusion_and_pubsub_wakeup_between_managers(
    cluster: Cluster, cluster_client: Any, name: str
) -> None:
    async with two_managers(cluster, cluster_client) as (first, second):
        holder = first.lock(name, ttl=30)
        await holder.acquire()
        held_token = holder.fencing_token
        assert held_token is not None
        assert not await second.lock(name, ttl=30).acquire(timeout=0)

        async def release_soon() -> None:
            await asyncio.sleep(0.2)
            await holder.release()

        task = asyncio.create_task(release_soon())
        started = time.monotonic()
        # Without the release message the waiter would sleep on the holder's
        # 30 s PTTL and time out: the wake-up crossed the cluster bus.
        async with second.lock(name, ttl=30, timeout=10) as waiter:
            assert time.monotonic() - started < 8
            assert waiter.fencing_token > held_token
        await task


async def test_a_handoff_to_a_shorter_ttl_is_announced_on_sharded_pubsub(
    cluster: Cluster, cluster_client: Any, name: str
) -> None:
    # Found by the simulation on clusters (seed 281474996725057, no fault): a handoff
    # within a process to a task with a shorter ttl announced nothing, that task's lock
    # expired in its body, and a waiter of another process slept on the PTTL it had
    # learnt before (no turn queue on a cluster: nothing else wakes it).
    async with two_managers(cluster, cluster_client) as (holder_side, waiter_side):
        holder = holder_side.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        waiter = waiter_side.lock(name, ttl=30, auto_renew=False)
        waits = asyncio.create_task(waiter.acquire(timeout=10))
        taker = holder_side.lock(name, ttl=0.3, auto_renew=False)
        takes = asyncio.create_task(taker.acquire(timeout=10))
        await asyncio.sleep(0.3)  # (the waiter's attempt failed: it sleeps on 30 s)
        assert not waits.done()
        handed_on = time.monotonic()
        await holder.release()  # within the process: the key lives 0.3 s now
        assert await takes  # (and is never released: it expires)
        # Broken: the waiter slept on the 30-s PTTL and timed out (10 s).
        assert await asyncio.wait_for(waits, 20)
        assert time.monotonic() - handed_on < 3
        await waiter.release()


async def test_a_cluster_is_one_vote_among_standalone_nodes(
    cluster: Cluster, cluster_client: Any, servers: Servers, name: str
) -> None:
    nodes: list[Any] = [cluster_client, servers[0], servers[1]]
    async with aiolock.LockManager(nodes) as locks:
        assert locks.quorum == 2
        owner = await cluster.master_of(key(name))
        plain = [redis.Redis.from_url(url) for url in servers[:2]]
        try:
            async with locks.lock(name, ttl=5):
                deadline = time.monotonic() + 2
                while True:  # a quorum answered; the third write lands a moment later
                    found = [await exists_on(owner, name)]
                    found += [bool(await c.exists(key(name))) for c in plain]
                    if all(found) or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.01)
                assert found == [True, True, True]
            # The cluster alone is not a quorum: with both standalone nodes down
            # the lock cannot be taken.
            servers.servers[0].kill()
            servers.servers[1].kill()
            with pytest.raises(aiolock.QuorumError):
                await locks.lock(name, ttl=5).acquire(timeout=0)
            assert not await exists_on(owner, name)
        finally:
            for client in plain:
                await client.aclose()


async def test_a_renewal_batch_is_split_by_slot_and_answered_in_order(
    cluster: Cluster, cluster_client: Any
) -> None:
    names = names_on_every_master(3)
    node = ClusterNode(cluster_client, request_timeout=1.0, scripts=(EXTEND_MANY_SCRIPT,))
    writer = cluster.client()
    try:
        for i, name in enumerate(names):
            # Every other lock is held by someone else: its extend must say 0.
            await writer.set(key(name), b"mine" if i % 2 == 0 else b"theirs", px=5000)
        args: list[bytes] = [b"%d" % len(names)]
        args += [key(name).encode() for name in names]
        for _name in names:
            args += [b"mine", b"60000"]
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        node.call_script(EXTEND_MANY_SCRIPT, tuple(args), answer.set_result)
        reply = await asyncio.wait_for(answer, 10)
        assert reply == [1 if i % 2 == 0 else 0 for i in range(len(names))]
        for i, name in enumerate(names):
            ttl = await writer.pttl(key(name))
            assert (ttl > 10_000) == (i % 2 == 0), (name, ttl)
    finally:
        await node.aclose()
        await writer.aclose()


async def test_held_locks_on_every_master_are_renewed(cluster_client: Any) -> None:
    names = names_on_every_master(4)
    async with aiolock.LockManager([cluster_client], node_timeout=0.2) as locks:
        held = [locks.lock(name, ttl=1.5) for name in names]
        for lock in held:
            await lock.acquire()
        await asyncio.sleep(3.5)  # over twice the ttl: renewed, or lost
        assert all(lock.owned and not lock.lost for lock in held)
        for lock in held:
            await lock.release()


async def test_a_request_whose_keys_span_slots_is_refused_without_io(
    cluster_client: Any,
) -> None:
    node = ClusterNode(cluster_client, request_timeout=1.0)
    a, b = names_on_every_master(1)[:2]
    replies: list[Any] = []
    args = (b"2", key(a).encode(), key(b).encode(), b"t", b"1000", b"1", b"1")
    node.call_script(ACQUIRE_SCRIPT, args, replies.append)
    assert len(replies) == 1
    assert isinstance(replies[0], ClusterCrossSlotError)
    assert not node._servers  # nothing was connected
    await node.aclose()


async def test_rwlock_and_semaphore_work_on_a_cluster(cluster_client: Any, name: str) -> None:
    async with aiolock.LockManager([cluster_client]) as locks:
        rw = locks.rwlock(name, ttl=5)
        async with rw.read(), rw.read():
            assert not await rw.write().acquire(timeout=0)
        async with rw.write():
            assert not await rw.read().acquire(timeout=0)
        first, second = (locks.semaphore(name + "-s", 2, ttl=5) for _ in range(2))
        async with first, second:
            assert not await locks.semaphore(name + "-s", 2, ttl=5).acquire(timeout=0)


async def test_a_moved_slot_is_followed(cluster: Cluster, cluster_client: Any) -> None:
    name = names_on_every_master(1)[0]
    slot = key_slot(key(name).encode())
    async with aiolock.LockManager([cluster_client]) as locks:
        async with locks.lock(name, ttl=5):  # the manager knows the slot's master
            pass
        source = await cluster.master_of(key(name))
        target = next(m for m in cluster.masters if m is not source)
        # Hand the slot (with the name's fencing counter) to another master behind
        # the manager's back.
        await start_migration(source, target, slot)
        await finish_migration(cluster, source, target, slot)
        # The first request goes to the old master, which answers MOVED.
        async with locks.lock(name, ttl=5):
            assert await exists_on(target, name)
            assert not await exists_on(source, name)


async def test_an_ask_redirect_during_a_migration_is_followed(
    cluster: Cluster, cluster_client: Any
) -> None:
    name, slot, source = await on_a_master(cluster, 1)
    target = next(m for m in cluster.masters if m is not source)
    src, dst = direct(source), direct(target)
    try:
        async with aiolock.LockManager([cluster_client]) as locks:
            lock = locks.lock(name, ttl=30, auto_renew=False)
            await lock.acquire()
            await start_migration(source, target, slot)
            # Move the lock's keys; the slot itself is still the source's.
            keys = await src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            assert key(name).encode() in keys
            await src.execute_command(
                "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys
            )
            # The source no longer has the key and answers ASK: the release must
            # run on the target (after ASKING) and delete the key there.
            await lock.release()
            await dst.execute_command("ASKING")
            assert await dst.exists(key(name) + ":fence")
            await dst.execute_command("ASKING")
            assert not await dst.exists(key(name))
    finally:
        await src.aclose()
        await dst.aclose()
        await finish_migration(cluster, source, target, slot)


async def replicated(replica: Server, name_key: str) -> None:
    """Wait until ``replica`` has the key (replication is asynchronous)."""
    client = direct(replica)
    try:
        await client.execute_command("READONLY")  # read on a cluster replica
        deadline = time.monotonic() + 10
        while not await client.exists(name_key):
            assert time.monotonic() < deadline, "not replicated in 10 s"
            await asyncio.sleep(0.01)
    finally:
        await client.aclose()


async def test_a_failover_to_the_replica_is_followed() -> None:
    async with redis_cluster(3, replicas=1) as own:
        client = own.client()
        try:
            async with aiolock.LockManager([client], node_timeout=0.2) as locks:
                name, other = names_on_every_master(2)[:2]  # one master serves both
                async with locks.lock(name, ttl=5) as first:
                    token = first.fencing_token
                kept = locks.lock(other, ttl=30, auto_renew=False)
                assert await kept.acquire(timeout=0)
                master = await own.master_of(key(name))
                assert await own.master_of(key(other)) is master
                await replicated(own.replicas[own.masters.index(master)], key(other))
                master.kill()
                deadline = time.monotonic() + 30
                while await own.master_of(key(name)) is master:
                    assert time.monotonic() < deadline, "no failover in 30 s"
                    await asyncio.sleep(0.05)
                # The manager has not heard of the failover: its first request goes
                # to the dead master, then to the promoted replica once the slot map
                # is read again.
                await kept.release()
                assert await on_slot_master(own, other) is None
                deadline = time.monotonic() + 30
                while True:
                    try:
                        async with locks.lock(name, ttl=5) as after:
                            assert after.fencing_token > token
                            promoted = await own.master_of(key(name))
                            assert promoted is not master
                            assert await exists_on(promoted, name)
                        break
                    except aiolock.QuorumError:  # the cluster may not be ok everywhere yet
                        assert time.monotonic() < deadline
                        await asyncio.sleep(0.1)
        finally:
            await client.aclose()


async def run_cli(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiolock", *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    return out.decode()


async def test_cli_inspects_and_releases_a_lock_with_a_cluster_node(
    cluster: Cluster, cluster_client: Any, servers: Servers, name: str
) -> None:
    # Any server of the cluster will do: the CLI's cluster client follows redirects.
    url = f"redis://127.0.0.1:{cluster.masters[0].port}"
    nodes = ["--nodes", servers[0], servers[1], "--cluster", url]
    async with aiolock.LockManager([cluster_client, servers[0], servers[1]]) as locks:
        holder = locks.lock(name, ttl=20, auto_renew=False)
        assert await holder.acquire()
        waiter = asyncio.create_task(locks.lock(name, ttl=20).acquire(timeout=15))
        report = await run_cli("inspect", name, *nodes)
        assert report.count("held by") == 3, report
        assert f"cluster {url}: held by" in report
        assert "holder with a quorum (2): none" not in report
        released = await run_cli("release", name, "--force", "--yes", *nodes)
        assert released.count("deleted") == 3, released
        assert await asyncio.wait_for(waiter, 10)  # woken by the release messages


async def test_held_locks_survive_a_failover_or_are_reported_lost() -> None:
    async with redis_cluster(3, replicas=1) as own:
        client = own.client()
        try:
            async with aiolock.LockManager([client], node_timeout=0.2) as locks:
                held = [locks.lock(n, ttl=2.0) for n in names_on_every_master(2)]
                for lock in held:
                    assert await lock.acquire(timeout=5)
                tokens = {lock.name: await on_slot_master(own, lock.name) for lock in held}
                victim = await own.master_of(key(held[0].name))
                others = [
                    lock for lock in held if await own.master_of(key(lock.name)) is not victim
                ]
                assert len(others) == 4
                victim.kill()
                await asyncio.sleep(5)  # the replica takes over; renewal goes on
                # Never silently lost: a lock that says it is owned has its key, with
                # its token, on the slot's master now.
                owned = [lock for lock in held if lock.owned]
                assert all(lock.lost for lock in held if not lock.owned)
                for lock in owned:
                    assert await on_slot_master(own, lock.name) == tokens[lock.name]
                # The locks of the other masters were never in danger.
                assert all(lock.owned for lock in others)
                for lock in owned:
                    await lock.release()
        finally:
            await client.aclose()


async def test_a_hung_master_costs_only_its_own_names() -> None:
    # A long cluster-node-timeout: the pause is not taken for a failure.
    async with redis_cluster(3, node_timeout_ms=15000) as own:
        client = own.client()
        try:
            async with aiolock.LockManager([client], node_timeout=0.1) as locks:
                names = names_on_every_master(1)
                for name in names:  # the slot map is known, connections are up
                    async with locks.lock(name, ttl=5):
                        pass
                hung = await own.master_of(key(names[0]))
                hung.pause()
                try:
                    started = time.monotonic()
                    with pytest.raises(aiolock.QuorumError, match="no reply within"):
                        await locks.lock(names[0], ttl=5).acquire(timeout=0)
                    assert time.monotonic() - started < 2  # node_timeout, not a hang
                    for name in names[1:]:
                        started = time.monotonic()
                        async with locks.lock(name, ttl=5):
                            pass
                        assert time.monotonic() - started < 2
                finally:
                    hung.resume()
                deadline = time.monotonic() + 15
                while True:  # the hung master answers again (its connection is reset)
                    try:
                        async with locks.lock(names[0], ttl=5):
                            break
                    except aiolock.QuorumError:
                        assert time.monotonic() < deadline
                        await asyncio.sleep(0.1)
        finally:
            await client.aclose()


# -- TRYAGAIN and CLUSTERDOWN during acquire and renewal ----------------------------------


async def _slot_served(cluster: Cluster, server: Server, slot: int, served: bool) -> None:
    """Take ``slot`` away from ``server`` (CLUSTERDOWN for its keys), or give it back."""
    client = direct(server)
    try:
        await client.execute_command("CLUSTER", "ADDSLOTS" if served else "DELSLOTS", slot)
    finally:
        await client.aclose()
    if served:
        await wait_cluster_ok(cluster.masters)


async def test_clusterdown_during_acquire_is_an_outage_then_recovers(
    cluster: Cluster, cluster_client: Any
) -> None:
    name, slot, master = await on_a_master(cluster, 0)
    async with aiolock.LockManager([cluster_client], node_timeout=0.5) as locks:
        await _slot_served(cluster, master, slot, served=False)
        try:
            with pytest.raises(aiolock.QuorumError, match="CLUSTERDOWN"):
                await locks.lock(name).acquire(timeout=0)
        finally:
            await _slot_served(cluster, master, slot, served=True)
        deadline = time.monotonic() + 10
        while True:
            try:
                async with locks.lock(name, ttl=5) as lock:
                    assert lock.fencing_token is not None
                break
            except aiolock.QuorumError:
                assert time.monotonic() < deadline, "not recovered in 10 s"
                await asyncio.sleep(0.1)
        assert not await exists_on(master, name)


async def test_clusterdown_during_renewal_keeps_the_lock_when_it_ends_in_time(
    cluster: Cluster, cluster_client: Any
) -> None:
    name, slot, master = await on_a_master(cluster, 2)
    async with (
        aiolock.LockManager([cluster_client], node_timeout=0.5) as locks,
        locks.lock(name, ttl=4.0) as lock,
    ):
        await _slot_served(cluster, master, slot, served=False)
        try:
            await asyncio.sleep(1.6)  # the renewal at ttl/3 meets CLUSTERDOWN
        finally:
            await _slot_served(cluster, master, slot, served=True)
        await asyncio.sleep(1.6)  # a retried renewal gets through
        assert lock.owned
        assert lock.lost is None
        client = direct(master)
        try:
            assert await client.pttl(key(name)) > 2500  # renewed after the outage
        finally:
            await client.aclose()


def names_in_one_slot(count: int) -> list[str]:
    """Lock names whose keys share one hash slot (so one renewal call carries them all)."""
    by_slot: dict[int, list[str]] = {}
    while True:
        name = f"s-{uuid.uuid4().hex[:10]}"
        group = by_slot.setdefault(key_slot(key(name).encode()), [])
        group.append(name)
        if len(group) == count:
            return group


async def test_tryagain_during_acquire_is_retried_until_the_keys_are_together(
    cluster: Cluster, cluster_client: Any
) -> None:
    name, slot, source = await on_a_master(cluster, 1)
    target = next(m for m in cluster.masters if m is not source)
    src = direct(source)
    migrated = False
    try:
        async with aiolock.LockManager([cluster_client], node_timeout=2.0) as locks:
            async with locks.lock(name, ttl=5) as first:
                before = first.fencing_token
            assert before is not None
            await start_migration(source, target, slot)
            # The fencing counter is on the source, the lock key is not: a script
            # over both gets TRYAGAIN (and the target too, after ASK) until the
            # migration ends; the request is re-sent meanwhile, within node_timeout.
            attempt = asyncio.create_task(locks.lock(name, ttl=5).acquire(timeout=0))
            await asyncio.sleep(0.3)
            assert not attempt.done(), "TRYAGAIN was not retried"
            await finish_migration(cluster, source, target, slot)
            migrated = True
            assert await asyncio.wait_for(attempt, 5)  # taken on the target
            assert await exists_on(target, name)
    finally:
        await src.aclose()
        if not migrated:
            await finish_migration(cluster, source, target, slot)


async def test_tryagain_during_renewal_is_retried_and_the_locks_kept(
    cluster: Cluster, cluster_client: Any
) -> None:
    names = names_in_one_slot(2)
    slot = key_slot(key(names[0]).encode())
    source = await cluster.master_of(key(names[0]))
    target = next(m for m in cluster.masters if m is not source)
    src = direct(source)
    try:
        async with aiolock.LockManager([cluster_client], node_timeout=0.5) as locks:
            held = [locks.lock(name, ttl=3.0) for name in names]
            for lock in held:
                assert await lock.acquire(timeout=5)
            await start_migration(source, target, slot)
            # One of the two keys moves: a renewal call over both gets TRYAGAIN.
            await src.execute_command(
                "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", key(names[0])
            )
            await asyncio.sleep(1.5)  # a renewal meets TRYAGAIN
            await finish_migration(cluster, source, target, slot)
            await asyncio.sleep(1.5)  # renewed on the target since
            assert all(lock.owned and lock.lost is None for lock in held)
            client = direct(target)
            try:
                assert all([await client.pttl(key(name)) > 1500 for name in names])
            finally:
                await client.aclose()
            for lock in held:
                await lock.release()
    finally:
        await src.aclose()
