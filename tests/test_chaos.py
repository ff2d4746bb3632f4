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
  fencing tokens out of order. A holder is told only when its event loop runs: each
  worker watches its loop, and a body late by no more than its loop stalled (a busy
  machine) is forgiven and counted as ``stalled``; a lock taken while the earlier
  holder's validity lasted never is.

* **delay** (messages that arrive late): as renew, with bodies that also
  call ``extend()`` with shorter and longer ttls, while :class:`DelayNemesis` (through
  ``aiolock.testing.nemesis``) holds back random commands and scripts on random
  connections for 0 to 3 x ``node_timeout`` (sometimes ttl/2), delays pub/sub messages,
  drops one connection, black-holes a node. The checker is renew mode's, unchanged.

Short by default (``expire`` 12 s, ``renew`` and ``delay`` 60 s). The default ``nox``
runs ``expire`` only, as a smoke run; ``nox -s chaos`` runs all three
(``nox -s chaos -- 600``, or ``AIOLOCK_CHAOS_SECONDS=600``, for a long run of each).
``AIOLOCK_CHAOS_SEED`` replays a nemesis's choices (the processes' timing still varies);
``AIOLOCK_CHAOS_DUMP=DIR`` writes every section of a mode to ``DIR/MODE.json``.
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

import pytest

import aiolock.testing
from aiolock.testing import NodeProxy, Server, Servers, command, script

from .chaos_worker import DELAY_TTL, NODE_TIMEOUT, RENEW_TTL
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
        self.seed = seed
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


#: What DelayNemesis holds back: any command, or one of aiolock's scripts.
HELD_BACK = [
    command("EVALSHA", "EVAL", "PUBLISH"),
    *(
        script(name)
        for name in (
            "ACQUIRE", "RELEASE", "EXTEND", "EXTEND_MANY", "REPAIR", "PASS_ON",
            "RELEASE_EITHER", "RAISE_FENCE", "HANDOVER", "RELEASE_TURN", "TURN_JOIN",
            "TURN_LEAVE",
        )
    ),
]  # fmt: skip


class DelayNemesis:
    """Makes messages arrive late: one random fault at a time per node.

    ``hold``: the next 1 to 5 requests that match a random matcher of
    :data:`HELD_BACK` on a random connection of a node (and all behind them on it)
    arrive 0 to 3 x node_timeout late, now and then half a ttl; ``replies``: a node's
    pub/sub messages (release messages, grants) arrive late for a while; ``drop``: one
    connection reset while the others stay up; ``blackhole``: a node unreachable for a
    while. At most a minority of nodes black-holed at once.
    """

    def __init__(self, proxied: list[NodeProxy], seed: int) -> None:
        self.proxied = proxied
        self.seed = seed
        self.rng = random.Random(seed)
        self.injected: Counter[str] = Counter()
        self.blackholed: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def _delay(self) -> float:
        if self.rng.random() < 0.1:
            return self.rng.uniform(*DELAY_TTL) / 2
        return self.rng.uniform(0.0, 3 * NODE_TIMEOUT)

    async def run(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        stop_at = loop.time() + seconds
        while loop.time() < stop_at:
            await asyncio.sleep(self.rng.uniform(0.02, 0.2))
            i = self.rng.randrange(len(self.proxied))
            proxy = self.proxied[i]
            kind = self.rng.choices(["hold", "replies", "drop", "blackhole"], [20, 3, 2, 1])[0]
            links = [link for link in proxy.links if not link.closed]
            if kind == "hold" and links:
                link = self.rng.choice(links)
                match = self.rng.choice(HELD_BACK)
                count = self.rng.randint(1, 5)
                delay = self._delay()
                proxy.hold(match, delay, count=count, links=lambda x, chosen=link: x is chosen)
            elif kind == "replies":
                self._start(self._replies(proxy))
            elif kind == "drop" and links:
                self.rng.choice(links).drop()
            elif kind == "blackhole" and i not in self.blackholed and len(self.blackholed) < 2:
                self._start(self._blackhole(i))
            else:
                continue
            self.injected[kind] += 1
        await asyncio.gather(*self._tasks)

    def _start(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _replies(self, proxy: NodeProxy) -> None:
        proxy.delay_replies(self._delay(), links=lambda link: link.kind == "pubsub")
        await asyncio.sleep(self.rng.uniform(0.1, 1.0))
        proxy.delay_replies(0.0)

    async def _blackhole(self, i: int) -> None:
        self.blackholed.add(i)
        proxy = self.proxied[i]
        proxy.blackhole()
        try:
            await asyncio.sleep(self.rng.uniform(0.2, 1.0))
        finally:
            proxy.blackhole(False)
            proxy.drop_all()  # what was sent meanwhile is gone, as after a partition
            self.blackholed.discard(i)


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


def _seed() -> int:
    return int(os.environ.get("AIOLOCK_CHAOS_SEED") or int.from_bytes(os.urandom(4), "big"))


async def _run_chaos(
    servers: Servers, mode: str, seconds: float
) -> tuple[list[dict[str, Any]], Counter[str], Nemesis | DelayNemesis]:
    """Run the workers and the nemesis; return every section, the errors, the nemesis."""
    async with contextlib.AsyncExitStack() as stack:
        nemesis: Nemesis | DelayNemesis
        if mode == "delay":
            net = await stack.enter_async_context(aiolock.testing.nemesis(servers))
            urls = net.urls
            nemesis = DelayNemesis(list(net), seed=_seed())
        else:
            proxied = await stack.enter_async_context(proxies(servers))
            urls = [p.url for p in proxied]
            nemesis = Nemesis(servers, proxied, seed=_seed(), majority=mode == "renew")
        print(f"chaos ({mode}): nemesis seed {nemesis.seed}", flush=True)
        args = [str(WORKER), mode, str(seconds), str(TASKS), ",".join(NAMES), *urls]
        pipe = asyncio.subprocess.PIPE
        procs = [
            await asyncio.create_subprocess_exec(sys.executable, *args, stdout=pipe, stderr=pipe)
            for _ in range(PROCESSES)
        ]
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
    _dump(mode, sections)
    return sections, errors, nemesis


def _dump(mode: str, sections: list[dict[str, Any]]) -> None:
    """Write the sections to ``$AIOLOCK_CHAOS_DUMP/MODE.json``, if set, for study."""
    folder = os.environ.get("AIOLOCK_CHAOS_DUMP")
    if folder:
        Path(folder, f"{mode}.json").write_text(json.dumps(sections))


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
    stats["stalled"] = 0
    for section in sections:
        by_name.setdefault(section["name"], []).append(section)
        # The body ended before its own last validity estimate; a holder that was
        # told, at least half the promised guard before it (README). Late by no more
        # than its process's event loop stalled meanwhile: a holder is told only when
        # its loop runs (a busy machine, a paused VM; what fencing tokens are for).
        margin = section["valid_until"] - section["left"]
        guard = min(section["ttl"] / 5, max(3 * NODE_TIMEOUT, 0.05))
        needed = guard / 2 if section["told"] else 0.0
        if margin < needed:
            stalled = _stalled(section, section["valid_until"] - guard)
            violation = "told too late" if section["told"] else "ran past its validity"
            assert margin + stalled >= needed, _shown(violation, section)
            stats["stalled"] += 1
        stats["told"] += section["told"]
        stats["least_margin_ms"] = min(stats["least_margin_ms"], int(margin * 1000))
    for group in by_name.values():
        group.sort(key=lambda s: s["entered"])
        for earlier, later in itertools.pairwise(group):
            assert later["token"] > earlier["token"], _shown("tokens", earlier, later)
            # No overlap: a holder that was told stopped when told. And never, stalled
            # or not, while the earlier's validity lasted: the nodes kept its key.
            overlap = later["entered"] < earlier["left"]
            assert not overlap or later["entered"] >= earlier["valid_until"], _shown(
                "overlap", earlier, later
            )
    return stats


def _stalled(section: dict[str, Any], since: float) -> float:
    """How long the section's event loop stalled between ``since`` and its end."""
    left = section["left"]
    return sum(
        max(0.0, min(to, left) - max(start, since)) for start, to in section.get("stalls", ())
    )


def _shown(violation: str, *sections: dict[str, Any]) -> str:
    """A violation with its sections in full (pytest shortens a tuple's repr)."""
    return "\n".join([violation, *(json.dumps(s, sort_keys=True) for s in sections)])


@pytest.mark.slow
async def test_chaos_with_renewal_and_majority_pauses(servers: Servers) -> None:
    sections, errors, nemesis = await _run_chaos(servers, "renew", RENEW_SECONDS)
    stats = check_renewed(sections)
    print(
        f"chaos (renew): {RENEW_SECONDS:.0f}s, {PROCESSES}x{TASKS} tasks, faults "
        f"{dict(nemesis.injected)}, {stats['sections']} sections checked, {stats['told']} "
        f"holders told of a loss, {stats['stalled']} late by no more than their loop "
        f"stalled, least margin before validity ended "
        f"{stats['least_margin_ms']} ms, client-side errors {dict(errors)}"
    )
    # The run did something. (Each majority restart is an outage of restart_grace, 7 s,
    # and restarted minorities are quarantined too: 12 to 18 sections were seen.)
    assert stats["sections"] >= 8
    assert nemesis.injected["pause_majority"] >= 1
    assert nemesis.injected["restart_majority"] >= 1


@pytest.mark.slow
async def test_chaos_with_late_messages(servers: Servers) -> None:
    """The renew checker, unchanged, while the nemesis makes messages late."""
    sections, errors, nemesis = await _run_chaos(servers, "delay", RENEW_SECONDS)
    assert isinstance(nemesis, DelayNemesis)
    stats = check_renewed(sections)
    print(
        f"chaos (delay): {RENEW_SECONDS:.0f}s, seed {nemesis.seed}, {PROCESSES}x{TASKS} "
        f"tasks, faults {dict(nemesis.injected)}, {stats['sections']} sections checked, "
        f"{stats['told']} holders told of a loss, {stats['stalled']} late by no more than "
        f"their loop stalled, least margin before validity ended "
        f"{stats['least_margin_ms']} ms, client-side errors {dict(errors)}"
    )
    # A majority that said "not held" while its holder believed the lock valid.
    assert errors["extend_not_owned"] == 0, errors
    assert stats["sections"] >= RENEW_SECONDS / 3  # (sections last 0.05 to 2 ttls)
    assert nemesis.injected["hold"] >= 10 * RENEW_SECONDS / 12


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
    ok = [dict(section, ttl=3.0) for section in ok]  # guard: 0.15 s
    assert check_renewed(ok) == {"sections": 2, "told": 1, "least_margin_ms": 500, "stalled": 0}
    ran_past = dict(ok[0], left=3.1, told=False)
    for broken, what in [
        ([ran_past, dict(ok[1], entered=3.2)], "ran past its validity"),
        ([dict(ok[0], left=2.95), ok[1]], "told too late"),
        ([ok[0], dict(ok[1], entered=2.4)], "overlap"),
        ([ok[0], dict(ok[1], token=1)], "tokens"),
        # Stalled, but less than it was late (0.03 s of 0.1 s; 0.01 s of 0.025 s).
        ([dict(ran_past, stalls=[(3.05, 3.08)]), dict(ok[1], entered=3.2)], "ran past"),
        ([dict(ok[0], left=2.95, stalls=[(2.8, 2.86)]), ok[1]], "told too late"),
        # However long the loop stalled: never taken while its validity lasted.
        ([dict(ran_past, stalls=[(2.9, 3.2)]), dict(ok[1], entered=2.95)], "overlap"),
    ]:
        with pytest.raises(AssertionError, match=what):
            check_renewed(broken)
    # Late by no more than the loop stalled within the guard: forgiven, and counted.
    forgiven = [
        [dict(ran_past, stalls=[(2.9, 3.2)]), dict(ok[1], entered=3.05)],
        [dict(ok[0], left=2.95, stalls=[(2.88, 2.95)]), dict(ok[1], entered=3.0)],
    ]
    for sections in forgiven:
        assert check_renewed(sections)["stalled"] == 1
