"""The head of a process's queue as its process gives way, leaves, or is named."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

import pytest
import redis.asyncio as redis

import aiolock
import aiolock._lua
import aiolock._waiting.head
import aiolock._waiting.queue
import aiolock._waiting.turns
import aiolock._waiting.waiting
from aiolock import LockManager
from aiolock._waiting.waiting import LOCAL_STREAK
from aiolock.testing import nemesis

from .. import seam
from ..conftest import in_line, key, two_in_line
from .conftest import (
    _as_refused,
    _attempt_times,
    _hears_late,
    _holder_and_line,
    _intercept,
    _named_first,
    _no_refresh_meanwhile,
    _pubsub_refused,
    _release_subscription,
    _then_the_head,
)


async def test_a_head_cancelled_while_subscribing_leaves_its_place_in_line_to_the_next(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    async with LockManager(urls) as holder_side, LockManager(urls) as locks:
        holder = holder_side.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        waiting = seam.engine(locks).waiting
        subscribe = waiting._subscribe
        gate = asyncio.Event()

        async def slow_subscribe(queue: Any, grants: bytes | None) -> None:
            await subscribe(queue, grants)
            await gate.wait()  # the first head is cancelled here, before it joins

        waiting._subscribe = slow_subscribe  # type: ignore[method-assign]
        first = asyncio.create_task(locks.lock(name, ttl=30).acquire(timeout=20))
        await asyncio.sleep(0.2)
        second_lock = locks.lock(name, ttl=30, auto_renew=False)
        second = asyncio.create_task(second_lock.acquire(timeout=20))
        await asyncio.sleep(0.2)
        first.cancel()
        # The next head joins the turn queue in its place.
        assert len(await in_line(clients, name, 1)) == 1
        released = time.monotonic()
        await holder.release()
        assert await asyncio.wait_for(second, 20)
        assert time.monotonic() - released < aiolock._waiting.turns.FALLBACK * 0.6  # its turn
        await second_lock.release()


@pytest.mark.usefixtures("naming_only")
async def test_a_head_that_leaves_as_its_process_gives_way_does_not_beat_the_process_named(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 549756914144, no fault; and, where
    # pub/sub is refused, seed 549755934222). A release at the end of its process's
    # streak named another process; in that instant the process's head was cancelled
    # (its operation's timeout), and the waiter after it, head now, tried at once: its
    # attempt followed the release on every connection and won, before the process
    # named had heard it was its turn. The streak began again: 8 holdings in a row.
    monkeypatch.setattr(aiolock._waiting.waiting, "LOCAL_STREAK", 0)  # each release gives way
    async with LockManager(urls) as busy, LockManager(urls) as other:
        queue = key(name).encode()
        holder = busy.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        head = asyncio.create_task(busy.lock(name, ttl=30).acquire(timeout=20))
        while seam.waiters(busy, queue) < 1:
            await asyncio.sleep(0.001)
        behind = busy.lock(name, ttl=30, auto_renew=False)
        behind_waits = asyncio.create_task(behind.acquire(timeout=20))
        while seam.waiters(busy, queue) < 2:
            await asyncio.sleep(0.001)
        named = other.lock(name, ttl=30, auto_renew=False)
        named_waits = asyncio.create_task(named.acquire(timeout=20))
        await in_line(clients, name, 2)  # both processes in line
        # The process named hears its turn 10 ms late (a network further away), so
        # that a waiter of the busy process trying at once wins every time; waiting
        # 50 ms first, it loses every time (without the delay: a race).
        _hears_late(other, 0.01)
        waiting = seam.engine(busy).waiting
        released = waiting.released

        def gives_way(*args: Any, **kwargs: Any) -> Any:
            local = released(*args, **kwargs)
            assert local is False  # the release names the other process
            head.cancel()  # and the busy process's head leaves in that instant
            return local

        waiting.released = gives_way  # type: ignore[method-assign]
        await holder.release()
        with pytest.raises(asyncio.CancelledError):
            await head
        # The process named takes the lock (broken: the waiter behind the head
        # took it, and the named one timed out).
        assert await asyncio.wait_for(named_waits, 20)
        assert not behind_waits.done()
        await named.release()
        assert await asyncio.wait_for(behind_waits, 20)
        await behind.release()


@pytest.mark.usefixtures("naming_only", "giving_way")
async def test_a_head_still_subscribing_as_its_process_gives_way_does_not_beat_the_process_named(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation's streak rule (seed 35184372089874, no fault, on a trial of
    # the renewer). The first waiter of a process was still subscribing when its
    # process's release, at the streak's end, named another process. Its subscription
    # in place, the head tried at once: its attempt followed the release on every
    # connection and won, before the process named had heard it was its turn.
    async with LockManager(urls) as busy, LockManager(urls) as other:
        holder = busy.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        named = other.lock(name, ttl=30, auto_renew=False)
        named_waits = asyncio.create_task(named.acquire(timeout=20))
        await in_line(clients, name, 1)
        waiting = seam.engine(busy).waiting
        subscribe = waiting._subscribe
        subscribing, gate = asyncio.Event(), asyncio.Event()

        async def slow_subscribe(queue: Any, grants: bytes | None) -> None:
            await subscribe(queue, grants)
            subscribing.set()
            await gate.wait()  # the release comes here

        waiting._subscribe = slow_subscribe  # type: ignore[method-assign]
        head = busy.lock(name, ttl=30, auto_renew=False)
        head_waits = asyncio.create_task(head.acquire(timeout=20))
        await asyncio.wait_for(subscribing.wait(), 20)
        # The process named hears its turn 10 ms late (a network further away): a head
        # that tries as its subscription is in wins (without the delay: a race).
        _hears_late(other, 0.01)
        await holder.release()  # names the other process
        gate.set()
        # The process named takes the lock (broken: the head took it).
        await _named_first(named_waits, head_waits, "the head took the lock first")
        await named.release()
        assert await asyncio.wait_for(head_waits, 20)
        await head.release()


@pytest.mark.usefixtures("naming_only")
async def test_a_named_process_that_holds_past_the_fallback_stays_in_line(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule, in its first schedules focused on turns
    # (seed 549755813917, no fault). A release named a process, which took the lock and
    # held it longer than FALLBACK; the other waiting process heard no later release,
    # "passed over" the process holding the lock and took it out of the line. Until it
    # refreshed its entry, handoffs found nobody else in line: the other process, next
    # to hold, handed the lock to its own waiters 7 times while the first one waited
    # (the promise is at most LOCAL_STREAK).
    _no_refresh_meanwhile(monkeypatch)
    # A process taken out of line joins again at once since (it is told): that it was
    # never taken out is read from what it was told, too.
    told: list[aiolock._waiting.turns.TurnEntry] = []
    taken_out = aiolock._waiting.turns.TurnEntry.taken_out

    def noted(entry: aiolock._waiting.turns.TurnEntry) -> None:
        told.append(entry)
        taken_out(entry)

    monkeypatch.setattr(aiolock._waiting.turns.TurnEntry, "taken_out", noted)
    async with contextlib.AsyncExitStack() as stack:
        line = await two_in_line(stack, urls, clients, name)
        named = seam.engine(line.first).turns
        assert named is not None
        # The first process has a second waiter: it wants the lock after this holding.
        again = line.first.lock(name, ttl=30, auto_renew=False)
        again_waits = asyncio.create_task(again.acquire(timeout=20))
        while seam.waiters(line.first, key(name).encode()) < 2:
            await asyncio.sleep(0.001)
        await line.holder.release()  # names the first process, which takes the lock
        assert await asyncio.wait_for(line.first_waits, 20)
        # Held for twice the fallback: the second process's fallback has fired.
        await asyncio.sleep(2 * aiolock._waiting.turns.FALLBACK * 1.1)
        assert not line.second_waits.done()  # (its attempt failed: the lock is held)
        turns = key(name) + ":turns"
        for client in clients:
            # Still in line on every node (broken: taken out on all three).
            assert await client.zscore(turns, named.member) is not None
        assert not told  # (and never taken out meanwhile)
        await line.first_lock.release()
        assert await asyncio.wait_for(again_waits, 20)
        await again.release()
        assert await asyncio.wait_for(line.second_waits, 20)
        await line.second_lock.release()


@pytest.mark.usefixtures("naming_only")
async def test_a_named_process_taken_out_of_line_as_its_lock_expired_joins_again_at_once(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 35184372089874, no fault). A release
    # named a process, which took the lock and held it, unrenewed, past its ttl: it
    # expired just before the other process's fallback fired, and the next waiter of the
    # process named, which had read the holder's PTTL, was to try a little later. The
    # other process found the lock free, took the one named out of the line (as far as
    # it could tell, it had not used its turn) and took the lock. The one named, alive
    # and waiting, was out of line until its next refresh: the other handed the lock to
    # its own waiters 8 times in a row meanwhile. A process taken out of line is told,
    # and joins again at its place at once.
    _no_refresh_meanwhile(monkeypatch)
    # The waiter of the process named tries after the other's fallback (0.5 s), though
    # the holder's key expired before it (0.3 s).
    monkeypatch.setattr(aiolock._waiting.head, "EXPIRY_SLACK", 1.0)
    async with contextlib.AsyncExitStack() as stack:
        line = await two_in_line(stack, urls, clients, name, first_ttl=0.3)
        named, short, other_lock = line.first, line.first_lock, line.second_lock
        await line.holder.release()  # names the process first in line, which takes it
        assert await asyncio.wait_for(line.first_waits, 20)
        # The process named waits again, in line, while its lock runs out.
        again = named.lock(name, ttl=30, auto_renew=False)
        again_waits = asyncio.create_task(again.acquire(timeout=20))
        await in_line(clients, name, 2)
        # The other's fallback finds the lock free, takes the process named out of the
        # line, and takes the lock.
        assert await asyncio.wait_for(line.second_waits, 20)
        assert not again_waits.done()
        turns = key(name) + ":turns"
        member = seam.member(named) if seam.engine(named).turns is not None else b""
        deadline = time.monotonic() + 2.0  # (the next refresh is 5 s away)
        while True:
            scores = [await client.zscore(turns, member) for client in clients]
            if all(score is not None for score in scores):
                break  # back in line on every node (broken: out until refresh)
            assert time.monotonic() < deadline, scores
            await asyncio.sleep(0.01)
        await other_lock.release()  # names the process back in line
        assert await asyncio.wait_for(again_waits, 20)
        await again.release()
        with contextlib.suppress(aiolock.LockNotOwned):
            await short.release()


@pytest.mark.usefixtures("naming_only", "giving_way")
async def test_a_head_whose_subscription_is_confirmed_as_its_process_gives_way_does_not_try(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation's streak rule (seed 17592266044573, subscriptions held
    # back). A head whose subscription a node confirmed only after its first attempt
    # tries again when the confirmation comes (a release in between went unheard). One
    # came just as its process's release, at the streak's end, named the other
    # process: the head tried at once, its attempt followed the release on every
    # connection and won, and its process held the name 8 times in a row.
    async with (
        nemesis(urls) as net,
        LockManager(net.urls) as busy,
        LockManager(urls) as other,
    ):
        holder = busy.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        named = other.lock(name, ttl=30, auto_renew=False)
        named_waits = asyncio.create_task(named.acquire(timeout=20))
        await in_line(clients, name, 1)
        for proxy in net:  # the head's subscriptions to the releases wait
            proxy.hold(_release_subscription, math.inf)
        head = busy.lock(name, ttl=30, auto_renew=False)
        head_waits = asyncio.create_task(head.acquire(timeout=20))
        await in_line(clients, name, 2)  # the confirmations' wait timed out; it joined
        # The process named hears its turn 10 ms late (a network further away): a head
        # that tries as the confirmations come wins (without the delay: a race).
        _hears_late(other, 0.01)
        await holder.release()  # names the other process
        for proxy in net:  # and the confirmations come
            proxy.flush()
        # The process named takes the lock (broken: the head took it).
        await _named_first(named_waits, head_waits, "the head took the lock first")
        net.clear()
        await named.release()
        assert await asyncio.wait_for(head_waits, 20)
        await head.release()


@pytest.mark.usefixtures("naming_only", "giving_way")
async def test_a_head_woken_before_its_process_gives_way_does_not_try_again_after_it(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation's streak rule (seed 17592286046564, no fault). A head's
    # attempt was under way when a second message woke it again (a shortening
    # extend() announced by three nodes; the first had started the attempt), and
    # meanwhile its process's release, at the streak's end, named the other process.
    # The attempt failed (the lock was still ours when it arrived); woken already,
    # the head tried again at once, after our release on every connection, and won:
    # its process held the name 8 times in a row. Whatever woke it came before our
    # release, and is stale after it.
    channel = (key(name) + ":released").encode()
    async with (
        nemesis(urls) as net,
        LockManager(net.urls, node_timeout=2.0) as busy,
        LockManager(urls) as other,
    ):
        holder, line = await _holder_and_line(busy, other, clients, name)
        _, named_waits, _, head_waits = line
        tries = _attempt_times(busy)
        # The process named hears its turn 1 s late: a head that tries again when its
        # attempt returns wins (without the delay: a race).
        _hears_late(other, 1.0)
        heard: list[bytes] = []  # what the busy process heard

        def noted(channel: bytes, message: bytes) -> None:
            heard.append(message)
            on_busy(channel, message)

        on_busy = _intercept(busy, noted)
        for proxy in net:  # the busy process's replies take 0.3 s
            proxy.delay_replies(0.3, links=lambda link: link.kind == "commands")
        for client in clients:  # wakes the head, on the first node it listens on
            if await client.publish(channel, aiolock._lua.SHORTENED):
                break
        while not tries:
            await asyncio.sleep(0.001)
        for client in clients:  # wakes it again while its attempt is under way
            await client.publish(channel, aiolock._lua.SHORTENED)
        while len(heard) < 1 + 3:  # (it listens on 3 nodes of 5: n - quorum + 1)
            await asyncio.sleep(0.001)
        assert tries[-1] > time.monotonic() - 0.2  # (its attempt is still under way)
        await holder.release()  # names the other process; returns after the attempt
        # The process named takes the lock (broken: the head took it, trying
        # again 0.3 s after our release).
        await _named_first(named_waits, head_waits, f"the head took it; its tries: {tries}")
        net.clear()
        await _then_the_head(line)


@pytest.mark.usefixtures("naming_only", "giving_way")
async def test_a_shortening_heard_after_its_process_gives_way_does_not_wake_the_head(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation's streak rule (seed 140737492368453, no fault). A holder
    # shortened its lock with extend() and released it at once, its release ending
    # its process's streak (naming the other process). The nodes' announcement of the
    # shortening reached the process only after its release had gone out (pub/sub is
    # another connection): it woke the head, whose attempt followed the release on
    # every connection and won. Its process held the name 8 times in a row. The
    # shortening came before our release, and is stale after it.
    async with LockManager(urls) as busy, LockManager(urls) as other:
        holder, line = await _holder_and_line(busy, other, clients, name)
        _, named_waits, _, head_waits = line
        # The process named hears its turn 0.5 s late: a head woken at our release
        # wins (without the delay: a race).
        _hears_late(other, 0.5)
        held_back: list[tuple[bytes, bytes]] = []  # the busy process's shortenings

        def holding(channel: bytes, message: bytes) -> None:
            if message == aiolock._lua.SHORTENED:
                held_back.append((channel, message))
            else:
                on_busy(channel, message)

        on_busy = _intercept(busy, holding)
        await holder.extend(20)  # announced: the head would learn the new PTTL
        while len(held_back) < 3:  # (it listens on 3 nodes of 5: n - quorum + 1)
            await asyncio.sleep(0.001)
        await holder.release()  # names the other process
        for message in held_back:  # and the shortening is heard only now
            on_busy(*message)
        # The process named takes the lock (broken: the head took it at once).
        await _named_first(named_waits, head_waits, "the head took the lock first")
        await _then_the_head(line)


async def test_a_head_holding_back_that_a_release_of_ours_hands_the_lock_sends_nothing_of_its_own(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation (seed 8796103035398: exclusion, fencing, kept). Where
    # pub/sub is refused, a head that polls holds back after its process gave way. A
    # release of ours in that window claimed the head's offer and passed the lock to its
    # token; woken, the head tried with the same token all the same. Its attempt failed
    # (the lock was still the releaser's), and its clean-up, sent after the handoff on
    # the nodes that had not answered yet, deleted the key the handoff had set there:
    # the head took the handoff's outcome and held a lock kept on one node of five.
    monkeypatch.setattr(aiolock._waiting.queue, "GAVE_WAY_POLL", 3.0)  # the window, made wide
    async with (
        _pubsub_refused(clients, urls),
        nemesis(urls) as net,
        LockManager(_as_refused(net.urls), node_timeout=1.0) as ours,
    ):
        first = ours.lock(name, ttl=30, auto_renew=False)
        assert await first.acquire(timeout=0)
        head = ours.lock(name, ttl=30, auto_renew=False)
        head_waits = asyncio.create_task(head.acquire(timeout=20))
        await in_line(clients, name, 1)
        monkeypatch.setattr(aiolock._waiting.waiting, "LOCAL_STREAK", 0)
        await first.release()  # gives way (to nobody): the head holds back from its poll
        monkeypatch.setattr(aiolock._waiting.waiting, "LOCAL_STREAK", LOCAL_STREAK)
        await asyncio.sleep(3 * aiolock._waiting.queue.POLL_INTERVAL)
        assert not head_waits.done()
        second = ours.lock(name, ttl=30, auto_renew=False)
        assert await second.acquire(timeout=0)  # (timeout=0 tries at once)
        # Nodes 4 and 5 hold another token; nodes 2 and 3 answer us 0.2 s late. The
        # handoff wins on nodes 1 to 3; an attempt of the head's own would be decided
        # (lost) by nodes 1, 4 and 5 and clean up on 2 and 3, after the handoff there.
        for client in clients[3:]:
            await client.set(key(name), b"another", xx=True, px=30_000)
        for proxy in net[1:3]:
            proxy.delay_replies(0.2, links=lambda link: link.kind == "commands")
        await second.release()
        assert await asyncio.wait_for(head_waits, 20)
        assert head._hold is not None
        tokens = [await c.get(key(name)) for c in clients]
        # Held where the head believes it is: on nodes 1 to 3 (broken: node 1).
        assert tokens[:3] == [head._hold.token] * 3, tokens
        for client in clients[3:]:
            await client.delete(key(name))
        net.clear()
        await head.release()
