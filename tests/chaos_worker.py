"""A chaos test worker process: contend for a few names, record every critical section.

    python tests/chaos_worker.py MODE SECONDS TASKS NAME,NAME URL [URL ...]

Prints one JSON object per line: each critical section (name, entered, valid_until,
left, token, pid, told) on the system-wide monotonic clock, then a summary of errors.

MODE ``expire``: ``auto_renew=False``, ttl 1 s, short sections. Now and then a holder
blocks its event loop past its lock's validity (a "paused holder"); its section may
then overlap the next holder's, which the checker allows only after its validity
ended and with a lower fencing token.

MODE ``renew``: ``async with`` and auto-renewal, ttl 2 to 6 s, sections of up to two
ttls. A body samples ``now + remaining()`` as a careful user would (``valid_until``,
its last estimate); when the lock is lost, ``left`` is the moment the cancellation
reached the body (``told``).

MODE ``delay``: as ``renew`` with ttls of 1 to 3 s, and bodies that now and then call
``extend()`` with a shorter or a longer ttl (issue 31: the nemesis holds messages back).

``$AIOLOCK_CHAOS_GRACE`` sets the managers' ``restart_grace`` (default: a little more than
the mode's longest ttl; ``0`` turns the restart quarantine off, to show what it prevents).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
from typing import Any

from aiolock import LockError, LockLost, LockManager, LockNotOwned, LockTimeout, QuorumError

NODE_TIMEOUT = 0.05
TTL = 1.0  # MODE expire
RENEW_TTL = (2.0, 6.0)  # MODE renew: the range of ttls
RENEW_HOLD = (0.05, 2.0)  # MODE renew: how long a section lasts, in ttls
DELAY_TTL = (1.0, 3.0)  # MODE delay: the range of ttls (sections as in renew)
EXTEND_CHANCE = 0.02  # MODE delay: per 10 ms of a body, the chance of an extend()


def restart_grace(mode: str) -> float:
    """The managers' restart_grace: longer than any ttl of the mode, unless overridden."""
    longest = {"renew": RENEW_TTL[1], "delay": DELAY_TTL[1]}.get(mode, TTL)
    default = longest + (1.0 if mode != "expire" else 0.5)
    return float(os.environ.get("AIOLOCK_CHAOS_GRACE", default))


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


async def main(mode: str, seconds: float, tasks: int, names: list[str], urls: list[str]) -> None:
    pid = os.getpid()
    errors: dict[str, int] = {}
    stop_at = time.monotonic() + seconds
    rng = random.Random(pid)

    def count(kind: str) -> None:
        errors[kind] = errors.get(kind, 0) + 1

    grace = restart_grace(mode)
    async with LockManager(urls, node_timeout=NODE_TIMEOUT, restart_grace=grace) as locks:

        async def expiring() -> None:
            while time.monotonic() < stop_at:
                name = rng.choice(names)
                lock = locks.lock(name, ttl=TTL, timeout=5, auto_renew=False)
                try:
                    if not await lock.acquire():
                        count("timeout")
                        continue
                except QuorumError:
                    count("quorum")
                    await asyncio.sleep(0.05)
                    continue
                entered = time.monotonic()
                valid_until = entered + lock.remaining()
                token = lock.fencing_token
                if valid_until <= entered:
                    # Acquired, but another task's stall (below) blocked this process
                    # before the body began: the lock expired meanwhile, and a careful
                    # holder does nothing with it (its older token is what fencing
                    # refuses). Not a section: recording it as one misordered tokens.
                    count("expired_before_entry")
                    with contextlib.suppress(LockError):
                        await lock.release()
                    continue
                if rng.random() < 0.01:
                    time.sleep(TTL * 1.3)  # a paused holder: the whole process stalls
                else:
                    await asyncio.sleep(rng.uniform(0.001, 0.01))
                left = time.monotonic()
                emit(
                    {
                        "name": name,
                        "entered": entered,
                        "valid_until": valid_until,
                        "left": left,
                        "token": token,
                        "pid": pid,
                        "told": False,
                    }
                )
                try:
                    await lock.release()
                except LockNotOwned:
                    count("expired")
                except LockError as exc:
                    count(type(exc).__name__)

        async def renewed() -> None:
            while time.monotonic() < stop_at:
                name = rng.choice(names)
                ttl = rng.uniform(*(DELAY_TTL if mode == "delay" else RENEW_TTL))
                record: dict[str, Any] = {}
                try:
                    async with locks.lock(name, ttl=ttl, timeout=5) as lock:
                        entered = time.monotonic()
                        record = {
                            "name": name,
                            "entered": entered,
                            "valid_until": entered + lock.remaining(),
                            "left": entered,
                            "token": lock.fencing_token,
                            "pid": pid,
                            "told": False,
                            "ttl": ttl,
                        }
                        end = min(entered + rng.uniform(*RENEW_HOLD) * ttl, stop_at)
                        try:
                            while True:
                                now = time.monotonic()
                                remaining = lock.remaining()
                                if remaining > 0.0:
                                    record["valid_until"] = now + remaining
                                record["left"] = now
                                if now >= end:
                                    break
                                if mode == "delay" and rng.random() < EXTEND_CHANCE:
                                    # Shorter or longer than the ttl: a shorter one that
                                    # lands late must never cut a later, longer one.
                                    await extend(lock, ttl, record)
                                    continue
                                await asyncio.sleep(min(0.01, end - now))
                        except asyncio.CancelledError:
                            record["left"] = time.monotonic()
                            record["told"] = True
                            raise
                except LockTimeout:
                    count("timeout")
                except LockLost:
                    count("lost")
                except QuorumError:
                    count("quorum")
                    await asyncio.sleep(0.05)
                except LockError as exc:
                    count(type(exc).__name__)
                if record:
                    emit(record)

        async def extend(lock: Any, ttl: float, record: dict[str, Any]) -> None:
            factor = rng.uniform(0.2, 0.6) if rng.random() < 0.5 else rng.uniform(1.0, 2.0)
            new_ttl = max(3 * NODE_TIMEOUT, ttl * factor)
            # The guard the checker expects is that of the ttl that set the validity
            # (renewal.md): after a shorter extend(), the shorter one's.
            record["ttl"] = min(record["ttl"], new_ttl)
            try:
                await lock.extend(new_ttl)
            except QuorumError:
                count("extend_quorum")  # the validity follows what the nodes may hold
            except LockNotOwned:
                # Not held on a majority while the holder believed it valid: the nodes
                # lost a key we kept: the test fails on this count.
                count("extend_not_owned")

        task = renewed if mode in ("renew", "delay") else expiring
        await asyncio.gather(*(task() for _ in range(tasks)))
    emit({"summary": errors, "pid": pid})


if __name__ == "__main__":
    mode, seconds, tasks, names, *urls = sys.argv[1:]
    asyncio.run(main(mode, float(seconds), int(tasks), names.split(","), urls))
