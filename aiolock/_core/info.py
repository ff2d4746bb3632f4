"""What ``locks.inspect(name)`` reports: who holds a lock, on which nodes, for how long.

Read-only and never a token: each node runs one script (``INSPECT``) that returns the
key's PTTL, a digest of the holder's token and the fencing counter. The summary is
decided here, without I/O, from those replies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .votes import drift

__all__ = ["LockInfo", "NodeInfo", "decided", "summarize"]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node's view of a lock (see :meth:`LockManager.inspect`)."""

    #: The node, as in messages: its URL without the password.
    node: str
    #: Whether the node holds the lock's key.
    held: bool
    #: Milliseconds the key lives on that node; ``None`` when not held or not known.
    pttl: int | None
    #: A digest of the holder's token (12 hex digits), telling holders apart; never the
    #: token. ``None`` when not held or not known.
    holder: str | None
    #: The fencing counter of the name on that node (the last token it issued).
    fencing_counter: int | None
    #: Why the node did not answer, if it did not.
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class LockInfo:
    """A lock as the nodes see it now; returned by :meth:`LockManager.inspect`."""

    name: str
    #: Held by one holder on a quorum of nodes.
    held: bool
    #: That holder's digest (see :attr:`NodeInfo.holder`).
    holder: str | None
    #: Seconds the lock stays held on a quorum at least (less the drift allowance and
    #: the time the question took); ``None`` when not held.
    remaining: float | None
    #: The highest fencing counter of the nodes: the last fencing token issued (or
    #: above it, by tokens reserved for handoffs within a process: see _waiting/lease.py).
    fencing_counter: int | None
    #: Each node's view, in the manager's order.
    nodes: tuple[NodeInfo, ...]


def _quorum(n: int) -> int:
    return n // 2 + 1


def _integer(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def summarize(
    name: str,
    node_names: Sequence[str],
    replies: Sequence[Any],
    *,
    elapsed: float,
    drift_factor: float,
) -> LockInfo:
    """The :class:`LockInfo` of the ``INSPECT`` replies (or exceptions), node by node.

    ``elapsed``: seconds from sending the question to now, taken off ``remaining``.
    """
    nodes = []
    for node_name, reply in zip(node_names, replies, strict=True):
        if isinstance(reply, BaseException) or not isinstance(reply, list) or len(reply) < 3:
            error = reply if isinstance(reply, BaseException) else TypeError(repr(reply))
            nodes.append(NodeInfo(node_name, False, None, None, None, error))
            continue
        pttl, holder, counter = reply[0], reply[1], reply[2]
        held = holder is not None
        nodes.append(
            NodeInfo(
                node_name,
                held,
                int(pttl) if held and int(pttl) >= 0 else None,
                holder.decode() if isinstance(holder, bytes) else holder,
                _integer(counter),
            )
        )
    quorum = _quorum(len(nodes))
    counts = Counter(node.holder for node in nodes if node.held)
    holder, count = counts.most_common(1)[0] if counts else (None, 0)
    held = count >= quorum
    remaining = None
    if held:
        # The key lives at least this long on a quorum: the quorum-th longest PTTL of
        # the holder's nodes (unknown PTTLs count as none left).
        pttls = sorted(
            (node.pttl or 0 for node in nodes if node.held and node.holder == holder),
            reverse=True,
        )
        seconds = pttls[quorum - 1] / 1000
        remaining = max(0.0, seconds - elapsed - drift(seconds, drift_factor))
    counters = [node.fencing_counter for node in nodes if node.fencing_counter is not None]
    return LockInfo(
        name,
        held,
        holder if held else None,
        remaining,
        max(counters) if counters else None,
        tuple(nodes),
    )


def decided(info: LockInfo) -> bool:
    """Whether enough nodes answered to tell "held" from "not held" (see ``locked()``)."""
    if info.held:
        return True
    answered = sum(1 for node in info.nodes if node.error is None)
    most = max(Counter(n.holder for n in info.nodes if n.held).values(), default=0)
    # Not held for sure when the nodes that answered leave no holder a quorum.
    return answered - most >= _quorum(len(info.nodes))
