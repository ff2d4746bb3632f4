"""Lock tokens: 160 random bits each, from the operating system, drawn in batches.

A token proves which holder a key is for: it must be unguessable, and never the same
for two acquisitions anywhere. ``secrets.token_bytes`` asks the kernel for each (a
``getrandom`` system call); one call here draws :data:`BATCH` tokens at once, from the
same source. A forked child drops what its parent drew, so the two never share one.
"""

from __future__ import annotations

import os
from typing import Final

__all__ = ["TOKEN_BYTES", "new_token"]

#: Token size in bytes: 160 bits, unguessable and never logged.
TOKEN_BYTES: Final = 20
#: Tokens drawn per system call.
BATCH: Final = 128

_drawn: list[bytes] = []
os.register_at_fork(after_in_child=_drawn.clear)


def new_token() -> bytes:
    """A fresh token."""
    try:
        return _drawn.pop()
    except IndexError:
        data = os.urandom(TOKEN_BYTES * BATCH)
        _drawn.extend(
            [data[i : i + TOKEN_BYTES] for i in range(TOKEN_BYTES, len(data), TOKEN_BYTES)]
        )
        return data[:TOKEN_BYTES]
