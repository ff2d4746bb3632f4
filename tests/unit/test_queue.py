"""aiolock/_waiting/queue.py: what a queue's head makes of subscriptions not confirmed
yet, without servers (a node's confirmation is a future the test settles)."""

from __future__ import annotations

import asyncio

import pytest

from aiolock._waiting.queue import Queue

CHANNEL = b"aiolock:{n}:released"


class Listener:
    """A node's pub/sub connection that has lost its subscriptions: each is asked for
    again, and confirmed when the test says so."""

    refused: BaseException | None = None

    def __init__(self) -> None:
        self.asked: list[asyncio.Future[None]] = []

    def confirmation(self, channel: bytes) -> asyncio.Future[None] | None:
        assert channel == CHANNEL
        self.asked.append(asyncio.get_running_loop().create_future())
        return self.asked[-1]


async def test_a_head_is_deaf_until_every_late_confirmation_came_and_each_wakes_it() -> None:
    queue = Queue((CHANNEL,), [])
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()
    queue.confirmed_late(first)
    queue.confirmed_late(second)
    assert queue.deaf()  # a release on either node may go unheard: the head polls
    first.set_result(None)
    await asyncio.sleep(0)  # (done callbacks run on the loop)
    assert queue.wake.is_set(), "a release may have gone unheard before the confirmation"
    assert queue.deaf()
    queue.wake.clear()
    second.set_result(None)
    await asyncio.sleep(0)
    assert queue.wake.is_set()
    assert not queue.deaf()


async def test_after_a_reset_the_head_is_deaf_until_its_subscriptions_are_back() -> None:
    nodes = [Listener(), Listener()]
    queue = Queue((CHANNEL,), nodes)
    queue.subscribed = True
    queue.reset(None, nodes)
    assert queue.wake.is_set()  # a release may have been lost with the connection
    queue.wake.clear()
    assert queue.deaf()
    for node in nodes:
        node.asked[0].set_result(None)
    await asyncio.sleep(0)
    assert queue.wake.is_set(), "a release may have come before the new subscription"
    assert not queue.deaf()


async def test_a_confirmation_after_our_process_gave_way_wakes_the_head_only_later() -> None:
    queue = Queue((CHANNEL,), [])
    confirmation = asyncio.get_running_loop().create_future()
    queue.confirmed_late(confirmation)
    queue.gave_way = 0.0  # a release of ours named another process since
    confirmation.set_result(None)
    await asyncio.sleep(0)
    assert not queue.wake.is_set()  # what it missed came before ours: the fallback
    assert not queue.deaf()


async def test_a_deaf_head_whose_process_gave_way_holds_back_until_the_fallback() -> None:
    """A head that may not hear a release yet polls at the fallback; after a release of
    ours named another process, its poll must let that process go first: no sooner
    than the fallback after our release, as a head that missed a release (found by the
    simulation: seed v2:32386808113564, a poll 0.42 s after the release)."""
    queue = Queue((CHANNEL,), [])
    now = 100.0
    queue.gave_way = now
    assert queue.holding_back(lambda: now) == 0.0  # hears the release: no need
    queue.confirmed_late(asyncio.get_running_loop().create_future())
    assert queue.deaf()
    assert queue.holding_back(lambda: now + 0.1) == pytest.approx(0.4)
    assert queue.holding_back(lambda: now + 0.6) < 0.0
