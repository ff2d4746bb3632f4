"""What is held: one acquisition of one key, and the names each task holds. No I/O.

A :class:`Hold` is made when an acquire wins and lives until the handle releases or
drops it: its token, fencing token and validity. The handle, ``extend()`` and the
renewal all change its validity through :meth:`Hold.begin_extension` /
:meth:`Hold.end_extension`, so the rule for overlapping extensions is in one place
(httpcore's pool has the same split: state decided here, without I/O; the I/O in the
callers).

:class:`TaskHolds` notes which names each asyncio task holds through one manager. A
task that acquires a name it already holds through the same manager would wait for
itself until its timeout. So, as anyio's and trio's locks do, that raises
``RuntimeError`` at once, unless both handles are reentrant (``reentrant=True``): then
the inner one shares the outer acquisition (same token, fencing token, validity and
loss) with no I/O, and the nodes are released with the last level. Another task, a
child task included, waits as usual. Only plain locks take part (``locks.lock()`` and
``lock_many``): a semaphore's slots and a read lock's key are one holder's each, and
two of them in one task are fine.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

from .errors import LockLost

__all__ = ["Extension", "Hold", "Renewing", "TaskHold", "TaskHolds", "Watcher"]


class Watcher(Protocol):
    """What a hold needs of its renewal (``_renewal.Renewal``)."""

    @property
    def active(self) -> bool: ...

    @property
    def lost(self) -> LockLost | None: ...

    def validity_changed(self, ttl: float) -> None: ...

    def validity_lowered(self, ttl: float) -> None: ...


class Extension:
    """One extension of a hold's validity in flight (an ``extend()`` or a renewal)."""

    __slots__ = ("overlapped", "settled")

    def __init__(self) -> None:
        #: Another extension of the same hold was in flight at the same time.
        self.overlapped = False
        self.settled = False


class Renewing(Protocol):
    """A held lock's background renewal, as its handle sees it (the engine makes it)."""

    @property
    def lost(self) -> LockLost | None:
        """Why the lock was lost, once the renewal gave up; else ``None``."""

    async def wait_lost(self) -> LockLost:
        """Until the renewal gives up: the ``LockLost`` that says why."""

    def on_lost(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` once when the renewal gives up (at once if it has)."""

    def declare_lost(self, reason: str, cause: BaseException | None) -> None:
        """Give up: the lock is known lost (an extend() found it gone, say)."""

    def stop(self) -> None:
        """Stop renewing (released, detached)."""


@dataclass(eq=False, slots=True)
class Hold:
    """The state of one held key, shared by its handle and its renewal."""

    name: str
    key: bytes
    token: bytes
    _: KW_ONLY
    #: The ttl of each renewal.
    ttl: float
    fence: int | None
    #: When the request that set the current validity was sent (monotonic).
    valid_from: float
    #: When the validity ends (monotonic): ``valid_from + ttl - drift``.
    expires_at: float
    acquired_at: float
    max_hold: float | None = None
    #: Whether the renewal may re-create the key where a node lost it (a plain key
    #: and counter; a reader of a read-write lock is also a member of a set: not).
    repairable: bool = True
    #: The longest ttl any command of this hold carried (its acquire, renewals and
    #: extensions): one may land late and keep the key that long from then.
    longest: float = field(init=False)
    #: The greatest fencing token reserved on a quorum for this key's holders of
    #: this process (see ``_waiting/lease.py``): tokens above ``fence`` up to it may be
    #: handed out without asking the nodes.
    reserve: int | None = field(init=False)
    #: Released or dropped: no extension settles on it any more.
    ended: bool = field(init=False, default=False)
    extensions: list[Extension] = field(init=False, default_factory=list)
    renewal: Watcher | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.longest = self.ttl
        self.reserve = self.fence

    @property
    def lost(self) -> LockLost | None:
        """Why the renewal gave the key up, if it did."""
        renewal = self.renewal
        return renewal.lost if renewal is not None else None

    def end(self) -> None:
        """Released or dropped: no extension settles on it any more.

        It forgets its renewal, stopped by now, which refers back to it: the two would
        otherwise be a cycle that only the garbage collector frees. ``remaining()`` is
        ``0.0`` from now on whatever the renewal said.
        """
        self.ended = True
        self.renewal = None

    def remaining(self, now: float) -> float:
        """Seconds of validity left at ``now``; ``0.0`` once ended or lost."""
        if self.ended or self.lost is not None:
            return 0.0
        left = self.expires_at - now
        return left if left > 0.0 else 0.0

    def deadline(self, now: float) -> float:
        """When ``max_hold`` ends, counted from ``now``; infinity without one."""
        return math.inf if self.max_hold is None else now + self.max_hold

    def begin_extension(self, expires_at: float = math.inf, ttl: float = 0.0) -> Extension:
        """Note an extension by ``ttl`` going out, whose validity would end at ``expires_at``.

        A shorter one lowers the validity at once, before any node applied it: at every
        moment, the validity is at most what the nodes keep once every command of ours
        in flight has landed, whenever that is. (Waiting for the outcome would be safe
        too, since a key cannot expire before the outcome is decided, but would leave
        the holder believing more than the nodes keep meanwhile.) See
        :meth:`end_extension`.
        """
        self.longest = max(self.longest, ttl)
        if expires_at < self.expires_at and not self.ended:
            self.expires_at = expires_at
            renewal = self.renewal
            if renewal is not None and renewal.active:
                renewal.validity_lowered(ttl)
        extension = Extension()
        if self.extensions:
            extension.overlapped = True
            for other in self.extensions:
                other.overlapped = True
        self.extensions.append(extension)
        return extension

    def end_extension(
        self,
        extension: Extension,
        start: float,
        expires_at: float,
        ttl: float,
        *,
        won: bool = False,
    ) -> None:
        """Make the validity follow an extension by ``ttl`` sent at ``start``.

        ``expires_at`` is ``start + ttl`` less drift. Each node that applied the
        extension holds the key until at least ``start + ttl``; the others keep the
        expiry they had. So the validity becomes ``expires_at`` only when a quorum
        confirmed it and no other extension of this hold was in flight meanwhile
        (then the nodes may have applied them in either order); otherwise it becomes
        the earlier of the two. That also holds when the caller of ``extend()`` was
        cancelled, when the ttl is shorter than the one before, and when the outcome
        is unknown. The renewal schedule follows.
        """
        if extension.settled:
            return
        extension.settled = True
        self.extensions.remove(extension)
        if self.ended:
            return  # released (or dropped) meanwhile
        # (Equal: a shorter one lowered the validity when sent; the schedule follows now.)
        if (not won or extension.overlapped) and expires_at > self.expires_at:
            return  # unconfirmed or raced: keep the earlier
        self.expires_at = expires_at
        self.valid_from = start
        renewal = self.renewal
        if renewal is not None and renewal.active:
            renewal.validity_changed(ttl)


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
    """The names each task holds; a task is known only while it holds a name.

    One plain dict keyed by task and key: not a ``WeakKeyDictionary`` (each entry
    references its task anyway, and a weak key costs a new weak reference on every
    lookup), and not a dict per task (made and dropped on every lock cycle).
    """

    def __init__(self) -> None:
        self._held: dict[tuple[asyncio.Task[Any], bytes], TaskHold] = {}

    def held(self, task: asyncio.Task[Any], key: bytes, now: float) -> TaskHold | None:
        """``task``'s entry for ``key``, if it still holds it with validity left."""
        entry = self._held.get((task, key))
        if entry is None or entry.hold.remaining(now) <= 0.0:
            return None  # (a lost or expired one no longer counts)
        return entry

    def add(self, entry: TaskHold) -> TaskHold:
        """Note that ``entry``'s task now holds its key (at one level)."""
        self._held[entry.task, entry.key] = entry
        return entry

    def remove(self, entry: TaskHold) -> None:
        """Forget ``entry`` (released, dropped, detached), from whichever task."""
        held = (entry.task, entry.key)
        if self._held.get(held) is entry:
            del self._held[held]
