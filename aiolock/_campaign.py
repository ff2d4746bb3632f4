"""Leader election on a lock: ``await locks.campaign(name, run)``.

Forever: wait to be elected (acquire with no timeout), run ``await run(term)`` while
leader (``term`` is the held lock; ``term.fencing_token`` numbers the term), cancel
``run`` the moment leadership is lost (the lock's loss cancels the body of its
``async with``), then campaign again after a jittered pause. A leader that dies is
replaced when its lock expires: within about one ttl. Ends only by cancellation,
releasing the lock if leader.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NoReturn

import anyio

from ._checks import shown
from ._errors import LockLost, LockNotOwned, QuorumError
from ._events import logger

if TYPE_CHECKING:
    from ._lock import Lock

__all__ = ["campaign"]


async def campaign(
    name: str, make: Callable[[], Lock], run: Callable[[Lock], Awaitable[object]], pause: float
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
