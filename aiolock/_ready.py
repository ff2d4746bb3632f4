"""Waiting until the nodes count: for a service's startup and its readiness probe.

A node whose server started (or whose ``run_id`` changed) less than ``restart_grace``
ago is in its restart quarantine: its yes to an acquire does not count, since it may
have lost the keys of locks still held (see docs/explanation/safety.md). Against
servers started a moment before, every acquire then fails with ``QuorumError`` until
the quarantine ends. :func:`wait_ready` lets a service wait that out once, at startup
(or answer "not ready" from a readiness probe with ``timeout=0``), instead of failing
its first requests.

Ready means: a quorum of nodes is connected, not refused (the same server as another
node, a server too old) and out of its quarantine. It says nothing of any lock, and
sends nothing but what connecting sends (``INFO server``, the scripts).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

import anyio

from ._core.errors import QuorumError
from ._engine import connect_each

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = ["wait_ready"]

#: How often nodes that are not connected are tried again while waiting.
RETRY: Final = 0.25


def _unready(engine: Engine) -> dict[object, BaseException]:
    """Each node that would not count for an acquire now, and why."""
    errors: dict[object, BaseException] = {}
    for i, node in enumerate(engine.nodes):
        error = engine.unready(i)
        if error is not None:
            errors[node.spec] = error
    return errors


async def wait_ready(engine: Engine, seconds: float | None) -> None:
    """Return once a quorum of ``engine``'s nodes would count for an acquire.

    Raises :class:`QuorumError` (each node that does not count, and why) when
    ``seconds`` pass first; ``0`` checks once, ``None`` waits for ever.
    """
    quorum = engine.quorum
    deadline = math.inf if seconds is None else engine.clock() + seconds
    await engine.connect()
    while True:
        errors = _unready(engine)
        if quorum.n - len(errors) >= quorum.quorum:
            return
        now = engine.clock()
        if now >= deadline:
            detail = "; ".join(str(e) or type(e).__name__ for e in errors.values())
            raise QuorumError(
                f"not ready within {seconds or 0.0:g}s: {len(errors)} of {quorum.n} nodes do "
                f"not count yet, a quorum needs {quorum.quorum}: {detail}",
                errors,
            )
        # Until the next quarantine ends, at most RETRY: unconnected nodes are tried.
        ends = [left for left in map(engine.quarantine_left, range(quorum.n)) if left > 0.0]
        with anyio.move_on_after(min([RETRY, deadline - now, *ends])):
            await connect_each(n for n in engine.nodes if not getattr(n, "connected", True))
            await anyio.sleep_forever()
