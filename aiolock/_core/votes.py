"""Counting the nodes' replies: votes, the validity maths, one acquire's outcome. No I/O.

A fan-out (see _quorum/quorum.py) hands every reply to :meth:`Votes.record` as it arrives; the
votes know when the outcome is decided, a quorum won or no longer possible, and what
failed. (``_core/batch.py`` does the same for a renewal batch, lock by lock.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from .._lua import Script
from .calls import Callback, Record

__all__ = [
    "DRIFT_FLOOR",
    "Attempt",
    "NodeLike",
    "Outcome",
    "Votes",
    "drift",
    "milliseconds",
    "quorum_size",
]

#: The constant part of the clock-drift allowance, in seconds (2 ms).
DRIFT_FLOOR: Final = 0.002

_PENDING: Final[Any] = object()


class NodeLike(Protocol):
    """What the engine needs of a node (a real :class:`~aiolock._io.node.Node` or a fake)."""

    @property
    def spec(self) -> object: ...

    @property
    def name(self) -> str: ...

    def call(self, args: tuple[bytes, ...], callback: Callback) -> None: ...

    def call_script(self, script: Script, args: tuple[bytes, ...], callback: Callback) -> None: ...

    def call_for_vote(
        self, script: Script, args: tuple[bytes, ...], record: Record, index: int
    ) -> None:
        """``call_script``, whose reply goes to ``record(index, reply)``."""

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
    # A script that took the lock replies its fencing token, a bare integer (PASS_ON:
    # [1, fence, others]); one that found it held [0, pttl, holder] (the read-write
    # lock's scripts: [0, pttl]).
    kind = type(reply)
    if kind is int:
        return True if reply > 0 else None
    if kind is list and len(reply) >= 2:
        return bool(reply[0] == 1)
    return None


def fence_of(reply: Any) -> int:
    """The fencing token in a reply :func:`is_taken` counts as taken."""
    return reply if type(reply) is int else int(reply[1])


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
        # decided(), written out: a call less per reply (tests/unit/test_votes.py holds
        # the two to one meaning).
        if not self.waiter.done() and (
            self.yes + self.no + self.failed == self.n
            or (
                self._early
                and (self.yes >= self.quorum or self.no + self.failed > self.n - self.quorum)
            )
        ):
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


def milliseconds(seconds: float) -> int:
    """Whole milliseconds for PX/PEXPIRE, at least 1."""
    return max(1, int(seconds * 1000))
