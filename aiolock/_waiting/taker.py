"""The waiter's side of a handoff within a process: its offer to take the lock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._core.votes import Attempt

__all__ = ["Taker", "attempt_as_head"]


class Taker:
    """A waiter's offer to take the lock straight from its holder, when it is the head.

    A release of this process that finds the head's offer, while the head is not in an
    attempt of its own, claims it, passes the lock on in one script per node (see
    ``_waiting/handoff.py``) and delivers the outcome. The head meanwhile waits for it and sends
    nothing of its own: an attempt of its own would race the handoff with its token,
    and its clean-up, after the handoff on a node that answered late, would delete the
    key the handoff set there. So a head checks ``claimed`` after every wait, the last
    before it tries included (its hold-back, see ``Queue.holding_back``).
    """

    __slots__ = ("busy", "claimed", "future", "on_dropped", "token", "ttl")

    def __init__(self, token: bytes, ttl: float) -> None:
        self.token = token
        self.ttl = ttl
        self.claimed = False
        #: The head is in an attempt of its own: not to be claimed now.
        self.busy = False
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        #: Gives back a lock passed to the head that it did not take (it was cancelled
        #: between the delivery and its wake-up); set by the release.
        self.on_dropped: Callable[[], None] | None = None

    def deliver(self, outcome: Attempt) -> bool:
        """Give the head the handoff's outcome; False when it left meanwhile."""
        if self.future.done():
            return False
        self.future.set_result(outcome)
        return True

    def leave(self) -> None:
        """The waiter leaves: nothing may stay passed to it (it was cancelled)."""
        future = self.future
        if not future.done():
            future.cancel()  # a handoff in flight is given back (see pass_on)
        elif (
            not future.cancelled()
            and future.result().expires_at is not None
            and self.on_dropped is not None
        ):
            self.on_dropped()  # passed, but we were cancelled before taking it


_R = TypeVar("_R")


async def attempt_as_head(attempt: Callable[[], Awaitable[_R]], offer: Taker | None) -> _R:
    """The head's own attempt: its offer may not be claimed meanwhile."""
    if offer is None:
        return await attempt()
    offer.busy = True
    try:
        return await attempt()
    finally:
        offer.busy = False
