"""Handoffs within a process that send nothing: the lease.

A handoff to a waiter of the same process (``PASS_ON``, see _waiting/handoff.py) still costs
a round trip to the nodes, which the next holder waits for: that round trip, not the
critical section, bounded how many sections a second one name allowed. So a
``PASS_ON`` with more waiters of this process queued behind its taker also
*reserves* fencing tokens for them (up to :data:`LEASE_RESERVE`): the counters it
advances are left that many above the taker's token, in the same script that sets the
taker's key. While the lock is fresh, the next handoff then sends nothing
(:func:`lease`): the waiter takes the lock as it is on the nodes (the same token, the
same validity) with the next reserved fencing token.

- **Exclusion.** The key holds this process's token on a quorum until the validity
  the holder computed; within the process, one task holds it at a time. Nothing the
  nodes hold changes, so nothing can go wrong on them.
- **Fencing tokens still increase.** A token handed out by a lease is at most the
  reserve, which a quorum's counters reached (the nodes that returned the taker's own
  token, each left at token + reserve) with the key set by the same script: the
  majority-intersection argument (safety.md, "Fencing tokens") holds for every reserved token as
  for the taker's. A reserve confirmed on fewer than a quorum is not used.
- **Validity.** The waiter's is the holder's: it counts from when the request that set
  it was sent, as any validity does. A lease is made only while that leaves the
  waiter at most :func:`lease_slack` (1 % of its ttl, at least 5 ms) less than a
  fresh acquire would, never more (a waiter with a shorter ttl than the holder's: the
  key would outlive it should its process die). Nor to a waiter whose ttl is shorter
  than any the holder's commands carried (``Hold.longest``: its acquire's, its
  renewals', every ``extend()``'s): one of them still in flight, or given up on, may
  land after the lease and keep the key that long from then. A shorter extension in
  flight lowered the holder's validity when it was sent (``Hold.begin_extension``),
  so the waiter inherits at most what it leaves.
  Otherwise the handoff is a ``PASS_ON``,
  which brings a fresh ttl and a new reserve.
- Leases count in the streak of handoffs within the process (``Waiting.released``),
  so other processes get their turn as before.
- The cost: the tokens are not consecutive (they never were: see safety.md, "Fencing tokens"), and
  ``inspect()``'s fencing counter may run ahead of the last token handed out by the
  tokens reserved and not used.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Final

from .._core.votes import Attempt, Votes, is_one
from .handoff import give_back
from .taker import Taker

if TYPE_CHECKING:
    from .._core.hold import Hold
    from .._quorum.quorum import Quorum
    from .grants import Grants

__all__ = ["LEASE_RESERVE", "lease", "lease_slack"]

#: The most fencing tokens a handoff reserves for the leases after it (the streak of
#: handoffs within a process is never longer: ``_waiting.LONE_STREAK``).
LEASE_RESERVE: Final = 32


def lease_slack(ttl: float) -> float:
    """How much less validity than a fresh acquire a lease may leave its taker."""
    return max(0.005, 0.01 * ttl)


def lease(quorum: Quorum, hold: Hold, taker: Taker, grants: Grants | None) -> bool:
    """Pass the lock held as ``hold`` to ``taker`` with no I/O, if it may be.

    Returns whether it was (see the module's docstring for when it may). Should the
    taker be cancelled before it wakes up to take it, the lock is given back
    (released on every node).
    """
    fence, reserve = hold.fence, hold.reserve
    fresh = quorum.expiry(quorum.clock(), taker.ttl)  # what the taker's PASS_ON would give
    if (
        fence is None
        or reserve is None
        or reserve <= fence
        or hold.expires_at < fresh - lease_slack(taker.ttl)
        # Nor more: not to a waiter with a shorter ttl than any the holder's commands
        # carried. The key would outlive the taker should its process die, even once the
        # validity passed on is short enough: a command in flight or given up on may land
        # after the lease and keep the key that long. (As validities count from when they
        # were sent, that also bounds the validity.)
        or hold.longest > taker.ttl
    ):
        return False
    token = hold.token
    taker.on_dropped = functools.partial(_give_back_lease, quorum, hold.key, token, grants)
    outcome = Attempt(
        _decided_votes(quorum.n, quorum.quorum),
        hold.expires_at,
        fence + 1,
        hold.valid_from,
        reserve=reserve,
        token=token,
    )
    return taker.deliver(outcome)


def _decided_votes(n: int, quorum: int) -> Votes:
    """Votes already won, with no request sent: a lease's (see :func:`lease`)."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiter.set_result(None)
    votes = Votes(n, quorum, is_one, waiter, early=True)
    votes.yes = quorum
    return votes


def _give_back_lease(quorum: Quorum, key: bytes, token: bytes, grants: Grants | None) -> None:
    """Give back a lock leased to a waiter that was cancelled before it took it."""
    if grants is not None:
        grants.forget(token)
    give_back(quorum, key, token)
