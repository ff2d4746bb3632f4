"""Node I/O on real servers: requests of one loop iteration share a write, and keep
their whole ``node_timeout`` however long the iteration runs (see ``_io/node.py``)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError

from aiolock import LockManager
from aiolock._io.node import MIN_STALL_TIMEOUT, Node
from aiolock._lua import Script

from . import seam
from .faults import proxies
from .faults.proxy import Mode


async def _connected(manager: LockManager) -> Node:
    """The manager's first node, connected."""
    node = seam.nodes(manager)[0]
    assert isinstance(node, Node)
    await node.connect()
    return node


def _count_writes(manager: LockManager) -> list[int]:
    """Count, per node, the writes to its connection from now on (a test's wiretap)."""
    counts = [0] * len(seam.nodes(manager))
    for i, node in enumerate(seam.nodes(manager)):
        assert isinstance(node, Node)
        transport = node._transport
        assert transport is not None

        def counting(
            data: bytes, i: int = i, write: Callable[[bytes], None] = transport.write
        ) -> None:
            counts[i] += 1
            write(data)

        transport.write = counting  # type: ignore[method-assign,assignment]
    return counts


async def test_requests_of_one_loop_iteration_leave_in_one_write_per_node(
    urls: list[str], name: str
) -> None:
    async with LockManager(urls, restart_grace=0) as locks:
        counts = _count_writes(locks)
        handles = [locks.lock(f"{name}:{i}", ttl=10) for i in range(64)]
        # 64 acquires started in one loop iteration: 64 requests to each node.
        assert all(await asyncio.gather(*(h.acquire(timeout=5) for h in handles)))
        # At most one write per 16 requests, and one for the rest: never one each.
        assert all(count <= 8 for count in counts), counts
        for handle in handles:
            assert handle.owned
        await asyncio.gather(*(h.release() for h in handles))


async def test_a_lone_request_is_written_in_the_same_loop_iteration(
    urls: list[str], name: str
) -> None:
    async with LockManager(urls, restart_grace=0) as locks:
        counts = _count_writes(locks)
        lock = locks.lock(name, ttl=10)
        assert await lock.acquire(timeout=0)
        await lock.release()
        # An acquire and a release: two writes per node, each written once.
        assert counts == [2] * len(urls), counts


async def test_a_long_loop_iteration_after_a_request_does_not_eat_its_node_timeout(
    urls: list[str], name: str
) -> None:
    # Two acquires start in one loop iteration: each node writes the first one's
    # request at once and holds the second's for the iteration's end. The iteration
    # then blocks for longer than node_timeout (a task hogging the loop). The held
    # request must still get the whole node_timeout from the moment it is written: a
    # timer started with it timed out every node (the reason coalescing was once
    # taken out). node_timeout 200 ms: a generous bound for a reply on a loaded box.
    loop = asyncio.get_running_loop()
    async with LockManager(urls, node_timeout=0.2, restart_grace=0) as locks:
        pair = [locks.lock(f"{name}:{i}", ttl=10) for i in range(2)]
        # Ten rounds: whether a round's timing shows a timer started too early varies
        # (the named mutant survived 3 rounds about one run in two, on a busy box).
        for _ in range(10):
            acquiring = [asyncio.ensure_future(lock.acquire(timeout=0)) for lock in pair]
            loop.call_soon(time.sleep, 0.3)  # runs right after both first steps
            assert await asyncio.gather(*acquiring) == [True, True]
            releasing = [asyncio.ensure_future(lock.release()) for lock in pair]
            loop.call_soon(time.sleep, 0.3)
            await asyncio.gather(*releasing)


async def test_a_block_within_a_fan_outs_writes_does_not_eat_its_node_timeout(
    urls: list[str], name: str
) -> None:
    # A script's first use on a connection writes its load at once and holds its
    # EVALSHA for the loop iteration's end (Node._write), after the fan-out's timer was
    # set going. The process blocks inside those writes (a GC pause in the second
    # node's write): the nodes written after the block must still get their whole
    # node_timeout from their writes. Timed from before them, every node but the first
    # timed out and the semaphore's acquire failed its quorum (found by the simulation:
    # plan v2:78525548743244, a stall within a step of a semaphore's release).
    async with LockManager(urls, node_timeout=0.2, restart_grace=0) as locks:
        nodes = [await _connected_node(node) for node in seam.nodes(locks)]
        transport = nodes[1]._transport
        assert transport is not None
        write, blocked = transport.write, []

        def block_once(data: bytes) -> None:
            if b"EVALSHA" in data and not blocked:
                blocked.append(data)
                time.sleep(0.5)
            write(data)

        transport.write = block_once  # type: ignore[method-assign,assignment]
        semaphore = locks.semaphore(name, 2, ttl=10)
        assert await semaphore.acquire(timeout=0)
        assert blocked
        await semaphore.release()


async def _connected_node(node: Any) -> Node:
    assert isinstance(node, Node)
    await node.connect()
    return node


async def test_a_script_first_used_on_a_connection_runs_in_the_order_it_was_written(
    urls: list[str], name: str
) -> None:
    # Scripts that are not loaded when a connection opens (the semaphore's, the
    # read-write lock's) are loaded on first use. Sent as EVALSHA and retried with EVAL
    # on NOSCRIPT, the first call ran after the requests written behind it: a
    # semaphore's release ran after its waiter's attempt, which failed and slept 1 s
    # (test_semaphore_waiter_is_woken_by_a_release failed about one run in three).
    setter = Script(b"redis.call('set', KEYS[1], ARGV[1]) return 1")
    async with LockManager(urls[:1], restart_grace=0) as locks:
        node = seam.nodes(locks)[0]
        assert isinstance(node, Node)
        loop = asyncio.get_running_loop()
        replies: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(3)]
        node.call_script(setter, (b"1", name.encode(), b"first"), replies[0].set_result)
        node.call((b"GET", name.encode()), replies[1].set_result)
        node.call_script(setter, (b"1", name.encode(), b"second"), replies[2].set_result)
        assert [await reply for reply in replies] == [1, b"first", 1]


async def test_a_loop_blocked_past_the_stall_timeout_keeps_a_healthy_connection(
    urls: list[str], name: str
) -> None:
    # A request is written, and the loop then blocks for longer than the stall
    # watchdog's timeout (1 s at the least: a task hogging the loop), its reply unread
    # in the socket's buffer meanwhile. The next request, sent as the block ends,
    # finds the first one unanswered for that long: the node is not silent, our loop
    # was. Resetting the connection then failed the first request, whose reply had
    # come, and every other in flight (renewals, releases): failed votes for nothing.
    assert MIN_STALL_TIMEOUT < 1.5
    loop = asyncio.get_running_loop()
    async with LockManager(urls[:1], restart_grace=0) as locks:
        node = await _connected(locks)
        transport = node._transport
        replies: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(2)]
        key = name.encode()
        node.call((b"SET", key, b"1"), replies[0].set_result)

        def block_then_send() -> None:
            time.sleep(1.5)
            node.call((b"GET", key), replies[1].set_result)

        loop.call_soon(block_then_send)
        assert [await reply for reply in replies] == [b"OK", b"1"]
        assert node._transport is transport  # never reset


async def test_a_request_kept_in_the_write_buffer_through_a_block_is_timed_from_its_write(
    urls: list[str], name: str
) -> None:
    # Two requests in one loop iteration: the first is written at once, the second waits
    # in the node's write buffer for the iteration's end (Node._write). A task blocks the
    # loop past the stall watchdog's timeout before that end, so the second goes out only
    # after the block. The first one's reply, read then, wakes a task that sends a third:
    # the watchdog found the second "unanswered" since before the block, though it had
    # just been written, and nothing to read yet (the node takes 0.3 s over it), and
    # reset the connection: the second failed with "no reply for 1.00s" (found by the
    # simulation, seed 140737489374714: a release queued behind a turn-queue script, a
    # block of 1.36 s, then an acquire).
    assert MIN_STALL_TIMEOUT < 1.5
    loop = asyncio.get_running_loop()
    async with LockManager(urls[:1], restart_grace=0) as locks:
        node = await _connected(locks)
        transport = node._transport
        replies: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(3)]
        key = name.encode()

        def block_between_send_and_write() -> None:
            node.call((b"SET", key, b"1"), replies[0].set_result)  # written at once
            node.call((b"BLPOP", key + b":list", b"0.3"), replies[1].set_result)  # buffered
            time.sleep(1.5)

        async def send_once_the_first_is_answered() -> None:
            await replies[0]
            node.call((b"GET", key), replies[2].set_result)

        task = loop.create_task(send_once_the_first_is_answered())
        loop.call_soon(block_between_send_and_write)
        await task
        assert [await reply for reply in replies] == [b"OK", None, b"1"]
        assert node._transport is transport  # never reset


async def test_a_block_inside_a_write_is_not_the_node_falling_silent(
    urls: list[str], name: str
) -> None:
    # The process blocks inside a request's write, before its bytes leave (a GC pause
    # in transport.write), for longer than the stall watchdog's timeout. The next
    # request finds the first unanswered: it was written just now, and its reply takes
    # 0.3 s, so nothing waits to be read. Timed from before the block, the watchdog took
    # the node for silent and reset a healthy connection, failing both requests (found
    # by the simulation: plan v2:54618783178458, an extend()'s fan-out).
    assert MIN_STALL_TIMEOUT < 1.5
    loop = asyncio.get_running_loop()
    # (node_timeout 50 ms: the watchdog's timeout is its floor, MIN_STALL_TIMEOUT.)
    async with LockManager(urls[:1], node_timeout=0.05, restart_grace=0) as locks:
        node = await _connected(locks)
        transport = node._transport
        assert transport is not None
        write = transport.write

        def paused(data: bytes) -> None:
            if b"BLPOP" in data:
                time.sleep(1.5)
            write(data)

        pong: asyncio.Future[Any] = loop.create_future()
        node.call((b"PING",), pong.set_result)
        await pong  # (nothing pending: the connection's script loads answered too)
        transport.write = paused  # type: ignore[method-assign,assignment]
        key = name.encode()
        replies: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(2)]
        node.call((b"BLPOP", key + b":list", b"0.3"), replies[0].set_result)
        node.call((b"GET", key), replies[1].set_result)
        assert [await reply for reply in replies] == [None, None]
        assert node._transport is transport  # never reset


async def test_a_script_whose_load_was_lost_with_a_silent_connection_runs_in_order(
    urls: list[str], name: str
) -> None:
    # A script's first use went out on a connection that had gone silent: its SCRIPT
    # LOAD never reached the server. Its next use counted it as loaded, and sending that
    # EVALSHA reset the silent connection (the watchdog, below): the EVALSHA went out
    # on the new connection, which loads only the usual scripts, was answered NOSCRIPT,
    # and its retry ran after a request sent behind it (found by the simulation's rule
    # "scripts run in order", seed 18014428509482168: a read-write lock's script).
    loop = asyncio.get_running_loop()
    script = Script(b"redis.call('set', KEYS[1], ARGV[1]) return 1 -- " + name.encode())
    key = name.encode()
    async with proxies(urls[:1]) as (proxy,), LockManager([proxy.url], restart_grace=0) as locks:
        node = await _connected(locks)
        lost: asyncio.Future[Any] = loop.create_future()
        proxy.mode = Mode.BLACKHOLE
        node.call_script(script, (b"1", key, b"lost"), lost.set_result)
        await asyncio.sleep(MIN_STALL_TIMEOUT + 0.2)
        proxy.mode = Mode.PASS
        replies: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(2)]
        node.call_script(script, (b"1", key, b"first"), replies[0].set_result)
        node.call((b"SET", key, b"second"), replies[1].set_result)
        async with asyncio.timeout(10):
            assert isinstance(await lost, TimeoutError)
            assert [await reply for reply in replies] == [1, b"OK"]
        last: asyncio.Future[Any] = loop.create_future()
        node.call((b"GET", key), last.set_result)
        assert await last == b"second"  # the script ran first, as sent


async def test_a_silent_connection_is_reset_once_its_oldest_request_waited_too_long(
    urls: list[str],
) -> None:
    # The other side of the test above: a node from which no byte comes (blackholed)
    # is taken for hung once its oldest request has waited the stall timeout; the next
    # request resets the connection, fails the ones in flight, and goes out on a new
    # connection.
    loop = asyncio.get_running_loop()
    async with proxies(urls[:1]) as (proxy,), LockManager([proxy.url], restart_grace=0) as locks:
        node = await _connected(locks)
        transport = node._transport
        replies: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(2)]
        proxy.mode = Mode.BLACKHOLE
        node.call((b"PING",), replies[0].set_result)
        await asyncio.sleep(MIN_STALL_TIMEOUT + 0.2)
        proxy.mode = Mode.PASS
        node.call((b"PING",), replies[1].set_result)
        async with asyncio.timeout(10):  # (without the watchdog: no reply, ever)
            first, second = [await reply for reply in replies]
        assert isinstance(first, TimeoutError), first
        assert "no reply for" in str(first)
        assert second == b"PONG"
        assert node._transport is not transport


async def test_a_script_first_used_while_the_node_is_down_still_runs_in_order(
    urls: list[str], name: str
) -> None:
    # A script's first use loads it on the node's connection, on the same ordered
    # connection before its EVALSHA: a NOSCRIPT answer retried with EVAL would run after
    # the requests written behind it (Node.call_script). First used while the node is
    # down (its connects failing, requests failing fast), the script counted as loaded
    # though its SCRIPT LOAD never went out; the next connection, to a server that had
    # not got it (restarted empty), answered its EVALSHA with NOSCRIPT, and its retry ran
    # after a request sent behind it (found by the simulation, seed 140737490355870: a
    # failed pass-on's clean-up after the next turn-queue script).
    loop = asyncio.get_running_loop()
    script = Script(b"redis.call('set', KEYS[1], ARGV[1]) return 1 -- " + name.encode())
    key = name.encode()
    async with LockManager(urls[:1], restart_grace=0) as locks:
        node = await _connected(locks)
        node._reset(ConnectionError("down"))  # as if its connection was lost...
        node._retry_at = time.monotonic() + 0.2  # ...and a reconnect then failed
        failed: asyncio.Future[Any] = loop.create_future()
        node.call_script(script, (b"1", key, b"early"), failed.set_result)
        assert isinstance(await failed, Exception)  # nothing went out
        await asyncio.sleep(0.25)  # the back-off is over: the next request reconnects
        replies: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(2)]
        node.call_script(script, (b"1", key, b"first"), replies[0].set_result)
        node.call((b"SET", key, b"second"), replies[1].set_result)
        assert [await reply for reply in replies] == [1, b"OK"]
        last: asyncio.Future[Any] = loop.create_future()
        node.call((b"GET", key), last.set_result)
        assert await last == b"second"  # the script ran first, as sent


async def test_a_reply_read_after_a_callback_reset_its_connection_is_not_delivered(
    urls: list[str],
) -> None:
    # A callback may reset the node's connection as it runs (a request it sends finds
    # the oldest one waiting past the stall timeout): every request still waiting has
    # failed with the reset. The replies read in the same chunk, behind the one that
    # ran the callback, belong to that connection: none may reach a callback again (a
    # second answer, a reply after an error, would be taken for news).
    async with LockManager(urls[:1], restart_grace=0) as locks:
        node = await _connected(locks)
        calls: list[Any] = []

        def reset_by_callback(reply: Any) -> None:
            calls.append(("first", reply))
            node._reset(ConnectionError("reset by a callback"))

        node.call((b"PING",), reset_by_callback)
        node.call((b"PING",), lambda reply: calls.append(("second", reply)))
        await asyncio.sleep(0)  # (the iteration's end: both written)
        time.sleep(0.2)  # both replies wait in the socket: one read takes them together
        async with asyncio.timeout(5):
            while len(calls) < 2:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # (a second answer would come now)
        assert calls[0] == ("first", b"PONG")
        assert [who for who, _ in calls] == ["first", "second"], calls
        assert isinstance(calls[1][1], ConnectionError)


async def test_connections_tell_the_servers_they_are_aiolocks_reading_versions_once(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CLIENT LIST tells an operator which connections are the lock library's. redis-py
    # 7.1 and later read their version from the installed package's metadata for every
    # connection not given a driver_info, a third of a millisecond each (broken: once
    # per connection and reconnection, on every node).
    reads: list[str] = []
    version = importlib.metadata.version

    def counted(package: str) -> str:
        reads.append(package)
        return version(package)

    monkeypatch.setattr(importlib.metadata, "version", counted)
    async with LockManager(urls, restart_grace=0) as one, LockManager(urls) as two:
        holder, waiter = one.lock(name, ttl=5), two.lock(name, ttl=5)
        assert await holder.acquire(timeout=5)
        waiting = asyncio.create_task(waiter.acquire(timeout=5))
        await asyncio.sleep(0.2)  # (the waiter's pub/sub connections are up)
        assert reads.count("redis") <= 1, reads
        listed = await clients[0].client_list()
        await holder.release()
        assert await waiting
        await waiter.release()
    if "lib-name" not in listed[0]:  # (CLIENT SETINFO: servers from Redis 7.2 on)
        return
    ours = [c for c in listed if c["lib-name"] != "redis-py"]  # (not the fixture's)
    assert len(ours) >= 2, listed  # (each manager's commands; the waiter's pub/sub too)
    name = f"redis-py(aiolock_v{version('aiolock-redis')})"
    assert {(c["lib-name"], c["lib-ver"]) for c in ours} == {(name, version("redis"))}


async def test_a_fan_outs_callback_gets_its_node_index_however_its_request_ends(
    urls: list[str], name: str
) -> None:
    # A fan-out gives every node one callback and the node's index (Node.call_for_vote):
    # a reply, and every failure instead of one, must come with that index.
    script = Script(b"return 1 -- " + name.encode())
    got: list[tuple[int, Any]] = []

    def record(index: int, reply: Any) -> None:
        got.append((index, reply))

    async def ended(node: Node, index: int) -> Any:
        before = len(got)
        node.call_for_vote(script, (b"0",), record, index)
        for _ in range(200):
            if len(got) > before:
                break
            await asyncio.sleep(0.01)
        assert [i for i, _ in got[before:]] == [index]
        return got[before][1]

    async with LockManager(urls[:1], restart_grace=0) as locks:
        node = await _connected(locks)
        assert await ended(node, 3) == 1  # a reply
        node.refuse(ConnectionError("the same server as another"))
        assert isinstance(await ended(node, 4), ConnectionError)  # refused
        node.refuse(None)
        before = len(got)
        node.call_for_vote(script, (b"0",), record, 5)
        node._reset(ConnectionError("lost"))  # a reset with the request in flight
        assert got[before:] == [(5, got[before][1])]
        assert isinstance(got[before][1], ConnectionError)
        node._retry_at = time.monotonic() + 5  # a failed reconnect's back-off
        assert isinstance(await ended(node, 6), ConnectionError)
    assert isinstance(await ended(node, 7), RedisConnectionError)  # the manager closed
    down = Node("redis://127.0.0.1:1", request_timeout=1.0)  # nothing listens there
    assert isinstance(await ended(down, 8), RedisConnectionError)  # a connect that failed
    await down.aclose()
