"""What the head of a local queue does next: one step, decided without I/O.

The head of a queue (see _waiting/waiting.py) loops until it holds the lock, sees an
outage, or reaches its deadline. Each turn of that loop is one *act*:

* **take**: a release of ours claimed the head's offer: take the lock it passes on;
* **hold back**: a release of ours named another process, whose turn goes first (see
  ``Queue.holding_back``): wait until then, or until woken;
* **try**: make an attempt of its own;
* **sleep**: after an attempt that failed, wait until woken, or until the holder's key
  expires (its PTTL), or for the poll where a release may go unheard;
* **give up**: the deadline has passed.

:func:`next_act` reads the head's :class:`Wait` and the clock, and returns the act and
how long it may wait. It sends nothing and awaits nothing: ``Waiting._contend`` runs
the act and records its outcome in the :class:`Wait`, and asks again.
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from .._core.votes import Attempt
from .queue import POLL_INTERVAL, Queue
from .taker import Taker

__all__ = ["EXPIRY_SLACK", "UNKNOWN_HOLDER_WAIT", "Act", "Wait", "next_act", "split_pause"]

#: Pause before retrying when no holder's ttl is known (nodes failing meanwhile).
UNKNOWN_HOLDER_WAIT: Final = 0.05
#: Added to the holder's ttl so that its key has expired everywhere when we retry.
EXPIRY_SLACK: Final = 0.002
#: After a split vote, a waiter pauses up to this many times its attempt's duration,
#: twice as many after each split vote of its wait before (see split_pause)...
SPLIT_PAUSE: Final = 2.0
#: ... and never longer than this, in seconds: a release during the pause goes unheard.
SPLIT_PAUSE_LONGEST: Final = 0.2


class Act(enum.Enum):
    """What the head does next (see the module's docstring)."""

    TAKE = "take"
    HOLD_BACK = "hold back"
    TRY = "try"
    SLEEP = "sleep"
    GIVE_UP = "give up"


@dataclass(eq=False, slots=True)
class Wait:
    """One task's wait for a lock, from joining its local queue to leaving it."""

    queue: Queue
    #: Set when the task is the head of its queue: the ttl the previous head took the
    #: lock for (``None``: it did not, or there was none).
    turn: asyncio.Future[float | None]
    deadline: float
    #: The head's offer to take the lock from a release of ours (see ``Taker``).
    offer: Taker | None
    #: The holder's ttl the last attempt learnt (the longest the head sleeps on).
    hint: float | None = None
    #: Split votes so far (each pause after one is twice as long).
    splits: int = 0
    #: How long the lock taken stays valid, for the next head of ours.
    taken: float | None = None
    #: The attempt that acquired the lock on the nodes (not a lease), for the grants.
    won: Attempt | None = None
    #: The head sleeps before its next attempt: its last one failed, or it waits first
    #: (a lock of ours is held, or a release of ours named another process).
    tried: bool = False
    #: The head has held back since its last attempt or handoff.
    held_back: bool = False


def next_act(wait: Wait, clock: Callable[[], float]) -> tuple[Act, float]:
    """The head's next act, and the longest it waits in it (0.0: not a wait).

    A claimed offer is taken before anything else: an attempt of the head's own would
    race the handoff with the same token (see ``Taker``). A head holds back only while
    nothing woke it; once it has held back, not past its deadline (it then tries, once).
    ``clock`` is read only where the act depends on it; a sleep draws its jitter (up
    to 10 % more) from ``random``.
    """
    queue = wait.queue
    if wait.tried:
        left = wait.deadline - clock()
        if left <= 0:
            return Act.GIVE_UP, 0.0
        hint = wait.hint
        sleep = UNKNOWN_HOLDER_WAIT if hint is None else hint + EXPIRY_SLACK
        if queue.polling():
            sleep = min(sleep, POLL_INTERVAL)  # a release may go unheard
        return Act.SLEEP, min(left, sleep * random.uniform(1.0, 1.1))
    offer = wait.offer
    if offer is not None and offer.claimed:
        return Act.TAKE, 0.0
    back = queue.holding_back(clock)
    if back > 0 and not queue.wake.is_set() and (not wait.held_back or clock() < wait.deadline):
        return Act.HOLD_BACK, min(back, wait.deadline - clock())
    return Act.TRY, 0.0


def split_pause(outcome: object, took: float, before: int = 0) -> float:
    """How long a waiter pauses before it tries again after ``outcome`` (0: it need not).

    An attempt that split the vote (:attr:`Attempt.split`) woke every waiter with its
    clean-up, and so did its rivals': tried again at once, each would take the same
    nodes first again (each nearer its own: three processes can split three free
    nodes of five, a few thousand scripts a second, for as long as a stale key holds
    the other two). Redlock's remedy:
    try again after a random pause, here up to :data:`SPLIT_PAUSE` times the attempt's
    own duration ``took`` (its round trips, clean-up included), so that the first to
    try again takes every free node before the others' attempts arrive.

    ``before``: the split votes of the same wait before this one; each doubles the
    pause's bound, up to :data:`SPLIT_PAUSE_LONGEST`. Where nobody can win (a stale
    key on 2 nodes of 5, a third quarantined), every attempt splits the vote, and each
    clean-up's message wakes the rival at once: without the backoff two waiters try
    about 500 times a second each for as long as the key or the quarantine lasts. An
    exponential backoff, as a shared medium's.
    """
    if isinstance(outcome, Attempt) and outcome.split:
        bound = SPLIT_PAUSE * took * 2.0 ** min(before, 30)
        return random.uniform(0.0, min(bound, SPLIT_PAUSE_LONGEST))
    return 0.0
