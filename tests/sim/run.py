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
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
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
from .sleeps import Sleeps, name_of
from .subs import Subscriptions
from .workload import FOCI_GRANTS, NODE_TIMEOUT, Config, Recorder, make_config, run_processes
from .world import (
    CHUNKS_FROM,
    CLUSTER_FROM,
    DROP_FROM,
    EPOCH,
    HANDOVER_FROM,
    LIVE_FROM,
    MODELS_FROM,
    ORDERED_FROM,
    SKEW_FROM,
    SOCKETS_FROM,
    STEP_STALL_FROM,
    SUBSCRIBE_LATE_FROM,
    Deadlock,
    Fault,
    World,
    current_process,
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
#: Seeds from here on draw a *swarm* of kinds: each schedule uses a subset of 1 to 3 of
#: them (swarm testing: a schedule with many faults of few kinds reaches further into
#: each than one that spreads them over all kinds, and the subsets vary from seed to
#: seed). Seeds below draw from every kind, as the seeds found before it did: they
#: replay unchanged.
SWARM_FROM = 2**32
#: Seeds from here on also draw "late" faults (a burst of a client's commands held back
#: past its node timeout), and half their schedules keep the library's bounded memories
#: small (see :data:`MEMORIES`). Seeds below replay unchanged. From LEASES_FROM (2**34,
#: workload.py) on, the workload makes leases too; from ORDERED_FROM (2**35, world.py)
#: on, the loop releases its timers one at a time, the kinds include "failover" (an
#: empty server with a new run_id and a long uptime takes a node's address over), and
#: a body awaits the cancellation of a loss it saw noted; from SKEW_FROM (2**36,
#: world.py) each process has a wall clock of its own; from LIVE_FROM (2**37,
#: world.py), 2 schedules in 7 have no fault (see live.py); from MODELS_FROM (2**38,
#: world.py), where the search starts, some runs model deployments (make_models).
LATE_FROM = 2**33
#: The spreads a run's skews are drawn within (seconds either way).
SKEWS = (0.0, 0.001, 0.05, 2.0, 60.0)
#: The library's bounded memories and the sizes a schedule may give them. The library
#: argues that forgetting is safe at any size; at its real sizes (1,024 tokens taken,
#: 4,096 offers) a run of a few seconds never forgets, so the argument would go
#: untested (issue 31's second break needed 1,024 handoffs before a late grant).
MEMORIES = {
    "aiolock._waiting.grants._TAKEN_KEPT": (1, 2, 8),
    "aiolock._waiting.turns._OFFERS_KEPT": (1, 2, 8),
}


def make_memories(seed: int, faults: list[Fault]) -> dict[str, int]:
    """The sizes of the library's bounded memories in ``seed``'s schedule (empty: real);
    ``faults``: the schedule's, all of them (from LIVE_FROM on, a schedule without
    faults, or with late subscriptions or dropped pub/sub connections only, keeps the
    real sizes: the liveness rules apply there)."""
    if seed < LATE_FROM or (seed >= LIVE_FROM and quiet(faults)):
        return {}
    rng = random.Random(f"memories-{seed}")
    if rng.random() < 0.5:
        return {}
    return {where: rng.choice(sizes) for where, sizes in MEMORIES.items()}


#: Where the renewal's batches are split (see world.CHUNKS_FROM), and the sizes a
#: schedule may give it.
CHUNKS = ("aiolock._core.batch.BATCH_LIMIT", (1, 2, 3))


def make_chunks(seed: int) -> dict[str, int]:
    """The renewal's chunk size in ``seed``'s schedule (empty: the real 1,000); from
    CHUNKS_FROM on, half the runs, whatever their faults: a smaller chunk changes when
    the renewal's calls go out, not what a run may expect of the library."""
    if seed < CHUNKS_FROM:
        return {}
    rng = random.Random(f"chunks-{seed}")
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
    """What ``seed``'s run models of the deployment, beyond the faults (from MODELS_FROM)."""

    #: Every node refuses SUBSCRIBE (an ACL without +subscribe): waiters must poll.
    pubsub_refused: bool = False
    #: The managers are given one server twice: ``"database"`` (its URL again with
    #: another database number) or ``"address"`` (a second host name that reaches it).
    #: They must refuse to start; the run is that check alone.
    alias: str | None = None
    #: Each node is a Redis Cluster of one master (from CLUSTER_FROM, world.World.cluster).
    cluster: bool = False

    def __str__(self) -> str:
        shown = ["pub/sub refused"] if self.pubsub_refused else []
        shown += [f"one server twice ({self.alias})"] if self.alias else []
        shown += ["each node a cluster of one master"] if self.cluster else []
        return ", ".join(shown)


#: The foci whose runs never have pub/sub refused. ``handover`` (from HANDOVER_FROM): its
#: shortened keys are announced on pub/sub, which is what it checks. Where pub/sub is
#: refused every waiter polls, and a lock left to expire goes to whichever poll comes
#: first as its key lapses on a quorum, the other nodes' keys a few milliseconds from
#: their end: the name never free on every node, the streak rule read three such races
#: and four handoffs as 8 in a row (seed 1125899906885140, in the focus's first shape:
#: docs/project/testing.md). ``grants`` (from GRANTS_FROM): a grant is a message, and a
#: waiter that polls hears none.
SUBSCRIBED_FOCI = ("handover", "grants")


def make_models(seed: int) -> Models:
    """What ``seed``'s run models (below MODELS_FROM: nothing, and nothing drawn)."""
    if seed < MODELS_FROM:
        return Models()
    rng = random.Random(f"models-{seed}")
    alias = rng.choice(("database", "address")) if rng.random() < 1 / 16 else None
    models = Models(pubsub_refused=rng.random() < 1 / 6, alias=alias)
    if seed >= CLUSTER_FROM and not alias:  # (a stream of its own: the draws above stand)
        cluster = random.Random(f"cluster-{seed}").random() < 1 / 6
        models = Models(pubsub_refused=models.pubsub_refused, cluster=cluster)
    focus = make_config(seed).focus if models.pubsub_refused else None
    if seed >= HANDOVER_FROM and focus in SUBSCRIBED_FOCI:
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


def make_skews(seed: int, cfg: Config) -> dict[int, float]:
    """How far each process's wall clock is off in ``seed``'s schedule (empty: none)."""
    if seed < SKEW_FROM:
        return {}
    rng = random.Random(f"skews-{seed}")
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
#: world.SOCKETS_FROM on): past the stall watchdog's second, below a third of the ttl.
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
    world.STEP_STALL_FROM), each longer than node_timeout and shorter than
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
    """The faults of a run focused on grants (world.GRANTS_FROM): rolling pauses, one
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
    SUBSCRIBE_LATE_FROM on: 1 to 4 spells in which a process's subscriptions (or every
    process's) to a node, or to every node, are held back up to 0.3 s (see
    world.SUBSCRIBE_LATE_FROM). A waiter listens on n - quorum + 1 nodes: it misses a
    release only when none of them has its subscription yet."""
    return _pubsub_spells(
        rng, cfg, "subscribe", 4, lambda: {"seconds": rng.uniform(0.5, 4.0), "scale": 0.3}
    )


def dropped_subscriptions(rng: random.Random, cfg: Config) -> list[Fault]:
    """The faults of a quarter of the schedules drawn without any, from DROP_FROM on:
    1 to 8 resets of a process's pub/sub connection to a node (or every process's, or
    to every node), the messages in flight to it lost, half of them as the process's
    next release runs (see world.DROP_FROM)."""
    return _pubsub_spells(
        rng, cfg, "drop", 8, lambda: {"flag": rng.random() < 0.5, "rank": rng.randrange(2)}
    )


def make_faults(seed: int, cfg: Config) -> list[Fault]:
    """The faults of a schedule, in time order."""
    faults = _make_faults(seed, cfg)
    if seed >= CLUSTER_FROM and make_models(seed).cluster:  # (see world.CLUSTER_FROM)
        faults = [f for f in faults if f.kind not in ("restart", "failover")]
    if not faults and seed >= SUBSCRIBE_LATE_FROM:
        late = random.Random(f"subscribe-{seed}")
        if late.random() < 0.5:
            return late_subscriptions(late, cfg)
        if seed >= DROP_FROM:
            drops = random.Random(f"drop-{seed}")
            if drops.random() < 0.5:
                return dropped_subscriptions(drops, cfg)
    return faults


def _make_faults(seed: int, cfg: Config) -> list[Fault]:
    rng = random.Random(f"faults-{seed}")
    if cfg.focus == "repair":  # (from REPAIR_FROM on)
        return spaced_restarts(rng, cfg)
    if cfg.focus == "lag":  # (from LAG_FROM on)
        return lagging(rng, cfg)
    if cfg.focus == "block":  # (from STEP_STALL_FROM on)
        return blocking(rng, cfg)
    if cfg.focus == "chain":  # (the same)
        return chained_restarts(rng, cfg)
    if cfg.focus == "grants":  # (from GRANTS_FROM on)
        return paused_nodes(rng, cfg)
    if cfg.focus == "split":  # (from SPLIT_FROM on): releases split, many of them
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
    if cfg.focus == "death":  # (from DEATH_FROM on): one process dies
        at = rng.uniform(0.5, cfg.seconds - 1.0)
        return [Fault(at, "die", process=rng.randrange(cfg.processes))]
    count = rng.choice((0, 0, 2, 4, 8, 12, 16) if seed >= LIVE_FROM else (0, 2, 4, 8, 12, 16))
    kinds: tuple[str, ...] = KINDS
    if cfg.focus is not None:  # (from FOCUS_FROM on: the kinds its part needs)
        kinds = FOCI_GRANTS[cfg.focus]
        count = rng.choice((0, 4, 8, 12)) if kinds else 0
        if count:
            kinds = tuple(rng.sample(kinds, rng.randint(1, min(3, len(kinds)))))
    elif seed >= SWARM_FROM:
        swarm = random.Random(f"swarm-{seed}")
        every = {*KINDS, "late"} if seed >= LATE_FROM else set(KINDS)
        if seed >= ORDERED_FROM:
            every.add("failover")
        if seed >= SKEW_FROM:
            every.add("jump")
        if seed >= SOCKETS_FROM:
            every.add("silent")
        kinds = tuple(swarm.sample(sorted(every), swarm.randint(1, 3)))
    faults = []
    for _ in range(count):
        kind = rng.choice(kinds)
        at = rng.uniform(0.0, cfg.seconds)
        node = rng.randrange(cfg.nodes)
        process = rng.choice((-1, *range(cfg.processes)))
        if kind == "delay":
            fault = Fault(
                at,
                kind,
                node,
                process,
                seconds=rng.uniform(0.05, 2.0),
                scale=rng.choice((0.002, 0.02, 0.1, 0.5)),
                flag=rng.random() < 0.5,
            )
        elif kind == "slow":
            fault = Fault(
                at,
                kind,
                -1,
                rng.randrange(cfg.processes),
                seconds=rng.uniform(0.05, 2.0),
                scale=rng.choice((0.02, 0.1, 0.5)),
                rank=rng.randrange(2),
            )
        elif kind in ("sever", "silent"):
            fault = Fault(at, kind, node, process, flag=rng.random() < 0.5)
        elif kind == "pause":
            fault = Fault(at, kind, node, seconds=rng.uniform(0.02, 3.0))
        elif kind == "restart":
            fault = Fault(at, kind, node, seconds=rng.uniform(0.01, 2.0), flag=rng.random() < 0.8)
        elif kind == "failover":
            fault = Fault(at, kind, node, seconds=rng.uniform(0.01, 2.0))
        elif kind == "late":
            fault = Fault(
                at,
                kind,
                -1,
                process,
                seconds=rng.uniform(0.05, 2.0),
                scale=rng.choice((0.1, 0.3, 0.6)),
            )
        elif kind == "jump":
            step = rng.choice(SKEWS[1:])  # as far as a skew may be
            fault = Fault(
                at, kind, -1, rng.randrange(cfg.processes), scale=rng.uniform(-step, step)
            )
        elif kind == "pubsub":
            fault = Fault(
                at,
                kind,
                node,
                process,
                seconds=rng.uniform(0.1, 3.0),
                scale=rng.choice((0.0, 0.5, 1.0)),
            )
        else:
            fault = Fault(at, kind, seconds=rng.uniform(0.005, 1.5))
        faults.append(fault)
    faults.sort(key=lambda f: f.at)
    if seed >= STEP_STALL_FROM and cfg.focus != "block":  # (a stream of its own)
        within = random.Random(f"within-{seed}")
        faults = [
            replace(f, flag=True, rank=within.randint(1, 12))
            if f.kind == "stall" and within.random() < 0.5
            else f
            for f in faults
        ]
    return faults


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
    seed: int
    config: Config
    faults: list[Fault]
    violations: list[str]
    history: list[str]
    holdings: int
    counts: dict[str, int]
    busy: bool = False  # stopped as a livelock (World.max_deliveries)

    @property
    def failed(self) -> bool:
        return bool(self.violations)

    def digest(self) -> str:
        """A digest of the whole history: equal digests, equal runs."""
        return hashlib.sha256("\n".join(self.history).encode()).hexdigest()[:16]


def shape(seed: int) -> set[str]:
    """What ``seed``'s run is, as tags a search may ask for (``search --where``):
    ``focus=<name>``, ``pubsub_refused``, ``out_of_line``, ``no_fault``, ``late_subscriptions``,
    ``drops``, ``chunks``, ``nodes=<n>``, ``cluster``. Drawn as the run draws them, without
    playing it."""
    cfg = make_config(seed)
    faults = make_faults(seed, cfg)
    models = make_models(seed)
    tags = {f"focus={cfg.focus}", f"nodes={cfg.nodes}"}
    tags |= {"pubsub_refused"} if models.pubsub_refused else set()
    tags |= {"cluster"} if models.cluster else set()
    tags |= {"out_of_line"} if cfg.out_of_line else set()
    tags |= {"no_fault"} if not faults else set()
    tags |= {"late_subscriptions"} if faults and only_late_subscriptions(faults) else set()
    tags |= {"drops"} if any(fault.kind == "drop" for fault in faults) else set()
    tags |= {"chunks"} if make_chunks(seed) else set()
    return tags


def run(seed: int, keep: Iterable[int] | None = None) -> Result:
    """Play the schedule of ``seed`` (only the faults numbered in ``keep``, if given)."""
    cfg = make_config(seed)
    faults = make_faults(seed, cfg)
    sizes = make_memories(seed, faults)
    chunks = make_chunks(seed)
    if keep is not None:
        kept = set(keep)
        faults = [f for i, f in enumerate(faults) if i in kept]
    models = make_models(seed)
    if models.alias:
        faults = []
    world = World(seed=seed, nodes_count=cfg.nodes, drift=DRIFT, faults=faults)
    world.pubsub_refused = models.pubsub_refused
    world.cluster = models.cluster
    if quiet(faults) and not models.cluster:
        world.subs = Subscriptions(world)
        if not sizes:
            world.given = GivenTurns(world, world.subs)
    world.skews = make_skews(seed, cfg)
    if cfg.grace is not None:
        world.grace = cfg.grace
    rec = Recorder(world)
    rec.live = Liveness(world, cfg.processes)
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
                await run_processes(world, cfg, rec, seed)
        except TimeoutError:
            errors.append("liveness: the workload did not finish within 120 s of its end")
        # A command held by a paused node runs when it resumes, and may set a ttl then.
        resumed = max((n.paused_until for n in world.nodes), default=0.0)
        await asyncio.sleep(max(0.0, resumed - world.now) + SETTLE)

    rec.watch_orphans = rec.live.on = not sizes
    world.trace(f"seed {seed} config {cfg.describe()}")
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
            seed, cfg, faults, [], world.history, len(rec.holdings), rec.counts, busy=True
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
        *check_told(rec.holdings, world.stalls),
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
    ]
    for problem in violations:
        world.trace(f"VIOLATION {problem.splitlines()[0]}")
    return Result(seed, cfg, faults, violations, world.history, len(rec.holdings), rec.counts)


def shrink(seed: int) -> tuple[list[int], Result]:
    """The fewest faults of ``seed``'s schedule that still fail (greedy, one at a time)."""
    full = run(seed)
    keep = list(range(len(full.faults)))
    best = full
    changed = True
    while changed:
        changed = False
        for i in list(keep):
            trial = [k for k in keep if k != i]
            result = run(seed, trial)
            if result.failed:
                keep, best, changed = trial, result, True
    return keep, best


def search(first: int, count: int | None, seconds: float | None) -> Iterable[Result]:
    """Run seeds ``first, first + 1, ...``: ``count`` of them, or for ``seconds``."""
    started = time.monotonic()
    seed = first
    while (count is None or seed < first + count) and (
        seconds is None or time.monotonic() - started < seconds
    ):
        yield run(seed)
        seed += 1
