"""Counting the nodes' replies: votes, the validity maths, one acquire's outcome. No I/O.

A fan-out (see _quorum/quorum.py) hands every reply to :meth:`Votes.record` as it arrives; the
votes know when the outcome is decided, a quorum won or no longer possible, and what
failed. (``_core/batch.py`` does the same for a renewal batch, lock by lock.)
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn, Protocol

from .._lua import Script
from .calls import Callback, Soon
from .cancel import outlast

__all__ = [
    "DRIFT_FLOOR",
    "Attempt",
    "FanOutTimer",
    "NodeLike",
    "Outcome",
    "TimedFanOut",
    "Votes",
    "WriteTimer",
    "decided_despite",
    "drift",
    "milliseconds",
    "quorum_size",
    "split_pause",
    "wait_decided",
]

#: The constant part of the clock-drift allowance, in seconds (2 ms).
DRIFT_FLOOR: Final = 0.002
#: After a split vote, a waiter pauses up to this many times its attempt's duration,
#: twice as many after each split vote of its wait before (see split_pause)...
SPLIT_PAUSE: Final = 2.0
#: ... and never longer than this, in seconds: a release during the pause goes unheard.
SPLIT_PAUSE_LONGEST: Final = 0.2

_PENDING: Final[Any] = object()


class NodeLike(Protocol):
    """What the engine needs of a node (a real :class:`~aiolock._io.node.Node` or a fake)."""

    @property
    def spec(self) -> object: ...

    @property
    def name(self) -> str: ...

    def call(self, args: tuple[bytes, ...], callback: Callback) -> None: ...

    def call_script(self, script: Script, args: tuple[bytes, ...], callback: Callback) -> None: ...

    #: Whether the server has ``SET ... IFEQ`` (see :meth:`Quorum.extend_many`).
    set_ifeq: bool


def quorum_size(n: int) -> int:
    """The number of nodes that must agree: a strict majority."""
    return n // 2 + 1


def drift(ttl: float, drift_factor: float) -> float:
    """The allowance for clock drift between the nodes and us over ``ttl``."""
    return ttl * drift_factor + DRIFT_FLOOR


# A classifier maps one node's reply to True (a vote for), False (a definite
# "no": held by someone else, not ours) or None (a failure: error or timeout).
Classifier = Callable[[Any], bool | None]
# A veto turns node i's yes into a failed vote when it returns an exception (a node
# in its restart quarantine); consulted when the reply arrives, not when it is sent.
Veto = Callable[[int], BaseException | None]


def is_taken(reply: Any) -> bool | None:
    # ACQUIRE replies [1, fence] when taken, [0, pttl, holder] when held by someone
    # else (the read-write lock's scripts: [0, pttl]).
    if type(reply) is list and len(reply) >= 2:
        return bool(reply[0] == 1)
    return None


def is_list(reply: Any) -> bool | None:
    """A script's table reply is a yes; a failure is a failure."""
    return None if isinstance(reply, BaseException) else isinstance(reply, list)


def is_one(reply: Any) -> bool | None:
    if isinstance(reply, BaseException):
        return None
    return bool(reply == 1)


class Votes:
    """The replies of one fan-out, counted as they arrive."""

    __slots__ = (
        "_classify",
        "_early",
        "_veto",
        "failed",
        "n",
        "no",
        "quorum",
        "replies",
        "verdicts",
        "waiter",
        "yes",
    )

    def __init__(
        self,
        n: int,
        quorum: int,
        classify: Classifier,
        waiter: asyncio.Future[None],
        *,
        early: bool,
        veto: Veto | None = None,
    ) -> None:
        self.n = n
        self.quorum = quorum
        self.replies: list[Any] = [_PENDING] * n
        self.verdicts: list[bool | None] = [None] * n
        self.yes = 0
        self.no = 0
        self.failed = 0
        self._classify = classify
        self.waiter = waiter
        self._early = early
        self._veto = veto

    @property
    def won(self) -> bool:
        """A quorum voted for."""
        return self.yes >= self.quorum

    @property
    def outage(self) -> bool:
        """Failing nodes alone make a quorum impossible (as opposed to contention)."""
        return self.failed > self.n - self.quorum

    @property
    def rejected(self) -> bool:
        """Nodes saying "not yours" alone make a quorum impossible: the lock is not held."""
        return self.no > self.n - self.quorum

    def one_holder(self) -> bool:
        """Whether one holder (by its token's first bytes) said "held" on a quorum."""
        counts: dict[bytes, int] = {}
        for reply, verdict in zip(self.replies, self.verdicts, strict=True):
            if verdict is False and len(reply) > 2:
                counts[reply[2]] = counts.get(reply[2], 0) + 1
        return any(count >= self.quorum for count in counts.values())

    def errors(self, nodes: Sequence[NodeLike]) -> dict[object, BaseException]:
        """The failure of each failing node, keyed by what the user passed."""
        return {
            nodes[i].spec: reply
            for i, reply in enumerate(self.replies)
            if isinstance(reply, BaseException)
        }

    def record(self, i: int, reply: Any) -> None:
        """Count node ``i``'s reply; a reply after the timeout is ignored."""
        if self.replies[i] is not _PENDING:
            return
        verdict = self._classify(reply)
        if verdict and self._veto is not None:
            refused = self._veto(i)
            if refused is not None:  # a yes that does not count: a failed vote
                reply, verdict = refused, None
        self.replies[i] = reply
        self.verdicts[i] = verdict
        if verdict:
            self.yes += 1
        elif verdict is None:
            self.failed += 1
        else:
            self.no += 1
        if not self.waiter.done() and self.decided():
            self.waiter.set_result(None)

    def decided(self) -> bool:
        """Every node answered, or (``early``) the outcome can no longer change."""
        return self.yes + self.no + self.failed == self.n or (
            self._early
            and (self.yes >= self.quorum or self.no + self.failed > self.n - self.quorum)
        )

    def expire(self, timeout: float, names: Sequence[str]) -> None:
        """Count every node still pending as failed by timeout."""
        for i, reply in enumerate(self.replies):
            if reply is _PENDING:
                self.record(i, TimeoutError(f"{names[i]}: no reply within {timeout:g}s"))


class Outcome(Protocol):
    """What waiting needs of an attempt (a quorum Attempt, or a semaphore's)."""

    @property
    def expires_at(self) -> float | None: ...

    @property
    def outage(self) -> bool: ...

    def holder_ttl(self) -> float | None: ...


@dataclass(slots=True)
class Attempt:
    """The outcome of one acquire attempt."""

    votes: Votes
    #: Monotonic time at which the lock stops being valid, when acquired.
    expires_at: float | None
    #: The fencing token of the acquisition, when acquired.
    fence: int | None = None
    #: When the attempt's requests were sent (monotonic), when acquired.
    start: float = 0.0
    #: The greatest fencing token reserved on a quorum for the handoffs after this one
    #: within the process, which send nothing (see ``_waiting/lease.py``); ``None``: none.
    reserve: int | None = None
    #: The token the key holds, when not the one the attempt was made with: a lease
    #: hands the waiter the lock as its holder took it (see ``_lease.lease``).
    token: bytes | None = None
    #: The nodes where a failed attempt's clean-up deleted the token, or may have (it
    #: went to those that had not said "held" when the attempt was decided; a reply
    #: after the decision is still recorded in ``votes``). See ``Grants.tried``.
    cleaned: tuple[int, ...] = ()

    @property
    def acquired(self) -> bool:
        """A quorum took the key with validity to spare."""
        return self.expires_at is not None

    @property
    def outage(self) -> bool:
        """Failing nodes alone made a quorum impossible."""
        return self.votes.outage

    @property
    def split(self) -> bool:
        """Whether the attempt failed and split the vote: its clean-up woke every waiter.

        It took the key somewhere, and no holder has a quorum (see Quorum.acquire).
        """
        return self.expires_at is None and bool(self.cleaned) and not self.votes.one_holder()

    def holder_ttl(self) -> float | None:
        """Seconds until the other holder's key expires on enough nodes, if known.

        Among the nodes that said "held", the time to live after which, with the
        others, a quorum is free (a rival's key on a minority, cleaned up since
        without a word, must not keep us asleep its whole ttl): a waiter whose
        wake-up message is lost sleeps at most this long.
        """
        votes = self.votes
        pttls: list[int] = sorted(
            reply[1]
            for reply, verdict in zip(votes.replies, votes.verdicts, strict=True)
            if verdict is False and type(reply) is list and reply[1] >= 0
        )
        if not pttls:
            return None
        # The k-th shortest, k = quorum - (nodes not holding): never more than len(pttls).
        return pttls[max(1, votes.quorum - (votes.n - len(pttls))) - 1] / 1000


class _Awaited(Protocol):
    """Votes being counted: a future set once :meth:`decided` (see wait_decided)."""

    waiter: asyncio.Future[None]

    def decided(self) -> bool: ...


class WriteTimer:
    """A fan-out's ``node_timeout`` timer, started once the requests are written.

    A node writes the requests of one loop iteration at its end (see _io/node.py): a
    timer started with the requests would lose to that iteration however long it ran
    (a task blocking the loop), and time the nodes out before they were asked. Made
    after the requests are sent, it starts by ``call_soon`` after the writes they
    scheduled, and counts from them.
    """

    __slots__ = ("_handle",)

    def __init__(self, delay: float, callback: Callable[..., object], *args: object) -> None:
        loop = asyncio.get_running_loop()
        self._handle: asyncio.Handle = loop.call_soon(self._start, loop, delay, callback, args)

    def _start(
        self,
        loop: asyncio.AbstractEventLoop,
        delay: float,
        callback: Callable[..., object],
        args: tuple[object, ...],
    ) -> None:
        self._handle = loop.call_later(delay, callback, *args)

    def cancel(self) -> None:
        """Stop the timer, started or not."""
        self._handle.cancel()


class FanOutTimer:
    """The ``node_timeout`` of every fan-out of one quorum, on one loop timer.

    A fan-out's time counts from its writes, as a :class:`WriteTimer`'s: :meth:`start`,
    called after the sends, stamps it by a callback that runs after the writes they
    scheduled. Every fan-out of a quorum waits the same ``delay``, so their deadlines
    come in the order they are stamped: they queue, and one loop timer, armed for the
    oldest, expires what is due. (A timer per fan-out, its heap entry and its
    cancellation cost a fifth of a one-node lock cycle's client instructions.)
    """

    __slots__ = ("_armed_on", "_delay", "_due", "_names", "_soon")

    def __init__(self, delay: float, names: Sequence[str], soon: Soon | None = None) -> None:
        self._delay = delay
        self._names = names
        self._soon = Soon() if soon is None else soon
        self._due: deque[tuple[float, TimedFanOut]] = deque()
        #: The loop the timer is armed on (None: not armed).
        self._armed_on: asyncio.AbstractEventLoop | None = None

    def start(self, votes: Votes) -> TimedFanOut:
        """Time ``votes`` out ``delay`` after the writes scheduled so far."""
        timed = TimedFanOut(votes)
        self._soon(self._stamp, timed)
        return timed

    def _stamp(self, timed: TimedFanOut) -> None:
        if timed.votes is None:  # decided and cancelled before this ran
            return
        loop = asyncio.get_running_loop()
        self._due.append((loop.time() + self._delay, timed))
        if self._armed_on is not loop:
            self._armed_on = loop
            loop.call_at(self._due[0][0], self._fire)

    def _fire(self) -> None:
        loop = asyncio.get_running_loop()
        if self._armed_on is not loop:  # (armed again on another loop since)
            return
        now = loop.time()
        due = self._due
        while due and (due[0][1].votes is None or due[0][0] <= now):
            _, timed = due.popleft()
            votes, timed.votes = timed.votes, None
            if votes is not None:
                votes.expire(self._delay, self._names)
        if due:
            loop.call_at(due[0][0], self._fire)
        else:
            self._armed_on = None


class TimedFanOut:
    """A fan-out on a :class:`FanOutTimer`; :meth:`cancel` takes it off."""

    __slots__ = ("votes",)

    def __init__(self, votes: Votes) -> None:
        self.votes: Votes | None = votes

    def cancel(self) -> None:
        """Never time these votes out."""
        self.votes = None


async def wait_decided(votes: _Awaited) -> None:
    """Wait until ``votes`` are decided even if cancelled meanwhile; re-raise after.

    The wait is bounded by the fan-out timer, so this costs at most ``node_timeout``.
    The usual path awaits the future directly: ``asyncio.shield`` would cost a
    future and an event-loop iteration more on every release.
    """
    try:
        await votes.waiter
    except asyncio.CancelledError as exc:
        await decided_despite(votes, exc)


async def decided_despite(votes: _Awaited, cancelled: BaseException) -> NoReturn:
    """Wait until ``votes`` are decided after ``cancelled`` interrupted the wait; raise it.

    The cancellation also cancelled the future (unless it was already set): wait on
    fresh ones, shielded from anyio's cancel scopes too (which would otherwise deliver
    the cancellation again at every await).
    """
    loop = asyncio.get_running_loop()
    while not votes.decided():
        waiter = votes.waiter = loop.create_future()
        try:
            await outlast(waiter)
        except asyncio.CancelledError as exc:  # cancelled again meanwhile
            cancelled = exc
    raise cancelled


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


def milliseconds(seconds: float) -> int:
    """Whole milliseconds for PX/PEXPIRE, at least 1."""
    return max(1, int(seconds * 1000))
