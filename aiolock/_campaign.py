"""Running code under a lock: leader election (``campaign``) and ``@synchronized``.

**Leader election**, ``await locks.campaign(name, run)``:

Forever: wait to be elected (acquire with no timeout), run ``await run(term)`` while
leader (``term`` is the held lock; ``term.fencing_token`` numbers the term), cancel
``run`` the moment leadership is lost (the lock's loss cancels the body of its
``async with``), then campaign again after a jittered pause. A leader that dies is
replaced when its lock expires: within about one ttl. Ends only by cancellation,
releasing the lock if leader.

**``@locks.synchronized(name_or_template)``**: each call runs under the lock of the
name formatted from the call's arguments.
"""

from __future__ import annotations

import functools
import inspect
import random
import string
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NoReturn, ParamSpec, TypeVar

import anyio

from ._core.checks import shown
from ._core.errors import LockLost, LockNotOwned, QuorumError
from ._core.events import logger

if TYPE_CHECKING:
    from ._handles.handle import Handle

__all__ = ["campaign", "synchronized"]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_H = TypeVar("_H", bound="Handle")


async def campaign(
    name: str, make: Callable[[], _H], run: Callable[[_H], Awaitable[object]], pause: float
) -> NoReturn:
    """Campaign for ``name`` with the locks ``make()`` gives (see the module docstring).

    ``pause``: about how long to wait between two terms (jittered by half), so that
    a leader whose ``run`` returned, or that lost its lock, lets others be elected.
    """
    while True:
        term = make()
        try:
            async with term:
                await run(term)
        except (LockLost, LockNotOwned, QuorumError) as exc:
            # Leadership lost, or nodes failing: campaign again. Anything else that
            # run() raises is the caller's and ends the campaign.
            logger.warning("aiolock: campaign for %s: %s", shown(name), exc)
        await anyio.sleep(pause * random.uniform(0.5, 1.5))


def synchronized(
    name_or_template: str, make: Callable[[str], Handle]
) -> Callable[[Callable[_P, Awaitable[_R]]], Callable[_P, Awaitable[_R]]]:
    """The decorator of ``@locks.synchronized``: ``make(name)`` gives each call's lock."""
    fields = {field for _, field, _, _ in string.Formatter().parse(name_or_template) if field}

    def decorate(fn: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]:
        signature = inspect.signature(fn)
        missing = {f.split(".")[0].split("[")[0] for f in fields} - set(signature.parameters)
        if missing:
            raise ValueError(
                f"lock name {name_or_template!r} uses {sorted(missing)}, which "
                f"{fn.__qualname__} has no parameter for"
            )

        @functools.wraps(fn)
        async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            name = name_or_template
            if fields:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                name = name_or_template.format(**bound.arguments)
            async with make(name):
                return await fn(*args, **kwargs)

        return wrapper

    return decorate
