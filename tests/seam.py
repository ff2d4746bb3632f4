"""The one door from the tests into the library's internals.

A test that must look inside a manager or a handle (its engine: the nodes, the quorum,
the local queues, the turn queue) goes through these functions, so that a change in
the shape of the internals is mended here once, not in every test. What the engine
offers is its own interface (aiolock/_engine.py); private attributes beyond it are a
test's last resort and say why where they are read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiolock._engine import Engine

__all__ = ["engine", "member", "nodes", "waiters"]


def engine(of: Any) -> Engine:
    """The engine of a ``LockManager`` or of a handle it made."""
    found: Engine = of._engine
    return found


def nodes(of: Any) -> list[Any]:
    """The manager's nodes (``Node`` or ``ClusterNode``), in the order it was given them."""
    return list(engine(of).nodes)


def member(of: Any) -> bytes:
    """The manager's member in the turn queues (each manager is one process there)."""
    turns = engine(of).turns
    assert turns is not None, "this manager takes no turns"
    return turns.member


def waiters(of: Any, key: bytes) -> int:
    """How many tasks of the manager wait for the lock ``key``."""
    return engine(of).waiting.waiters(key)
