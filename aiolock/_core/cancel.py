"""Cancellation, written one way: what must finish finishes; the caller's cancellation after.

Every site in the package that must not be cut short by its caller's cancellation uses
one of these, and nothing else:

* ``with shielded():`` around a clean-up that must run to its end (a failed attempt's
  release on every node, a lock given back): an anyio scope, so the cancellation of the
  caller, by anyio or asyncio, is delivered at the block's end.
* ``await outlast(task)``: wait for work that runs on its own (a handoff in a task of its
  own) even if the caller is cancelled meanwhile, native ``Task.cancel()`` included;
  that cancellation is re-raised once the work is done, so the work's outcome is never
  lost (a waiter always learns whether it was passed the lock).
* ``await join(shared)``: wait for work that other callers share (a connect in progress):
  the caller may be cancelled, the shared work is not.
* ``await done_within(future, seconds)``: wait, up to a time, for a future the caller
  must not cancel by being cancelled (a waiter's turn in its local queue).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, TypeVar

import anyio

__all__ = ["done_within", "join", "move_on_after", "outlast", "shielded"]

_T = TypeVar("_T")


def shielded(shield: bool = True) -> anyio.CancelScope:
    """A scope whose block runs to its end whatever cancels the caller meanwhile.

    ``shield=False``: an ordinary scope (a loop whose first rounds may be cancelled, the
    body of an ``async with`` that its lock's loss cancels).
    """
    return _scope_class()(shield=shield)


def move_on_after(seconds: float) -> anyio.CancelScope:
    """``anyio.move_on_after(seconds)``: a scope that ends its block after ``seconds``."""
    return _scope_class()(deadline=asyncio.get_running_loop().time() + seconds)


@functools.cache
def _scope_class() -> type[anyio.CancelScope]:
    """The class of the scopes ``anyio.CancelScope()`` makes on asyncio.

    aiolock runs on asyncio alone. A scope made by its class directly costs half as
    much: ``anyio.CancelScope()`` looks the running backend up each time.
    """
    return type(anyio.CancelScope())


async def outlast(task: asyncio.Future[_T]) -> _T:
    """``task``'s result, waited for through the caller's cancellation (re-raised after)."""
    cancelled: asyncio.CancelledError | None = None
    # Shielded from anyio's cancel scopes (which would cancel again at every await)
    # and from native cancellation (caught, re-raised once the task is done).
    with shielded():
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError as exc:
                if task.cancelled():  # pragma: no cover - nothing else cancels it
                    raise
                cancelled = exc
    if cancelled is not None:
        raise cancelled
    return task.result()


async def done_within(future: asyncio.Future[Any], seconds: float | None) -> None:
    """Return once ``future`` is done or ``seconds`` passed (``None``: no limit).

    ``asyncio.wait([future], timeout=seconds)`` for one future, without its sets and
    checks (8 against 13 µs): cancelling the caller leaves ``future`` alone.
    """
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    timer: asyncio.TimerHandle | None = None

    def release(_done: object = None) -> None:
        if not waiter.done():
            if timer is not None:
                timer.cancel()
            waiter.set_result(None)

    if seconds is not None:
        timer = loop.call_later(seconds, release)
    future.add_done_callback(release)
    try:
        await waiter
    finally:
        if timer is not None:
            timer.cancel()
        future.remove_done_callback(release)


async def join(shared: asyncio.Future[_T]) -> _T:
    """``shared``'s result; cancelling the caller leaves ``shared`` running for others."""
    return await asyncio.shield(shared)
