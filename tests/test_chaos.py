"""Chaos: processes contend while a nemesis injects faults; a checker verifies.

Several processes x tasks contend for a few names over 5 nodes (through proxies),
while a nemesis pauses (SIGSTOP), kills and restarts (empty, after more than the
ttl), delays and blackholes nodes. Two modes:

* **expire** (``auto_renew=False``, ttl 1 s, short sections): never more than a
  minority faulty at once; holders now and then stall past their validity. The
  checker fails on an overlap of two critical sections of one name that the
  library's promises exclude (the later may only start after the earlier's
  validity ended), on fencing tokens not strictly increasing in acquisition order,
  and on lost progress (no acquisition for several ttls).
* **renew** (``async with`` and auto-renewal, ttl 2-6 s, sections of up to two
  ttls): the nemesis also pauses a *majority* for up to a few seconds, so renewals
  fail and holders must be told. The checker fails when a body ran past its own
  last validity estimate (it must end, or be told, before), on any overlap of two
  sections of one name (a told holder's section ends when it is told), and on
  fencing tokens out of order.

Short by default (``expire`` 12 s, ``renew`` 60 s); ``AIOLOCK_CHAOS_SECONDS=60``
(or ``nox -s chaos``) for a long run of both.
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

from .chaos_worker import NODE_TIMEOUT, RENEW_TTL
from .faults import Mode, Proxy, proxies

SECONDS = float(os.environ.get("AIOLOCK_CHAOS_SECONDS", "12"))
RENEW_SECONDS = max(60.0, SECONDS)
PROCESSES = 4
TASKS = 3
NAMES = ["chaos:a", "chaos:b"]
TTL = 1.0  # as in chaos_worker.py
MAX_GAP = 4 * TTL + 1.5  # paused holder (1.3 ttl) + a lost release (1 ttl) + slack
WORKER = Path(__file__).parent / "chaos_worker.py"


class Nemesis:
    """Injects one fault at a time on a random node, at most a minority faulty."""

    def __init__(
        self, servers: Servers, proxied: list[Proxy], seed: int, *, majority: bool = False
    ) -> None:
        self.servers = servers
        self.proxied = proxied
        self.rng = random.Random(seed)
        #: Also pause a majority now and then (renew mode), when no other fault runs.
        self.majority = majority
        #: Kills keep a node down longer than the longest ttl of the mode.
        self.down_for = 1.2 * (RENEW_TTL[1] if majority else TTL)
        self.faulty: set[int] = set()
        self.injected: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        stop_at = loop.time() + seconds
        minority = len(self.servers) // 2
        next_majority = loop.time() + self.rng.uniform(2.0, 6.0)
        while loop.time() < stop_at:
            await asyncio.sleep(self.rng.uniform(0.2, 0.6))
            healthy = [i for i in range(len(self.servers)) if i not in self.faulty]
            if self.majority and loop.time() >= next_majority:
                if self.faulty:
                    continue  # let the running faults end first, and start none
                injected = self.injected
                kind = "pause_majority"  # then restarts, in turn
                if injected["pause_majority"] > injected["restart_majority"]:
                    kind = "restart_majority"
                self.injected[kind] += 1
                await self._majority(kind, minority + 1)
                next_majority = loop.time() + self.rng.uniform(4.0, 10.0)
                continue
            if len(self.faulty) >= minority or not healthy:
                continue
            i = self.rng.choice(healthy)
            kinds = ["pause", "kill", "delay", "blackhole"]
            if self.majority:
                kinds.append("restart")  # at once, empty: the quarantine's business
            kind = self.rng.choice(kinds)
            self.faulty.add(i)
            self.injected[kind] += 1
            task = asyncio.create_task(self._fault(kind, i))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.gather(*self._tasks)

    async def _majority(self, kind: str, count: int) -> None:
        """Pause a majority (``pause_majority``), or kill it and restart it at once, empty
        (``restart_majority``: new run_ids while locks are held)."""
        chosen = self.rng.sample(range(len(self.servers)), count)
        servers = [self.servers.servers[i] for i in chosen]
        assert all(isinstance(server, Server) for server in servers)
        self.faulty.update(chosen)
        try:
            if kind == "pause_majority":
                for server in servers:
                    server.pause()
                # Up to the longest ttl: renewals fail for longer than the validity of
                # many holders, which must then be told in time.
                await asyncio.sleep(self.rng.uniform(0.5, RENEW_TTL[1]))
            else:
                for server in servers:
                    await server.restart()
                await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        finally:
            for server in servers:
                server.resume()  # (a no-op on a restarted server)
            self.faulty.difference_update(chosen)

    async def _fault(self, kind: str, i: int) -> None:
        server = self.servers.servers[i]
        assert isinstance(server, Server)
        proxy = self.proxied[i]
        try:
            if kind == "pause":
                server.pause()
                await asyncio.sleep(self.rng.uniform(0.2, 1.0))
                server.resume()
            elif kind == "restart":
                await server.restart()
                await asyncio.sleep(self.rng.uniform(0.2, 1.0))
            elif kind == "kill":
                server.kill()
                await asyncio.sleep(self.down_for)  # down longer than the longest ttl
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


async def _run_chaos(
    servers: Servers, mode: str, seconds: float
) -> tuple[list[dict[str, Any]], Counter[str], Nemesis]:
    """Run the workers and the nemesis; return every section, the errors, the nemesis."""
    async with proxies(servers) as proxied:
        urls = [p.url for p in proxied]
        args = [str(WORKER), mode, str(seconds), str(TASKS), ",".join(NAMES), *urls]
        pipe = asyncio.subprocess.PIPE
        procs = [
            await asyncio.create_subprocess_exec(sys.executable, *args, stdout=pipe, stderr=pipe)
            for _ in range(PROCESSES)
        ]
        seed = int.from_bytes(os.urandom(4), "big")
        nemesis = Nemesis(servers, proxied, seed=seed, majority=mode == "renew")
        try:
            outputs = await asyncio.gather(
                nemesis.run(seconds - 1), *(p.communicate() for p in procs)
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
    return sections, errors, nemesis


async def test_chaos_mutual_exclusion_tokens_and_progress(servers: Servers) -> None:
    sections, errors, nemesis = await _run_chaos(servers, "expire", SECONDS)
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


def check_renewed(sections: list[dict[str, Any]]) -> dict[str, int]:
    """The checker of renew mode; returns counts. Raises AssertionError on a violation."""
    stats = {"sections": len(sections), "told": 0, "least_margin_ms": 10**9}
    by_name: dict[str, list[dict[str, Any]]] = {}
    for section in sections:
        by_name.setdefault(section["name"], []).append(section)
        # The body ended before its own last validity estimate; a holder that was
        # told, at least half the promised guard before it (README).
        margin = section["valid_until"] - section["left"]
        assert margin >= 0.0, ("ran past its validity", section)
        if section["told"]:
            guard = min(section["ttl"] / 5, max(3 * NODE_TIMEOUT, 0.05))
            assert margin >= guard / 2, ("told too late", section)
        stats["told"] += section["told"]
        stats["least_margin_ms"] = min(stats["least_margin_ms"], int(margin * 1000))
    for name, group in by_name.items():
        group.sort(key=lambda s: s["entered"])
        for earlier, later in itertools.pairwise(group):
            assert later["token"] > earlier["token"], (name, earlier, later)
            # No overlap: a holder that was told stopped when told.
            assert later["entered"] >= earlier["left"], ("overlap", name, earlier, later)
    return stats


async def test_chaos_with_renewal_and_majority_pauses(servers: Servers) -> None:
    sections, errors, nemesis = await _run_chaos(servers, "renew", RENEW_SECONDS)
    stats = check_renewed(sections)
    print(
        f"chaos (renew): {RENEW_SECONDS:.0f}s, {PROCESSES}x{TASKS} tasks, faults "
        f"{dict(nemesis.injected)}, {stats['sections']} sections checked, {stats['told']} "
        f"holders told of a loss, least margin before validity ended "
        f"{stats['least_margin_ms']} ms, client-side errors {dict(errors)}"
    )
    # The run did something. (Each majority restart is an outage of restart_grace, 7 s,
    # and restarted minorities are quarantined too: 12 to 18 sections were seen.)
    assert stats["sections"] >= 8
    assert nemesis.injected["pause_majority"] >= 1
    assert nemesis.injected["restart_majority"] >= 1


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


def test_renew_checker_catches_violations() -> None:
    ok = [
        {"name": "n", "entered": 0.0, "valid_until": 3.0, "left": 2.5, "told": True, "token": 1},
        {"name": "n", "entered": 2.6, "valid_until": 5.0, "left": 4.0, "told": False, "token": 2},
    ]
    ok = [dict(section, ttl=3.0) for section in ok]
    assert check_renewed(ok)["told"] == 1
    for broken, what in [
        ([dict(ok[0], left=3.1), ok[1]], "ran past its validity"),
        ([dict(ok[0], left=2.95), ok[1]], "told too late"),
        ([ok[0], dict(ok[1], entered=2.4)], "overlap"),
        ([ok[0], dict(ok[1], token=1)], "token order"),
    ]:
        with contextlib.suppress(AssertionError):
            check_renewed(broken)
            raise RuntimeError(f"{what} not caught")
