"""A release grants the lock to the process whose turn it is (see
aiolock/_waiting/grants.py and RELEASE_TURN): the key gets that process's offered token on each
node, the process learns it from one message per node, and makes no attempt of its own.

Each ``LockManager`` is one process in line, as in tests/turns/; a real process
is killed where the test needs its connections gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as redis

import aiolock._waiting.turns
from aiolock import LockManager
from aiolock._lua import (
    ACQUIRE_SCRIPT,
    NOT_FREE,
    RELEASE_SCRIPT,
    RELEASE_TURN_SCRIPT,
    TURN_JOIN_SCRIPT,
    Script,
)
from aiolock._waiting.grants import GRANT_WAIT, Grants
from aiolock._waiting.taker import Taker

from . import seam
from .conftest import TurnScripts, count_attempts, key, members_on, scripts_run, two_in_line

WORKER = Path(__file__).parent / "turns_worker.py"


async def _offers(clients: list[redis.Redis], name: str, count: int) -> list[bytes]:
    """The offers in ``name``'s turn queue, once every node holds ``count`` of them."""
    return (await members_on(clients, key(name) + ":turns:offers", count))[0]


async def _expect(pubsub: Any, data: bytes) -> Any:
    """The next message, which must carry ``data``."""
    message = await _next(pubsub)
    assert message is not None
    assert message["data"] == data
    return message


async def _next(pubsub: Any) -> Any:
    """The next message (not a subscription's confirmation), within 5 s."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
        if message is not None:
            return message
    return None


def _heard_through(manager: LockManager, hook: Callable[..., None]) -> None:
    """Route what ``manager`` hears on each node through ``hook(deliver, channel, message)``."""
    for subscriber in seam.engine(manager).waiting._subscribers:
        deliver = subscriber._on_message  # type: ignore[attr-defined]
        subscriber._on_message = (  # type: ignore[attr-defined]
            lambda channel, message, deliver=deliver: hook(deliver, channel, message)
        )


async def test_the_next_process_in_line_is_granted_the_lock_without_an_attempt(
    urls: list[str], clients: list[redis.Redis], name: str, turn_scripts: TurnScripts
) -> None:
    async with LockManager(urls) as holder_side, LockManager(urls) as waiter_side:
        holder = holder_side.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        before = holder.fencing_token
        assert before is not None
        waiter = waiter_side.lock(name, ttl=30, auto_renew=False)
        queued = time.monotonic()
        waits = asyncio.create_task(waiter.acquire(timeout=20))
        await _offers(clients, name, 1)
        attempts = count_attempts(waiter_side)
        await asyncio.sleep(1.0)  # the offer was sent a second before the release
        turn_scripts.watch(holder_side, waiter_side)
        for client in clients:
            await client.config_resetstat()
        await holder.release()
        assert await asyncio.wait_for(waits, 10)
        # The release was the handoff: one script per node, and no attempt.
        assert attempts == [0]
        assert await scripts_run(clients, leaving_out=turn_scripts) == [1] * 5
        fence = waiter.fencing_token
        assert fence is not None
        assert fence > before
        # Validity counts from when the offer was sent, not from the release: the
        # second the holder kept the lock after it is gone (and the drift allowance).
        remaining = waiter.remaining()
        drift = 30 * 0.01 + 0.002
        assert 30 - (time.monotonic() - queued) - drift <= remaining <= 29.0 - drift
        assert waiter._hold is not None
        assert [await c.get(key(name)) for c in clients] == [waiter._hold.token] * 5
        pttls = [await c.pttl(key(name)) for c in clients]
        assert all(pttl >= remaining * 1000 for pttl in pttls), (pttls, remaining)
        await waiter.release()


async def test_a_grant_to_a_killed_process_is_undone_and_the_others_try_at_once(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    async with LockManager(urls) as holder_side, LockManager(urls) as waiter_side:
        holder = holder_side.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        worker = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), name, "1", *urls, stdout=PIPE
        )
        try:
            assert worker.stdout is not None
            assert await asyncio.wait_for(worker.stdout.readline(), 30) == b"waiting\n"
            await _offers(clients, name, 1)
            waiter = waiter_side.lock(name, ttl=30, auto_renew=False)
            waits = asyncio.create_task(waiter.acquire(timeout=20))
            await _offers(clients, name, 2)
        finally:
            worker.send_signal(signal.SIGKILL)
            await worker.wait()
        pubsub = clients[0].pubsub()
        await pubsub.subscribe(key(name) + ":released")
        released = time.monotonic()
        await holder.release()
        assert await asyncio.wait_for(waits, 20)
        waited = time.monotonic() - released
        # Its turn, but nobody heard the grant: the node took it back, took the dead
        # process out of line and told everyone the lock is free (not after FALLBACK).
        message = await _next(pubsub)
        await pubsub.aclose()
        assert message is not None
        assert message["data"] == b""
        assert waited < aiolock._waiting.turns.FALLBACK * 0.6
        assert seam.engine(waiter_side).turns is not None
        members = [await c.zrange(key(name) + ":turns", 0, -1) for c in clients]
        assert all(line in ([], [seam.member(waiter_side)]) for line in members)
        await waiter.release()


async def test_grants_lost_on_the_way_cost_one_attempt_not_a_fallback(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        line = await two_in_line(stack, urls, clients, name)
        holder, first, first_lock, first_waits = (
            line.holder,
            line.first,
            line.first_lock,
            line.first_waits,
        )
        second_lock, second_waits = line.second_lock, line.second_waits
        # The first in line loses three of the five grant messages: no quorum heard.
        lost: list[bytes] = []

        def losing(deliver: Callable[[bytes, bytes], None], channel: bytes, message: bytes) -> None:
            if b":turn:" in channel and len(lost) < 3:
                lost.append(message)
                return
            deliver(channel, message)

        _heard_through(first, losing)
        attempts = count_attempts(first)
        released = time.monotonic()
        await holder.release()
        assert await asyncio.wait_for(first_waits, 20)
        waited = time.monotonic() - released
        assert len(lost) == 3
        # Its head tried with the token it had offered (the nodes that granted it count
        # for it) once GRANT_WAIT passed; the second in line still waits its turn.
        assert attempts == [1]
        assert GRANT_WAIT * 0.9 < waited < aiolock._waiting.turns.FALLBACK
        assert not second_waits.done()
        await first_lock.release()
        assert await asyncio.wait_for(second_waits, 20)
        await second_lock.release()


async def test_a_waiter_that_leaves_as_the_lock_is_granted_gives_it_back_at_once(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        line = await two_in_line(stack, urls, clients, name)
        holder, first, first_waits = line.holder, line.first, line.first_waits
        second_lock, second_waits = line.second_lock, line.second_waits

        def cancelling(
            deliver: Callable[[bytes, bytes], None], channel: bytes, message: bytes
        ) -> None:
            if b":turn:" in channel:
                first_waits.cancel()  # before the grant is read: it comes to nobody
            deliver(channel, message)

        _heard_through(first, cancelling)
        released = time.monotonic()
        await holder.release()
        assert await asyncio.wait_for(second_waits, 20)
        # At once: not after FALLBACK, nor the granted token's 30 s.
        assert time.monotonic() - released < aiolock._waiting.turns.FALLBACK * 0.6
        assert first_waits.cancelled()
        assert second_lock._hold is not None
        assert [await c.get(key(name)) for c in clients].count(second_lock._hold.token) >= 3
        await second_lock.release()


# -- the scripts, on one node -------------------------------------------------------


def _turn_keys(name: str) -> list[str]:
    base = key(name)
    return [base, base + ":fence", base + ":turns", base + ":turns:live", base + ":turns:offers"]


async def _eval(client: redis.Redis, script: Script, keys: list[str], *args: Any) -> Any:
    return await client.eval(script.source.decode(), len(keys), *keys, *args)


async def _join(client: redis.Redis, name: str, member: str, place: int, ttl_ms: int) -> None:
    keys = _turn_keys(name)[2:]
    await _eval(
        client, TURN_JOIN_SCRIPT, keys, member, place, 60_000, 7, ttl_ms, 3_600_000, "tok-" + member
    )


async def test_an_offer_sits_at_its_place_on_the_node_and_a_refresh_without_one_withdraws_it(
    clients: list[redis.Redis], name: str
) -> None:
    # A process whose queue emptied and filled again joins with a new place; a node that
    # missed its leave (a partition) keeps its old entry, at the old place. Its offer
    # must sit there, where a release looks for the offer of the process it names, and a
    # refresh without an offer must withdraw it wherever the process sent it from. (The
    # simulation's rule "a refresh without an offer withdraws it", v2:13310562437074:
    # an offer sent from the old place stayed, beside the new one.)
    client = clients[0]
    turns, _live, offers = _turn_keys(name)[2:]
    await _join(client, name, "aa", 100, 5000)  # its first entry, with an offer
    await _eval(  # joined again from place 200, the node still has it at 100
        client,
        TURN_JOIN_SCRIPT,
        _turn_keys(name)[2:],
        "aa",
        200,
        60_000,
        8,
        5000,
        3_600_000,
        "tok-2",
    )
    assert await client.zscore(turns, "aa") == 100
    placed = await client.zrange(offers, 0, -1, withscores=True)
    assert [(o.split(b" ")[:2], score) for o, score in placed] == [([b"aa", b"8"], 100)]
    await _eval(client, TURN_JOIN_SCRIPT, _turn_keys(name)[2:], "aa", 200, 60_000)  # none
    assert await client.zrange(offers, 0, -1) == []


async def test_a_releaser_s_offer_sits_at_its_place_on_the_node_too(
    clients: list[redis.Redis], name: str
) -> None:
    # As TURN_JOIN's (above): the offer a release leaves for its process's next head goes
    # where the node has the process in line, and an earlier one is taken out.
    client = clients[0]
    keys = _turn_keys(name)
    floor = int(time.time() * 1_000_000)
    await _join(client, name, "aa", 100, 5000)  # in line at 100 on this node, an offer
    await client.set(key(name), "t", px=30_000)
    released = await _eval(
        client, RELEASE_TURN_SCRIPT, keys, "t", floor, 60_000, 200, "aa", 9, 5000, 3_600_000, "u"
    )
    assert released == 1
    placed = await client.zrange(keys[4], 0, -1, withscores=True)
    assert [(o.split(b" ")[:2], score) for o, score in placed] == [([b"aa", b"9"], 100)]
    # Without an offer (its process stopped offering): none is left.
    await client.set(key(name), "t", px=30_000)
    assert await _eval(client, RELEASE_TURN_SCRIPT, keys, "t", floor, 60_000, 200, "aa") == 1
    assert await client.zrange(keys[4], 0, -1) == []


async def test_the_release_script_grants_a_fresh_offer_and_names_a_stale_one(
    clients: list[redis.Redis], name: str
) -> None:
    client = clients[0]
    keys = _turn_keys(name)
    floor = int(time.time() * 1_000_000)
    pubsub = client.pubsub()
    await pubsub.subscribe(key(name) + ":released", key(name) + ":turn:aa")
    await client.set(key(name), "old", px=30_000)
    await _join(client, name, "aa", 1, 10_000)
    # Fresh (all of its ttl left): granted, told to that process alone.
    assert await _eval(client, RELEASE_TURN_SCRIPT, keys, "old", floor) == 1
    assert await client.get(key(name)) == b"tok-aa"
    assert 9_000 < await client.pttl(key(name)) <= 10_000
    message = await _next(pubsub)
    assert message is not None
    assert message["channel"] == (key(name) + ":turn:aa").encode()
    seq, fence = message["data"].split()
    assert seq == b"7"
    assert int(fence) >= floor
    assert int(await client.get(key(name) + ":fence")) == int(fence)
    # Used once: the next release of it names the process instead.
    assert await _eval(client, RELEASE_TURN_SCRIPT, keys, "tok-aa", floor) == 1
    assert await client.get(key(name)) is None
    message = await _next(pubsub)
    assert message is not None
    assert message["channel"] == (key(name) + ":released").encode()
    assert message["data"] == b"aa"
    # Stale (less than half its ttl left): named, not granted.
    await client.set(key(name), "old", px=30_000)
    await _join(client, name, "aa", 1, 1_000)
    await asyncio.sleep(0.6)
    assert await _eval(client, RELEASE_TURN_SCRIPT, keys, "old", floor) == 1
    assert await client.get(key(name)) is None
    await _expect(pubsub, b"aa")
    await pubsub.aclose()


async def test_the_release_script_undoes_a_grant_nobody_hears_and_skips_the_releaser(
    clients: list[redis.Redis], name: str
) -> None:
    client = clients[0]
    keys = _turn_keys(name)
    floor = int(time.time() * 1_000_000)
    pubsub = client.pubsub()
    await pubsub.subscribe(key(name) + ":released")
    # Nobody listens on the grant channel of "aa": undone, taken out of line, and
    # every process may try; also where the key had expired before its release.
    await _join(client, name, "aa", 1, 10_000)
    assert await _eval(client, RELEASE_TURN_SCRIPT, keys, "old", floor) == 0
    assert await client.get(key(name)) is None
    assert await client.zrange(key(name) + ":turns", 0, -1) == []
    await _expect(pubsub, b"")
    await client.set(key(name), "old", px=30_000)
    await _join(client, name, "aa", 1, 10_000)
    await _join(client, name, "bb", 2, 10_000)
    assert await _eval(client, RELEASE_TURN_SCRIPT, keys, "old", floor) == 1
    assert await client.get(key(name)) is None
    assert await client.zrange(key(name) + ":turns", 0, -1) == [b"bb"]
    await _expect(pubsub, b"")
    # The releasing process is next (alone in line): named, never granted (its streak
    # ends so that processes out of line get a chance).
    await client.set(key(name), "old", px=30_000)
    life, place, member = 60_000, 2, "bb"
    assert await _eval(client, RELEASE_TURN_SCRIPT, keys, "old", floor, life, place, member) == 1
    assert await client.get(key(name)) is None
    await _expect(pubsub, b"bb")
    await pubsub.aclose()


async def test_a_release_that_grants_deletes_nothing_and_finds_its_own_offer_once(
    clients: list[redis.Redis], name: str
) -> None:
    # The server's work on the path of a handoff between processes: the key is
    # overwritten with the grant, not deleted first, and a releaser still at its place
    # looks for its old offer there once. (Counted by the server: INFO commandstats
    # counts the commands a script calls.)
    client = clients[0]
    keys = _turn_keys(name)
    pubsub = client.pubsub()
    await pubsub.subscribe(key(name) + ":turn:bb")
    await _join(client, name, "aa", 1, 10_000)
    await _join(client, name, "bb", 2, 10_000)
    await client.set(key(name), "t", px=30_000)
    await client.config_resetstat()
    floor = int(time.time() * 1_000_000)
    released = await _eval(
        client, RELEASE_TURN_SCRIPT, keys, "t", floor, 60_000, 1, "aa", 9, 5000, 3_600_000, "u"
    )
    stats = await client.info("commandstats")
    assert released == 1
    assert await client.get(key(name)) == b"tok-bb"  # granted
    message = await _next(pubsub)
    assert message is not None
    assert message["channel"] == (key(name) + ":turn:bb").encode()
    assert "cmdstat_del" not in stats
    # The expired entries, the releaser's old offer, the next in line, its offer.
    assert stats["cmdstat_zrangebyscore"]["calls"] == 4
    await pubsub.aclose()


async def test_an_attempt_with_the_token_granted_to_it_wins_and_resets_the_expiry(
    clients: list[redis.Redis], name: str
) -> None:
    client = clients[0]
    floor = int(time.time() * 1_000_000)
    await client.set(key(name), "granted", px=5_000)
    await client.set(key(name) + ":fence", floor - 10)
    keys = [key(name), key(name) + ":fence"]
    reply = await _eval(client, ACQUIRE_SCRIPT, keys, "granted", 30_000, 3_600_000, floor)
    assert reply == floor
    assert 29_000 < await client.pttl(key(name)) <= 30_000
    other = await _eval(client, ACQUIRE_SCRIPT, keys, "other", 30_000, 3_600_000, floor)
    assert other[0] == 0


# -- counting grants (pure logic) ---------------------------------------------------


class _Node:
    def __init__(self) -> None:
        self.calls: list[tuple[bytes, tuple[bytes, ...]]] = []

    set_ifeq = False

    def call_script(self, script: Script, args: tuple[bytes, ...], _callback: Any) -> None:
        self.calls.append((script.sha, args))


class _Quorum:
    n = 5
    quorum = 3

    def __init__(self, veto: Callable[[int], BaseException | None] | None = None) -> None:
        self.nodes = [_Node() for _ in range(5)]
        self.veto = veto

    def expiry(self, start: float, ttl: float) -> float:
        return start + ttl - 0.1

    def clock(self) -> float:
        return time.monotonic()


async def test_a_quorum_of_equal_grants_is_delivered_and_late_ones_follow_the_holder() -> None:
    quorum = _Quorum()
    grants = Grants(quorum)  # type: ignore[arg-type]
    head = Taker(b"t", 10.0)
    woken: list[int] = []
    sent = time.monotonic() - 1.0
    for node in (0, 1):
        grants.heard(node, b"k", (b"t", 10.0, sent), 42, head=head, wake=lambda: woken.append(1))
        assert not head.future.done()
    grants.heard(2, b"k", (b"t", 10.0, sent), 42, head=head, wake=lambda: woken.append(1))
    outcome = head.future.result()
    assert outcome.fence == 42
    assert outcome.start == sent  # validity from the offer's sending
    assert outcome.expires_at == sent + 10.0 - 0.1
    assert woken
    # Taken: a late grant from another node is kept while the lock is held...
    grants.settled(b"t", b"k", outcome)
    grants.heard(3, b"k", (b"t", 10.0, sent), 42, head=None, wake=lambda: None)
    assert not any(node.calls for node in quorum.nodes)
    # ...and given back on that node alone once it was let go.
    grants.forget(b"t")
    grants.heard(4, b"k", (b"t", 10.0, sent), 42, head=None, wake=lambda: None)
    assert [len(node.calls) for node in quorum.nodes] == [0, 0, 0, 0, 1]
    assert quorum.nodes[4].calls[0] == (RELEASE_SCRIPT.sha, (b"1", b"k", b"t", NOT_FREE))
    # A node that counted is never given back.
    grants.heard(1, b"k", (b"t", 10.0, sent), 42, head=None, wake=lambda: None)
    assert len(quorum.nodes[1].calls) == 0


async def test_grants_from_nodes_the_heads_own_clean_up_released_never_count() -> None:
    """Found by the simulation: the head's own failed attempt, with the offer's token,
    releases it on nodes 0 and 1, grants included. Their grants, heard before or
    (pub/sub being another connection) after, never count again."""
    sent = time.monotonic()
    grants = Grants(_Quorum())  # type: ignore[arg-type]
    head = Taker(b"t", 10.0)
    woken: list[int] = []
    for node in (0, 1):
        grants.heard(node, b"k", (b"t", 10.0, sent), 42, head=head, wake=lambda: woken.append(1))
    grants.undone(b"t", [0, 1])
    # Node 1's grant message, late: the grant it announces was deleted meanwhile.
    grants.heard(1, b"k", (b"t", 10.0, sent), 42, head=head, wake=lambda: woken.append(1))
    grants.heard(2, b"k", (b"t", 10.0, sent), 42, head=head, wake=lambda: woken.append(1))
    grants.heard(3, b"k", (b"t", 10.0, sent), 42, head=head, wake=lambda: woken.append(1))
    assert not head.future.done()  # 2 grants that count: the head tries itself
    assert woken
    grants.heard(4, b"k", (b"t", 10.0, sent), 42, head=head, wake=lambda: woken.append(1))
    assert head.future.done()  # nodes 2, 3 and 4
    assert {i for i, yes in enumerate(head.future.result().votes.verdicts) if yes} == {2, 3, 4}


async def test_grants_that_disagree_or_come_from_quarantined_nodes_are_left_to_an_attempt() -> None:
    sent = time.monotonic()
    # Fencing tokens that differ: the head settles them with an attempt of its own.
    grants = Grants(_Quorum())  # type: ignore[arg-type]
    head = Taker(b"t", 10.0)
    woken: list[int] = []
    for node, fence in ((0, 41), (1, 42), (2, 42)):
        grants.heard(node, b"k", (b"t", 10.0, sent), fence, head=head, wake=lambda: woken.append(1))
    assert not head.future.done()
    assert woken
    # A node in its restart quarantine does not count.
    grants = Grants(_Quorum(veto=lambda i: RuntimeError() if i == 0 else None))  # type: ignore[arg-type]
    head = Taker(b"t", 10.0)
    for node in (0, 1, 2):
        grants.heard(node, b"k", (b"t", 10.0, sent), 42, head=head, wake=lambda: None)
    assert not head.future.done()
    grants.heard(3, b"k", (b"t", 10.0, sent), 42, head=head, wake=lambda: None)
    assert head.future.done()
    assert {head.future.result().votes.verdicts[i] for i in (1, 2, 3)} == {True}


async def test_a_grant_for_a_waiter_that_is_gone_is_given_back_everywhere() -> None:
    quorum = _Quorum()
    grants = Grants(quorum)  # type: ignore[arg-type]
    other_head = Taker(b"u", 10.0)
    grants.heard(0, b"k", (b"t", 10.0, time.monotonic()), 42, head=other_head, wake=lambda: None)
    assert [len(node.calls) for node in quorum.nodes] == [1] * 5
    assert quorum.nodes[0].calls[0] == (RELEASE_SCRIPT.sha, (b"1", b"k", b"t"))
    # A waiter that leaves after grants came, without the lock: given back too.
    head = Taker(b"v", 10.0)
    grants.heard(0, b"k", (b"v", 10.0, time.monotonic()), 42, head=head, wake=lambda: None)
    grants.settled(b"v", b"k", None)
    assert [len(node.calls) for node in quorum.nodes] == [2] * 5
