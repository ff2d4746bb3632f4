"""Validation of what callers pass, before any I/O: each bound said in its error.

Pure functions, no imports from the rest of the package: the manager checks its
configuration with them, and the handles their per-call arguments.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_SEMAPHORE_LIMIT",
    "MAX_TTL",
    "check_limit",
    "check_name",
    "check_names",
    "check_number",
    "check_timeout",
    "check_ttl",
    "shown",
]

#: The longest ttl (and ``max_hold``), in seconds: a year. Far inside what ``PX`` takes,
#: with the fencing counter's retention (100 x ttl, see _core/keys.py) inside it too.
MAX_TTL: Final = 365 * 24 * 3600.0
#: The longest lock name, in UTF-8 bytes. A name is in every key and request of the
#: lock: a huge one would hold up the other requests queued on each node's connection.
MAX_NAME_BYTES: Final = 4096
#: The most holders a semaphore may have. A try costs the same round trips at any limit,
#: but a node's script reads what it noted of every taken slot to find a free one: this
#: bound keeps that read under a millisecond (see SEM_ACQUIRE).
MAX_SEMAPHORE_LIMIT: Final = 1000


#: How much of a name messages and logs show (a name may be 4 KB).
SHOWN_CHARS: Final = 100
#: What a number of seconds may be (besides a bool, refused). A tuple: ``int | float``
#: would make a union object on every check, three times per lock handle made.
_NUMBERS: Final = (int, float)


def shown(name: str) -> str:
    """``name`` for a message or a log line: quoted, and cut when long."""
    if len(name) <= SHOWN_CHARS:
        return repr(name)
    return f"{name[:SHOWN_CHARS]!r}... ({len(name.encode(errors='replace'))} bytes)"


def check_number(value: object, what: str) -> float:
    """A finite int or float (not a bool), as a float."""
    if isinstance(value, bool) or not isinstance(value, _NUMBERS):
        raise TypeError(f"{what} must be a number, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, got {number!r}")
    return number


def check_ttl(ttl: object, node_timeout: float, what: str = "ttl") -> float:
    """Validate a ttl (seconds) before any I/O."""
    if isinstance(ttl, bool) or not isinstance(ttl, _NUMBERS):
        raise TypeError(f"{what} must be a number of seconds, not {type(ttl).__name__}")
    ttl = float(ttl)
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"{what} must be a finite number of seconds > 0, got {ttl!r}")
    if ttl > MAX_TTL:
        raise ValueError(f"{what} must be at most {MAX_TTL:g}s (a year), got {ttl:g}")
    if node_timeout >= ttl:
        raise ValueError(
            f"{what} ({ttl:g}s) must be greater than the manager's node_timeout "
            f"({node_timeout:g}s): every lock would expire while being acquired"
        )
    return ttl


def check_timeout(timeout: object) -> float | None:
    """Validate a timeout: ``None`` (wait forever) or a number of seconds >= 0."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, _NUMBERS):
        raise TypeError(
            f"timeout must be None or a number of seconds, not {type(timeout).__name__}"
        )
    timeout = float(timeout)
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be None or >= 0, got {timeout!r}")
    return None if math.isinf(timeout) else timeout


def check_name(name: object) -> str:
    """Validate a lock name: a non-empty string of at most MAX_NAME_BYTES in UTF-8."""
    if not isinstance(name, str):
        raise TypeError(f"a lock name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("a lock name must not be empty")
    # Sized before it is encoded, in O(1): an ASCII str knows it is one (a flag of the
    # string, not a scan), and no character takes fewer than one byte in UTF-8.
    if name.isascii():
        size = len(name)
    elif len(name) > MAX_NAME_BYTES:
        raise ValueError(
            f"a lock name must be at most {MAX_NAME_BYTES} bytes in UTF-8, got "
            f"{len(name)} characters (starting {name[:40]!r})"
        )
    else:
        try:
            size = len(name.encode())
        except UnicodeEncodeError as exc:  # a lone surrogate
            raise ValueError(f"a lock name must be encodable as UTF-8: {exc.reason}") from None
    if size > MAX_NAME_BYTES:
        raise ValueError(
            f"a lock name must be at most {MAX_NAME_BYTES} bytes in UTF-8, got {size} "
            f"(starting {name[:40]!r})"
        )
    return name


def check_names(names: object) -> tuple[str, ...]:
    """Validate the names of a LockMany: a non-empty collection of lock names, sorted."""
    if isinstance(names, str | bytes) or not isinstance(names, Iterable):
        raise TypeError(f"names must be a collection of str, not {type(names).__name__}")
    checked = sorted({check_name(name) for name in names})
    if not checked:
        raise ValueError("names must not be empty")
    return tuple(checked)


def check_limit(limit: object) -> int:
    """Validate a semaphore's limit: an int from 1 to MAX_SEMAPHORE_LIMIT."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if not 1 <= limit <= MAX_SEMAPHORE_LIMIT:
        raise ValueError(f"limit must be from 1 to {MAX_SEMAPHORE_LIMIT}, got {limit!r}")
    return limit
