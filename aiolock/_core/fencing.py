"""Fencing tokens that stay strictly increasing across a Redlock quorum.

A lease can outlive its holder's belief in it (a GC or event-loop pause, a clock
jump, a slow network): the holder wakes up and writes after its lock expired and
someone else took it. The remedy is a *fencing token*: every acquisition of a name
gets a number greater than every earlier acquisition's, and the protected resource
refuses a write carrying a number lower than one it has already seen.

On one node an ``INCR`` does it. Across N nodes any single node may have missed
acquisitions (it was down, slow, or restarted empty), so its counter may lag.

How tokens are made
-------------------
Each node keeps a counter per lock name, ``<key>:fence`` (same hash tag as the lock
key). The acquirer sends every node the same *floor*, its own clock in microseconds
since the epoch. When the acquire script sets the lock key on a node it also computes

    fence = max(counter + 1, floor)                                        (1)

stores it as the counter (kept ``fence_retention(ttl)`` after its last use) and
returns it. When a quorum granted the lock:

    token = the largest fence returned by the nodes that granted it        (2)

and before the token is handed out, the counters of a majority must be at least
``token``. Usually they are at once: time moves on between acquisitions, so every
granting node returns the floor itself, even one that missed earlier acquisitions.
Otherwise (the acquirer's clock is behind the last token and the counters disagree)
the lagging nodes are raised to ``token`` and a majority must confirm it: one more
round trip. Nodes left behind are raised in the background.

Why they increase (the majority-intersection argument)
-------------------------------------------------------
Let A acquire with token ``t_A`` and B acquire after A, i.e. B's acquire script ran on
each node after A's key there was gone (released or expired; under the lock's safety
conditions A and B never hold at once).

* When A's acquire returned, a set ``W_A`` of at least a majority of nodes had a
  counter ``>= t_A`` (step 2). Counters never decrease while they exist.
* B's quorum ``M_B`` is a majority, so it shares a node ``n`` with ``W_A``.
* On ``n``, B's script ran after A's counter write on ``n``: B's ``SET NX`` on ``n``
  needs A's key to be gone, and A set its key on ``n`` before it wrote its counter
  there (same script, or a raise after it). So by (1) B's fence on ``n`` is
  ``>= counter + 1 > t_A``, and by (2) ``t_B >= fence_n > t_A``.

This needs the counter of ``n`` to survive from A to B: it fails only if every node of
``W_A ∩ M_B`` lost its counter, i.e. when more than a minority of the nodes failed in
total (down when A acquired, or restarted empty before B). Even then, and when a
counter expired (``fence_retention`` unused), the floor of (1) keeps tokens increasing
as long as acquirers' clocks agree to better than the time between A and B (``t_A`` is
A's clock at A's acquire, plus one per acquisition at most).

Cost: nothing extra in the common case (the counter is updated by the acquire script
itself, with one ``SET ... GET``: a few µs of server CPU); one round trip when
counters disagree. Tokens are
large integers (microseconds since the epoch, about 1.8e15 in 2026): below 2**53, exact
in every language.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MIN_RETENTION", "fence_retention"]

#: Least time a counter is kept after its last use.
MIN_RETENTION: Final = 3600.0


def fence_retention(ttl: float) -> float:
    """How long a name's counter outlives its last acquisition, in seconds.

    Long enough that clocks of the nodes agree much better than that; short enough
    that a name used once (a row id, an order id) does not cost memory forever.
    """
    return max(MIN_RETENTION, 100 * ttl)
