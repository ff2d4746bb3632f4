"""Callbacks: a request's, as every layer that sends requests writes it, and Soon's.

:class:`Soon` runs the callbacks due once a loop iteration's requests are written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["Callback", "Record", "Soon", "ignore"]

#: Called once with a request's reply, or with the exception that ended it.
Callback = Callable[[Any], None]
#: A fan-out's one callback for all its nodes: called with a node's index and its reply.
Record = Callable[[int, Any], None]


def ignore(_reply: Any) -> None:
    """A callback for requests whose reply does not matter."""
    return


class Soon:
    """Callbacks run after the current loop iteration's work, in order, on one handle.

    A manager's nodes flush the requests they held back (see _io/node.py), then its
    fan-outs start their timers (see FanOutTimer). One per manager: a loop handle per
    node and per fan-out cost more than the requests did.
    """

    __slots__ = ("_due", "_loop")

    def __init__(self) -> None:
        #: The callbacks of the handle now due, on ``_loop`` (a batch that another loop
        #: was left with never runs here: a new one starts).
        self._due: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, callback: Callable[..., object], *args: Any) -> None:
        """Run ``callback(*args)`` after every callback given before it."""
        loop = asyncio.get_running_loop()
        due = self._due
        if not due or self._loop is not loop:
            due = self._due = []
            self._loop = loop
            loop.call_soon(self._run, due)
        due.append((callback, args))

    def _run(self, due: list[tuple[Callable[..., object], tuple[Any, ...]]]) -> None:
        if self._due is due:  # (callbacks given from now on: the next handle's)
            self._due = []
        for callback, args in due:
            try:
                callback(*args)
            except Exception as exc:  # as the loop's own handles: reported, the rest run
                asyncio.get_running_loop().call_exception_handler(
                    {"message": f"aiolock: exception in {callback!r}", "exception": exc}
                )
