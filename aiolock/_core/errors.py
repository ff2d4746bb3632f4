"""The exception tree of the public API (see docs/reference/contract.md)."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["LockError", "LockLost", "LockNotOwned", "LockTimeout", "QuorumError"]


class LockError(Exception):
    """Base class of every error aiolock raises on purpose."""


class LockTimeout(LockError, TimeoutError):
    """The lock was not acquired within the timeout: someone else held it."""


class LockNotOwned(LockError):
    """``release()`` or ``extend()`` of a lock that is not held (any more).

    Raised when the lock expired, was taken over by another holder, was deleted
    behind the holder's back, or was never acquired by this handle.
    """


class LockLost(LockError):
    """A held lock could not be kept; the body of the ``async with`` was cancelled.

    The cause (quorum lost, key taken over, validity ran out) is chained as
    ``__cause__``.
    """


class QuorumError(LockError):
    """Too many nodes failed (errors or timeouts) for a quorum to be possible.

    This is distinct from the lock being held by someone else. ``errors`` maps
    each failing node (the URL or client given to the manager) to its exception.
    """

    def __init__(self, message: str, errors: Mapping[object, BaseException]) -> None:
        super().__init__(message)
        self.errors: dict[object, BaseException] = dict(errors)

    def __reduce__(self) -> tuple[type[QuorumError], tuple[str, dict[object, BaseException]]]:
        return (type(self), (str(self), self.errors))


class NodeQuarantined(Exception):
    """A node's yes to an acquire did not count: its server restarted too recently.

    Not raised: it is the per-node entry of :attr:`QuorumError.errors` for a node in its
    restart quarantine (see ``restart_grace``). Not part of the public API yet.
    """
