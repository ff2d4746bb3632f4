"""Which names each asyncio task holds through one manager: reentrancy, and its absence.

A task that acquires a name it already holds through the same manager would wait for
itself until its timeout. So, as anyio's and trio's locks do, that raises
``RuntimeError`` at once, unless both handles are reentrant (``reentrant=True``): then
the inner one shares the outer acquisition (same token, fencing token, validity and
loss) with no I/O, and the nodes are released with the last level. Another task, a
child task included, waits as usual.

Only plain locks take part (``locks.lock()`` and ``lock_many``): a semaphore's slots
and a read lock's key are one holder's each, and two of them in one task are fine.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .hold import Hold, Renewing

__all__ = ["TaskHold", "TaskHolds"]


class TaskHold:
    """One name held by one task: the shared acquisition and how many levels hold it."""

    __slots__ = ("hold", "key", "levels", "reentrant", "renewal", "task")

    def __init__(
        self,
        task: asyncio.Task[Any],
        key: bytes,
        hold: Hold,
        renewal: Renewing | None,
        *,
        reentrant: bool,
    ) -> None:
        self.task = task
        self.key = key
        self.hold = hold
        self.renewal = renewal
        self.reentrant = reentrant
        self.levels = 1


class TaskHolds:
    """The names each live task holds (tasks are weakly referenced: no leak)."""

    def __init__(self) -> None:
        self._by_task: weakref.WeakKeyDictionary[asyncio.Task[Any], dict[bytes, TaskHold]] = (
            weakref.WeakKeyDictionary()
        )

    def held(self, key: bytes, now: float) -> TaskHold | None:
        """The current task's entry for ``key``, if it still holds it with validity left."""
        task = asyncio.current_task()
        if task is None:
            return None
        entry = self._by_task.get(task, {}).get(key)
        if entry is None or entry.hold.remaining(now) <= 0.0:
            return None  # (a lost or expired one no longer counts)
        return entry

    def add(self, key: bytes, hold: Hold, renewal: Renewing | None, *, reentrant: bool) -> TaskHold:
        """Note that the current task now holds ``key`` (at one level)."""
        task = asyncio.current_task()
        assert task is not None  # noqa: S101 - acquire runs in a task
        entry = TaskHold(task, key, hold, renewal, reentrant=reentrant)
        self._by_task.setdefault(task, {})[key] = entry
        return entry

    def remove(self, entry: TaskHold) -> None:
        """Forget ``entry`` (released, dropped, detached), from whichever task."""
        holds = self._by_task.get(entry.task)
        if holds is not None and holds.get(entry.key) is entry:
            del holds[entry.key]
