"""Passing a released lock straight to a waiter of the same process, in one script.

A release that a local waiter follows would cost a release and an acquire on every
node (10 scripts on 5 nodes). When the head of the local queue sleeps (it offers a
:class:`~aiolock._waiting.taker.Taker`), the release is instead ``PASS_ON`` on every node:
compare the old token, set the waiter's with a fresh ttl, advance the fencing counter
as an acquire does. Nothing is published: the lock is not free for other processes;
unless the waiter's ttl is shorter than the key had left, which is announced as a
shortening ``extend()`` is (``SHORTENED``: other processes' waiters learn the new PTTL).

- The waiter's validity counts from the moment the handoff was sent, as an acquire's.
- A handoff that does not win a quorum is cleaned up on every node that may hold either
  token (``RELEASE_EITHER``); the waiter then falls back to a normal attempt.
- The old holder's ``release()`` returns when the handoff is decided: it succeeded when
  a majority replaced its token, the lock was not held any more when a majority did not
  have it (gone, or another token), as a plain release would say.
- A waiter that leaves (cancelled) while the handoff is in flight: the lock, if passed,
  is released again with the waiter's token, so that nobody holds it for nothing; the
  same when it is cancelled after the lock was passed, before it woke up to take it.
- Only a lock still valid is passed on: one lost or expired is released as before.
- Not during a restart quarantine: a quarantined node's yes does not count for an
  acquire, and a handoff would then fail where a release succeeds.

A handoff with more waiters of this process behind its taker also reserves fencing
tokens for them, which the handoffs after it hand out with no I/O (see _waiting/lease.py).
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

from .._core.calls import ignore
from .._core.cancel import outlast
from .._core.votes import Attempt, Votes, fence_of
from .._lua import NOT_FREE, PASS_ON_SCRIPT, RELEASE_EITHER_SCRIPT, RELEASE_SCRIPT
from .taker import Taker

if TYPE_CHECKING:
    from .._quorum.quorum import Quorum

__all__ = [
    "Line",
    "can_pass_on",
    "give_back",
    "others_in_line",
    "pass_on",
    "reserved",
]


#: A name's turn queue and this process's member in it, or nothing (no turns).
Line = tuple[bytes, bytes] | tuple[()]


def can_pass_on(quorum: Quorum) -> bool:
    """Whether a release may pass the lock on now (no node in its restart quarantine)."""
    veto = quorum.veto
    return veto is None or all(veto(i) is None for i in range(quorum.n))


def reserved(quorum: Quorum, attempt: Attempt, reserve: int) -> int | None:
    """The reserve a won ``PASS_ON`` asking for ``reserve`` tokens made, if any.

    The nodes that returned the token itself left their counters at token + reserve;
    when they are a quorum, every token up to that is reserved.
    """
    fence = attempt.fence
    if not reserve or fence is None:
        return None
    votes = attempt.votes
    at_fence = sum(
        1
        for reply, verdict in zip(votes.replies, votes.verdicts, strict=True)
        if verdict and fence_of(reply) == fence
    )
    return fence + reserve if at_fence >= quorum.quorum else None


async def pass_on(
    quorum: Quorum, key: bytes, token: bytes, taker: Taker, line: Line = (), *, reserve: int = 0
) -> Votes:
    """Release ``key``, held with ``token``, by passing it to ``taker``.

    ``line``: the name's turn queue and this process's member in it, when processes
    take turns: each node then says whether another process is in line (read the
    replies with :func:`others_in_line`). ``reserve``: how many fencing tokens to
    reserve above the taker's, for leases to the waiters behind it.

    Completes even if the caller is cancelled (re-raised after, as a release): the
    handoff runs in a task of its own, which the caller waits for whatever happens, so
    that the waiter always gets its outcome. Returns the votes, read as the release's:
    won when a majority now holds the taker's token.
    """
    handoff = asyncio.get_running_loop().create_task(
        _send_pass_on(quorum, key, token, taker, line, reserve=reserve)
    )
    return await outlast(handoff)


async def _send_pass_on(
    quorum: Quorum, key: bytes, token: bytes, taker: Taker, line: Line, *, reserve: int
) -> Votes:
    """The handoff itself: one script per node, then the outcome to the waiter."""
    attempt = await quorum.acquire(
        key,
        taker.token,
        taker.ttl,
        script=PASS_ON_SCRIPT,
        more_keys=line[:1],
        more_args=(token, b"%d" % reserve, *line[1:]),
        # The waiter falls back to an attempt of its own: others need not try.
        cleanup=(RELEASE_EITHER_SCRIPT, (), (token, NOT_FREE)),
    )
    if attempt.acquired:
        attempt.reserve = reserved(quorum, attempt, reserve)
        taker.on_dropped = functools.partial(give_back, quorum, key, taker.token)
    if not taker.deliver(attempt) and attempt.acquired:
        # The waiter left meanwhile: nobody takes the lock after all.
        await quorum.release(key, taker.token)
    return attempt.votes


def others_in_line(votes: Votes) -> bool:
    """Whether another process is in the name's turn queue, by a handoff's replies.

    Yes when a node that took the handoff (``PASS_ON`` with the turn queue) says so,
    and when none says (see Waiting.released).
    """
    said = [r[2] for r in votes.replies if type(r) is list and r[0] == 1 and len(r) > 2]
    return not said or any(said)


def give_back(quorum: Quorum, key: bytes, token: bytes, *, only: int | None = None) -> None:
    """Release ``key`` from ``token``, without waiting (a waiter cancelled too late).

    On each node's ordered connection the release goes before any later attempt.
    ``only``: on that node alone, quietly (the lock is held elsewhere, see _waiting/grants.py).
    """
    if only is not None:
        quorum.nodes[only].call_script(RELEASE_SCRIPT, (b"1", key, token, NOT_FREE), ignore)
        return
    args = (b"1", key, token)
    for node in quorum.nodes:
        node.call_script(RELEASE_SCRIPT, args, ignore)
