"""The fan-out engine: one request to every node at once, decided by quorum.

Rules (each one is a bug somewhere in a peer library):

* every node is asked at once, and each request is bounded by ``node_timeout``;
* the outcome is returned as soon as it is decided, a quorum won or a quorum no
  longer possible, without waiting for slow or hung nodes;
* validity is ``ttl - elapsed - (ttl * drift_factor + 2 ms)``, with ``elapsed``
  measured on a monotonic clock from just before the first request of the attempt;
* a failed acquire releases on every node that may have taken the key (all but
  those that said "held by someone else"), and waits for that clean-up, shielded
  from cancellation, before returning;
* "held by someone else" (a *no*) and "node failing" (an error or a timeout) are
  counted apart, so that callers can tell contention from an outage.

No retry policy and no waiting live here: that is the lock's business.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import anyio

from ._fencing import fence_retention
from ._keys import fence_key as fence_key_of
from ._node import Callback, Script, ignore
from ._scripts import (
    ACQUIRE,
    EXTEND,
    EXTEND_MANY,
    NOT_FREE,
    RAISE_FENCE,
    RELEASE,
    REPAIR,
    RW_READ,
    RW_RELEASE,
    RW_WRITE,
)

__all__ = [
    "DRIFT_FLOOR",
    "REPAIR_SCRIPT",
    "Attempt",
    "BatchVotes",
    "NodeLike",
    "Quorum",
    "Votes",
    "drift",
    "milliseconds",
    "quorum_size",
    "validity",
]

#: The constant part of the clock-drift allowance, in seconds (2 ms).
DRIFT_FLOOR: Final = 0.002

ACQUIRE_SCRIPT: Final = Script(ACQUIRE)
RELEASE_SCRIPT: Final = Script(RELEASE)
RAISE_FENCE_SCRIPT: Final = Script(RAISE_FENCE)
RW_READ_SCRIPT: Final = Script(RW_READ)
RW_WRITE_SCRIPT: Final = Script(RW_WRITE)
RW_RELEASE_SCRIPT: Final = Script(RW_RELEASE)
EXTEND_SCRIPT: Final = Script(EXTEND)
EXTEND_MANY_SCRIPT: Final = Script(EXTEND_MANY, per_key_args=2)
REPAIR_SCRIPT: Final = Script(REPAIR)
SCRIPTS: Final = (ACQUIRE_SCRIPT, RELEASE_SCRIPT, EXTEND_SCRIPT, RAISE_FENCE_SCRIPT)
#: Loaded on first use (NOSCRIPT fallback): most applications never need them.
RW_SCRIPTS: Final = (RW_READ_SCRIPT, RW_WRITE_SCRIPT, RW_RELEASE_SCRIPT)
#: How often one node may be asked again with the keys its reply named (see acquire).
MAX_KEY_ROUNDS: Final = 3
#: Most locks renewed by one script call (bounds the time a node spends in it).
BATCH_LIMIT: Final = 1000

_PENDING: Final[Any] = object()


class NodeLike(Protocol):
    """What the engine needs of a node (a real :class:`~aiolock._node.Node` or a fake)."""

    @property
    def spec(self) -> object: ...

    @property
    def name(self) -> str: ...

    def call(self, args: tuple[bytes, ...], callback: Callback) -> None: ...

    def call_script(self, script: Script, args: tuple[bytes, ...], callback: Callback) -> None: ...


def quorum_size(n: int) -> int:
    """The number of nodes that must agree: a strict majority."""
    return n // 2 + 1


def drift(ttl: float, drift_factor: float) -> float:
    """The allowance for clock drift between the nodes and us over ``ttl``."""
    return ttl * drift_factor + DRIFT_FLOOR


def validity(ttl: float, elapsed: float, drift_factor: float) -> float:
    """Seconds the lock stays valid after an attempt that took ``elapsed`` seconds."""
    return ttl - elapsed - drift(ttl, drift_factor)


# A classifier maps one node's reply to True (a vote for), False (a definite
# "no": held by someone else, not ours) or None (a failure: error or timeout).
Classifier = Callable[[Any], bool | None]
# A veto turns node i's yes into a failed vote when it returns an exception (a node
# in its restart quarantine); consulted when the reply arrives, not when it is sent.
Veto = Callable[[int], BaseException | None]


def _is_taken(reply: Any) -> bool | None:
    # ACQUIRE replies [1, fence] when taken, [0, pttl, holder] when held by someone
    # else (the read-write lock's scripts: [0, pttl]).
    if type(reply) is list and len(reply) >= 2:
        return bool(reply[0] == 1)
    return None


def _is_one(reply: Any) -> bool | None:
    if isinstance(reply, BaseException):
        return None
    return bool(reply == 1)


class Votes:
    """The replies of one fan-out, counted as they arrive."""

    __slots__ = (
        "_classify",
        "_early",
        "_veto",
        "_waiter",
        "failed",
        "n",
        "no",
        "quorum",
        "replies",
        "verdicts",
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
        self._waiter = waiter
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
        if not self._waiter.done() and self.decided():
            self._waiter.set_result(None)

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


@dataclass(slots=True)
class Attempt:
    """The outcome of one acquire attempt."""

    votes: Votes
    #: Monotonic time at which the lock stops being valid, when acquired.
    expires_at: float | None
    #: The fencing token of the acquisition, when acquired.
    fence: int | None = None

    @property
    def acquired(self) -> bool:
        """A quorum took the key with validity to spare."""
        return self.expires_at is not None

    @property
    def outage(self) -> bool:
        """Failing nodes alone made a quorum impossible."""
        return self.votes.outage

    def holder_ttl(self) -> float | None:
        """Seconds until the other holder's key expires on enough nodes, if known.

        The longest remaining time to live among the nodes that said "held": a
        waiter whose wake-up message is lost sleeps at most this long.
        """
        pttls = [
            reply[1]
            for reply, verdict in zip(self.votes.replies, self.votes.verdicts, strict=True)
            if verdict is False and type(reply) is list and reply[1] >= 0
        ]
        return max(pttls) / 1000 if pttls else None


class _Awaited(Protocol):
    """Votes being counted: a future set once :meth:`decided` (see _uncancellable)."""

    _waiter: asyncio.Future[None]

    def decided(self) -> bool: ...


async def _uncancellable(votes: _Awaited) -> None:
    """Wait until ``votes`` are decided even if cancelled meanwhile; re-raise after.

    The wait is bounded by the fan-out timer, so this costs at most ``node_timeout``.
    The usual path awaits the future directly: ``asyncio.shield`` would cost a
    future and an event-loop iteration more on every release.
    """
    try:
        await votes._waiter
        return
    except asyncio.CancelledError as exc:
        # The cancellation also cancelled the future (unless it was already set):
        # wait on fresh ones, shielded from anyio's cancel scopes too (which would
        # otherwise deliver the cancellation again at every await).
        cancelled = exc
    loop = asyncio.get_running_loop()
    with anyio.CancelScope(shield=True):
        while not votes.decided():
            waiter = votes._waiter = loop.create_future()
            try:
                await asyncio.shield(waiter)
            except asyncio.CancelledError as exc:  # native asyncio cancellation
                cancelled = exc
    raise cancelled


class Quorum:
    """The Redlock algorithm over a fixed set of nodes."""

    def __init__(
        self,
        nodes: Sequence[NodeLike],
        *,
        node_timeout: float,
        drift_factor: float,
        clock: Callable[[], float],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.nodes = tuple(nodes)
        self.names = tuple(node.name for node in self.nodes)
        #: Seconds since the epoch, for the floor of fencing tokens (see _fencing.py).
        self.wall_clock = wall_clock
        self.n = len(self.nodes)
        self.quorum = quorum_size(self.n)
        self.node_timeout = node_timeout
        self.drift_factor = drift_factor
        self.clock = clock
        #: Consulted for each yes to an acquire (see :data:`Veto`); None: none.
        self.veto: Veto | None = None

    def _start(
        self,
        send: Callable[[NodeLike, Callback], None],
        classify: Classifier,
        *,
        early: bool,
        only: Sequence[int] | None = None,
        others: Any = None,
        veto: Veto | None = None,
    ) -> tuple[Votes, asyncio.Future[None], asyncio.TimerHandle]:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        votes = Votes(self.n, self.quorum, classify, waiter, early=early, veto=veto)
        indices = range(self.n) if only is None else only
        if only is not None:
            # Nodes left out are not asked: they count as if they had replied
            # ``others`` (a "no" by default).
            for i in range(self.n):
                if i not in only:
                    votes.record(i, others)
        timer = loop.call_later(self.node_timeout, votes.expire, self.node_timeout, self.names)
        record = votes.record
        for i in indices:
            send(self.nodes[i], functools.partial(record, i))
        return votes, waiter, timer

    async def _run(
        self,
        send: Callable[[NodeLike, Callback], None],
        classify: Classifier,
        *,
        early: bool = True,
        shielded: bool = False,
        only: Sequence[int] | None = None,
        others: Any = None,
        then: Callable[[Votes], None] | None = None,
        veto: Veto | None = None,
    ) -> Votes:
        votes, waiter, timer = self._start(
            send, classify, early=early, only=only, others=others, veto=veto
        )
        try:
            if shielded:
                await _uncancellable(votes)
            else:
                await waiter
        finally:
            timer.cancel()
            if not votes._waiter.done():
                votes._waiter.cancel()
            if then is not None:
                # Also when the caller was cancelled meanwhile (shielded: the votes
                # are decided by now): the caller's state must follow the nodes'.
                then(votes)
        return votes

    # -- operations ---------------------------------------------------------------

    async def acquire(
        self,
        key: bytes,
        token: bytes,
        ttl: float,
        *,
        script: Script = ACQUIRE_SCRIPT,
        fence_key: bytes | None = None,
        more_keys: tuple[bytes, ...] = (),
        more_args: tuple[bytes, ...] = (),
        keys_asked: Callable[[Any], tuple[bytes, ...] | None] | None = None,
    ) -> Attempt:
        """One acquire attempt: ``SET key token NX PX ttl`` (in a script) on every node.

        A won attempt also gets a fencing token (see ``_fencing.py``). On failure
        (or cancellation) the key is released again on every node that may hold it,
        and the clean-up is waited for before returning (or raising).

        ``script`` (with ``more_keys`` and ``more_args`` after the usual ones) may
        replace the plain acquire: the read-write lock's take other keys into account.
        A script declares every key it touches (strict proxies and DragonflyDB refuse
        others): when it needs keys that only the node knows, it says which, and
        ``keys_asked`` reads them from its reply; the request is then sent again to
        that node with those keys appended (at most :data:`MAX_KEY_ROUNDS` times; then
        the node counts as "held", holder's ttl unknown).
        """
        fence_key = fence_key_of(key) if fence_key is None else fence_key
        retention = b"%d" % milliseconds(fence_retention(ttl))
        # The same floor for every node: in the usual case each returns exactly it.
        floor = b"%d" % int(self.wall_clock() * 1_000_000)
        args = (
            b"%d" % (2 + len(more_keys)),
            key,
            fence_key,
            *more_keys,
            token,
            b"%d" % milliseconds(ttl),
            retention,
            floor,
            *more_args,
        )

        def send(node: NodeLike, callback: Callback) -> None:
            if keys_asked is None:
                node.call_script(script, args, callback)
            else:
                _call_with_keys_asked(node, script, args, keys_asked, callback)

        start = self.clock()
        try:
            # A node in its restart quarantine is still asked (its state catches up),
            # but its yes does not count.
            votes = await self._run(send, _is_taken, veto=self.veto)
            fence = None
            if votes.won:
                fence = await self._settle_fence(votes, fence_key, retention)
        except BaseException:
            # Cancelled with requests in flight: any node may have taken the key.
            with anyio.CancelScope(shield=True):
                await self.release(key, token, wait_all=True)
            raise
        if fence is not None:
            expires_at = start + ttl - drift(ttl, self.drift_factor)
            if expires_at > self.clock():
                return Attempt(votes, expires_at, fence)
        maybe_taken = [i for i in range(self.n) if votes.verdicts[i] is not False]
        if maybe_taken:
            # The clean-up frees nothing for others when one holder has a quorum
            # (we lost a race): its message says so, and their waiters do not try.
            # After a split vote it must wake them: nobody holds the lock.
            message = (NOT_FREE,) if self._one_holder(votes) else ()
            await self.release(key, token, wait_all=True, only=maybe_taken, more_args=message)
        return Attempt(votes, None)

    def _one_holder(self, votes: Votes) -> bool:
        """Whether one holder (by its token's first bytes) said "held" on a quorum."""
        counts: dict[bytes, int] = {}
        for reply, verdict in zip(votes.replies, votes.verdicts, strict=True):
            if verdict is False and len(reply) > 2:
                counts[reply[2]] = counts.get(reply[2], 0) + 1
        return any(count >= self.quorum for count in counts.values())

    async def _settle_fence(self, votes: Votes, fence_key: bytes, retention: bytes) -> int | None:
        """The fencing token of a won attempt, once a majority of counters reached it.

        Returns ``None`` when no majority could be confirmed in time.
        """
        replies = votes.replies
        verdicts = votes.verdicts
        fences = [replies[i][1] for i in range(self.n) if verdicts[i]]
        fence: int = max(fences)
        at_fence = sum(1 for f in fences if f >= fence)
        # Usually every node that granted the lock returned the same value (the
        # floor we sent): their counters already hold the token. Nodes that granted
        # with a lower value, or said "held", lag behind; failed nodes and nodes
        # still to answer are left alone (the next floor brings them up to date).
        behind = [
            i
            for i in range(self.n)
            if (verdicts[i] and replies[i][1] < fence) or verdicts[i] is False
        ]
        if at_fence >= self.quorum and not behind:
            return fence
        args = (b"1", fence_key, b"%d" % fence, retention)

        def send(node: NodeLike, callback: Callback) -> None:
            node.call_script(RAISE_FENCE_SCRIPT, args, callback)

        if at_fence >= self.quorum:
            # A majority holds the token already: bring the others up to date
            # without waiting (the requests are in flight on ordered connections).
            for i in behind:
                self.nodes[i].call_script(RAISE_FENCE_SCRIPT, args, ignore)
            return fence
        # Too few nodes hold the token: it must be durable on a majority first.
        # Nodes at the token count as confirmed; every other node is asked.
        ask = [i for i in range(self.n) if not (verdicts[i] and replies[i][1] >= fence)]
        raised = await self._run(send, _is_one, only=ask, others=1)
        return fence if raised.won else None

    async def release(
        self,
        key: bytes,
        token: bytes,
        *,
        wait_all: bool = False,
        only: Sequence[int] | None = None,
        script: Script = RELEASE_SCRIPT,
        more_keys: tuple[bytes, ...] = (),
        more_args: tuple[bytes, ...] = (),
    ) -> Votes:
        """Compare-and-delete on every node (or on ``only``); never cancelled midway.

        Returns as soon as the outcome is decided, unless ``wait_all``: then when
        every node answered or timed out (used for clean-up).
        """
        args = (b"%d" % (1 + len(more_keys)), key, *more_keys, token, *more_args)

        def send(node: NodeLike, callback: Callback) -> None:
            node.call_script(script, args, callback)

        return await self._run(send, _is_one, early=not wait_all, shielded=True, only=only)

    async def extend(
        self,
        key: bytes,
        token: bytes,
        ttl: float,
        *,
        then: Callable[[Votes], None] | None = None,
    ) -> tuple[Votes, float | None]:
        """Compare-and-PEXPIRE on every node; never cancelled midway.

        Returns the votes and the new expiry time (``None`` when not extended on a
        quorum in time). ``then(votes)`` is called once the votes are decided, also
        when the caller is cancelled meanwhile (before the cancellation is re-raised).
        """
        args = (b"1", key, token, b"%d" % milliseconds(ttl))

        def send(node: NodeLike, callback: Callback) -> None:
            node.call_script(EXTEND_SCRIPT, args, callback)

        start = self.clock()
        votes = await self._run(send, _is_one, shielded=True, then=then)
        if votes.won:
            expires_at = start + ttl - drift(ttl, self.drift_factor)
            if expires_at > self.clock():
                return votes, expires_at
        return votes, None

    async def extend_many(
        self, items: Sequence[tuple[bytes, bytes, float]], *, budget: float | None = None
    ) -> BatchVotes:
        """Extend many locks, each ``(key, token, ttl)``, with one script call per node.

        Waits for every node, or ``budget`` seconds (default ``node_timeout``: a big batch
        takes a node longer than one small request); never cancelled midway. The
        caller derives each lock's outcome from the counts, from ``start``.
        """
        timeout = self.node_timeout if budget is None else budget
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        chunks = [
            (lo, min(lo + BATCH_LIMIT, len(items))) for lo in range(0, len(items), BATCH_LIMIT)
        ]
        batch = BatchVotes(len(items), self.n * len(chunks), self.clock(), waiter)
        if not chunks:
            return batch
        timer = loop.call_later(timeout, batch.expire, self.nodes, chunks, timeout)
        for lo, hi in chunks:
            part = items[lo:hi]
            args: list[bytes] = [b"%d" % len(part)]
            args.extend(key for key, _token, _ttl in part)
            for _key, token, ttl in part:
                args.append(token)
                args.append(b"%d" % milliseconds(ttl))
            packed_args = tuple(args)
            for ni, node in enumerate(self.nodes):
                node.call_script(
                    EXTEND_MANY_SCRIPT,
                    packed_args,
                    functools.partial(batch.record, node, ni, lo, hi),
                )
        try:
            await _uncancellable(batch)
        finally:
            timer.cancel()
        return batch


class BatchVotes:
    """Per-lock vote counts of one batched extend (see :meth:`Quorum.extend_many`)."""

    __slots__ = (
        "_answered",
        "_outstanding",
        "_waiter",
        "errors",
        "failed",
        "missing",
        "no",
        "start",
        "yes",
    )

    def __init__(
        self, m: int, outstanding: int, start: float, waiter: asyncio.Future[None]
    ) -> None:
        self.start = start
        self.yes = [0] * m
        self.no = [0] * m
        self.failed = [0] * m
        self.errors: dict[object, BaseException] = {}
        #: For each lock that some node said it does not hold: those nodes' indices.
        self.missing: dict[int, list[int]] = {}
        self._answered: set[tuple[int, int]] = set()
        self._outstanding = outstanding
        self._waiter = waiter

    def record(self, node: NodeLike, ni: int, lo: int, hi: int, reply: Any) -> None:
        """Count node ``ni``'s reply for the locks ``lo`` to ``hi`` (exclusive)."""
        if (ni, lo) in self._answered:
            return
        self._answered.add((ni, lo))
        if isinstance(reply, BaseException) or not isinstance(reply, list):
            error = reply if isinstance(reply, BaseException) else TypeError(repr(reply))
            self.errors[node.spec] = error
            for j in range(lo, hi):
                self.failed[j] += 1
        else:
            for j, one in zip(range(lo, hi), reply, strict=False):
                if one == 1:
                    self.yes[j] += 1
                elif isinstance(one, BaseException):  # one part of a split call failed
                    self.errors[node.spec] = one
                    self.failed[j] += 1
                else:
                    self.no[j] += 1
                    self.missing.setdefault(j, []).append(ni)
        self._outstanding -= 1
        if self._outstanding == 0 and not self._waiter.done():
            self._waiter.set_result(None)

    def decided(self) -> bool:
        """Every (node, chunk) answered or timed out."""
        return self._outstanding == 0

    def expire(
        self, nodes: Sequence[NodeLike], chunks: Sequence[tuple[int, int]], timeout: float
    ) -> None:
        """Count every (node, chunk) still unanswered as failed by timeout."""
        for ni, node in enumerate(nodes):
            for lo, hi in chunks:
                if (ni, lo) not in self._answered:
                    error = TimeoutError(f"{node.name}: no reply within {timeout:g}s")
                    self.record(node, ni, lo, hi, error)


def _call_with_keys_asked(
    node: NodeLike,
    script: Script,
    args: tuple[bytes, ...],
    keys_asked: Callable[[Any], tuple[bytes, ...] | None],
    callback: Callback,
) -> None:
    """Run ``script`` on ``node``; while its reply asks for keys, run it again with them.

    ``args`` is ``(numkeys, *keys, *argv)``; the keys asked for are appended to the keys.
    After :data:`MAX_KEY_ROUNDS` rounds the node counts as "held", holder's ttl unknown.
    """
    numkeys = int(args[0])
    keys, argv = args[1 : 1 + numkeys], args[1 + numkeys :]
    rounds = 0

    def on_reply(reply: Any) -> None:
        nonlocal rounds
        more = None if isinstance(reply, BaseException) else keys_asked(reply)
        if more is None:
            callback(reply)
        elif rounds >= MAX_KEY_ROUNDS:
            callback([0, -2])  # the keys kept changing: held, ttl unknown
        else:
            rounds += 1
            node.call_script(script, (b"%d" % (numkeys + len(more)), *keys, *more, *argv), on_reply)

    node.call_script(script, args, on_reply)


def milliseconds(seconds: float) -> int:
    """Whole milliseconds for PX/PEXPIRE, at least 1."""
    return max(1, int(seconds * 1000))
