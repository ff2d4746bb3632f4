"""aiolock/_waiting/head.py: what the head of a queue does next, decided without I/O.

Each test sets a head's state (its queue, its offer, its deadline, what it tried) and
reads the act :func:`next_act` returns; no server, no task, no sleep.
"""

from __future__ import annotations

import asyncio

import pytest

from aiolock._core.votes import Attempt, Votes, is_taken
from aiolock._waiting.head import (
    EXPIRY_SLACK,
    SPLIT_PAUSE,
    SPLIT_PAUSE_LONGEST,
    UNKNOWN_HOLDER_WAIT,
    Act,
    Wait,
    next_act,
    split_pause,
)
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


def _split(took_nodes: int = 2, *, one_holder: bool = False) -> Attempt:
    """A failed attempt that took ``took_nodes`` nodes of five and cleaned them up, the
    others held by different holders (nobody has a quorum: a split vote), or by one."""
    votes = Votes(5, 3, is_taken, asyncio.get_running_loop().create_future(), early=False)
    for i in range(5):
        holder = b"holder%d" % (0 if one_holder else i)
        votes.record(i, 7 if i < took_nodes else [0, 5000, holder])
    return Attempt(votes, None, cleaned=tuple(range(took_nodes)))


async def test_a_split_vote_pauses_at_random_up_to_twice_the_attempt_and_longer_each_time() -> None:
    """Tried again at once, waiters that split the vote would split it again (see
    ``split_pause``); each further split vote of the same wait doubles the bound."""
    took = 0.01
    assert _split().split
    first = [split_pause(_split(), took) for _ in range(200)]
    assert all(0.0 < pause <= SPLIT_PAUSE * took for pause in first)
    assert len(set(first)) > 100  # (random: the rivals' pauses differ)
    third = [split_pause(_split(), took, before=2) for _ in range(200)]
    assert all(0.0 < pause <= 4 * SPLIT_PAUSE * took for pause in third)
    assert max(third) > SPLIT_PAUSE * took  # (the chance it is not: 4 ** -200)
    longest = [split_pause(_split(), 1.0, before=30) for _ in range(50)]
    assert all(0.0 < pause <= SPLIT_PAUSE_LONGEST for pause in longest)
    # Not a split vote, no pause: one holder has a quorum, or the attempt took nothing.
    assert split_pause(_split(one_holder=True), took) == 0.0
    assert split_pause(_split(took_nodes=0), took) == 0.0
    assert split_pause(None, took) == 0.0
