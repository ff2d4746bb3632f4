"""Turns across processes: the nodes keep, per name, a line of the waiting processes.

Without it, every waiting process tries on each release message and all but one lose:
each loser costs a script per node, and a split vote a round for everyone. Instead:

* A process whose tasks wait for a lock **joins the name's turn queue** on every node
  (``TURN_JOIN``): one entry per process (its member, random), not per task, placed by
  its clock when it joined; the same place is sent to every node.
* **The release names whose turn it is** (``RELEASE_TURN``): the next process in line
  after the releasing one, by place, going round (the first in line when the releasing
  process is not in it). That process tries; the others keep waiting. The choice
  depends only on the entries, not on what each node saw before: nodes that hold the
  same entries name the same process.
* **The queue is advice, never safety**: the lock is still the quorum ``SET NX``, and any
  process may still try. Nodes that disagree on the order name different processes,
  which then race as before; a message that names nobody (an empty line, a forced
  release, the clean-up after a split vote) lets everyone try.
* **An entry expires unless its process refreshes it** (every :data:`REFRESH`; it lives
  :data:`ENTRY_TTL`), and leaves with the process's last waiter. A process that does not
  use its turn (killed, or its message lost) delays the others by about one refresh
  interval: a process told it is another's turn tries anyway after :data:`FALLBACK`
  unless a later release is heard first, and takes the one passed over out of the line
  where the lock is free (it is told: alive, it joins again at its place at once; where
  the lock is held, the process named most likely took it, and it stays). A
  process that was named
  and whose waiters all left announces the lock free.
* **The release grants the lock to that process when it can**: each waiting process
  leaves with its entry the token and ttl its head would take the lock with (an
  *offer*, refreshed with the entry and with each release of ours), and the release
  sets the key to it and tells that process alone (see ``_waiting/grants.py``). Where it
  cannot (no fresh offer), it names the process, which then tries as above.
* **A lost message still costs at most one ttl, never a hang**: the waiter's other
  wake-ups (the holder's expiry, a dropped pub/sub connection) are unchanged.

Only the plain lock takes turns; a semaphore's and a read-write lock's waiters race as
before.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from .._core.keys import fence_retention, turn_keys
from .._core.votes import milliseconds
from .._lua import TURN_JOIN_SCRIPT, TURN_LEAVE_SCRIPT, Script

if TYPE_CHECKING:
    from .taker import Taker

__all__ = ["ENTRY_TTL", "FALLBACK", "REFRESH", "TAKEN_OUT", "TurnEntry", "Turns"]

#: How often a waiting process refreshes its entry in a name's turn queue.
REFRESH: Final = 0.5
#: How long an entry lives unless refreshed: three refreshes (one lost is not enough).
ENTRY_TTL: Final = 1.5
#: After a message naming another process, how long a waiter waits for a later release
#: before it tries anyway (the process named may be gone).
FALLBACK: Final = 0.5

Broadcast = Callable[[Script, tuple[bytes, ...]], None]
#: An offer as we sent it: the token, the ttl, and when it was sent (monotonic).
Offer = tuple[bytes, float, float]
#: What a pass-over publishes on the grant channel of the process it took out of line.
TAKEN_OUT: Final = b"out"
#: Offers remembered, to read the grants that name them (by sequence number).
_OFFERS_KEPT: Final = 4096


class Turns:
    """The turn queues of one manager: it is one member of each (see the module doc)."""

    def __init__(
        self,
        broadcast: Broadcast,
        *,
        wall_clock: Callable[[], float] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        #: Sends a script to every node without waiting (ordered connections).
        self.broadcast = broadcast
        # (Looked up now, not when the module was imported: a simulated world's clocks.)
        self.wall_clock = time.time if wall_clock is None else wall_clock
        self.clock = time.monotonic if clock is None else clock
        #: Names this manager in release messages: never empty, never ``NOT_FREE``.
        self.member = os.urandom(8).hex().encode()
        self._seq = 0
        self._offers: OrderedDict[tuple[bytes, int], Offer] = OrderedDict()

    def join(
        self,
        key: bytes,
        wake: Callable[[], None],
        head: Callable[[], Taker | None],
        confirmed: Sequence[asyncio.Future[None]] = (),
    ) -> TurnEntry:
        """Join the turn queue of ``key``.

        ``wake``, ``head``: our local queue's wake-up and head; ``confirmed``: done
        once each node confirmed our subscription to the grants.
        """
        return TurnEntry(self, key, wake, head, confirmed)

    def offer(
        self, key: bytes, taker: Taker | None, *, tentative: bool = False
    ) -> tuple[bytes, ...]:
        """The arguments of ``taker``'s offer for ``key`` (none: no taker), noted as sent now.

        Sequence number, ttl and fencing counter retention in ms, token (see
        ``RELEASE_TURN``): a grant names the sequence number, which tells us the token
        and when it was sent. ``tentative``: a node may not have our subscription to
        the grants yet; its grant, unheard, then keeps us in line (the number ends in
        ``*``).
        """
        if taker is None:
            return ()
        self._seq += 1
        self._offers[key, self._seq] = (taker.token, taker.ttl, self.clock())
        if len(self._offers) > _OFFERS_KEPT:
            self._offers.popitem(last=False)
        ttl, retention = milliseconds(taker.ttl), milliseconds(fence_retention(taker.ttl))
        seq = b"%d*" % self._seq if tentative else b"%d" % self._seq
        return (seq, b"%d" % ttl, b"%d" % retention, taker.token)

    def offered(self, key: bytes, seq: int) -> Offer | None:
        """The offer for ``key`` with sequence number ``seq``, if we sent it."""
        return self._offers.get((key, seq))


class TurnEntry:
    """A manager's entry in one name's turn queue, while it has waiters."""

    __slots__ = (
        "_confirmed",
        "_fallback",
        "_head",
        "_join_args",
        "_key",
        "_keys",
        "_life",
        "_refresh",
        "_tentative",
        "_turns",
        "_wake",
        "named",
        "offering",
        "place",
    )

    def __init__(
        self,
        turns: Turns,
        key: bytes,
        wake: Callable[[], None],
        head: Callable[[], Taker | None],
        confirmed: Sequence[asyncio.Future[None]],
    ) -> None:
        self._turns = turns
        self._wake = wake
        self._head = head
        self._confirmed = confirmed
        self._key = key
        self._keys = (b"3", *turn_keys(key))
        #: Where we are in line: our clock when we joined, in microseconds (a float
        #: holds it exactly; two processes are unlikely to share one).
        self.place = b"%d" % int(turns.wall_clock() * 1_000_000)
        #: How long the queue's keys live unless refreshed, in ms.
        self._life = b"%d" % int(ENTRY_TTL * 1000)
        self._join_args = (*self._keys, turns.member, self.place, self._life)
        self._fallback: asyncio.TimerHandle | None = None
        self._refresh: asyncio.TimerHandle | None = None
        #: A release named us and none of our waiters has taken the lock since.
        self.named = False
        #: What we last sent carried an offer (see withdraw); a tentative one.
        self.offering = self._tentative = False
        self._send_join()
        for confirmation in confirmed:
            if not confirmation.done():
                confirmation.add_done_callback(self._on_confirmed)

    def _offer(self) -> tuple[bytes, ...]:
        """Our head's offer: tentative until every node confirmed our subscription.

        Our subscription to the grants goes out before our first attempt, but a node
        may not have it yet when we offer: a grant published before it is in place is
        heard by nobody, and would take us out of line as if we were gone.
        """
        tentative = not self._offer_is_firm()
        offer = self._turns.offer(self._key, self._head(), tentative=tentative)
        self.offering, self._tentative = bool(offer), tentative and bool(offer)
        return offer

    def _on_confirmed(self, _confirmation: asyncio.Future[None]) -> None:
        """A node confirmed our subscription to the grants: make a tentative offer firm.

        Once every node has, at once, not at the next refresh: a process killed in
        between is then taken out of line by the first grant it cannot hear.
        """
        if self._tentative and self._refresh is not None and self._offer_is_firm():
            self._send_join()

    def _offer_is_firm(self) -> bool:
        return all(c.done() for c in self._confirmed)

    def _send_join(self) -> None:
        """Send our entry now; the next refresh counts from here."""
        if self._refresh is not None:
            self._refresh.cancel()
        turns = self._turns
        offer = self._offer()
        turns.broadcast(TURN_JOIN_SCRIPT, (*self._join_args, *offer))
        loop = asyncio.get_running_loop()
        self._refresh = loop.call_later(REFRESH, self._send_join)

    def withdraw(self) -> None:
        """Refresh our entry now if it carries an offer our head cannot take any more.

        Our head offered before the refusals of its subscriptions came back: a grant
        to that offer is heard by nobody, undone, and takes us out of line, and the
        other processes' handoffs then find nobody else waiting (a lone streak).
        Called before each attempt of a head that polls.
        """
        if self.offering and self._head() is None:
            self._send_join()

    def release_args(self) -> tuple[bytes, ...]:
        """What a release of ours adds to ``RELEASE_TURN``.

        How long the queue's keys live, our place and member, and our head's offer
        (sent with the release, the freshest there is).
        """
        offer = self._offer()  # (without one, RELEASE_TURN takes ours out)
        return (self._life, self.place, self._turns.member, *offer)

    def heard(self, message: bytes) -> bool:
        """Whether a release ``message`` (not ``NOT_FREE``) lets our head try now.

        Yes when it names us or nobody; when it names another process, not now: our
        head tries after :data:`FALLBACK` unless a later release is heard first.
        """
        self._cancel_fallback()
        if not message or message == self._turns.member:
            self.named = bool(message)
            return True
        loop = asyncio.get_running_loop()
        delay = FALLBACK * random.uniform(1.0, 1.1)
        self._fallback = loop.call_later(delay, self._fall_back, message)
        return False

    def _fall_back(self, member: bytes) -> None:
        """No release heard since the one that named ``member``: we try.

        ``member`` goes out of line where the lock is free (it did not take it in time);
        where the lock is held it most likely did, and stays (``TURN_LEAVE``).
        """
        self._fallback = None
        self._turns.broadcast(TURN_LEAVE_SCRIPT, (b"4", *self._keys[1:], self._key, member))
        self._wake()

    def taken_out(self, confirmed: Sequence[asyncio.Future[None]] | None = None) -> None:
        """A pass-over took us out of line: we join again at our place now.

        ``TURN_LEAVE`` told us (:data:`TAKEN_OUT`) while we wait, and our next refresh may
        be far. Our turn may have been used: a holder of ours kept the lock until it expired
        just before the other's fallback, and out of line, the next holder's handoffs found
        nobody else waiting. A late or repeated message costs one refresh of our entry;
        after we left, nothing. Also called when a pub/sub connection of ours drops: a grant
        to us that no node could tell us of takes us out without a word (Waiting._on_reset);
        and ``confirmed``, our subscription to the grants asked for again on the new
        connection, makes our offer tentative until every node has confirmed it, as when we
        joined (the grant it may take meanwhile would go unheard too).
        """
        if confirmed is not None:
            self._confirmed = confirmed
            for confirmation in confirmed:
                if not confirmation.done():
                    confirmation.add_done_callback(self._on_confirmed)
        if self._refresh is not None:
            self._send_join()

    def taken(self) -> None:
        """A waiter of ours acquired the lock: our turn is used."""
        self.named = False
        self._cancel_fallback()

    def leave(self) -> bool:
        """Leave the queue (our last waiter left).

        Returns whether our turn went unused: the caller then announces the lock free
        to every waiting process.
        """
        self._cancel_fallback()
        if self._refresh is not None:
            self._refresh.cancel()
            self._refresh = None
        # Nothing asks for our head once we left (no refresh, no fallback), and it
        # reads the queue that refers to us: a cycle only the garbage collector frees.
        self._head = _nobody
        self._turns.broadcast(TURN_LEAVE_SCRIPT, (*self._keys, self._turns.member))
        return self.named

    def _cancel_fallback(self) -> None:
        if self._fallback is not None:
            self._fallback.cancel()
            self._fallback = None


def _nobody() -> None:
    """The head of a queue that has left the line: none."""
