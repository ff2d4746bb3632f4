"""aiolock/_waiting/head.py: what the head of a queue does next, decided without I/O.

Each test sets a head's state (its queue, its offer, its deadline, what it tried) and
reads the act :func:`next_act` returns; no server, no task, no sleep.
"""

from __future__ import annotations

import asyncio

import pytest

from aiolock._waiting.head import EXPIRY_SLACK, UNKNOWN_HOLDER_WAIT, Act, Wait, next_act
from aiolock._waiting.queue import GAVE_WAY_POLL, POLL_INTERVAL, Queue
from aiolock._waiting.taker import Taker

NOW = 100.0


class Node:
    """A node's pub/sub connection, refusing or not."""

    def __init__(self, refused: BaseException | None = None) -> None:
        self.refused = refused


def clock() -> float:
    return NOW


def head(*, refused: bool = False, deadline: float = NOW + 10.0, offer: bool = True) -> Wait:
    """A head of its queue, its turn come, listening on one node."""
    queue = Queue((b"aiolock:{n}:released",), [Node(PermissionError() if refused else None)])
    turn: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
    turn.set_result(None)
    return Wait(queue, turn, deadline, Taker(b"token", 10.0) if offer else None)


async def test_a_head_whose_turn_just_came_tries() -> None:
    assert next_act(head(), clock) == (Act.TRY, 0.0)
    assert next_act(head(offer=False), clock) == (Act.TRY, 0.0)


async def test_a_claimed_offer_is_taken_before_anything_else() -> None:
    """An attempt of the head's own would race the handoff with the same token."""
    wait = head(refused=True)
    wait.queue.gave_way = NOW  # it would hold back otherwise
    assert wait.offer is not None
    wait.offer.claimed = True
    assert next_act(wait, clock) == (Act.TAKE, 0.0)
    wait.held_back = True  # also after it held back: the release claimed it meanwhile
    assert next_act(wait, clock) == (Act.TAKE, 0.0)


async def test_a_polling_head_holds_back_a_poll_after_its_process_gave_way() -> None:
    wait = head(refused=True)
    wait.queue.gave_way = NOW - 0.05
    act, seconds = next_act(wait, clock)
    assert act is Act.HOLD_BACK
    assert seconds == pytest.approx(GAVE_WAY_POLL - 0.05)
    wait.held_back = True  # it held back, and its process gave way again meanwhile
    wait.queue.gave_way = NOW
    act, seconds = next_act(wait, clock)
    assert act is Act.HOLD_BACK
    assert seconds == pytest.approx(GAVE_WAY_POLL)
    wait.queue.gave_way = NOW - GAVE_WAY_POLL  # the process named had its poll
    assert next_act(wait, clock) == (Act.TRY, 0.0)


async def test_a_head_that_hears_releases_does_not_hold_back() -> None:
    wait = head()
    wait.queue.gave_way = NOW
    assert next_act(wait, clock) == (Act.TRY, 0.0)


async def test_a_head_woken_while_holding_back_tries() -> None:
    wait = head(refused=True)
    wait.queue.gave_way = NOW
    wait.held_back = True
    wait.queue.wake.set()
    assert next_act(wait, clock) == (Act.TRY, 0.0)


async def test_a_hold_back_is_cut_at_the_deadline_and_then_the_head_tries_once() -> None:
    wait = head(refused=True, deadline=NOW + 0.01)
    wait.queue.gave_way = NOW
    act, seconds = next_act(wait, clock)
    assert act is Act.HOLD_BACK
    assert seconds == pytest.approx(0.01)
    wait.held_back = True
    wait.deadline = NOW
    assert next_act(wait, clock) == (Act.TRY, 0.0)


async def test_after_a_failed_attempt_the_head_sleeps_toward_the_holders_expiry() -> None:
    wait = head()
    wait.tried, wait.hint = True, 2.0
    act, seconds = next_act(wait, clock)
    assert act is Act.SLEEP
    assert 2.0 + EXPIRY_SLACK <= seconds <= (2.0 + EXPIRY_SLACK) * 1.1
    wait.hint = None  # no holder's ttl known (nodes failing)
    act, seconds = next_act(wait, clock)
    assert UNKNOWN_HOLDER_WAIT <= seconds <= UNKNOWN_HOLDER_WAIT * 1.1


async def test_a_sleep_ends_at_the_deadline_and_a_polling_heads_at_its_poll() -> None:
    wait = head(deadline=NOW + 0.5)
    wait.tried, wait.hint = True, 2.0
    assert next_act(wait, clock) == (Act.SLEEP, 0.5)
    wait = head(refused=True)
    wait.tried, wait.hint = True, 2.0
    act, seconds = next_act(wait, clock)
    assert act is Act.SLEEP
    assert POLL_INTERVAL <= seconds <= POLL_INTERVAL * 1.1


async def test_a_head_past_its_deadline_gives_up_after_an_attempt_not_before() -> None:
    wait = head(deadline=NOW)
    assert next_act(wait, clock) == (Act.TRY, 0.0)  # a timeout of 0: one attempt
    wait.tried = True
    assert next_act(wait, clock) == (Act.GIVE_UP, 0.0)
