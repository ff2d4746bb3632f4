"""A chaos test worker process: contend for a few names, record every critical section.

    python tests/chaos_worker.py MODE SECONDS TASKS NAME,NAME URL [URL ...]

Prints one JSON object per line: each critical section (name, entered, valid_until,
left, token, pid, told; in renew and delay modes also ``lost_at`` and the loss's
message, and each ``extend()`` as [sent, ttl, outcome, returned]) on the system-wide
monotonic clock, then a summary of errors.

MODE ``expire``: ``auto_renew=False``, ttl 1 s, short sections. Now and then a holder
blocks its event loop past its lock's validity (a "paused holder"); its section may
then overlap the next holder's, which the checker allows only after its validity
ended and with a lower fencing token.

MODE ``renew``: ``async with`` and auto-renewal, ttl 2 to 6 s, sections of up to two
ttls. A body samples ``now + remaining()`` as a careful user would (``valid_until``,
its last estimate); when the lock is lost, ``left`` is the moment the cancellation
reached the body (``told``).

MODE ``delay``: as ``renew`` with ttls of 1 to 3 s, and bodies that now and then call
``extend()`` with a shorter or a longer ttl (the nemesis holds messages back).

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
STALL_PERIOD = 0.005  # how often the stall watcher wakes up
STALL_SEEN = 0.01  # how late a wake-up must be to count as a stall


def restart_grace(mode: str) -> float:
    """The managers' restart_grace: longer than any ttl of the mode, unless overridden."""
    longest = {"renew": RENEW_TTL[1], "delay": DELAY_TTL[1]}.get(mode, TTL)
    default = longest + (1.0 if mode != "expire" else 0.5)
    return float(os.environ.get("AIOLOCK_CHAOS_GRACE", default))


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


class Stalls:
    """When this process's event loop could not run: a holder is told only when it runs.

    A task sleeps :data:`STALL_PERIOD` again and again; a wake-up later than that by
    :data:`STALL_SEEN` or more is a stall, kept as (from, to): from when it should have
    woken, so a stall that began earlier counts short, never long. On a busy 2-core
    machine the processes wait for a core, as they would on a paused VM; the checker
    forgives a late word to a holder by as long as its loop stalled, never a lock taken
    while its validity lasted (renewal.md).
    """

    def __init__(self) -> None:
        self.seen: list[tuple[float, float]] = []

    async def run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(STALL_PERIOD)
            after = time.monotonic()
            if after - before - STALL_PERIOD >= STALL_SEEN:
                self.seen.append((before + STALL_PERIOD, after))

    def during(self, start: float, end: float) -> list[tuple[float, float]]:
        """The stalls that overlap ``start`` to ``end``."""
        return [(a, b) for a, b in self.seen if b > start and a < end]


async def main(mode: str, seconds: float, tasks: int, names: list[str], urls: list[str]) -> None:
    pid = os.getpid()
    errors: dict[str, int] = {}
    stop_at = time.monotonic() + seconds
    rng = random.Random(pid)

    def count(kind: str) -> None:
        errors[kind] = errors.get(kind, 0) + 1

    grace = restart_grace(mode)
    stalls = Stalls()
    watcher = asyncio.ensure_future(stalls.run())
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
                        watch = asyncio.ensure_future(note_lost(lock, record))
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
                        finally:
                            watch.cancel()
                except LockTimeout:
                    count("timeout")
                except LockLost as exc:
                    count("lost")
                    if record:
                        record["lost"] = str(exc)
                except QuorumError:
                    count("quorum")
                    await asyncio.sleep(0.05)
                except LockError as exc:
                    count(type(exc).__name__)
                if record:
                    record["stalls"] = stalls.during(record["entered"], record["left"])
                    emit(record)

        async def note_lost(lock: Any, record: dict[str, Any]) -> None:
            # For the checker's report: when the library gave the lock up (the body is
            # told at its next await).
            await lock.wait_lost()
            record["lost_at"] = time.monotonic()

        async def extend(lock: Any, ttl: float, record: dict[str, Any]) -> None:
            factor = rng.uniform(0.2, 0.6) if rng.random() < 0.5 else rng.uniform(1.0, 2.0)
            new_ttl = max(3 * NODE_TIMEOUT, ttl * factor)
            # The guard the checker expects is that of the ttl that set the validity
            # (renewal.md): after a shorter extend(), the shorter one's.
            record["ttl"] = min(record["ttl"], new_ttl)
            # A shorter one lowers the validity as it goes out (renewal.md): the nodes
            # keep the key at least new_ttl from now, and no longer if it lands. The
            # body's own estimate follows before the call, as the library's does.
            record["valid_until"] = min(record["valid_until"], time.monotonic() + new_ttl)
            # For the checker's report: when each extend() went out and came back, how.
            sent = [time.monotonic(), new_ttl, "cancelled", None]
            record.setdefault("extends", []).append(sent)
            try:
                await lock.extend(new_ttl)
                sent[2] = "ok"
            except QuorumError:
                sent[2] = "quorum"
                count("extend_quorum")  # the validity follows what the nodes may hold
            except LockNotOwned:
                # Not held on a majority while the holder believed it valid: the nodes
                # lost a key we kept: the test fails on this count.
                sent[2] = "not_owned"
                count("extend_not_owned")
            finally:
                sent[3] = time.monotonic()

        task = renewed if mode in ("renew", "delay") else expiring
        await asyncio.gather(*(task() for _ in range(tasks)))
    watcher.cancel()
    emit({"summary": errors, "pid": pid})


if __name__ == "__main__":
    mode, seconds, tasks, names, *urls = sys.argv[1:]
    asyncio.run(main(mode, float(seconds), int(tasks), names.split(","), urls))
