"""Offers and grants as pub/sub comes late, drops, or is refused."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

import pytest
import redis.asyncio as redis

import aiolock
import aiolock._waiting.queue
import aiolock._waiting.turns
import aiolock._waiting.waiting
from aiolock import LockManager
from aiolock._core.keys import turn_keys
from aiolock._lua import TURN_LEAVE_SCRIPT
from aiolock.testing import command, nemesis

from .. import seam
from ..conftest import in_line, key
from ..test_failures import MINIMAL_ACL
from .conftest import (
    _as_refused,
    _attempt_times,
    _expired_then_taken,
    _grant_subscription,
    _named_first,
    _offer_seqs,
    _pubsub_refused,
    _until_firm,
    _waiting_behind,
)


async def test_a_process_that_learns_late_that_pubsub_is_refused_stops_offering(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 4398046823285, every node refusing
    # pub/sub): a head joined the turn queue before the refusals of its subscriptions
    # came back (the head before it had been cancelled), and its process went on
    # offering to take grants it could never hear. A release granted it the lock, heard
    # nobody, undid the grant and took the process out of line; the other process, alone
    # in line as far as its handoffs could see, kept the lock 8 times in a row.
    learnt = False
    refused = aiolock._waiting.queue.Queue.polling

    def polling(queue: aiolock._waiting.queue.Queue) -> bool:  # the refusals come back late
        return learnt and refused(queue)

    monkeypatch.setattr(aiolock._waiting.queue.Queue, "polling", polling)
    offers = key(name) + ":turns:offers"
    async with (
        _pubsub_refused(clients, urls) as limited,
        LockManager(limited) as holder_side,
        LockManager(limited) as waiter_side,
    ):
        holder, _, waits = await _waiting_behind(holder_side, waiter_side, clients, name)
        assert [await c.zcard(offers) for c in clients] == [1] * 5  # offered, unaware
        learnt = True
        await asyncio.sleep(aiolock._waiting.turns.REFRESH * 1.5)  # its entry refreshed since
        # No offer left, none made again (broken: its refresh made it anew).
        assert [await c.zcard(offers) for c in clients] == [0] * 5
        waits.cancel()  # (it slept on the PTTL, believing it would hear the release)
        with contextlib.suppress(asyncio.CancelledError):
            await waits
        await holder.release()


async def test_a_head_that_learns_pubsub_is_refused_after_offering_withdraws_the_offer_at_once(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 17592186151447, every node refusing
    # pub/sub, no fault): a head joined the line before the refusals of its
    # subscriptions came back, and offered to take grants. The refusals withdrew its
    # offers only at the entry's next refresh (0.5 s later). Meanwhile the other
    # process's release, at the end of its streak, granted the lock to that offer,
    # heard nobody, undid the grant and took the process out of line: the other
    # process, alone in line as its handoffs saw it, held the name 8 times in a row.
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 5.0)  # (a refresh withdraws it too)
    offers = key(name) + ":turns:offers"
    async with (
        _pubsub_refused(clients, urls) as refused,
        nemesis(urls) as net,
        LockManager(refused) as holder_side,
        LockManager(_as_refused(net.urls), node_timeout=0.05) as waiter_side,
    ):
        for proxy in net:  # the refusals come 0.3 s late; the head waits 0.1 s for them
            proxy.delay_replies(0.3, links=lambda link: link.kind == "pubsub")
        holder, waiter, waits = await _waiting_behind(holder_side, waiter_side, clients, name)
        assert [await c.zcard(offers) for c in clients] == [1] * 5  # offered, unaware
        await asyncio.sleep(0.8)
        # Withdrawn once the refusals came (broken: at the refresh, 5 s on).
        assert [await c.zcard(offers) for c in clients] == [0] * 5
        assert not waits.done()
        await holder.release()
        assert await asyncio.wait_for(waits, 20)  # (it polls)
        await waiter.release()


async def test_a_grant_unheard_because_our_subscription_is_not_in_place_yet_keeps_us_in_line(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 17592196048300, subscriptions held
    # back, no message lost): a process offered in the same instant it subscribed to
    # its grants. A release granted the lock to the offer before the nodes had that
    # subscription: nobody heard it, so it was undone and the process taken out of
    # line, as a dead one is; the other process, alone in line as its handoffs saw
    # it, then held the name 8 times in a row. An offer sent before every node
    # confirmed the subscription is tentative: its grant, unheard, is undone, but the
    # process stays in line.
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 5.0)  # (a refresh puts it back too)
    turns = key(name) + ":turns"

    async with (
        nemesis(urls) as net,
        LockManager(urls) as holder_side,
        LockManager(net.urls, node_timeout=0.05) as waiter_side,
    ):
        # A wait for another name keeps the pub/sub connections open: each channel
        # below is then subscribed by a command of its own.
        _, _, elsewhere = await _waiting_behind(holder_side, waiter_side, clients, name + "-x")
        for proxy in net:  # the grants' subscriptions do not get through (yet)
            proxy.hold(_grant_subscription, math.inf)
        holder, first, first_waits = await _waiting_behind(holder_side, waiter_side, clients, name)
        second = waiter_side.lock(name, ttl=30, auto_renew=False)
        second_waits = asyncio.create_task(second.acquire(timeout=20))
        offers = [await c.zrange(turns + ":offers", 0, -1) for c in clients]
        assert all(len(o) == 1 and o[0].split(b" ")[1].endswith(b"*") for o in offers), offers
        member = seam.member(waiter_side)  # type: ignore[union-attr]
        await holder.release()  # grants to the offer: nobody hears it, undone
        assert await asyncio.wait_for(first_waits, 20)  # (the release let all try)
        # Still in line on every node (broken: taken out of every line,
        # until its refresh).
        assert [await c.zrange(turns, 0, -1) for c in clients] == [[member]] * 5
        for proxy in net:
            proxy.clear()
            proxy.flush()
        await first.release()
        assert await asyncio.wait_for(second_waits, 20)
        await second.release()
        elsewhere.cancel()


async def test_a_process_subscribes_to_its_grants_before_it_joins_the_line(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # The subscription to the grants goes out with the release channels, before the
    # wait for their confirmations and the head's first attempt, so that every node
    # normally has it by the time the process joins: its first TURN_JOIN then carries a
    # firm offer (one script per node, as before the fix for seed 17592196048300).
    # Subscribed only as it joined, its offer would be tentative every time, and sent
    # again once confirmed.
    async with LockManager(urls) as holder_side, LockManager(urls) as waiter_side:
        waiting = seam.engine(waiter_side).waiting
        join = waiting._join
        subscribed: list[bool] = []  # as it joins: already subscribed to the grants?

        def noted(lock_key: bytes, queue: Any) -> None:
            subscribed.append(queue.grants is not None)
            join(lock_key, queue)

        waiting._join = noted  # type: ignore[method-assign]
        holder, waiter, waits = await _waiting_behind(holder_side, waiter_side, clients, name)
        assert subscribed == [True], subscribed
        await holder.release()
        assert await asyncio.wait_for(waits, 20)
        await waiter.release()


async def test_a_tentative_offer_is_made_firm_as_soon_as_every_node_confirms(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tentative offer (see above) waits for no refresh: once the last node confirms
    # the subscription, the process sends its entry again with the offer firm, so that
    # a process killed in between is taken out of line by a grant it cannot hear.
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 5.0)
    async with (
        nemesis(urls) as net,
        LockManager(urls) as holder_side,
        LockManager(net.urls, node_timeout=0.05) as waiter_side,
    ):
        _, _, elsewhere = await _waiting_behind(holder_side, waiter_side, clients, name + "-x")
        net[2].hold(_grant_subscription, 0.3)  # one node confirms 0.3 s late
        holder, waiter, waits = await _waiting_behind(holder_side, waiter_side, clients, name)
        seqs = await _offer_seqs(clients, name)
        assert all(seq.endswith(b"*") for seq in seqs), seqs
        await asyncio.sleep(0.6)
        # Firm on every node (broken: tentative until the refresh, 5 s on).
        seqs = await _offer_seqs(clients, name)
        assert not any(seq.endswith(b"*") for seq in seqs), seqs
        await holder.release()
        assert await asyncio.wait_for(waits, 20)
        await waiter.release()
        elsewhere.cancel()


@pytest.mark.parametrize("refused", ["connections-dropped", "open-connections"])
async def test_a_head_whose_pubsub_is_refused_after_its_offer_was_firm_withdraws_it(
    urls: list[str],
    clients: list[redis.Redis],
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    refused: str,
) -> None:
    # As above, but pub/sub is refused only after the offer was made firm (an ACL
    # changed): no confirmation is pending any more to send the entry again, and the
    # head withdraws the offer before its attempt. The refusal comes on connections
    # that dropped and came back (which, since they ask for the grants again,
    # Queue.reset, also send the entry again without the offer as the refusal confirms
    # them), or as a reply on the open connections (the next SUBSCRIBE, for another
    # name, is refused): there only the head's withdrawal takes the offer back.
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 5.0)
    offers = key(name) + ":turns:offers"
    for client in clients:
        await client.execute_command("ACL", "SETUSER", "aiolock", *MINIMAL_ACL.split())
    try:
        async with (
            nemesis(urls) as net,
            LockManager(urls) as holder_side,
            LockManager(_as_refused(net.urls), node_timeout=0.05) as waiter_side,
        ):
            holder, waiter, waits = await _waiting_behind(holder_side, waiter_side, clients, name)
            await _until_firm(clients, name)
            elsewhere = holder_side.lock(name + "-x", ttl=30, auto_renew=False)
            assert await elsewhere.acquire(timeout=0)
            other = waiter_side.lock(name + "-x", ttl=30, auto_renew=False)
            for client in clients:
                await client.execute_command("ACL", "SETUSER", "aiolock", "-subscribe")
            other_waits = None
            if refused == "connections-dropped":
                for proxy in net:
                    for link in proxy.links:
                        if link.kind == "pubsub" and not link.closed:
                            link.drop()
            else:  # (its SUBSCRIBE is refused)
                other_waits = asyncio.create_task(other.acquire(timeout=20))
            await asyncio.sleep(0.8)
            # Withdrawn at the head's attempt after the refusal (broken: at the
            # refresh, 5 s on).
            assert [await c.zcard(offers) for c in clients] == [0] * 5
            assert not waits.done()
            await holder.release()
            assert await asyncio.wait_for(waits, 20)  # (it polls)
            await waiter.release()
            await elsewhere.release()
            if other_waits is not None:
                assert await asyncio.wait_for(other_waits, 20)
                await other.release()
    finally:
        for client in clients:
            await client.execute_command("ACL", "DELUSER", "aiolock")


async def test_where_pubsub_is_refused_a_process_that_gave_way_lets_the_one_named_try_first(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 1099511628058, every node refusing
    # pub/sub: an ACL without +subscribe). There every head polls, and hears no release:
    # at the end of its process's streak, a release named the other process, and the
    # process's own head, its poll due just then, tried and won; the process named,
    # whose poll came later, never had its turn (8 holdings in a row).
    monkeypatch.setattr(aiolock._waiting.waiting, "LOCAL_STREAK", 0)  # each release gives way
    poll = aiolock._waiting.queue.POLL_INTERVAL
    async with (
        _pubsub_refused(clients, urls) as limited,
        LockManager(limited) as busy,
        LockManager(limited) as other,
    ):
        holder = busy.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        named = other.lock(name, ttl=30, auto_renew=False)
        named_waits = asyncio.create_task(named.acquire(timeout=20))
        await in_line(clients, name, 1)
        tries = _attempt_times(busy)
        head = busy.lock(name, ttl=30, auto_renew=False)
        head_waits = asyncio.create_task(head.acquire(timeout=20))
        while not tries:  # its first tries fail: then it polls, every POLL_INTERVAL
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.3 * poll)
        # Released just before the head's next poll: at once, it would win nearly
        # every time (the process named polls on a phase of its own).
        await asyncio.sleep(max(0.0, tries[-1] + 0.95 * poll - time.monotonic()))
        released_at = time.monotonic()
        await holder.release()
        assert await asyncio.wait_for(named_waits, 20)
        assert not head_waits.done()
        # The head let a whole poll of the process named go by before it tried (broken:
        # it tried at its poll, 5 to 15 ms after the release).
        early = [t - released_at for t in tries if 0 < t - released_at < 1.1 * poll]
        assert not early, early
        await named.release()
        assert await asyncio.wait_for(head_waits, 20)
        await head.release()


async def test_where_pubsub_is_refused_an_expired_holds_late_release_leaves_the_turn_given(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation's streak rule (seed 70368841183464, every node refusing
    # pub/sub, no fault). A task's manual lock expired; another task of its process
    # took the name at the expiry's race and, at the end of the streak, released it
    # naming the other process. Then the expired hold's release came: counted as a
    # release of ours with the streak begun anew, it woke our head, which tried at
    # once and won before the process named polled (8 holdings in a row).
    monkeypatch.setattr(aiolock._waiting.turns, "FALLBACK", 30.0)  # nobody tries out of turn
    async with (
        _pubsub_refused(clients, urls) as limited,
        LockManager(limited) as busy,
        LockManager(limited) as other,
    ):
        stale, taker, named, named_waits, tries, head, head_waits = await _expired_then_taken(
            busy, other, clients, name
        )
        released_at = time.monotonic()
        await taker.release()  # names the other process
        with contextlib.suppress(aiolock.LockNotOwned):
            await stale.release()  # the expired hold's, late
        # The process named takes the lock (broken: the head, woken by the
        # expired hold's release, tried at once and took it).
        early = [round(t - released_at, 4) for t in tries if t > released_at]
        await _named_first(named_waits, head_waits, f"the head took it; its tries: {early}")
        await named.release()
        assert await asyncio.wait_for(head_waits, 20)
        await head.release()


async def test_where_pubsub_is_refused_a_head_holding_back_holds_back_again_if_we_give_way_again(
    urls: list[str], clients: list[redis.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the simulation (seed 9007199254748187, runs focused on lone streaks,
    # every node refusing pub/sub): an expired hold's late release gave way, and the
    # polling head held back for it; 0.11 s later, another task of the process
    # released the name, naming the other process again. The head, still holding back
    # for the first, tried when that wait ended, 50 ms after the second release, not
    # after a poll of the process named.
    monkeypatch.setattr(aiolock._waiting.queue, "GAVE_WAY_POLL", 3.0)  # the window, made wide
    monkeypatch.setattr(aiolock._waiting.turns, "FALLBACK", 30.0)  # nobody tries out of turn
    async with (
        _pubsub_refused(clients, urls) as limited,
        LockManager(limited) as busy,
        LockManager(limited) as other,
    ):
        stale, taker, named, named_waits, tries, head, head_waits = await _expired_then_taken(
            busy, other, clients, name
        )
        with contextlib.suppress(aiolock.LockNotOwned):
            await stale.release()  # the expired hold's, late: it gives way
        await asyncio.sleep(1.0)  # the head holds back (until 3 s after that release)
        released_at = time.monotonic()
        await taker.release()  # it gives way again: the head holds back for this one
        assert await asyncio.wait_for(named_waits, 20)
        after = [round(t - released_at, 3) for t in tries if t > released_at]
        while not after:
            await asyncio.sleep(0.05)
            after = [round(t - released_at, 3) for t in tries if t > released_at]
        # Its first try after our second release: once that release's window is over
        # (broken: when the first's was: 2 s after the second).
        assert after[0] > 2.9, after
        await named.release()
        assert await asyncio.wait_for(head_waits, 20)
        await head.release()


async def test_a_process_whose_pubsub_connections_drop_joins_the_line_again_at_once(
    urls: list[str], clients: list[redis.Redis], name: str, no_refresh: None
) -> None:
    # Found by the simulation (seed 281474983711000, pub/sub connections dropped): a
    # release granted the lock to the other process as its pub/sub connections
    # dropped. No node had its subscription any more: each gave the grant back and
    # took that process out of line, telling nobody. Out of line until its entry's
    # next refresh (0.5 s), it let the holder's process hand the lock to its own
    # waiters 15 times in a row. A process that loses a pub/sub connection now joins
    # again at its place at once (what it missed may have taken it out).
    async with LockManager(urls) as busy, LockManager(urls) as other:
        holder, waiter, waits = await _waiting_behind(busy, other, clients, name)
        [member] = await in_line(clients, name, 1)
        for client in clients:  # what an unheard grant does on each node
            await client.eval(TURN_LEAVE_SCRIPT.source, 3, *turn_keys(key(name).encode()), member)
        await in_line(clients, name, 0)
        for client in clients:
            await client.client_kill_filter(_type="pubsub")
        # Back at its place (broken: only at its next refresh).
        assert await in_line(clients, name, 1) == [member]
        await holder.release()
        assert await asyncio.wait_for(waits, 20)
        await waiter.release()


async def test_a_process_whose_pubsub_connections_drop_offers_tentatively_until_they_are_back(
    urls: list[str], clients: list[redis.Redis], name: str, no_refresh: None
) -> None:
    # Found by the simulation's streak rule (seed 281474985869760, one pub/sub drop,
    # no other fault): the process joined the line again at once (above), its offer
    # firm, and a release granted it the lock before its new connections had
    # subscribed again. Nobody heard the grant: each node undid it and took the
    # process out of line, telling nobody, until its entry's refresh (0.5 s); the
    # holder's process, alone in line as its handoffs saw it, held the name 8 times in
    # a row. Its subscriptions are asked for again on the new connections: until each
    # node confirms, its offer is tentative (an unheard grant keeps it in line), and
    # the confirmations wake its head (a release may have gone unheard meanwhile).
    turns = key(name) + ":turns"
    async with (
        nemesis(urls) as net,
        LockManager(urls) as holder_side,
        LockManager(net.urls, node_timeout=0.05) as waiter_side,
    ):
        holder, waiter, waits = await _waiting_behind(holder_side, waiter_side, clients, name)
        member = seam.member(waiter_side)  # type: ignore[union-attr]
        await _until_firm(clients, name)
        for proxy in net:  # the new connections' subscriptions do not get through (yet)
            proxy.hold(_grant_subscription, math.inf)
            for link in proxy.links:
                if link.kind == "pubsub" and not link.closed:
                    link.drop()
        # In line again at once, its offer tentative (broken: firm).
        deadline = time.monotonic() + 5
        while not all(seq.endswith(b"*") for seq in await _offer_seqs(clients, name)):
            assert time.monotonic() < deadline, await _offer_seqs(clients, name)
            await asyncio.sleep(0.01)
        await holder.release()  # grants to the offer: nobody hears it, undone
        # Still in line on every node (broken: taken out of every line).
        assert [await c.zrange(turns, 0, -1) for c in clients] == [[member]] * 5
        assert not waits.done()
        for proxy in net:
            proxy.clear()
            proxy.flush()
        # Subscribed again: the confirmations wake the head, which finds the lock free
        # (broken: it slept on the holder's 30-s PTTL).
        assert await asyncio.wait_for(waits, 10)
        await waiter.release()


async def test_a_process_whose_queue_fills_again_as_its_confirmations_lag_stays_in_line(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    # Found by the simulation's streak rule (seed 2251799813703477, subscriptions held
    # back). A process's queue for a name emptied while the nodes' confirmations of its
    # subscriptions were on their way, and a new waiter subscribed again at once. The
    # old confirmations came first and were taken for the new ones: its offer went
    # firm while the nodes, past the UNSUBSCRIBE and not yet at the new SUBSCRIBE, had
    # it on no channel. The release that named it granted the lock to nobody: undone,
    # and the process taken out of line (its rival then held the name 8 times in a
    # row). Until its own confirmations come, its offer stays tentative: a grant
    # unheard is undone, and the process stays in line.
    turns = key(name) + ":turns"

    def pubsub(link: Any) -> bool:
        return link.kind == "pubsub"

    async with nemesis(urls) as net, LockManager(net.urls) as lagging, LockManager(urls) as other:
        holder = other.lock(name, ttl=30, auto_renew=False)
        assert await holder.acquire(timeout=0)
        for proxy in net:  # the nodes' confirmations reach the lagging process 0.3 s late
            proxy.delay_replies(0.3, links=pubsub)
        first = asyncio.create_task(lagging.lock(name, ttl=30).acquire(timeout=20))
        pattern = key(name) + ":turn:*"
        for _ in range(500):  # until every node has its subscription to its grants
            if all([await c.pubsub_channels(pattern) for c in clients]):
                break
            await asyncio.sleep(0.01)
        for proxy in net:  # a subscription from now on reaches the node 2 s late
            proxy.hold(command("SUBSCRIBE"), 2.0, links=pubsub)
        first.cancel()  # its queue empties (UNSUBSCRIBE) and fills again (SUBSCRIBE)
        waiter = lagging.lock(name, ttl=30, auto_renew=False)
        waits = asyncio.create_task(waiter.acquire(timeout=20))
        await in_line(clients, name, 1)
        await asyncio.sleep(0.6)  # the replies to the first subscriptions have come
        # The nodes have it on no channel of its grants (the new SUBSCRIBEs are held).
        assert [await c.pubsub_channels(pattern) for c in clients] == [[]] * len(clients)
        assert all(seq.endswith(b"*") for seq in await _offer_seqs(clients, name)), (
            "its offer went firm on the replies to the subscriptions before"
        )
        await holder.release()  # names it: the grant, unheard, is undone
        assert [await c.zcard(turns) for c in clients] == [1] * len(clients), (
            "its unheard grant took it out of line"
        )
        assert await asyncio.wait_for(waits, 20)  # woken by its own confirmations
        await waiter.release()
