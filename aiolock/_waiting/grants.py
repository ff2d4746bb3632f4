"""A lock granted by another process's release, without an attempt of our own.

A waiting process leaves, with its entry in the name's turn queue, an *offer*: the token
and ttl its head would take the lock with (see ``_waiting/turns.py``). The release that names the
process sets the key to that token on each node and publishes the grant to it alone
(``RELEASE_TURN``), so the lock changes processes in one script per node and one
message, where it took a release, a message and an attempt. The rules:

* **Validity counts from when the offer was sent**, as an acquire's from its requests:
  each node keeps the key the offer's ttl after the offer *arrived*, so never shorter.
  A node grants only an offer with at least half its ttl left.
* **A quorum of nodes, not vetoed (restart quarantine), must have granted the same
  token with the same fencing token** before the head takes it; each node's grant
  advanced its counter as an acquire does, so tokens still increase (safety.md,
  "Fencing tokens").
* **Anything less, the head settles with an attempt of its own, with the same token**:
  a node that granted it answers yes (``ACQUIRE`` on its own token), the others as
  usual. So grants split between processes (nodes that disagree on the line), grants
  lost on the way, or fencing tokens that differ cost an attempt, as before, never a
  wrong outcome. The head tries :data:`GRANT_WAIT` after a first grant when the rest
  does not come, and at once after its own attempt, if a grant came meanwhile.
* **A grant the head's own clean-up may have deleted never counts**: when the head's
  attempt (same token) fails, it releases the token on the nodes that may hold it,
  grants included; those nodes' grants, heard before or after (pub/sub is another
  connection), no longer count for the offer.
* **A grant nobody can take is given back** on every node (and everyone may try):
  its head left, or was passed the lock by its own process meanwhile. A grant no
  process receives (it is gone) is undone by the node itself.
* **A token held is never given back by a late grant**: once the head holds it (by a
  grant, or by its own attempt), later grants of it are left alone, however late they
  come; its release deletes them with the rest. A late grant of a token taken and
  no longer held is given back on its own node alone: where it was not taken, or
  where the grant is newer than the taking (a greater fencing token: the offer in
  line still named the token, and a release granted it again).
* **Only what is held must be remembered exactly.** Which tokens are held
  (``_held``) is exact and holds one entry per lock held through this manager (a
  lease passes the entry on with the token; a release, handoff, detach or a new
  acquisition of the handle drops it). The other memories are bounded and forget
  safely: ``_held`` is read before them, so a token forgotten from ``_taken`` and not in
  ``_held`` is one nobody holds, and giving it back everywhere deletes nothing a holder
  believes valid; an offer forgotten by ``Turns`` makes its late grants unreadable, and they stay on
  their node until their ttl (a lock idle that long, never two holders).
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from .._core.votes import Attempt, Votes, is_taken
from .handoff import give_back
from .taker import Taker

if TYPE_CHECKING:
    from .._quorum.quorum import Quorum

__all__ = ["GRANT_WAIT", "Grants"]

#: How long after a first grant the others may take before the head tries itself.
GRANT_WAIT: Final = 0.05
#: Tokens remembered as taken (late grants of them are left alone).
_TAKEN_KEPT: Final = 1024


class _Heard:
    """The grants of one token heard so far: node -> (fencing token, offer sent at)."""

    __slots__ = ("nodes", "timer")

    def __init__(self) -> None:
        self.nodes: dict[int, tuple[int, float]] = {}
        self.timer: asyncio.TimerHandle | None = None


class Grants:
    """The grants this manager's processes heard, per offered token."""

    def __init__(self, quorum: Quorum) -> None:
        self._quorum = quorum
        self._heard: dict[bytes, _Heard] = {}
        #: Tokens taken, with the nodes that counted for them and the fencing token
        #: (the last _TAKEN_KEPT: forgetting one is safe, see the module's docstring).
        self._taken: OrderedDict[bytes, tuple[frozenset[int], int]] = OrderedDict()
        #: The tokens taken and still held (not released, passed on, detached): exact,
        #: never forgotten while held; late grants of these are never given back.
        self._held: set[bytes] = set()
        #: The nodes where the head's own failed attempt released its offer's token
        #: (see :meth:`undone`); dropped with the offer.
        self._undone: dict[bytes, set[int]] = {}

    def heard(
        self,
        node: int,
        key: bytes,
        offer: tuple[bytes, float, float],
        fence: int,
        *,
        head: Taker | None,
        wake: Callable[[], None],
    ) -> None:
        """Node ``node`` granted ``key`` to ``offer`` (token, ttl, sent at) with ``fence``.

        ``head``: the offer of the head of our queue for ``key`` (None: nobody waits);
        ``wake`` wakes it.
        """
        token = offer[0]
        if token in self._held:
            # Ours, held: a node that granted it late. The copy is kept, whatever else
            # we remember (the next handoff or release finds the node in step): a
            # holder of ours believes the key valid, and a renewal may count this node.
            return
        taken = self._taken.get(token)
        if taken is not None:
            # Taken and let go since: given back on this node only (it would stay out
            # of step until the key expires). The nodes it was taken on had the
            # release, and a grant from before it is stale there; a newer one (a
            # release granted our offer again, still naming the token) is not.
            taken_on, fenced = taken
            if node not in taken_on or fence > fenced:
                give_back(self._quorum, key, token, only=node)
            if fence > fenced:
                wake()  # our turn, granted to a used offer: our head tries
            return
        if head is None or head.token != token:
            # Not held, and not our head's: the waiter it was for left without it, or
            # took it and let it go (forgotten since). Nobody holds it: give it back.
            self._forget(token)
            give_back(self._quorum, key, token)
            return
        if node in self._undone.get(token, ()):
            # Its grant may be one the head's own clean-up deleted since (this message
            # and that release went on different connections): not counted; the head's
            # next attempt, with the same token, asks the node again.
            wake()
            return
        self._count(node, key, offer, fence, head=head, wake=wake)

    def _count(
        self,
        node: int,
        key: bytes,
        offer: tuple[bytes, float, float],
        fence: int,
        *,
        head: Taker,
        wake: Callable[[], None],
    ) -> None:
        """A grant to our head's offer: once a quorum granted it, the head takes it."""
        token, ttl, sent_at = offer
        heard = self._heard.get(token)
        if heard is None:
            heard = self._heard[token] = _Heard()
        heard.nodes[node] = (fence, sent_at)
        if head.busy or head.claimed:
            wake()  # after its own attempt, which counts this grant, if it failed
            return
        quorum = self._quorum
        veto = quorum.veto
        counted = [i for i in heard.nodes if veto is None or veto(i) is None]
        if len(counted) < quorum.quorum:
            if heard.timer is None:
                heard.timer = asyncio.get_running_loop().call_later(GRANT_WAIT, wake)
            return
        fences = {heard.nodes[i][0] for i in counted}
        start = min(heard.nodes[i][1] for i in counted)
        expires_at = quorum.expiry(start, ttl)
        if len(fences) == 1 and expires_at > quorum.clock():
            (fence,) = fences
            votes = Votes(quorum.n, quorum.quorum, is_taken, _done(), early=False)
            for i in counted:
                votes.record(i, fence)  # (as ACQUIRE replies it)
            head.claimed = True
            head.on_dropped = functools.partial(give_back, quorum, key, token)
            head.deliver(Attempt(votes, expires_at, fence, start))
        wake()  # the head takes it, or settles it with an attempt of its own

    def settled(self, token: bytes, key: bytes, won: Attempt | None) -> None:
        """The waiter offering ``token`` left the queue.

        It took the lock with ``won`` (a grant's or its own attempt), or
        not (``None``).
        """
        if won is not None:
            nodes = frozenset(i for i, yes in enumerate(won.votes.verdicts) if yes)
            self._taken[token] = (nodes, won.fence or 0)
            self._held.add(token)
            if len(self._taken) > _TAKEN_KEPT:
                self._taken.popitem(last=False)
            self._forget(token)
        elif self._forget(token):
            give_back(self._quorum, key, token)  # granted somewhere, taken nowhere

    def tried(self, token: bytes, outcome: object) -> None:
        """The head's own attempt with ``token`` returned ``outcome``.

        Failed, it released the token on every node that may hold it (see
        ``Quorum.acquire``): the grants there are undone. Those nodes are the ones where the
        clean-up deleted the token, or may have (``Attempt.cleaned``): not the ones whose
        verdict is unknown now (a node's "held" that came after the decision, while the
        clean-up was on its way, is in the votes too), and not those where it deleted
        nothing (any grant of the token there came after it, and stands).
        """
        if isinstance(outcome, Attempt) and outcome.expires_at is None:
            self.undone(token, list(outcome.cleaned))

    def undone(self, token: bytes, nodes: list[int]) -> None:
        """The head's own attempt with ``token`` failed and released it on ``nodes``.

        A grant of ``token`` those nodes made before is deleted by that release, and one
        heard from them from now on may be such a grant, come late: none of these nodes
        counts for the offer any more (counted, they could make a quorum of grants the nodes
        no longer hold). Costs at most an attempt, never a holder.
        """
        if not nodes:
            return
        # Kept apart from the grants heard: a head that leaves without the lock gives
        # back only tokens some node granted (a give-back of a token a lease or a
        # handoff left on the key would delete a holder's key).
        self._undone.setdefault(token, set()).update(nodes)
        heard = self._heard.get(token)
        if heard is not None:
            for node in nodes:
                heard.nodes.pop(node, None)
            # The grants still to come start the wait for the rest again.
            if heard.timer is not None:
                heard.timer.cancel()
                heard.timer = None

    def forget(self, token: bytes) -> None:
        """A lock held with ``token`` is being released, passed on, detached or dropped."""
        self._held.discard(token)

    def _forget(self, token: bytes) -> bool:
        self._undone.pop(token, None)
        heard = self._heard.pop(token, None)
        if heard is not None and heard.timer is not None:
            heard.timer.cancel()
        return heard is not None


def _done() -> asyncio.Future[None]:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    return done
