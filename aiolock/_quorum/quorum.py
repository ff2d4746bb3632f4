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
import math
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn, Protocol

from .._core.batch import BatchVotes, as_extended, batch_chunks, chunk_args, extend_one
from .._core.calls import Soon, ignore
from .._core.cancel import outlast, shielded
from .._core.keys import fence_key as fence_key_of
from .._core.keys import fence_retention
from .._core.votes import (
    Attempt,
    Classifier,
    NodeLike,
    Veto,
    Votes,
    drift,
    fence_of,
    is_list,
    is_one,
    is_taken,
    milliseconds,
    quorum_size,
)
from .._lua import (
    ACQUIRE_SCRIPT,
    EXTEND_MANY_SCRIPT,
    EXTEND_SCRIPT,
    HANDOVER_SCRIPT,
    NOT_FREE,
    RAISE_FENCE_SCRIPT,
    RELEASE_SCRIPT,
    Script,
)
from .keys_asked import call_with_keys_asked

__all__ = ["Cleanup", "Quorum"]

#: How a failed attempt is cleaned up, when not with ``RELEASE`` (see Quorum.acquire).
Cleanup = tuple[Script, tuple[bytes, ...], tuple[bytes, ...]]
#: What a reply asks for more keys, if it does (see keys_asked.py).
KeysAsked = Callable[[Any], tuple[bytes, ...] | None]


class Quorum:
    """The Redlock algorithm over a fixed set of nodes."""

    def __init__(
        self,
        nodes: Sequence[NodeLike],
        *,
        node_timeout: float,
        drift_factor: float,
        clock: Callable[[], float],
        wall_clock: Callable[[], float] | None = None,
        soon: Soon | None = None,
    ) -> None:
        self.nodes = tuple(nodes)
        self.names = tuple(node.name for node in self.nodes)
        #: Seconds since the epoch, for fencing floors (safety.md, "Fencing tokens"); read
        #: at init.
        self.wall_clock = time.time if wall_clock is None else wall_clock
        self.n = len(self.nodes)
        self.quorum = quorum_size(self.n)
        self.node_timeout = node_timeout
        self.drift_factor = drift_factor
        self.clock = clock
        #: Consulted for each yes to an acquire (see :data:`Veto`); None: none.
        self.veto: Veto | None = None
        self._timer = FanOutTimer(node_timeout, self.names, soon)

    def expiry(self, start: float, ttl: float) -> float:
        """When a key set for ``ttl`` by requests sent at ``start`` stops being valid.

        Each node that applied the request keeps the key until at least ``start +
        ttl`` by its own clock; ours may run faster by the drift allowance.
        """
        return start + ttl - drift(ttl, self.drift_factor)

    async def _run(
        self,
        script: Script,
        args: tuple[bytes, ...],
        classify: Classifier,
        *,
        early: bool = True,
        shielded: bool = False,
        only: Sequence[int] | None = None,
        others: Any = None,
        then: Callable[[Votes], None] | None = None,
        veto: Veto | None = None,
        keys_asked: KeysAsked | None = None,
    ) -> Votes:
        """Run ``script`` with ``args`` on every node (or on ``only``): its votes, decided."""
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
        record, nodes = votes.record, self.nodes
        for i in indices:
            if keys_asked is None:
                nodes[i].call_for_vote(script, args, record, i)
            else:
                call_with_keys_asked(
                    nodes[i], script, args, keys_asked, functools.partial(record, i)
                )
        # Set going after the sends: its start then follows every write they scheduled
        # for this iteration's end (a script's load written at once, its EVALSHA held).
        timer = self._timer.start(votes, loop)
        try:
            try:
                await waiter
            except asyncio.CancelledError as exc:
                if not shielded:
                    raise
                await decided_despite(votes, exc)  # (wait_decided's, inlined: a frame less)
        finally:
            timer.cancel()
            if not votes.waiter.done():
                votes.waiter.cancel()
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
        keys_asked: KeysAsked | None = None,
        cleanup: Cleanup | None = None,
    ) -> Attempt:
        """One acquire attempt: ``SET key token NX PX ttl`` (in a script) on every node.

        A won attempt also gets a fencing token (docs/explanation/safety.md, "Fencing
        tokens"). On failure (or cancellation) the key is released again on every node
        that may hold it, and the clean-up is waited for before returning (or raising).
        ``script``, with ``more_keys`` and ``more_args`` after the usual ones, replaces the
        plain acquire (the read-write lock's); ``keys_asked`` reads the keys a reply asks
        to declare (see ``keys_asked.py``); ``cleanup``: how the clean-up releases, when
        not with ``RELEASE`` (the script, its keys after ``key``, its arguments after the
        token).
        """
        fence_key = fence_key_of(key) if fence_key is None else fence_key
        px, retention = _ttl_arguments(ttl)
        args = self._acquire_args(
            key, fence_key, token, px, retention=retention, more=(more_keys, more_args)
        )
        start = self.clock()
        try:
            # A node in its restart quarantine is still asked (its state catches up),
            # but its yes does not count.
            votes = await self._run(script, args, is_taken, veto=self.veto, keys_asked=keys_asked)
            fence = None
            if votes.won:
                fence = _agreed_fence(votes)
                if fence is None:
                    fence = await self._settle_fence(votes, fence_key, retention)
        except BaseException:
            # Cancelled with requests in flight: any node may have taken the key.
            with shielded():
                await self._clean_up(key, token, cleanup, None, ())
            raise
        if fence is not None:
            expires_at = self.expiry(start, ttl)
            if expires_at > self.clock():
                return Attempt(votes, expires_at, fence, start)
        return await self._failed(votes, key, token, cleanup)

    def _acquire_args(
        self,
        key: bytes,
        fence_key: bytes,
        token: bytes,
        px: bytes,
        *,
        retention: bytes,
        more: tuple[tuple[bytes, ...], tuple[bytes, ...]],
    ) -> tuple[bytes, ...]:
        """An acquire script's arguments (``numkeys``, its keys, then its ARGV).

        ``px`` and ``retention``: see :func:`_ttl_arguments`. ``more``: the keys and the
        arguments a script takes after the usual ones.
        """
        more_keys, more_args = more
        # The same floor for every node: in the usual case each returns exactly it.
        floor = b"%d" % int(self.wall_clock() * 1_000_000)
        return (
            b"%d" % (2 + len(more_keys)),
            key,
            fence_key,
            *more_keys,
            token,
            px,
            retention,
            floor,
            *more_args,
        )

    async def _failed(
        self, votes: Votes, key: bytes, token: bytes, cleanup: Cleanup | None
    ) -> Attempt:
        """A lost attempt: released again on every node that may have taken the key."""
        maybe_taken = [i for i in range(self.n) if votes.verdicts[i] is not False]
        cleaned: tuple[int, ...] = ()
        if maybe_taken:
            # The clean-up frees nothing for others when one holder has a quorum (we
            # lost a race): its message says so, and their waiters do not try. After
            # a split vote it must wake them: nobody holds the lock.
            message = (NOT_FREE,) if votes.one_holder() else ()
            cleaned = await self._clean_up(key, token, cleanup, maybe_taken, message)
        return Attempt(votes, None, cleaned=cleaned)

    async def _clean_up(
        self,
        key: bytes,
        token: bytes,
        cleanup: Cleanup | None,
        only: list[int] | None,
        message: tuple[bytes, ...],
    ) -> tuple[int, ...]:
        """Release ``token`` again; the nodes where it deleted it, or may have."""
        script, keys, args = cleanup or (RELEASE_SCRIPT, (), ())
        released = await self.release(
            key, token, wait_all=True, only=only, script=script, more_keys=keys,
            more_args=(*args, *message),
        )  # fmt: skip
        asked = range(self.n) if only is None else only
        return tuple(i for i in asked if released.verdicts[i] is not False)

    async def _settle_fence(self, votes: Votes, fence_key: bytes, retention: bytes) -> int | None:
        """A won attempt's fencing token, once a majority of counters has it (None: late).

        For when the nodes did not agree (:func:`_agreed_fence`).
        """
        replies = votes.replies
        verdicts = votes.verdicts
        fences = [fence_of(replies[i]) if verdicts[i] else 0 for i in range(self.n)]
        fence: int = max(fences)
        at_fence = sum(1 for f in fences if f >= fence)
        # Nodes that granted with a lower value, or said "held", lag behind; failed
        # nodes and nodes still to answer are left alone (the next floor brings them up
        # to date).
        behind = [
            i for i in range(self.n) if (verdicts[i] and fences[i] < fence) or verdicts[i] is False
        ]
        args = (b"1", fence_key, b"%d" % fence, retention)
        if at_fence >= self.quorum:
            # A majority holds the token already: bring the others up to date
            # without waiting (the requests are in flight on ordered connections).
            for i in behind:
                self.nodes[i].call_script(RAISE_FENCE_SCRIPT, args, ignore)
            return fence
        # Too few nodes hold the token: it must be durable on a majority first.
        # Nodes at the token count as confirmed; every other node is asked.
        ask = [i for i in range(self.n) if not (verdicts[i] and fences[i] >= fence)]
        raised = await self._run(RAISE_FENCE_SCRIPT, args, is_one, only=ask, others=1)
        return fence if raised.won else None

    def release(
        self,
        key: bytes,
        token: bytes,
        *,
        wait_all: bool = False,
        only: Sequence[int] | None = None,
        script: Script = RELEASE_SCRIPT,
        more_keys: tuple[bytes, ...] = (),
        more_args: tuple[bytes, ...] = (),
    ) -> Coroutine[Any, Any, Votes]:
        """Compare-and-delete on every node (or on ``only``); never cancelled midway.

        Its votes, once the outcome is decided; unless ``wait_all``: once every node
        answered or timed out (used for clean-up). (The fan-out itself, returned: a
        coroutine less to make, and to pass through, on every release.)
        """
        args = (b"%d" % (1 + len(more_keys)), key, *more_keys, token, *more_args)
        return self._run(script, args, is_one, early=not wait_all, shielded=True, only=only)

    async def extend(
        self,
        key: bytes,
        token: bytes,
        ttl: float,
        *,
        then: Callable[[Votes], None] | None = None,
        new_token: bytes | None = None,
    ) -> tuple[Votes, float | None]:
        """Compare-and-PEXPIRE on every node; never cancelled midway.

        Returns the votes and the new expiry time (``None`` when not extended on a
        quorum in time). ``then(votes)`` is called once the votes are decided, also
        when the caller is cancelled meanwhile (before the cancellation is re-raised).
        ``new_token``: also hand the lock over to that token (see ``HANDOVER``).
        """
        ms = b"%d" % milliseconds(ttl)
        script, args = (
            (EXTEND_SCRIPT, (b"1", key, token, ms))
            if new_token is None
            else (HANDOVER_SCRIPT, (b"1", key, token, new_token, ms))
        )
        start = self.clock()
        votes = await self._run(script, args, is_one, shielded=True, then=then)
        if votes.won:
            expires_at = self.expiry(start, ttl)
            if expires_at > self.clock():
                return votes, expires_at
        return votes, None

    async def ask(self, script: Script, args: tuple[bytes, ...]) -> Votes:
        """Run a read-only ``script`` on every node; wait for all (or ``node_timeout``).

        Each node's reply (or failure) is in ``votes.replies``; a list counts as a yes.
        """
        return await self._run(script, args, is_list, early=False)

    async def extend_many(
        self,
        items: Sequence[tuple[bytes, bytes, float]],
        *,
        budget: float | None = None,
        limit: float = math.inf,
    ) -> BatchVotes:
        """Extend many locks, each ``(key, token, ttl)``, with one script call per node.

        Waits for every node, or ``budget`` seconds per script call (default
        ``node_timeout``), ``limit`` at most in all (the calls go one at a time: below);
        never cancelled midway. The caller derives each lock's outcome from the counts,
        and its validity from when it called (the requests go before the first await).
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        chunks = batch_chunks([len(key) + len(token) for key, token, _ttl in items])
        batch = BatchVotes(len(items), n=self.n, chunks=len(chunks), waiter=waiter)
        if not chunks:
            return batch
        timeout = min((self.node_timeout if budget is None else budget) * len(chunks), limit)
        packed: dict[int, tuple[bytes, ...]] = {}  # a chunk's script arguments, once sent

        # One chunk at a time on each node: the batch shares the node's one ordered
        # connection with acquires and releases (see _engine.py), which then wait for
        # one chunk at most, not the whole batch. A chunk sent later is applied later:
        # validity counted from ``start`` only errs short. (Each takes a round trip: the
        # budget is per chunk: for the batch, later chunks would fail.)
        def send(ni: int, node: NodeLike, k: int) -> None:
            lo, hi = chunks[k]

            def answered(reply: object) -> None:
                batch.record(node, ni, lo, hi, reply)
                if k + 1 < len(chunks) and not batch.decided():
                    send(ni, node, k + 1)

            if hi - lo == 1 and node.set_ifeq:  # (one lock: the server's own command)
                node.call(extend_one(items[lo]), lambda reply: answered(as_extended(reply)))
                return
            if k not in packed:
                packed[k] = chunk_args(items, lo, hi)
            node.call_script(EXTEND_MANY_SCRIPT, packed[k], answered)

        for ni, node in enumerate(self.nodes):
            send(ni, node, 0)
        timer = WriteTimer(timeout, batch.expire, self.nodes, chunks, timeout)  # (as _fan_out's)
        try:
            await wait_decided(batch)
        finally:
            timer.cancel()
        return batch


@functools.lru_cache(maxsize=256)
def _ttl_arguments(ttl: float) -> tuple[bytes, bytes]:
    """An acquire's ``PX`` and its fencing counter's retention, in milliseconds, as arguments.

    Kept for the ttls last used: a service has a few, and every acquire sends both.
    """
    return b"%d" % milliseconds(ttl), b"%d" % milliseconds(fence_retention(ttl))


def _agreed_fence(votes: Votes) -> int | None:
    """A won attempt's fencing token when its nodes agree, without I/O; else ``None``.

    Usually every node that granted the lock returned the same value (the floor we
    sent), and none said "held": their counters, a quorum, already hold the token.
    """
    verdicts = votes.verdicts
    if False in verdicts:  # (a node said "held": its counter may lag)
        return None
    fence: int | None = None
    for reply, verdict in zip(votes.replies, verdicts, strict=True):
        if verdict:
            if fence is None:
                fence = fence_of(reply)
            elif fence_of(reply) != fence:
                return None
    return fence if votes.yes >= votes.quorum else None


# -- a fan-out's time: node_timeout from its writes; waiting until decided -------


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

    A fan-out's time counts from its writes, as a :class:`WriteTimer`'s: the fan-outs
    started in a loop iteration are stamped together by one callback, run after the
    writes they scheduled (:class:`Soon`'s, given with the iteration's first). Every
    fan-out of a quorum waits the same ``delay``, so their deadlines come in the order
    they are stamped: they queue, and one loop timer, armed for the oldest, expires what
    is due. (A timer per fan-out, its heap entry and its cancellation cost a fifth of a
    one-node lock cycle's client instructions.)
    """

    __slots__ = ("_armed_on", "_delay", "_due", "_fresh", "_fresh_on", "_names", "_soon")

    def __init__(self, delay: float, names: Sequence[str], soon: Soon | None = None) -> None:
        self._delay = delay
        self._names = names
        self._soon = Soon() if soon is None else soon
        self._due: deque[tuple[float, TimedFanOut]] = deque()
        #: The loop the timer is armed on (None: not armed).
        self._armed_on: asyncio.AbstractEventLoop | None = None
        #: The fan-outs started on ``_fresh_on`` that its next stamp times.
        self._fresh: list[TimedFanOut] = []
        self._fresh_on: asyncio.AbstractEventLoop | None = None

    def start(self, votes: Votes, loop: asyncio.AbstractEventLoop) -> TimedFanOut:
        """Time ``votes`` out ``delay`` after the writes scheduled so far (on ``loop``)."""
        timed = TimedFanOut(votes)
        fresh = self._fresh
        if fresh and self._fresh_on is loop:  # (its stamp runs after these writes too)
            fresh.append(timed)
            return timed
        fresh = self._fresh = [timed]
        self._fresh_on = loop
        self._soon(self._stamp, fresh, loop)
        return timed

    def _stamp(self, fresh: list[TimedFanOut], loop: asyncio.AbstractEventLoop) -> None:
        if self._fresh is fresh:  # (fan-outs started from now on: the next stamp's)
            self._fresh = []
        due = self._due
        # Fan-outs decided since leave now, not when the timer next fires (which skips
        # them alike): kept a node_timeout, each would outlive the young garbage
        # collections, and bring on the full ones (a full one costs milliseconds).
        while due and due[0][1].votes is None:
            due.popleft()
        deadline = loop.time() + self._delay
        for timed in fresh:
            if timed.votes is not None:  # (else decided and cancelled before this ran)
                due.append((deadline, timed))
        if due and self._armed_on is not loop:
            self._armed_on = loop
            loop.call_at(due[0][0], self._fire)

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
