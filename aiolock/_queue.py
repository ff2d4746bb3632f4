"""The tasks of one process waiting for one name (see _waiting.py): their local queue."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._handoff import Taker
    from ._pubsub import Listener
    from ._turns import Entry

__all__ = ["Queue"]


class Queue:
    """The tasks of this process waiting for one name."""

    __slots__ = (
        "alone",
        "channels",
        "entries",
        "entry",
        "listeners",
        "local_streak",
        "promised",
        "subscribed",
        "takers",
        "wake",
    )

    def __init__(self, channels: tuple[bytes, ...], listeners: Sequence[Listener]) -> None:
        self.channels = channels
        # The subscribers (nodes) this queue listens on (see Waiting._listeners).
        self.listeners = listeners
        # One future per waiting task, in FIFO order; the head's is done ("your
        # turn"): with None to try at once, or with the ttl of the lock the previous
        # head just took (the new head then waits for its release, or expiry, first).
        self.entries: deque[asyncio.Future[float | None]] = deque()
        self.wake = asyncio.Event()
        self.subscribed = False
        # Handoffs in a row to a waiter of this process (see Waiting.released).
        self.local_streak = 0
        # The last handoff found no other process in the name's turn queue.
        self.alone = False
        # A release told other processes that a waiter of ours takes the lock, and
        # none has taken it since.
        self.promised = False
        # The offers of the waiters that may be passed the lock, by turn (see Taker).
        self.takers: dict[asyncio.Future[float | None], Taker] = {}
        # Our place in the name's turn queue on the nodes (a plain lock's; see _turns).
        self.entry: Entry | None = None
