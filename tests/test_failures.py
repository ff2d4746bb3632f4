"""Failure modes with defined behaviour: network faults, server errors, security.

Each gives a clear error class, a message naming the node, and leaves nothing half-held.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as redis
from redis.exceptions import NoPermissionError

import aiolock
from aiolock import LockLost, LockManager, LockNotOwned, QuorumError
from aiolock.testing import Server, Servers, redis_servers

from .conftest import key, settled_keys
from .faults import Mode, Proxy, proxies, tls_proxies


@pytest.fixture
async def proxied(servers: Servers) -> AsyncIterator[list[Proxy]]:
    async with proxies(servers) as made:
        yield made


async def _eventually_free(clients: list[redis.Redis], name: str) -> None:
    assert await settled_keys(clients, name, [False] * 5) == [False] * 5


# -- network faults (a proxy per node) ---------------------------------------------------


async def test_blackholed_majority_raises_quorum_error_naming_the_nodes(
    proxied: list[Proxy], clients: list[redis.Redis], name: str
) -> None:
    async with LockManager([p.url for p in proxied], node_timeout=0.05) as locks:
        for proxy in proxied[:3]:
            proxy.mode = Mode.BLACKHOLE
        started = time.monotonic()
        with pytest.raises(QuorumError) as info:
            await locks.lock(name, ttl=5).acquire(timeout=5)
        assert time.monotonic() - started < 2.0
        assert set(info.value.errors) == {p.url for p in proxied[:3]}
        for proxy in proxied[:3]:
            assert proxy.url in str(info.value.errors[proxy.url])
            assert isinstance(info.value.errors[proxy.url], TimeoutError)
    await _eventually_free(clients, name)


async def test_one_blackholed_node_does_not_stop_the_lock(
    proxied: list[Proxy], clients: list[redis.Redis], name: str
) -> None:
    async with LockManager([p.url for p in proxied], node_timeout=0.05) as locks:
        proxied[0].mode = Mode.BLACKHOLE
        for _ in range(5):
            async with locks.lock(name, ttl=5, timeout=2):
                pass
    await _eventually_free(clients, name)


async def test_dropped_replies_after_the_key_was_set_leave_no_key(
    proxied: list[Proxy], clients: list[redis.Redis], name: str
) -> None:
    async with LockManager([p.url for p in proxied], node_timeout=0.05) as locks:
        for proxy in proxied[:3]:
            proxy.mode = Mode.DROP_REPLIES
        with pytest.raises(QuorumError):
            await locks.lock(name, ttl=30).acquire(timeout=0)
        # The nodes did set the key; the clean-up release reached them too.
        await _eventually_free(clients, name)


async def test_slow_minority_is_not_waited_for_and_is_cleaned_up(
    proxied: list[Proxy], clients: list[redis.Redis], name: str
) -> None:
    async with LockManager([p.url for p in proxied], node_timeout=0.05) as locks:
        for proxy in proxied[:2]:
            proxy.mode = Mode.DELAY
            proxy.delay = 0.3
        started = time.monotonic()
        async with locks.lock(name, ttl=5):
            pass
        assert time.monotonic() - started < 0.3
    # The slow nodes got the SET late, and the release after it (ordered connection).
    await _eventually_free(clients, name)


async def test_a_majority_slower_than_node_timeout_but_within_the_budget_keeps_the_lock(
    proxied: list[Proxy], name: str
) -> None:
    """Renewal is not latency-bound: a batch may wait ttl / 6 (not node_timeout) for its
    replies, so a majority answering in 0.2 s keeps a 3 s lock with node_timeout 50 ms."""
    async with (
        LockManager([p.url for p in proxied], node_timeout=0.05) as locks,
        locks.lock(name, ttl=3.0) as lock,
    ):
        for proxy in proxied[:3]:
            proxy.mode = Mode.DELAY
            proxy.delay = 0.2
        await asyncio.sleep(4.0)  # more than a ttl: renewed through the slow majority
        assert lock.owned
        assert lock.lost is None
        for proxy in proxied[:3]:
            proxy.mode = Mode.PASS
        # The replies already held back 0.2 s still come first on those connections: the
        # release on leaving must not queue behind them (it would wait past node_timeout).
        await asyncio.sleep(0.5)


async def test_a_subscription_confirmed_late_still_hears_a_release_made_before_it(
    proxied: list[Proxy], urls: list[str], name: str
) -> None:
    """The waiter's subscription may be confirmed after its attempt (a slow TLS
    handshake on a loaded machine): a release in between must not cost the holder's
    whole ttl (seen in a compat run: woken after 10 s instead of at once)."""
    async with (
        LockManager(urls) as holders,
        LockManager([p.url for p in proxied]) as waiters,
    ):
        holder = holders.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire()
        await waiters.lock(name + ":warm-up").acquire(timeout=0)  # request connections up
        for proxy in proxied:
            proxy.accept_delay = 0.6  # the subscriber's connections are slow to open
        waiting = waiters.lock(name, ttl=5)
        waiter = asyncio.create_task(waiting.acquire(timeout=10))
        await asyncio.sleep(0.2)  # it tried, and is not subscribed yet
        started = time.monotonic()
        await holder.release()  # unheard: nobody listens yet
        assert await asyncio.wait_for(waiter, 12)
        assert time.monotonic() - started < 3  # not the holder's 30 s (nor the 10 s timeout)
        await waiting.release()


async def test_reset_connections_are_reopened(
    proxied: list[Proxy], clients: list[redis.Redis], name: str
) -> None:
    async with LockManager([p.url for p in proxied]) as locks:
        async with locks.lock(name, ttl=5):
            pass
        for proxy in proxied:
            proxy.reset()
        lock = locks.lock(name, ttl=5)
        deadline = time.monotonic() + 5
        while True:
            with contextlib.suppress(QuorumError):
                if await lock.acquire(timeout=0):
                    break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await lock.release()
    await _eventually_free(clients, name)


async def test_node_that_accepts_and_never_answers(servers: Servers, name: str) -> None:
    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    silent_url = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        nodes = [silent_url, *servers[:2]]
        async with LockManager(nodes, node_timeout=0.05) as locks, locks.lock(name, timeout=2):
            pass  # 2 of 3: still a quorum
        async with LockManager([silent_url], node_timeout=0.05) as alone:
            started = time.monotonic()
            with pytest.raises(QuorumError) as info:
                await alone.lock(name).acquire(timeout=0)
            assert time.monotonic() - started < 2.0
            assert silent_url in str(info.value)
    finally:
        server.close()


async def test_unresolvable_host_is_a_failed_vote_naming_it(urls: list[str], name: str) -> None:
    bad = "redis://no-such-host.invalid:6379"
    locks = LockManager([bad, *urls[:2]])  # no I/O, no DNS look-up here
    async with locks, locks.lock(name, ttl=5, timeout=2):
        pass
    async with LockManager([bad]) as alone:
        with pytest.raises(QuorumError, match=r"no-such-host\.invalid") as info:
            await alone.lock(name).acquire(timeout=0)
        assert list(info.value.errors) == [bad]


async def test_all_nodes_down(servers: Servers, name: str) -> None:
    for server in servers.servers:
        assert isinstance(server, Server)
        server.kill()
    async with LockManager(servers) as locks:  # does not fail: nodes may come back
        with pytest.raises(QuorumError) as info:
            await locks.lock(name).acquire(timeout=None)
        assert len(info.value.errors) == 5


# -- server errors -----------------------------------------------------------------------


async def test_readonly_replicas_are_failed_votes(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    primary_port = int(servers[4].rsplit(":", 1)[1])
    try:
        for client in clients[:3]:
            await client.replicaof("127.0.0.1", primary_port)
        async with LockManager(servers) as locks:
            with pytest.raises(QuorumError, match="READONLY") as info:
                await locks.lock(name).acquire(timeout=0)
            assert set(info.value.errors) == set(servers[:3])
    finally:
        for client in clients[:3]:
            await client.replicaof("NO", "ONE")


async def test_out_of_memory_is_a_failed_vote(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    try:
        for client in clients[:3]:
            await client.config_set("maxmemory-policy", "noeviction")
            await client.config_set("maxmemory", 1)
        async with LockManager(servers) as locks:
            with pytest.raises(QuorumError, match="OOM"):
                await locks.lock(name).acquire(timeout=0)
    finally:
        for client in clients[:3]:
            await client.config_set("maxmemory", 0)
    await _eventually_free(clients, name)


async def test_missing_and_wrong_passwords(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    try:
        for client in clients:
            await client.config_set("requirepass", "s3cret")
        async with LockManager(servers[:3]) as locks:
            with pytest.raises(QuorumError, match=r"NOAUTH|Authentication required"):
                await locks.lock(name).acquire(timeout=0)
        wrong = [url.replace("redis://", "redis://:nope@") for url in servers[:3]]
        async with LockManager(wrong) as locks:
            with pytest.raises(QuorumError, match=r"WRONGPASS|invalid") as info:
                await locks.lock(name).acquire(timeout=0)
            assert "nope" not in str(info.value)  # no password in messages
        right = [url.replace("redis://", "redis://:s3cret@") for url in servers[:3]]
        async with LockManager(right) as locks, locks.lock(name, ttl=5):
            pass
    finally:
        for url in servers:
            admin = redis.Redis.from_url(url.replace("redis://", "redis://:s3cret@"))
            await admin.config_set("requirepass", "")
            await admin.aclose()


MINIMAL_ACL = (
    "on >lockpass ~aiolock:* resetchannels &aiolock:* -@all "
    "+evalsha +eval +script|load +subscribe +unsubscribe +ping "
    "+set +get +del +pexpire +pttl +publish +type +info +exists +sadd +srem +smembers "
    "+time +zadd +zrem +zrange +zrangebyscore +zcard"
)


async def test_minimal_acl_of_the_readme_is_enough(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    page = Path(__file__).parent.parent / "docs" / "how-to" / "security.md"
    assert MINIMAL_ACL in page.read_text()  # the documented ACL is the tested one
    for client in clients:
        await client.execute_command("ACL", "SETUSER", "aiolock", *MINIMAL_ACL.split())
    urls = [url.replace("redis://", "redis://aiolock:lockpass@") for url in servers]
    try:
        async with LockManager(urls) as locks:
            async with locks.lock(name, ttl=1.0) as lock:
                assert lock.fencing_token is not None
                await asyncio.sleep(0.5)  # renewed at least once
                await lock.extend()
                waiter = asyncio.create_task(locks.lock(name, ttl=5).acquire(timeout=5))
                await asyncio.sleep(0.05)
            assert await waiter
            # Every primitive: the read-write lock's scripts call more commands.
            rw = locks.rwlock(name + ":rw", ttl=5)
            reader = rw.read()
            assert await reader.acquire(timeout=0)
            writer = asyncio.create_task(rw.write().acquire(timeout=5))
            await asyncio.sleep(0.05)
            await reader.release()
            assert await writer
            async with locks.semaphore(name + ":sem", 2, ttl=5):
                pass
        # And nothing else: other keys are out of reach.
        limited = redis.Redis.from_url(urls[0])
        try:
            # (The words differ by server: "No permissions to access a key" on Valkey,
            # "this user has no permissions to access one of the keys" on Redis 7.0.)
            with pytest.raises(NoPermissionError, match=r"(?i)no permissions"):
                await limited.set("other:key", 1)
        finally:
            await limited.aclose()
    finally:
        for client in clients:
            await client.execute_command("ACL", "DELUSER", "aiolock")


async def test_info_denied_is_logged_once_per_node_and_not_quarantined(
    servers: Servers, clients: list[redis.Redis], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    no_info = MINIMAL_ACL.replace(" +info", "")
    for client in clients[:3]:
        await client.execute_command("ACL", "SETUSER", "aiolock", *no_info.split())
    urls = [url.replace("redis://", "redis://aiolock:lockpass@") for url in servers[:3]]
    try:
        # The default grace (30 s) would quarantine these young servers if it could
        # read their uptime; it cannot, so it says so and lets them vote.
        async with LockManager(urls, restart_grace=None) as locks:
            for _ in range(2):
                async with locks.lock(name, ttl=1.0) as lock:
                    assert lock.fencing_token is not None
        warnings = [r for r in caplog.records if "cannot read INFO server" in r.getMessage()]
        # Once per node and connection kind (hot path, renewal), not per request.
        assert 3 <= len(warnings) <= 6, [w.getMessage() for w in warnings]
        assert all("lockpass" not in w.getMessage() for w in warnings)
    finally:
        for client in clients[:3]:
            await client.execute_command("ACL", "DELUSER", "aiolock")


async def test_pubsub_refused_by_acl_waiters_poll_and_it_is_logged_once_per_node(
    servers: Servers, clients: list[redis.Redis], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    no_pubsub = MINIMAL_ACL.replace(" +subscribe +unsubscribe", "")
    assert no_pubsub != MINIMAL_ACL
    for client in clients:
        await client.execute_command("ACL", "SETUSER", "aiolock", *no_pubsub.split())
    urls = [url.replace("redis://", "redis://aiolock:lockpass@") for url in servers]
    try:
        async with LockManager(servers) as other, LockManager(urls) as locks:
            for _ in range(2):
                holder = other.lock(name, ttl=30, auto_renew=False)
                assert await holder.acquire(timeout=0)
                started = time.monotonic()
                waiting = locks.lock(name, ttl=5)
                waiter = asyncio.create_task(waiting.acquire(timeout=10))
                await asyncio.sleep(0.3)
                await holder.release()  # its message is never heard: polled instead
                assert await waiter  # no exception, no hang
                assert time.monotonic() - started < 5  # not the holder's 30 s
                await waiting.release()
        warnings = [r for r in caplog.records if "pub/sub unavailable" in r.getMessage()]
        assert warnings, "the refusal is logged"
        nodes = [r.args[0] for r in warnings if isinstance(r.args, tuple)]
        # Once per node: a waiter subscribes to its grants on every node before its
        # first attempt (not only on the 3 its release channel listens on).
        assert len(nodes) == len(set(nodes)) <= len(servers)
        assert all(r.levelname == "WARNING" for r in warnings)
    finally:
        for client in clients:
            await client.execute_command("ACL", "DELUSER", "aiolock")


async def test_acl_without_the_prefix_is_a_clear_error(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    acl = MINIMAL_ACL.replace("~aiolock:*", "~other:*")
    for client in clients:
        await client.execute_command("ACL", "SETUSER", "aiolock", *acl.split())
    urls = [url.replace("redis://", "redis://aiolock:lockpass@") for url in servers]
    try:
        async with LockManager(urls) as locks:
            with pytest.raises(QuorumError, match=r"NOPERM|No permissions"):
                await locks.lock(name).acquire(timeout=0)
    finally:
        for client in clients:
            await client.execute_command("ACL", "DELUSER", "aiolock")


# -- restarts ----------------------------------------------------------------------------


async def test_minority_restarted_empty_while_held_keeps_the_lock(
    servers: Servers, name: str
) -> None:
    async with (
        LockManager(servers, node_timeout=0.1) as locks,
        locks.lock(name, ttl=1.0) as lock,
    ):
        server = servers.servers[0]
        assert isinstance(server, Server)
        await server.restart()
        await asyncio.sleep(1.5)  # renewals go on with 4 of 5
        assert lock.owned


async def test_a_minority_restarted_empty_is_repaired_by_the_next_renewal(
    servers: Servers, name: str
) -> None:
    async with (
        LockManager(servers, node_timeout=0.1) as locks,
        locks.lock(name, ttl=1.5) as lock,
    ):
        token = lock.fencing_token
        assert token is not None
        for server in servers.servers[:3]:
            assert isinstance(server, Server)
            await server.restart()
            if server is servers.servers[0]:
                # A majority holds it still; then node 2 restarts too, and someone
                # else's key lands there meanwhile: repair must leave that one alone.
                await asyncio.sleep(1.2)
        async with _clients(servers) as fresh:
            await fresh[2].set(key(name), b"someone-else", px=10_000)
            await asyncio.sleep(1.2)  # two renewals (every ttl/3)
            assert lock.owned
            # Every other node holds the lock again, under our token, and knows its
            # fencing token: one more node failure no longer loses it.
            held = [await c.get(key(name)) for c in fresh]
            assert held[0] is not None
            assert held == [held[0], held[0], b"someone-else", held[0], held[0]], held
            fences = [int(await c.get(f"{key(name)}:fence") or 0) for c in fresh]
            assert all(fence >= token for i, fence in enumerate(fences) if i != 2), fences


async def test_a_repair_brings_the_counter_up_to_the_tokens_reserved_for_leases(
    servers: Servers, name: str
) -> None:
    # A holder whose PASS_ON reserved tokens for the waiters behind it (see _waiting/lease.py)
    # hands them out with no I/O: a node it repairs must know them all, not only its own.
    async with LockManager(servers, node_timeout=0.1) as locks:
        holder = locks.lock(name, ttl=3.0, auto_renew=False)
        assert await holder.acquire()
        waiters = [locks.lock(name, ttl=3.0) for _ in range(3)]
        queued = []
        for waiter in waiters:
            queued.append(asyncio.create_task(waiter.acquire(timeout=10)))
            await asyncio.sleep(0.05)
        await holder.release()  # PASS_ON to the first, reserving two more tokens
        assert await queued[0]
        token = waiters[0].fencing_token
        assert token is not None
        assert waiters[0]._hold is not None
        assert waiters[0]._hold.reserve == token + 2
        # The others leave: a head woken by the restart (its pub/sub connection drops)
        # would try, and its attempt raise node 0's counter far past the reserve by the
        # fencing floor, as if the repair had.
        for waiting in queued[1:]:
            waiting.cancel()
        await asyncio.gather(*queued[1:], return_exceptions=True)
        server = servers.servers[0]
        assert isinstance(server, Server)
        await server.restart()
        await asyncio.sleep(1.5)  # a renewal (every ttl/3) repairs node 0
        async with _clients(servers) as fresh:
            assert await fresh[0].get(key(name)) is not None
            assert int(await fresh[0].get(f"{key(name)}:fence") or 0) == token + 2
        await waiters[0].release()


async def test_a_renewal_without_a_quorum_recreates_nothing(servers: Servers, name: str) -> None:
    async with LockManager(servers, node_timeout=0.1) as locks:
        lock = locks.lock(name, ttl=1.0)
        assert await lock.acquire()
        for server in servers.servers[:3]:
            assert isinstance(server, Server)
            await server.restart()
        await asyncio.wait_for(lock.wait_lost(), 5)  # 3 of 5 say the key is gone
        await asyncio.sleep(0.2)  # anything sent with that renewal has landed
        async with _clients(servers) as fresh:
            # An expired or lost lock is never re-created, not even where it is missing.
            assert [await c.exists(key(name)) for c in fresh[:3]] == [0, 0, 0]
        with pytest.raises(LockNotOwned):
            await lock.release()


@contextlib.asynccontextmanager
async def _clients(urls: Servers) -> AsyncIterator[list[redis.Redis]]:
    made = [redis.Redis.from_url(url, socket_timeout=2) for url in urls]
    try:
        yield made
    finally:
        for client in made:
            await client.aclose()


# -- restart quarantine -------------------------------------------------------------------


async def _restart(servers: Servers, which: range) -> float:
    """Kill and restart these servers empty; return when the last one was back."""
    for i in which:
        server = servers.servers[i]
        assert isinstance(server, Server)
        await server.restart()
    return time.monotonic()


async def _past_their_grace(locks: LockManager, name: str, grace: float) -> None:
    """Wait until the servers (restarted by earlier tests, maybe) are out of quarantine."""
    deadline = time.monotonic() + grace + 3
    while True:
        with contextlib.suppress(QuorumError):
            lock = locks.lock(name, ttl=1.0, auto_renew=False)
            if await lock.acquire(timeout=0):
                await lock.release()
                return
        assert time.monotonic() < deadline, "the servers stayed in quarantine"
        await asyncio.sleep(0.1)


async def test_a_majority_restarted_empty_is_quarantined_until_the_holder_is_gone(
    servers: Servers, name: str
) -> None:
    grace = 3.0
    holder_done = asyncio.Event()
    restarted = asyncio.Event()
    restarted_at = math.inf

    async def hold() -> None:
        nonlocal restarted_at
        try:
            async with a_side.lock(name, ttl=1.0):
                restarted_at = await _restart(servers, range(3))
                restarted.set()
                await asyncio.sleep(10)
        except aiolock.LockLost:
            pass
        finally:
            holder_done.set()

    async with (
        LockManager(servers, node_timeout=0.1, restart_grace=grace) as a_side,
        LockManager(servers, node_timeout=0.1, restart_grace=grace) as b_side,
    ):
        await _past_their_grace(a_side, name, grace)
        holder = asyncio.create_task(hold())
        await restarted.wait()
        # A manager that meets the servers only now knows them by their uptime.
        async with LockManager(servers, node_timeout=0.1, restart_grace=grace) as c_side:
            with pytest.raises(QuorumError, match=r"server started .* quarantined"):
                await c_side.lock(name).acquire(timeout=0)
        quarantined = 0
        while True:
            contender = b_side.lock(name, ttl=1.0, auto_renew=False)
            refused = ""
            try:
                taken = await contender.acquire(timeout=0)
            except QuorumError as exc:
                refused, taken = str(exc), False
            assert not refused or "quarantined" in refused or holder_done.is_set(), refused
            quarantined += "quarantined" in refused
            if taken:
                break
            assert time.monotonic() - restarted_at < grace + 5, "never acquired after the grace"
            await asyncio.sleep(0.05)
        taken_at = time.monotonic()
        # Never while the holder's body ran; and only once the grace had passed.
        assert holder_done.is_set()
        assert taken_at >= restarted_at + grace - 1.0  # uptime is counted in whole seconds
        assert quarantined > 0
        await contender.release()
        await holder


@contextlib.asynccontextmanager
async def failed_over(
    servers: Servers, name: str, grace: float
) -> AsyncIterator[tuple[LockManager, Proxy]]:
    """A manager of three nodes, ``restart_grace=grace``, once its first node failed over.

    Every server is older than the grace. The manager takes ``name`` once, then the
    first node's address leads to another server (its own run_id, the same long
    uptime) and the third node is killed: the quorum of 2 needs the switched node.
    Yields once the node has noticed the reset and read the new run_id.
    """
    async with redis_servers(1) as spare, proxies(servers[:1]) as (proxy,):
        await asyncio.sleep(grace + 1.0)  # every server is older than the grace now
        nodes = [proxy.url, servers[1], servers[2]]
        async with LockManager(nodes, node_timeout=0.1, restart_grace=grace) as locks:
            async with locks.lock(name, ttl=1.0):
                pass
            proxy.target_port = spare.servers[0].port
            proxy.reset()
            server2 = servers.servers[2]
            assert isinstance(server2, Server)
            server2.kill()
            await asyncio.sleep(0.2)  # the node notices the reset, reads the new run_id
            yield locks, proxy


async def test_a_node_whose_run_id_changed_is_quarantined_whatever_its_uptime(
    servers: Servers, name: str
) -> None:
    grace = 1.5
    async with failed_over(servers, name, grace) as (locks, _proxy):
        changed_at = time.monotonic()
        with pytest.raises(QuorumError, match=r"restarted .* \(its run_id changed\)"):
            await locks.lock(name).acquire(timeout=0)
        while True:
            with contextlib.suppress(QuorumError):
                if await locks.lock(name, ttl=1.0, auto_renew=False).acquire(timeout=0):
                    break
            assert time.monotonic() - changed_at < grace + 3
            await asyncio.sleep(0.05)
        assert time.monotonic() - changed_at >= grace - 0.3


async def test_a_failed_over_nodes_quarantine_outlasts_a_reconnect(
    servers: Servers, name: str
) -> None:
    # A failover behind one address (another server, its own run_id, up for long), then
    # a blip: the connection to the new server resets, and the node reconnects to it.
    # Found by the simulation (seed 34459738402, a "failover" then a reset): that
    # reconnect read the same (new) run_id and the long uptime, and set the restart's
    # time back to an hour ago: the quarantine ended at the first reconnect, and a
    # rival took the lock on the empty node while its holder still held it.
    grace = 2.0
    async with failed_over(servers, name, grace) as (locks, proxy):
        with pytest.raises(QuorumError, match=r"restarted .* \(its run_id changed\)"):
            await locks.lock(name).acquire(timeout=0)
        proxy.reset()  # a blip: the node reconnects to the same new server
        await asyncio.sleep(0.2)
        with pytest.raises(QuorumError, match=r"restarted .* \(its run_id changed\)"):
            await locks.lock(name).acquire(timeout=0)


async def test_majority_restarted_empty_while_held_is_lost(servers: Servers, name: str) -> None:
    async with LockManager(servers, node_timeout=0.1) as locks:
        with pytest.raises(LockLost):
            async with locks.lock(name, ttl=1.0):
                for server in servers.servers[:3]:
                    assert isinstance(server, Server)
                    await server.restart()
                await asyncio.sleep(5)


# -- TLS ---------------------------------------------------------------------------------


async def test_rediss_tls_nodes(servers: Servers, tmp_path: Path, name: str) -> None:
    async with tls_proxies(servers[:3], tmp_path) as urls:
        assert all(url.startswith("rediss://") for url in urls)
        async with LockManager(urls) as locks, locks.lock(name, ttl=5) as lock:
            assert lock.fencing_token is not None
        # A client that does not trust the certificate cannot connect.
        untrusted = [url.split("?")[0] for url in urls]  # no CA given
        async with LockManager(untrusted) as untrusting:
            with pytest.raises(QuorumError, match=r"certificate|SSL"):
                await untrusting.lock(name).acquire(timeout=0)


# -- one server never counts as several nodes ----------------------------------------------


async def test_one_server_behind_two_addresses_is_refused_at_first_contact(
    servers: Servers, clients: list[redis.Redis], name: str
) -> None:
    async with proxies(servers[:1]) as (proxy,):
        # The proxy is another address of server 0; database 1 is another keyspace,
        # so without the check this server would grant two of the three votes.
        nodes = [servers[0], servers[1], f"{proxy.url}/1"]
        with pytest.raises(ValueError, match="same server"):
            async with LockManager(nodes) as locks:
                await locks.lock(name).acquire(timeout=0)
        locks = LockManager(nodes)
        with pytest.raises(ValueError, match="same server"):
            await locks.lock(name).acquire(timeout=0)
        await locks.aclose()
    assert [await c.exists(f"aiolock:{{{name}}}") for c in clients] == [0] * 5


async def test_a_node_that_turns_out_to_be_another_nodes_server_does_not_vote(
    servers: Servers, name: str
) -> None:
    async with proxies(servers[:1]) as (proxy,):
        proxy.target_port = 1  # nothing there: unknown at first contact
        nodes = [servers[0], f"{proxy.url}/1", servers[1]]
        async with LockManager(nodes) as locks:
            proxy.target_port = servers.servers[0].port  # now it reaches server 0
            server1 = servers.servers[1]
            assert isinstance(server1, Server)
            server1.kill()  # server 0 alone must never make a quorum of 2
            refused = False
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and not refused:
                try:
                    assert not await locks.lock(name).acquire(timeout=0)
                except QuorumError as exc:
                    refused = "same server" in str(exc)
                await asyncio.sleep(0.1)
            assert refused, "the proxy node was never recognised as server 0"
