"""Running schedules: one from a seed, a search over many, a failing one shrunk.

A schedule is everything a seed decides: the configuration (nodes, processes, tasks,
names, operations), the list of faults with their times, and the random streams of the
network, the workload and the library (tokens, jitter). ``run(seed)`` plays it in a
fresh world; ``run(seed, keep=...)`` plays it with only some of its faults, which is
how a failing seed is shrunk to the fewest faults that still break a rule.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any
from unittest import mock

import aiolock._waiting.handoff
import aiolock._waiting.waiting
from aiolock import LockManager

from .check import (
    check_backed,
    check_bare,
    check_exclusion,
    check_followed,
    check_kept,
    check_keys,
    check_outlives,
    check_revived,
    check_told,
    counters_lost,
)
from .given import GivenTurns
from .live import (
    OUT_OF_LINE_STREAK_LIMIT,
    Liveness,
    lost_needlessly,
    lost_without_a_fault,
    writers_first,
)
from .lone import WakeUps
from .plan import Plan
from .resource import Resource, check_fenced, check_refused
from .sleeps import Sleeps, name_of
from .subs import Subscriptions
from .workload import FOCI_GRANTS, NODE_TIMEOUT, Config, Recorder, make_config, run_processes
from .world import (
    EPOCH,
    Deadlock,
    Fault,
    World,
    current_process,
    excusing,
    only_late_subscriptions,
    quiet,
    virtual_process,
)

#: The nodes' clocks run at rates within 1 ± this (under the default drift_factor 0.01).
DRIFT = 0.009
#: How long after the managers closed, and every node is unpaused, the keys are checked:
#: the longest ttl an extend() sets (2 x 3 s), on the slowest clock, and a late message.
SETTLE = 2 * 3.0 * (1 + 2 * DRIFT) + 4.0


#: The kinds of fault a schedule draws from ("delay" twice: it comes in two forms).
KINDS = ("delay", "delay", "slow", "sever", "pause", "restart", "pubsub", "stall")
#: The spreads a run's skews are drawn within (seconds either way).
SKEWS = (0.0, 0.001, 0.05, 2.0, 60.0)
#: The library's bounded memories and the sizes a schedule may give them. The library
#: argues that forgetting is safe at any size; at its real sizes (1,024 tokens taken,
#: 4,096 offers) a run of a few seconds never forgets, so the argument would go
#: untested (a late grant of a forgotten token needs 1,024 handoffs before it).
MEMORIES = {
    "aiolock._waiting.grants._TAKEN_KEPT": (1, 2, 8),
    "aiolock._waiting.turns._OFFERS_KEPT": (1, 2, 8),
}


def make_memories(plan: Plan, faults: list[Fault]) -> dict[str, int]:
    """The sizes of the library's bounded memories in ``seed``'s schedule (empty: real);
    ``faults``: the schedule's, all of them (from 'live' (plan.V1_FROM) on, a schedule without
    faults, or with late subscriptions or dropped pub/sub connections only, keeps the
    real sizes: the liveness rules apply there)."""
    if not plan.has("late") or (plan.has("live") and quiet(faults)):
        return {}
    rng = random.Random(f"memories-{plan.seed}")
    if rng.random() < 0.5:
        return {}
    return {where: rng.choice(sizes) for where, sizes in MEMORIES.items()}


#: Where the renewal's batches are split (see 'chunks' (plan.V1_FROM)), and the sizes a
#: schedule may give it.
CHUNKS = ("aiolock._core.batch.BATCH_LIMIT", (1, 2, 3))


def make_chunks(plan: Plan) -> dict[str, int]:
    """The renewal's chunk size in ``seed``'s schedule (empty: the real 1,000); from
    'chunks' (plan.V1_FROM) on, half the runs, whatever their faults: a smaller chunk changes when
    the renewal's calls go out, not what a run may expect of the library."""
    if not plan.has("chunks"):
        return {}
    rng = random.Random(f"chunks-{plan.seed}")
    if rng.random() < 0.5:
        return {}
    where, sizes = CHUNKS
    return {where: rng.choice(sizes)}


@contextmanager
def memories(sizes: dict[str, int]) -> Iterator[None]:
    """The library's memories at ``sizes`` while the run lasts."""
    with ExitStack() as stack:
        for where, size in sizes.items():
            stack.enter_context(mock.patch(where, size))
        yield


@dataclass(frozen=True)
class Models:
    """What a run models of the deployment, beyond the faults (plan.V1_FROM: models)."""

    #: Every node refuses SUBSCRIBE (an ACL without +subscribe): waiters must poll.
    pubsub_refused: bool = False
    #: The managers are given one server twice: ``"database"`` (its URL again with
    #: another database number) or ``"address"`` (a second host name that reaches it).
    #: They must refuse to start; the run is that check alone.
    alias: str | None = None
    #: Each node is a Redis Cluster of one master (World.cluster).
    cluster: bool = False

    def __str__(self) -> str:
        shown = ["pub/sub refused"] if self.pubsub_refused else []
        shown += [f"one server twice ({self.alias})"] if self.alias else []
        shown += ["each node a cluster of one master"] if self.cluster else []
        return ", ".join(shown)


#: The foci whose runs never have pub/sub refused. ``handover``: its
#: shortened keys are announced on pub/sub, which is what it checks. Where pub/sub is
#: refused every waiter polls, and a lock left to expire goes to whichever poll comes
#: first as its key lapses on a quorum, the other nodes' keys a few milliseconds from
#: their end: the name never free on every node, the streak rule read three such races
#: and four handoffs as 8 in a row (seed 1125899906885140, in the focus's first shape:
#: docs/project/testing.md). ``grants`` (from 'grants' (plan.V1_FROM)): a grant is a message, and a
#: waiter that polls hears none.
SUBSCRIBED_FOCI = ("handover", "grants")


def make_models(plan: Plan) -> Models:
    """What ``seed``'s run models (below 'models' (plan.V1_FROM): nothing, and nothing drawn)."""
    if not plan.has("models"):
        return Models()
    seed = plan.seed
    rng = random.Random(f"models-{seed}")
    alias = rng.choice(("database", "address")) if rng.random() < 1 / 16 else None
    models = Models(pubsub_refused=rng.random() < 1 / 6, alias=alias)
    if plan.has("cluster") and not alias:  # (a stream of its own: the draws above stand)
        cluster = random.Random(f"cluster-{seed}").random() < 1 / 6
        models = Models(pubsub_refused=models.pubsub_refused, cluster=cluster)
    focus = make_config(plan).focus if models.pubsub_refused else None
    if plan.has("handover") and focus in SUBSCRIBED_FOCI:
        models = Models(pubsub_refused=False, alias=models.alias, cluster=models.cluster)
    return models


async def aliases_refused(world: World, alias: str) -> list[str]:
    """Managers given ``world``'s servers and one of them again (``alias``) must refuse:
    another database number with a ValueError before any I/O (one server's databases
    share its votes' fate: a restart empties them all), a second address with a
    ValueError at connect (the same run_id). Counted twice, one server would make a
    quorum on its own."""
    current_process.set(0)
    node = world.nodes[world.rng.randrange(len(world.nodes))]
    extra = f"{node.url}/1" if alias == "database" else world.alias(node)
    urls = [*world.urls, extra]
    world.trace(f"p0 starts a manager given {urls}")
    try:
        manager = LockManager(urls, node_timeout=NODE_TIMEOUT)
    except ValueError as exc:
        world.trace(f"p0 refused at construction: {exc}")
        return [] if not world.links else [f"aliases: I/O before the refusal: {exc}"]
    problems = []
    if alias == "database":
        problems.append(
            f"aliases: {node.url} given again as {extra} (another database of the same "
            "server) was not refused before any I/O"
        )
    try:
        async with manager as locks:
            lock = locks.lock("a", ttl=1.0)
            took = await lock.acquire(timeout=0)
            if took:
                await lock.release()
    except ValueError as exc:
        world.trace(f"p0 refused at connect: {exc}")
        return problems
    problems.append(
        f"aliases: {node.url} given again as {extra} was not refused (an acquire "
        f"{'won' if took else 'lost'}): one server would count as two votes"
    )
    return problems


def make_skews(plan: Plan, cfg: Config) -> dict[int, float]:
    """How far each process's wall clock is off in ``seed``'s schedule (empty: none)."""
    if not plan.has("skew"):
        return {}
    rng = random.Random(f"skews-{plan.seed}")
    spread = rng.choice(SKEWS)
    return {p: rng.uniform(-spread, spread) for p in range(cfg.processes)} if spread else {}


#: How far apart the restarts of a run focused on repair are, at least, on top of the
#: first one's downtime, the restart_grace and two ttls: a renewal every third of a
#: ttl repairs the node restarted before the next restart, once it reconnected (the
#: library's reconnect backoff is at most 0.5 s).
SPACING = 1.0
#: A run focused on blocks (run.blocking): its longest stall, below a third of the
#: shortest ttl there (a renewal comes late, never too late) and the "no reply"
#: watchdog's 1 s; and the least time from a stall's end to the next's beginning,
#: above that watchdog (two stalls' waits never add up to it before a reply is read).
BLOCK_LONGEST = 0.5
BLOCK_SPACING = 1.2
#: The blocks of a run focused on blocks with ``Config.long_blocks`` (from
#: 'sockets' (plan.V1_FROM) on): past the stall watchdog's second, below a third of the ttl.
LONG_BLOCK = (1.05, 1.5)


def spaced_restarts(rng: random.Random, cfg: Config) -> list[Fault]:
    """The faults of a run focused on repair: nodes restarted empty one at a time, each
    long enough after the last that a holder renewing on repairs it first (at most
    one node without the holder's key at any time: no renewed lock may be lost)."""
    assert cfg.ttl is not None  # (workload.focus sets both)
    assert cfg.grace is not None
    faults = []
    at = rng.uniform(0.1, 2.0)
    while at < cfg.seconds:
        down = rng.uniform(0.01, 0.5)
        new_id = rng.random() < 0.8
        faults.append(Fault(at, "restart", rng.randrange(cfg.nodes), seconds=down, flag=new_id))
        at += down + cfg.grace + 2 * cfg.ttl + SPACING + rng.uniform(0.0, 2.0)
    return faults


def lagging(rng: random.Random, cfg: Config) -> list[Fault]:
    """The faults of a run focused on lag: one or two spells, one after the other, of
    a steady extra latency on every link, each way: a round trip above node_timeout
    (acquires and releases time out), well within the renewal's budget (a sixth of the
    ttl, 0.2 s at least)."""
    faults = []
    at = rng.uniform(0.2, 2.0)
    for _ in range(rng.choice((1, 2))):
        seconds = rng.uniform(1.0, 4.0)
        each_way = rng.uniform(0.6, 1.0) * NODE_TIMEOUT * 1.2
        faults.append(Fault(at, "lag", -1, seconds=seconds, scale=each_way))
        at += seconds + rng.uniform(0.2, 2.0)
    return faults


def blocking(rng: random.Random, cfg: Config) -> list[Fault]:
    """The faults of a run focused on blocks: stalls within steps (see
    'step_stall' (plan.V1_FROM)), each longer than node_timeout and shorter than
    :data:`BLOCK_LONGEST`, at least :data:`BLOCK_SPACING` apart."""
    faults = []
    at = rng.uniform(0.1, 1.0)
    while at < cfg.seconds:
        seconds = rng.uniform(1.2 * NODE_TIMEOUT, BLOCK_LONGEST)
        if cfg.long_blocks:  # (see Config.long_blocks)
            assert cfg.ttl is not None
            seconds = rng.uniform(LONG_BLOCK[0], min(LONG_BLOCK[1], cfg.ttl / 3 - 0.05))
        faults.append(Fault(at, "stall", seconds=seconds, flag=True, rank=rng.randint(1, 12)))
        at += seconds + BLOCK_SPACING + rng.uniform(0.0, 1.0)
    return faults


def paused_nodes(rng: random.Random, cfg: Config) -> list[Fault]:
    """The faults of a run focused on grants ('grants' (plan.V1_FROM)): rolling pauses, one
    node after another, each of 0.2 to 1.5 s, the next beginning as the last ends (a
    little before or after). A node paused while a release runs everywhere else grants
    the head's offer as it comes back, after the head took the lock through the others,
    and runs the head's renewals and extend()s sent meanwhile, confirmed late; the next
    pause takes one of the others away while the holder counts on the first."""
    faults = []
    at = rng.uniform(0.1, 1.0)
    node = rng.randrange(cfg.nodes)
    while at < cfg.seconds:
        seconds = rng.uniform(0.2, 1.5)
        faults.append(Fault(at, "pause", node, seconds=seconds))
        node = (node + rng.randrange(1, cfg.nodes)) % cfg.nodes
        at += seconds + rng.uniform(-0.15, 0.15)
    return faults


def chained_restarts(rng: random.Random, cfg: Config) -> list[Fault]:
    """The faults of a run focused on chains: nodes restarted empty one at a time, each
    once the last one's quarantine (``restart_grace``, one ttl there) is over and a
    renewal (every third of a ttl) has repaired it, so that the holder keeps its lock;
    two or more within one long body (up to 6 ttls)."""
    assert cfg.ttl is not None  # (workload.focus sets both)
    assert cfg.grace is not None
    faults = []
    at = rng.uniform(0.2, 1.5)
    while at < cfg.seconds:
        down = rng.uniform(0.01, 0.1)
        node = rng.randrange(cfg.nodes)
        faults.append(Fault(at, "restart", node, seconds=down, flag=rng.random() < 0.8))
        at += down + cfg.grace + cfg.ttl * rng.uniform(0.4, 0.9)
    return faults


def _pubsub_spells(
    rng: random.Random, cfg: Config, kind: str, most: int, more: Callable[[], dict[str, Any]]
) -> list[Fault]:
    """1 to ``most`` faults of ``kind``, in time order, each on a process's pub/sub
    connection to a node (or every process's, or to every node), with ``more()``'s
    fields (drawn after the others)."""
    return sorted(
        (
            Fault(
                rng.uniform(0.0, cfg.seconds),
                kind,
                rng.choice((-1, rng.randrange(cfg.nodes))),  # (-1: on every node)
                rng.choice((-1, *range(cfg.processes))),
                **more(),
            )
            for _ in range(rng.randint(1, most))
        ),
        key=lambda f: f.at,
    )


def late_subscriptions(rng: random.Random, cfg: Config) -> list[Fault]:
    """The faults of a schedule drawn without any, half the time from
    'subscribe_late' (plan.V1_FROM) on: 1 to 4 spells in which a process's subscriptions (or every
    process's) to a node, or to every node, are held back up to 0.3 s (see
    'subscribe_late' (plan.V1_FROM)). A waiter listens on n - quorum + 1 nodes: it misses a
    release only when none of them has its subscription yet."""
    return _pubsub_spells(
        rng, cfg, "subscribe", 4, lambda: {"seconds": rng.uniform(0.5, 4.0), "scale": 0.3}
    )


def dropped_subscriptions(rng: random.Random, cfg: Config) -> list[Fault]:
    """The faults of a quarter of the schedules drawn without any, from 'drop' (plan.V1_FROM) on:
    1 to 8 resets of a process's pub/sub connection to a node (or every process's, or
    to every node), the messages in flight to it lost, half of them as the process's
    next release runs (see 'drop' (plan.V1_FROM))."""
    return _pubsub_spells(
        rng, cfg, "drop", 8, lambda: {"flag": rng.random() < 0.5, "rank": rng.randrange(2)}
    )


def make_faults(plan: Plan, cfg: Config) -> list[Fault]:
    """The faults of a schedule, in time order."""
    seed = plan.seed
    faults = _make_faults(plan, cfg)
    if plan.has("cluster") and make_models(plan).cluster:  # (see 'cluster' (plan.V1_FROM))
        faults = [f for f in faults if f.kind not in ("restart", "failover")]
    if not faults and plan.has("subscribe_late"):
        late = random.Random(f"subscribe-{seed}")
        if late.random() < 0.5:
            return late_subscriptions(late, cfg)
        if plan.has("drop"):
            drops = random.Random(f"drop-{seed}")
            if drops.random() < 0.5:
                return dropped_subscriptions(drops, cfg)
    return faults


def _make_faults(plan: Plan, cfg: Config) -> list[Fault]:
    seed = plan.seed
    rng = random.Random(f"faults-{seed}")
    if cfg.focus == "repair":  # (from 'repair' (plan.V1_FROM) on)
        return spaced_restarts(rng, cfg)
    if cfg.focus == "lag":  # (from 'lag' (plan.V1_FROM) on)
        return lagging(rng, cfg)
    if cfg.focus == "block":  # (from 'step_stall' (plan.V1_FROM) on)
        return blocking(rng, cfg)
    if cfg.focus == "chain":  # (the same)
        return chained_restarts(rng, cfg)
    if cfg.focus == "grants":  # (from 'grants' (plan.V1_FROM) on)
        return paused_nodes(rng, cfg)
    if cfg.focus == "split":  # (from 'split' (plan.V1_FROM) on): releases split, many of them
        splits = [
            Fault(
                rng.uniform(0.0, cfg.seconds),
                "split",
                -1,
                rng.choice((-1, *range(cfg.processes))),
                seconds=rng.uniform(0.1, 0.6),
                scale=rng.choice((0.05, 0.2, 0.6, 1.5)),
            )
            for _ in range(rng.choice((0, 16, 32, 64)))
        ]
        return sorted(splits, key=lambda f: f.at)
    if cfg.focus == "death":  # (from 'death' (plan.V1_FROM) on): one process dies
        at = rng.uniform(0.5, cfg.seconds - 1.0)
        return [Fault(at, "die", process=rng.randrange(cfg.processes))]
    if cfg.focus is None and plan.version >= 2:
        return _within_steps(plan, cfg, sorted(swarm_faults(plan, cfg), key=lambda f: f.at))
    count = rng.choice((0, 0, 2, 4, 8, 12, 16) if plan.has("live") else (0, 2, 4, 8, 12, 16))
    kinds: tuple[str, ...] = KINDS
    if cfg.focus is not None:  # (from 'focus' (plan.V1_FROM) on: the kinds its part needs)
        kinds = FOCI_GRANTS[cfg.focus]
        count = rng.choice((0, 4, 8, 12)) if kinds else 0
        if count:
            kinds = tuple(rng.sample(kinds, rng.randint(1, min(3, len(kinds)))))
    elif plan.has("swarm"):
        swarm = random.Random(f"swarm-{seed}")
        every = {*KINDS, "late"} if plan.has("late") else set(KINDS)
        if plan.has("ordered"):
            every.add("failover")
        if plan.has("skew"):
            every.add("jump")
        if plan.has("sockets"):
            every.add("silent")
        kinds = tuple(swarm.sample(sorted(every), swarm.randint(1, 3)))
    faults = []
    for _ in range(count):
        kind = rng.choice(kinds)
        at = rng.uniform(0.0, cfg.seconds)
        node = rng.randrange(cfg.nodes)
        process = rng.choice((-1, *range(cfg.processes)))
        faults.append(draw_fault(rng, cfg, kind, at, node=node, process=process))
    return _within_steps(plan, cfg, sorted(faults, key=lambda f: f.at))


def _within_steps(plan: Plan, cfg: Config, faults: list[Fault]) -> list[Fault]:
    """``faults`` with half their stalls striking within a step (a stream of its own)."""
    if not plan.has("step_stall") or cfg.focus == "block":
        return faults
    within = random.Random(f"within-{plan.seed}")
    return [
        replace(f, flag=True, rank=within.randint(1, 12))
        if f.kind == "stall" and within.random() < 0.5
        else f
        for f in faults
    ]


def draw_fault(
    rng: random.Random, cfg: Config, kind: str, at: float, *, node: int, process: int
) -> Fault:
    """One fault of ``kind`` at ``at``, its other fields drawn from ``rng`` (for the
    kinds of version 2's swarm, see :func:`draw_swarm_fault`)."""
    if kind == "delay":
        seconds, scale = rng.uniform(0.05, 2.0), rng.choice((0.002, 0.02, 0.1, 0.5))
        return Fault(at, kind, node, process, seconds=seconds, scale=scale, flag=rng.random() < 0.5)
    if kind == "slow":
        process = rng.randrange(cfg.processes)
        seconds, scale = rng.uniform(0.05, 2.0), rng.choice((0.02, 0.1, 0.5))
        return Fault(at, kind, -1, process, seconds=seconds, scale=scale, rank=rng.randrange(2))
    if kind in ("sever", "silent"):
        return Fault(at, kind, node, process, flag=rng.random() < 0.5)
    if kind == "pause":
        return Fault(at, kind, node, seconds=rng.uniform(0.02, 3.0))
    if kind == "restart":
        return Fault(at, kind, node, seconds=rng.uniform(0.01, 2.0), flag=rng.random() < 0.8)
    if kind == "failover":
        return Fault(at, kind, node, seconds=rng.uniform(0.01, 2.0))
    if kind == "late":
        seconds, scale = rng.uniform(0.05, 2.0), rng.choice((0.1, 0.3, 0.6))
        return Fault(at, kind, -1, process, seconds=seconds, scale=scale)
    if kind == "jump":
        step = rng.choice(SKEWS[1:])  # as far as a skew may be
        return Fault(at, kind, -1, rng.randrange(cfg.processes), scale=rng.uniform(-step, step))
    if kind == "pubsub":
        seconds, scale = rng.uniform(0.1, 3.0), rng.choice((0.0, 0.5, 1.0))
        return Fault(at, kind, node, process, seconds=seconds, scale=scale)
    if kind == "stall":
        return Fault(at, kind, seconds=rng.uniform(0.005, 1.5))
    return draw_swarm_fault(rng, cfg, kind, at, node=node, process=process)


#: Version 2's swarm: the fault kinds a run draws a subset of (1 to 4), each as often.
SWARM_KINDS = (
    "clock",
    "delay",
    "die",
    "drop",
    "failover",
    "freeze",
    "jump",
    "lag",
    "late",
    "partition",
    "pause",
    "pubsub",
    "restart",
    "sever",
    "silent",
    "slow",
    "split",
    "stall",
    "subscribe",
)
#: How far a "clock" fault steps a node's clock (seconds, either way): past the drift
#: allowance of every ttl the runs use, so these runs break the timing assumption.
CLOCK_STEPS = (0.05, 0.5, 5.0)


def draw_swarm_fault(
    rng: random.Random, cfg: Config, kind: str, at: float, *, node: int, process: int
) -> Fault:
    """One fault of a kind only version 2 draws in any run (see :func:`draw_fault`)."""
    one = rng.randrange(cfg.processes)  # (the kinds below strike one process)
    if kind == "lag":  # (as in a run focused on lag: a round trip past node_timeout)
        seconds, each_way = rng.uniform(0.2, 3.0), rng.uniform(0.6, 1.2) * NODE_TIMEOUT
        return Fault(at, kind, -1, seconds=seconds, scale=each_way)
    if kind == "split":
        seconds, scale = rng.uniform(0.1, 0.6), rng.choice((0.05, 0.2, 0.6, 1.5))
        return Fault(at, kind, -1, process, seconds=seconds, scale=scale)
    if kind == "partition":  # (a process from a minority, a majority, or every node)
        count = rng.choice((1, cfg.nodes // 2 + 1, cfg.nodes))
        mask = sum(1 << i for i in rng.sample(range(cfg.nodes), count))
        return Fault(at, kind, -1, one, seconds=rng.uniform(0.05, 3.0), rank=mask)
    if kind == "freeze":  # (short, or past a ttl: Kleppmann's pause)
        return Fault(at, kind, -1, one, seconds=rng.choice((0.01, 0.2, 1.0, 4.0)) * rng.random())
    if kind == "clock":
        step = rng.choice(CLOCK_STEPS)
        return Fault(at, kind, node, scale=rng.uniform(-step, step))
    if kind == "die":
        return Fault(at, kind, process=one)
    if kind == "drop":
        target = rng.choice((-1, node))
        return Fault(at, kind, target, process, flag=rng.random() < 0.5, rank=rng.randrange(2))
    if kind == "subscribe":
        target = rng.choice((-1, node))
        return Fault(at, kind, target, process, seconds=rng.uniform(0.5, 4.0), scale=0.3)
    raise ValueError(kind)


def swarm_faults(plan: Plan, cfg: Config) -> list[Fault]:
    """The faults of an unfocused version-2 run: 2 in 7 have none (the liveness rules
    judge those); the others draw 1 to 4 kinds of :data:`SWARM_KINDS`, and 2 to 32
    faults of those kinds at random times: in half the runs within the run's first
    30 % only, the rest a quiet tail in which the progress rule judges it."""
    swarm = random.Random(f"swarm-{plan}")
    if swarm.random() < 2 / 7:
        return []
    every = [kind for kind in SWARM_KINDS if cfg.nodes > 1 or kind != "split"]  # (some, others)
    kinds = swarm.sample(every, swarm.randint(1, 4))
    rng = random.Random(f"faults-{plan}")
    faults = []
    count = swarm.choice((2, 4, 8, 16, 32))
    span = cfg.seconds * swarm.choice((0.3, 1.0))  # (half: a quiet tail, to heal in)
    for _ in range(count):
        kind = rng.choice(kinds)
        at = rng.uniform(0.0, span)
        node = rng.randrange(cfg.nodes)
        process = rng.choice((-1, *range(cfg.processes)))
        faults.append(draw_fault(rng, cfg, kind, at, node=node, process=process))
    return faults


#: The rules that bind a run whose faults break the timing assumptions (:func:`broken`),
#: by their problems' first words, and every crash: nothing logged, no deadlock, fencing
#: tokens in order, no bare key, the nodes' scripts in order and, below, the fenced
#: resource. The others are reported as advisory there.
BINDING = ("crash", "deadlock", "loop:", "logged:", "fencing:", "bare", "scripts run in order")


def broken(faults: list[Fault]) -> bool:
    """Whether ``faults`` break the timing assumptions the library documents (a node's
    clock steps: its keys end sooner or later than their ttl by the step): there
    exclusion may fail; the fenced resource must still refuse every stale write."""
    return any(fault.kind == "clock" for fault in faults)


def judged_after_heal(faults: list[Fault]) -> bool:
    """Whether the progress rule judges a run (live.py: once its faults are over,
    World.faults_over, and a missed release's ttl, the fallback and an entry's life
    have passed, no waiter waits while its name is free on every node): where a fault
    excuses a wait (else the idle rule judges the run already) and the timing
    assumptions hold. Advisory: no document states a bound after faults yet."""
    return excusing(faults) and not broken(faults)


class Logged(logging.Handler):
    """The library's records at ERROR and above while a run lasts: each one is a promise
    broken (an exception swallowed where it was caught, say a renewal tick that raised:
    the real-server suite fails a test on it too, see tests/conftest.py)."""

    def __init__(self, world: World) -> None:
        super().__init__(logging.ERROR)
        self.world = world
        self.problems: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        problem = f"logged: {record.getMessage()}" + (f": {error!r}" if error else "")
        self.problems.append(problem)
        self.world.trace(f"LOGGED {problem}")

    @contextmanager
    def attached(self) -> Iterator[None]:
        library = logging.getLogger("aiolock")
        library.addHandler(self)
        try:
            yield
        finally:
            library.removeHandler(self)


@dataclass
class Result:
    plan: Plan
    config: Config
    faults: list[Fault]
    violations: list[str]
    history: list[str]
    holdings: int
    counts: dict[str, int]
    busy: bool = False  # stopped as a livelock (World.max_deliveries)
    #: What the rules found that the run's faults excuse (see :data:`BINDING`).
    advisory: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.violations)

    def digest(self) -> str:
        """A digest of the whole history: equal digests, equal runs."""
        return hashlib.sha256("\n".join(self.history).encode()).hexdigest()[:16]

    @property
    def portable(self) -> bool:
        """Whether the history is the same on every Python version. A version-1 stall
        within a step strikes after a count of callbacks scheduled, and the callbacks a
        step schedules differ between versions (see ``SimLoop.count_down``)."""
        return self.plan.version >= 2 or not any(f.kind == "stall" and f.flag for f in self.faults)


def shape(plan: Plan) -> set[str]:
    """What ``seed``'s run is, as tags a search may ask for (``search --where``):
    ``focus=<name>``, ``pubsub_refused``, ``out_of_line``, ``no_fault``, ``late_subscriptions``,
    ``drops``, ``chunks``, ``nodes=<n>``, ``cluster``. Drawn as the run draws them, without
    playing it."""
    cfg = make_config(plan)
    faults = make_faults(plan, cfg)
    models = make_models(plan)
    tags = {f"focus={cfg.focus}", f"nodes={cfg.nodes}"}
    tags |= {"pubsub_refused"} if models.pubsub_refused else set()
    tags |= {"cluster"} if models.cluster else set()
    tags |= {"out_of_line"} if cfg.out_of_line else set()
    tags |= {"no_fault"} if not faults else set()
    tags |= {"late_subscriptions"} if faults and only_late_subscriptions(faults) else set()
    tags |= {"drops"} if any(fault.kind == "drop" for fault in faults) else set()
    tags |= {"chunks"} if make_chunks(plan) else set()
    return tags


@dataclass(frozen=True)
class Schedule:
    """A schedule written out whole (kept.py): it replays whatever the generators
    draw later. ``seed`` seeds the random streams of the network, the workload and the
    library, as a version-2 plan's; nothing else is drawn (no memories made small, no
    chunks, no deployment modelled, no wall clocks apart)."""

    name: str
    config: Config
    faults: tuple[Fault, ...]
    seed: int = 1

    def __str__(self) -> str:
        return self.name


def run(target: Plan | Schedule, keep: Iterable[int] | None = None) -> Result:
    """Play a plan's schedule, or a schedule kept whole (only the faults numbered in
    ``keep``, if given)."""
    schedule = target if isinstance(target, Schedule) else None
    plan = Plan(target.seed, 2) if isinstance(target, Schedule) else target
    seed = plan.seed
    if schedule is not None:
        cfg, faults = replace(schedule.config), list(schedule.faults)
        sizes, chunks, models = {}, {}, Models()
    else:
        cfg = make_config(plan)
        faults = make_faults(plan, cfg)
        sizes = make_memories(plan, faults)
        chunks = make_chunks(plan)
        models = make_models(plan)
    if keep is not None:
        kept = set(keep)
        faults = [f for i, f in enumerate(faults) if i in kept]
    if models.alias:
        faults = []
    world = World(plan=plan, nodes_count=cfg.nodes, drift=DRIFT, faults=faults)
    world.pubsub_refused = models.pubsub_refused
    world.cluster = models.cluster
    world.native = cfg.native
    if quiet(faults) and not models.cluster:
        world.subs = Subscriptions(world)
        if not sizes:
            world.given = GivenTurns(world, world.subs)
    world.skews = make_skews(plan, cfg) if schedule is None else {}
    if cfg.fenced:
        world.resource = Resource(lambda: world.now, world.trace)
    if cfg.grace is not None:
        world.grace = cfg.grace
    rec = Recorder(world)
    rec.live = Liveness(world, cfg.processes)
    rec.live.longest = rec.longest
    rec.live.progress = plan.version >= 2 and not sizes and judged_after_heal(faults)
    sleeps = world.sleeps = rec.live.sleeps = Sleeps(world, rec.live)
    if cfg.out_of_line or models.cluster:  # (nobody takes turns on a cluster)
        rec.live.streak_limit = OUT_OF_LINE_STREAK_LIMIT
        rec.live.racing = True
    rec.nudge_chance = cfg.nudge

    def observe() -> None:
        rec.live.sample()
        sleeps.check()
        rec.watch()

    world.observer = observe
    errors: list[str] = []

    def on_error(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        exc = context.get("exception")
        # A task of the library left unawaited at close is not a broken promise.
        errors.append(f"loop: {context.get('message')}: {exc!r}")
        world.trace(f"LOOP ERROR {context.get('message')}: {exc!r}")

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(on_error)
        world.arm()
        if models.alias:
            errors.extend(await aliases_refused(world, models.alias))
            return
        try:
            async with asyncio.timeout(cfg.seconds + 120.0):
                await run_processes(world, cfg, rec, plan)
        except TimeoutError:
            errors.append("liveness: the workload did not finish within 120 s of its end")
        # A command held by a paused node runs when it resumes, and may set a ttl then.
        resumed = max((n.paused_until for n in world.nodes), default=0.0)
        await asyncio.sleep(max(0.0, resumed - world.now) + SETTLE)

    rec.watch_orphans = rec.live.on = not sizes
    named = f"schedule {schedule.name!r}, " if schedule is not None else ""
    world.trace(f"{named}seed {plan} config {cfg.describe()}")
    if str(models):
        world.trace(f"models {models}")
    if sizes:
        shown = ", ".join(f"{where.rsplit('.', 1)[1]}={size}" for where, size in sizes.items())
        world.trace(f"memories {shown}")
    if chunks:
        world.trace(f"renewal chunks of {', '.join(map(str, chunks.values()))} locks")
    if world.skews:
        shown = ", ".join(f"p{p} {skew:+.6f}s" for p, skew in sorted(world.skews.items()))
        world.trace(f"wall clocks {shown}")
    for i, fault in enumerate(faults):
        world.trace(f"planned #{i} {fault}")
    logged = Logged(world)
    give_back = aiolock._waiting.handoff.give_back

    def given_back(quorum: Any, key: bytes, token: bytes, **kwargs: Any) -> None:
        rec.live.given_back(name_of(key))
        give_back(quorum, key, token, **kwargs)

    def undone(key: bytes) -> None:  # (a race follows, as after a give-back)
        rec.live.given_back(name_of(key))

    world.on_undone = undone
    wait_in_queue = aiolock._waiting.waiting.Waiting.acquire
    wake_ups = WakeUps(world)
    release_in_queue = aiolock._waiting.waiting.Waiting.released
    see_line = aiolock._waiting.waiting.Waiting.line_seen

    def released(self: Any, key: bytes, **kwargs: Any) -> Any:
        """Waiting.released, its decision noted (lone.py)."""
        local = release_in_queue(self, key, **kwargs)
        wake_ups.released(self, key, local, current_process.get())
        return local

    def line_seen(self: Any, key: bytes, votes: Any) -> None:
        """Waiting.line_seen, noted (lone.py)."""
        see_line(self, key, votes)
        wake_ups.line_seen(self, key)

    async def queued(
        self: Any, key: bytes, attempt: Any, deadline: float, *, taker: Any = None, **kwargs: Any
    ) -> Any:
        """Waiting.acquire, noting a plain lock's waiter as it queues, and any waiter as
        it leaves its queue without the lock (given.py)."""
        given = world.given
        if given is not None and taker is not None:
            given.queue(taker[0], deadline)
        outcome = None
        try:
            outcome = await wait_in_queue(self, key, attempt, deadline, taker=taker, **kwargs)
        finally:
            if given is not None and (outcome is None or outcome.expires_at is None):
                given.left(key, current_process.get())
        return outcome

    with (
        virtual_process(world, seed),
        memories(sizes),
        memories(chunks),
        logged.attached(),
        mock.patch("aiolock._waiting.grants.give_back", given_back),
        mock.patch.object(aiolock._waiting.waiting.Waiting, "acquire", queued),
        mock.patch.object(aiolock._waiting.waiting.Waiting, "released", released),
        mock.patch.object(aiolock._waiting.waiting.Waiting, "line_seen", line_seen),
    ):
        try:
            with asyncio.Runner(loop_factory=lambda: world.loop) as runner:
                runner.run(main())
        except Deadlock as exc:
            if not world.busy:  # the loop had nothing left to do, and tasks were waiting
                errors.append(f"deadlock: {exc}")
        except RuntimeError:
            if not world.busy:
                raise
        except BaseExceptionGroup as group:
            errors.extend(f"crash: {e!r}" for e in group.exceptions)
    if world.busy:  # stopped midway: liveness, reported apart; nothing else is judged
        return Result(
            plan, cfg, faults, [], world.history, len(rec.holdings), rec.counts, busy=True
        )
    if models.alias:  # (the refusal is logged at ERROR too, as it should be)
        logged.problems = [p for p in logged.problems if "is the same server as" not in p]
    keys = {n.index: n.store.keys() for n in world.nodes}
    if world.subs is not None:
        world.subs.check_announced(final=True)
        world.subs.check_woken(final=True)
    violations = [
        *rec.crashes,
        *errors,
        *logged.problems,
        *rec.orphaned,
        *rec.live.problems,
        *rec.resting,
        *(lost_without_a_fault(rec.holdings, rec.counts) if rec.live.on and quiet(faults) else []),
        *(
            writers_first(
                rec.holdings, rec.writes, rec.released, late=bool(faults) or models.pubsub_refused
            )
            if rec.live.on and quiet(faults)
            else []
        ),
        *(
            lost_without_a_fault(rec.holdings, rec.counts, "lost under short blocks")
            if cfg.focus == "block"
            else []
        ),
        *(
            lost_needlessly(rec.holdings, cfg.focus, [EPOCH + f.at for f in faults])
            if cfg.focus in ("repair", "lag")
            else []
        ),
        *check_exclusion(rec.holdings, faults=bool(faults)),
        *check_kept(rec.holdings),
        *check_outlives(rec.holdings),
        *check_told(rec.holdings, world.stalls, world.freezes),
        *check_revived(rec.holdings),
        *check_followed(rec.holdings),
        *check_backed(rec.holdings),
        *check_keys(keys),
        *check_bare(world.bare),
        # (Without faults only: a connection that was down, or whose writes were held
        # back, sends what queued meanwhile at one instant, two batches' chunks among
        # it: seed 35184382090313, a pause and a stall.)
        *(world.wire if quiet(faults) else []),
        *world.promises,
        *(
            check_refused(world.resource, lambda a, b: counters_lost(a, b, faults=bool(faults)))
            if world.resource is not None
            else []
        ),
    ]
    advisory = []
    if broken(faults):  # (the timing assumptions do not hold: see BINDING)
        binding = [v for v in violations if v.startswith(BINDING) or v in rec.crashes]
        advisory = [v for v in violations if v not in binding]
        violations = binding
    if world.resource is not None:
        violations += check_fenced(world.resource)
        rec.counts["refused"] = world.resource.refused
    advisory += rec.live.unhealed  # (no document bounds it yet: see heal_time)
    rec.counts["unhealed"] = len(rec.live.unhealed)
    for problem in advisory:
        world.trace(f"ADVISORY {problem.splitlines()[0]}")
    for problem in violations:
        world.trace(f"VIOLATION {problem.splitlines()[0]}")
    result = Result(plan, cfg, faults, violations, world.history, len(rec.holdings), rec.counts)
    result.advisory = advisory
    return result


def shrink(plan: Plan | Schedule) -> tuple[list[int], Result]:
    """The fewest faults of ``plan``'s schedule that still fail (greedy, one at a time)."""
    full = run(plan)
    keep = list(range(len(full.faults)))
    best = full
    changed = True
    while changed:
        changed = False
        for i in list(keep):
            trial = [k for k in keep if k != i]
            result = run(plan, trial)
            if result.failed:
                keep, best, changed = trial, result, True
    return keep, best
