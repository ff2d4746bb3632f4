"""aiolock: asyncio-native distributed locks on Redis.

Redlock across N independent nodes (or a single-instance lock on one), background
renewal that cancels the holder when a lock is lost, and typed errors that tell
contention from outage. See ``LockManager``.
"""

from ._errors import LockError, LockLost, LockNotOwned, LockTimeout, QuorumError
from ._events import EventKind, LockEvent
from ._handle import Handle
from ._info import LockInfo, NodeInfo
from ._lock import Lock
from ._manager import LockManager
from ._many import LockMany
from ._rwlock import ReadLock, RWLock, WriteLock
from ._semaphore import Semaphore

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
