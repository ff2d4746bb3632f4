"""What happened to a lock: events for metrics and logs (never a token)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

__all__ = ["Emit", "EventKind", "LockEvent", "logger"]

#: aiolock's logger: DEBUG for acquisitions and releases, WARNING for losses and
#: outages. Messages name locks and nodes, never tokens.
logger: Final = logging.getLogger("aiolock")
# A library does not print: the application's logging configuration decides.
logger.addHandler(logging.NullHandler())

EventKind = Literal["acquired", "released", "timeout", "lost", "quorum_error"]


@dataclass(frozen=True, slots=True)
class LockEvent:
    """One event, passed to ``LockManager(on_event=...)``.

    ``seconds``: for ``acquired`` and ``timeout`` the time spent acquiring (waiting
    included); for ``released`` and ``lost`` the time the lock was held; for
    ``quorum_error`` the time until the nodes' failure was known. ``error`` is the
    ``LockLost`` or ``QuorumError`` (with each node's error) when there is one.
    """

    kind: EventKind
    name: str
    seconds: float
    error: BaseException | None = None


#: How the parts report events: ``emit(kind, name, seconds, error)`` (see _engine.py).
Emit: TypeAlias = Callable[[EventKind, str, float, "BaseException | None"], None]
