"""A request's callback, as every layer that sends requests to a node writes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Callback", "ignore"]

#: Called once with a request's reply, or with the exception that ended it.
Callback = Callable[[Any], None]


def ignore(_reply: Any) -> None:
    """A callback for requests whose reply does not matter."""
    return
