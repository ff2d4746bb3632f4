"""Chaos: processes contend while a nemesis injects faults; a checker verifies.

Several processes x tasks contend for a few names over 5 nodes (through proxies),
while a nemesis pauses (SIGSTOP), kills and restarts (empty, after more than the
ttl), delays and blackholes nodes -- never more than a minority at once -- and
holders now and then stall past their validity. The checker fails on:

* an overlap of two critical sections of one name that the library's promises
  exclude: the later may only start after the earlier's validity ended;
* fencing tokens not strictly increasing in acquisition order, per name;
* lost progress: no acquisition for several ttls while a majority is healthy.

Short by default; ``AIOLOCK_CHAOS_SECONDS=60 pytest tests/test_chaos.py`` (or
``nox -s chaos``) for a long run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from aiolock.testing import Server, Servers

from .faults import Mode, Proxy, proxies

SECONDS = float(os.environ.get("AIOLOCK_CHAOS_SECONDS", "12"))
PROCESSES = 4
TASKS = 3
NAMES = ["chaos:a", "chaos:b"]
TTL = 1.0  # as in chaos_worker.py
MAX_GAP = 4 * TTL + 1.5  # paused holder (1.3 ttl) + a lost release (1 ttl) + slack
WORKER = Path(__file__).parent / "chaos_worker.py"


class Nemesis:
    """Injects one fault at a time on a random node, at most a minority faulty."""

    def __init__(self, servers: Servers, proxied: list[Proxy], seed: int) -> None:
        self.servers = servers
        self.proxied = proxied
        self.rng = random.Random(seed)
        self.faulty: set[int] = set()
        self.injected: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        stop_at = loop.time() + seconds
        minority = len(self.servers) // 2
        while loop.time() < stop_at:
            await asyncio.sleep(self.rng.uniform(0.2, 0.6))
            healthy = [i for i in range(len(self.servers)) if i not in self.faulty]
            if len(self.faulty) >= minority or not healthy:
                continue
            i = self.rng.choice(healthy)
            kind = self.rng.choice(["pause", "kill", "delay", "blackhole"])
            self.faulty.add(i)
            self.injected[kind] += 1
            task = asyncio.create_task(self._fault(kind, i))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.gather(*self._tasks)

    async def _fault(self, kind: str, i: int) -> None:
        server = self.servers.servers[i]
        assert isinstance(server, Server)
        proxy = self.proxied[i]
        try:
            if kind == "pause":
                server.pause()
                await asyncio.sleep(self.rng.uniform(0.2, 1.0))
                server.resume()
            elif kind == "kill":
                server.kill()
                await asyncio.sleep(TTL * 1.2)  # down longer than the longest ttl
                await server.restart()
            else:
                proxy.mode = Mode.DELAY if kind == "delay" else Mode.BLACKHOLE
                proxy.delay = self.rng.uniform(0.02, 0.3)
                await asyncio.sleep(self.rng.uniform(0.3, 1.0))
                proxy.mode = Mode.PASS
                proxy.reset()  # drop what was held back
        finally:
            self.faulty.discard(i)


def check(sections: list[dict[str, Any]]) -> dict[str, int]:
    """The checker; returns counts. Raises AssertionError on a violation."""
    stats = {"sections": len(sections), "overlaps_after_expiry": 0, "paused_holders": 0}
    by_name: dict[str, list[dict[str, Any]]] = {}
    for section in sections:
        by_name.setdefault(section["name"], []).append(section)
    for name, group in by_name.items():
        group.sort(key=lambda s: s["entered"])
        for earlier, later in itertools.pairwise(group):
            assert later["token"] > earlier["token"], (name, earlier, later)
        for i, a in enumerate(group):
            overlapped = False
            for b in group[i + 1 :]:
                if b["entered"] >= a["left"]:
                    break
                # Overlap: allowed only once a's validity had ended (a paused holder,
                # which is what fencing tokens are for).
                assert b["entered"] >= a["valid_until"], (name, a, b)
                stats["overlaps_after_expiry"] += 1
                overlapped = True
            stats["paused_holders"] += overlapped
    enters = sorted(s["entered"] for s in sections)
    gaps = [b - a for a, b in itertools.pairwise(enters)]
    assert not gaps or max(gaps) < MAX_GAP, f"no progress for {max(gaps):.2f}s"
    return stats


async def test_chaos_mutual_exclusion_tokens_and_progress(servers: Servers) -> None:
    async with proxies(servers) as proxied:
        urls = [p.url for p in proxied]
        args = [str(WORKER), str(SECONDS), str(TASKS), ",".join(NAMES), *urls]
        pipe = asyncio.subprocess.PIPE
        procs = [
            await asyncio.create_subprocess_exec(sys.executable, *args, stdout=pipe, stderr=pipe)
            for _ in range(PROCESSES)
        ]
        nemesis = Nemesis(servers, proxied, seed=int.from_bytes(os.urandom(4), "big"))
        try:
            outputs = await asyncio.gather(
                nemesis.run(SECONDS - 1), *(p.communicate() for p in procs)
            )
        finally:
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
    sections: list[dict[str, Any]] = []
    errors: Counter[str] = Counter()
    for proc, (out, err) in zip(procs, outputs[1:], strict=True):
        assert proc.returncode == 0, err.decode()[-3000:]
        for line in out.decode().splitlines():
            record = json.loads(line)
            if "summary" in record:
                errors.update(record["summary"])
            else:
                sections.append(record)
    stats = check(sections)
    print(
        f"chaos: {SECONDS:.0f}s, {PROCESSES}x{TASKS} tasks, faults {dict(nemesis.injected)} "
        f"({sum(nemesis.injected.values())}), {stats['sections']} critical sections checked, "
        f"{stats['paused_holders']} stalled holders overlapped by "
        f"{stats['overlaps_after_expiry']} later sections after their expiry, "
        f"client-side errors {dict(errors)}"
    )
    assert stats["sections"] > 50 * SECONDS / 12
    assert sum(nemesis.injected.values()) >= 5


def test_checker_catches_violations() -> None:
    ok = [
        {"name": "n", "entered": 0.0, "valid_until": 1.0, "left": 0.5, "token": 1},
        {"name": "n", "entered": 0.6, "valid_until": 1.6, "left": 0.7, "token": 2},
    ]
    assert check(ok)["sections"] == 2
    overlap = [dict(ok[0]), dict(ok[1], entered=0.4)]
    with contextlib.suppress(AssertionError):
        check(overlap)
        raise RuntimeError("overlap not caught")
    stale = [dict(ok[0]), dict(ok[1], token=1)]
    with contextlib.suppress(AssertionError):
        check(stale)
        raise RuntimeError("token order not caught")
    stall = [dict(ok[0]), dict(ok[1], entered=MAX_GAP + 1, left=MAX_GAP + 2, token=2)]
    with contextlib.suppress(AssertionError):
        check(stall)
        raise RuntimeError("lost progress not caught")
    paused = [dict(ok[0], left=2.0), dict(ok[1], entered=1.2, token=2)]
    assert check(paused)["overlaps_after_expiry"] == 1
