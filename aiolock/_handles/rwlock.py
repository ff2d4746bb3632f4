"""Read-write lock: many readers or one writer, across a quorum.

Each node enforces the rule on its own, in one script per acquire: a reader is let in
when no writer holds and no writer waits; a writer when no writer holds and no live
reader remains. A holder needs a majority, and two majorities share a node, so a
reader and a writer (or two writers) never hold at once.

Policy: **writers are not starved.** A writer that finds readers leaves an *intent*
on the node, which keeps new readers out until the current ones are gone (or would
have expired); within a process, waiters are served in FIFO order, readers together.
A writer that gives up leaves its intent until those readers' locks would have
expired (a second more at most).

Keys (one hash tag): ``<key>:rw:w`` the writer, ``<key>:rw:i`` the writer's intent,
``<key>:rw:r`` the set of readers, ``<key>:rw:r:<id>`` each reader's own lock,
``<key>:rw:fence`` the fencing counter shared by readers and writers. Releases are
announced on ``<key>:rw:released``. Handles are renewed like locks.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._core.checks import shown
from .._core.keys import RWKeys
from .._core.votes import Attempt, Votes
from .._lua import RW_READ_SCRIPT, RW_RELEASE_SCRIPT, RW_WRITE_SCRIPT, Script
from .base import Configured
from .lock import Lock

if TYPE_CHECKING:
    from .._engine import Engine

__all__ = ["RWLock", "ReadLock", "WriteLock"]


class RWLock(Configured):
    """A read-write lock; created by :meth:`LockManager.rwlock`.

    ``read()`` and ``write()`` return new, unacquired handles with the API of
    :class:`Lock`.
    """

    def __init__(self, engine: Engine, name: str, *, ttl: float, timeout: float | None) -> None:
        super().__init__(name, ttl=ttl, timeout=timeout)
        self._engine = engine
        #: Every key and the channel of this name (see _core/keys.py).
        self.keys = RWKeys(engine.key(name))

    def __repr__(self) -> str:
        return f"<RWLock {shown(self._name)} ttl={self._ttl:g}>"

    def read(self) -> ReadLock:
        """A new handle for shared (read) access."""
        return ReadLock(self._engine, self)

    def write(self) -> WriteLock:
        """A new handle for exclusive (write) access."""
        return WriteLock(self._engine, self)


class _RWHandle(Lock):
    """What the read and the write handles share: their queue, channel and release."""

    def __init__(self, engine: Engine, rw: RWLock, *, role: str, key: bytes) -> None:
        self._rw = rw
        super().__init__(
            engine,
            f"{rw.name}[{role}]",
            ttl=rw.ttl,
            timeout=rw.timeout,
            auto_renew=True,
            key=key,
        )
        # Readers and writers of one name queue together, woken by one channel.
        self._channels = (rw.keys.channel,)

    # A reader's key alone is not the whole lock (it is also a member of the readers'
    # set), and the writer's counter is the name's: neither is re-created by renewal.
    _repairable = False
    _passes_on = False  # its keys and scripts are its own (see _waiting/handoff.py)

    @property
    def _queue_key(self) -> bytes:
        return self._rw.keys.base

    @property
    def _member(self) -> bytes:
        """The reader's id in the set of readers; empty for the writer."""
        return b""

    # The acquire script, and its keys and arguments after the usual ones.
    _script: Script

    def _more_keys(self) -> tuple[bytes, ...]:
        raise NotImplementedError

    def _more_args(self) -> tuple[bytes, ...]:
        raise NotImplementedError

    #: Reads from a node's reply the keys it asks to be declared (see RW_WRITE).
    _keys_asked: Callable[[Any], tuple[bytes, ...] | None] | None = None

    def _attempt(self, token: bytes) -> Awaitable[Attempt]:
        return self._engine.quorum.acquire(
            self._key,
            token,
            self._ttl,
            script=self._script,
            fence_key=self._rw.keys.fence,
            more_keys=self._more_keys(),
            more_args=self._more_args(),
            keys_asked=self._keys_asked,
        )

    def _release_votes(self, token: bytes, *, local: bool = False) -> Awaitable[Votes]:
        # (Readers and writers always announce a release: ``local`` is not used.)
        rw = self._rw
        return self._engine.quorum.release(
            self._key,
            token,
            script=RW_RELEASE_SCRIPT,
            more_keys=(rw.keys.readers,),
            more_args=(self._member, rw.keys.channel),
        )


class ReadLock(_RWHandle):
    """Shared access to a :class:`RWLock`: held together with other readers."""

    _exclusive = False

    def __init__(self, engine: Engine, rw: RWLock) -> None:
        self._id = secrets.token_hex(8).encode()
        super().__init__(engine, rw, role="read", key=rw.keys.reader_prefix + self._id)

    @property
    def _member(self) -> bytes:
        return self._id

    _script = RW_READ_SCRIPT

    def _more_keys(self) -> tuple[bytes, ...]:
        rw = self._rw
        return (rw.keys.writer, rw.keys.intent, rw.keys.readers)

    def _more_args(self) -> tuple[bytes, ...]:
        return (self._id,)


class WriteLock(_RWHandle):
    """Exclusive access to a :class:`RWLock`: no reader and no other writer."""

    def __init__(self, engine: Engine, rw: RWLock) -> None:
        super().__init__(engine, rw, role="write", key=rw.keys.writer)
        self._will_wait = True

    _script = RW_WRITE_SCRIPT

    def _more_keys(self) -> tuple[bytes, ...]:
        return (self._rw.keys.intent, self._rw.keys.readers)

    def _more_args(self) -> tuple[bytes, ...]:
        return (self._rw.keys.reader_prefix, b"1" if self._will_wait else b"0")

    def _keys_asked(self, reply: Any) -> tuple[bytes, ...] | None:
        # {2, id, ...}: the readers whose keys the script must be given.
        if type(reply) is list and reply and reply[0] == 2:
            prefix = self._rw.keys.reader_prefix
            return tuple(prefix + member for member in reply[1:])
        return None

    async def _acquire(self, wait: float | None) -> bool:
        # A writer that waits keeps new readers out meanwhile; one that only tries
        # once must not hold readers back after it gave up.
        self._will_wait = wait is None or wait > 0
        return await super()._acquire(wait)
