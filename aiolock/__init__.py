"""aiolock: asyncio-native distributed locks on Redis.

Redlock across N independent nodes (or a single-instance lock on one), background
renewal that cancels the holder when a lock is lost, and typed errors that tell
contention from outage. See ``LockManager``.
"""

from ._core.errors import LockError, LockLost, LockNotOwned, LockTimeout, QuorumError
from ._core.events import EventKind, LockEvent
from ._core.info import LockInfo, NodeInfo
from ._handles.handle import Handle
from ._handles.lock import Lock
from ._handles.many import LockMany
from ._handles.rwlock import ReadLock, RWLock, WriteLock
from ._handles.semaphore import Semaphore
from ._manager import LockManager

__version__ = "0.2.0"

__all__ = [
    "EventKind",
    "Handle",
    "Lock",
    "LockError",
    "LockEvent",
    "LockInfo",
    "LockLost",
    "LockManager",
    "LockMany",
    "LockNotOwned",
    "LockTimeout",
    "NodeInfo",
    "QuorumError",
    "RWLock",
    "ReadLock",
    "Semaphore",
    "WriteLock",
    "__version__",
]

# Tracebacks and reprs say ``aiolock.QuorumError``, not where the class is defined.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj
