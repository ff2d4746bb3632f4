"""What the simulated processes do, and what they record for the checker.

Every process is a :class:`aiolock.LockManager` of its own (its own connections, turns,
grants, renewer) in the one simulated loop. Its tasks loop until the run's end over a
mix of operations drawn from the run's seed: plain locks with and without renewal,
shorter and longer ``extend()``, reentrant levels, detach + attach, handoffs (several
tasks and processes on few names), semaphores, read-write locks and ``lock_many``; now
and then an operation is cancelled at a random await (``asyncio.timeout``).

A body works in *steps*: it reads ``remaining()`` and, only when it is positive, records
a step ``(now, now + remaining())`` with no await in between: a step is a moment the
holder believed, on the library's word, that it held the lock. The checker compares the
steps of different holders (check.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import RedisCluster

from aiolock import (
    LockError,
    LockEvent,
    LockLost,
    LockManager,
    LockMany,
    LockNotOwned,
    LockTimeout,
    QuorumError,
)

from .live import FIRST_TRY, Liveness, at_rest
from .plan import Plan
from .world import (
    BASE_LATENCY,
    SimLoop,
    World,
    current_process,
)

NODE_TIMEOUT = 0.05
#: From 'attach' (plan.V1_FROM) on, how much longer than its ttl a handover extends its lock before
#: it detaches it, in half the handovers (Worker.op_handover; the managers'
#: ``restart_grace``, when a run sets it, covers the longest).
ATTACH_LONGER = (2.0, 3.0)
#: How often a body of a run focused on chains reads its lock, past its work, for the
#: renewal it ends after (well within a lease's slack: 1 % of a ttl, 5 ms at least).
CHASE_STEP = 0.002
#: The library's default drift allowance: validity = ttl - elapsed - (ttl x this + floor).
DRIFT_FACTOR = 0.01
DRIFT_FLOOR = 0.002
#: How long a lock key may be held by a token nobody has, in a schedule without faults
#: (see Recorder.look_for_orphans): latencies are below a millisecond there.
ORPHAN_LIMIT = 1.0
#: How long after an ``extend()`` went out its confirmation may still set a validity
#: that had run out meanwhile (see Recorder.dry): its fan-out waits node_timeout, and
#: a margin for a slow link.
EXTENDING = 0.5
#: A lock's key on the nodes (the default prefix).
KEY = b"aiolock:{%s}"


@dataclass
class Holding:
    """One acquisition, as its holder lived it."""

    domain: tuple[Any, ...]  # ("lock", name) | ("sem", name, limit) | ("rw", name)
    mode: str  # "x" exclusive, "s" slot, "r" read, "w" write
    ident: Any  # what makes two records one holding (the fencing token for locks)
    token: int | None
    owner: str
    ttl: float
    renewed: bool  # auto-renewed inside ``async with``: a loss cancels the body
    steps: list[tuple[float, float]] = field(default_factory=list)
    told_at: float | None = None  # when the body was cancelled for the loss
    told_in_extend: bool = False  # the cancellation waited for an extend() in flight
    ran_out: float | None = None  # when a renewed body saw remaining() == 0 untold
    #: The first step at which a quorum of nodes did not keep the lock's key as long
    #: as the step believed, described: see check.check_kept.
    short: str | None = None
    #: For a lock, at the holding's first step: each node's fencing counter (None: it
    #: has none) and how many times each node had lost its data, read for the fencing
    #: rule's one exception (see check.py).
    counters: list[int | None] | None = None
    resets: list[int] | None = None
    #: The longest ttl the holding asked for (its handle's, or an extend()'s), and the
    #: first moment a node kept its key longer than that from then on: see
    #: check.check_outlives.
    longest: float = 0.0
    outlives: str | None = None
    #: The hold (the handle's ``_hold``) whose ``remaining()`` a step of this holding
    #: read as 0, and the first moment it read more again, described: see
    #: check.check_revived.
    ran_dry: Any = field(default=None, repr=False)
    revived: str | None = None
    #: When the holder last called ``extend()``, and how many of its calls have not
    #: returned (see Recorder.dry).
    extended_at: float = -math.inf
    extending: int = 0
    #: The hold the holder last extended with no other extension of it in flight
    #: (``tangled``: one went out while another was in flight, whose outcomes the
    #: library then rightly takes the earlier of), and the first moment its validity
    #: fell short of what the nodes applied, described: see Recorder.follows.
    followed: Any = field(default=None, repr=False)
    tangled: bool = False
    unfollowed: str | None = None
    #: When its acquire began (-inf: unknown), and, for a lock, where a quorum of
    #: counters did not back its token at its first step, described: see
    #: Recorder.backs.
    began: float = -math.inf
    unbacked: str | None = None
    #: For a ``lock_many``'s names, when the call began: each name's token may have
    #: been drawn from then on, long before the first step (see check._check_fencing).
    drawn: float | None = None

    def __post_init__(self) -> None:
        self.longest = max(self.longest, self.ttl)

    def step(self, now: float, remaining: float) -> None:
        self.steps.append((now, now + remaining))


@dataclass
class RWWait:
    """A writer's acquire of a read-write lock: from ``since`` until ``until``, when
    it took the lock (``got``), gave up, or was cancelled."""

    name: str
    owner: str
    since: float
    until: float
    got: bool


@dataclass
class Config:
    """The shape of one run, drawn from its seed."""

    nodes: int
    processes: int
    tasks: int
    names: tuple[str, ...]
    seconds: float
    ops: tuple[str, ...]
    #: From 'leases' (plan.V1_FROM) on (else None and 0.0, drawing nothing): every acquisition of
    #: the run with this ttl (as a service's code passes one ttl per name), and the
    #: chance that a body is short (at most 1 % of its ttl). Both are what a lease
    #: needs: a handoff within a process to a waiter with the holder's ttl, while the
    #: lock is fresh. Without them no lease was ever made (0 in 205 handoffs).
    ttl: float | None = field(default=None, repr=False)
    short: float = field(default=0.0, repr=False)
    #: From 'ordered' (plan.V1_FROM) on: a body that finds its lock noted lost in the instant it
    #: woke awaits the cancellation that must follow, rather than assume it (see
    #: Worker._body). Draws nothing.
    await_told: bool = field(default=False, repr=False)
    #: From 'skew' (plan.V1_FROM) on, in half the runs: the managers' ``restart_grace``, the
    #: longest ttl the run sets (an extend() may double a ttl); else None, the default.
    grace: float | None = field(default=None, repr=False)
    #: From 'skew' (plan.V1_FROM) on, in 3 runs of 10: long work, renewed bodies of up to 8 ttls
    #: (else 2), which outlive restarted nodes' quarantines: their keys must have been
    #: repaired by then.
    long: bool = field(default=False, repr=False)
    #: From 'live' (plan.V1_FROM) on: the chance that a body, as it ends, has a waiter for one of
    #: its names cancelled a few hundred microseconds later (see Recorder.nudge): while
    #: the lock is handed to it, or granted, which a cancellation at a random time
    #: seldom hits (a handoff takes a round trip).
    nudge: float = field(default=0.0, repr=False)
    #: From 'focus' (plan.V1_FROM) on, in half the runs: the part of the library the run focuses
    #: on (one of FOCI; see :func:`focus`), else None.
    focus: str | None = field(default=None, repr=False)
    #: From 'lag' (plan.V1_FROM) on, in half the runs focused on turns: the processes that wait
    #: without taking turns (as an older aiolock's do, or a Redis Cluster's: no turn
    #: queue, no grants), whom the end of a lone streak lets in.
    out_of_line: tuple[int, ...] = field(default=(), repr=False)
    #: From 'sockets' (plan.V1_FROM) on, in half the runs focused on blocks: ttls of 3.6 to 5 s and
    #: blocks of 1.05 s up to a third of the ttl (at most 1.5 s), past the stall
    #: watchdog's second (run.blocking): replies that came meanwhile wait in the socket,
    #: and a connection whose replies wait is kept. Draws nothing otherwise.
    long_blocks: bool = field(default=False, repr=False)
    #: From 'lone' (plan.V1_FROM) on, in runs focused on lone streaks: the process that rests 50 to
    #: 400 ms between its operations, and every body that may extend ends with a
    #: shortening extend() (see 'lone' (plan.V1_FROM)). Draw nothing otherwise.
    resting: int | None = field(default=None, repr=False)
    shortened: bool = field(default=False, repr=False)
    #: Version 2, half the runs: bodies write their work to the fenced resource
    #: (resource.py) with their locks' fencing tokens.
    fenced: bool = field(default=False, repr=False)
    #: Version 3, half the runs: the nodes say they are Valkey 9.1, whose ``SET`` takes
    #: ``IFEQ`` (one lock's renewal is then that command, not a script).
    native: bool = field(default=False, repr=False)

    def describe(self) -> str:
        extra = f" focus {self.focus}" if self.focus else ""
        extra += f" out of line {self.out_of_line}" if self.out_of_line else ""
        extra += f" ttl {self.ttl:.3f}" if self.ttl is not None else ""
        extra += f" short {self.short:.2f}" if self.short else ""
        extra += f" restart_grace {self.grace:.3f}" if self.grace else ""
        extra += " long blocks" if self.long_blocks else ""
        extra += " fenced" if self.fenced else ""
        extra += " native" if self.native else ""
        return f"{self}{extra}" + (" long" if self.long else "")


OPS = ("lock", "lock", "lock", "manual", "extend", "reentrant", "handover", "sem", "rw", "many")


def make_config(plan: Plan) -> Config:
    seed = plan.seed
    rng = random.Random(f"config-{seed}")
    cfg = Config(
        nodes=rng.choice((3, 3, 5)),
        processes=rng.choice((2, 2, 3)),
        tasks=rng.choice((1, 2, 3)),
        names=("a", "b")[: rng.choice((1, 1, 2))],
        seconds=rng.uniform(2.0, 6.0),
        ops=tuple(rng.sample(OPS, rng.randint(3, len(OPS)))),
    )
    if plan.has("leases"):
        more = random.Random(f"workload-{seed}")
        cfg.ttl = more.uniform(0.3, 3.0) if more.random() < 0.5 else None
        cfg.short = more.choice((0.0, 0.3, 0.7))
    cfg.await_told = plan.has("ordered")
    if plan.has("skew"):
        more = random.Random(f"grace-{seed}")
        if more.random() < 0.5:
            longest = cfg.ttl if cfg.ttl is not None else 3.0
            cfg.grace = longest * (2 if {"extend", "manual"} & set(cfg.ops) else 1)
            if plan.has("attach") and "handover" in cfg.ops:
                cfg.grace = longest * ATTACH_LONGER[1]  # (see Worker.op_handover)
        cfg.long = more.random() < 0.3
    if plan.has("live"):
        cfg.nudge = random.Random(f"nudge-{seed}").choice((0.0, 0.2, 0.5))
    if plan.version >= 4:  # (the foci a measurement keeps)
        kept = FOCI_KEPT_5 if plan.version >= 5 else FOCI_KEPT
        focus(cfg, random.Random(f"focus-{seed}"), kept, share=len(kept) / 26)
    elif plan.has("focus"):
        foci = next((foci for since, foci in V1_FOCI if plan.has(since)), FOCI)
        focus(cfg, random.Random(f"focus-{seed}"), foci)
    if plan.has("step_stall") and cfg.focus == "lease":
        chain = random.Random(f"chain-{seed}")
        if chain.random() < 0.5:
            cfg.focus = "chain"
            focus_on_chains(cfg, chain)
    if plan.has("sockets") and cfg.focus == "block":
        blocks = random.Random(f"blocks-{seed}")
        if blocks.random() < 0.5:
            cfg.long_blocks = True
            cfg.ttl = blocks.uniform(3.6, 5.0)
            if cfg.grace is not None:
                cfg.grace = cfg.ttl * 2  # (as focus sets it: the ops have manual locks)
    if plan.has("lag") and cfg.focus == "turns" and random.Random(f"line-{seed}").random() < 0.5:
        cfg.out_of_line = (cfg.processes - 1,)
    if plan.has("handover") and cfg.focus and cfg.grace is not None and "handover" in cfg.ops:
        assert cfg.ttl is not None  # (every focus sets one)
        cfg.grace = cfg.ttl * ATTACH_LONGER[1]  # (as above, for the ttl the focus set)
    if plan.version >= 2:  # (the swarm's own draws: plan.py)
        swarm = random.Random(f"swarm-config-{plan}")
        cfg.fenced = swarm.random() < 0.5
        if cfg.focus is None:
            cfg.nodes = swarm.choice((1, 3, 3, 5))
    if plan.version >= 3:
        cfg.native = random.Random(f"native-{plan}").random() < 0.5
    return cfg


#: The parts of the library a run may focus on (from 'focus' (plan.V1_FROM) on), each with the
#: fault kinds its schedules draw from (run.make_faults; none: no fault, so that the
#: liveness rules judge the run):
#:
#: * ``turns``: one name, many tasks of 2 or 3 processes, short bodies, manual locks
#:   left to expire, nudges: streaks at their limits, releases of expired holds,
#:   processes leaving in their turn (the waiting docs' promises, live.py's rules).
#: * ``renewal``: renewed locks with long work, short ttls and a ``restart_grace`` of
#:   twice the ttl (an extend() may double it), under restarts, failovers and slow or
#:   late replies: repairs, and renewals confirmed late, while quarantines end during
#:   the run.
#: * ``sem``: a semaphore of 2 slots for 4 to 6 renewed tasks with long work, under
#:   restarts: slots repaired on emptied nodes, then tried by others.
#: * ``lease``: plain locks of one ttl, handed on within a process while fresh (leases,
#:   PASS_ON's reserve), detached and attached, under late replies and restarts.
FOCI: dict[str, tuple[str, ...]] = {
    "turns": (),
    "renewal": ("restart", "restart", "failover", "delay", "late", "slow", "pause"),
    "sem": ("restart", "restart", "failover", "delay", "late", "sever"),
    "lease": ("late", "delay", "sever", "restart", "failover"),
}
#: From 'repair' (plan.V1_FROM) on, two more (seeds below replay unchanged):
#:
#: * ``repair``: renewed locks and slots with very long work, under restarts only, one
#:   node at a time and far apart (run.spaced_restarts): a holder renewing on must
#:   repair each node before the next restart, and then keeps its lock. Lost there, it
#:   was lost needlessly (live.py's "kept held" rule judges these runs).
#: * ``stall``: renewed locks with long work under loop stalls (the client blocked,
#:   replies read late, perhaps after a deadline passed) and slow or late replies.
FOCI_LATER: dict[str, tuple[str, ...]] = {
    **FOCI,
    "repair": ("restart",),
    "stall": ("stall", "stall", "slow", "late", "delay"),
}
#: From 'lag' (plan.V1_FROM) on, one more:
#:
#: * ``lag``: renewed locks and slots of 1.2 to 3 s under a steady extra latency on every
#:   link (run.lagging): a round trip longer than node_timeout, a third of the
#:   renewal's budget at most. A renewal waits that long: lost there, a lock was lost
#:   needlessly (live.py's "kept held" rule judges these runs).
FOCI_LAG: dict[str, tuple[str, ...]] = {**FOCI_LATER, "lag": ("lag",)}
#: From 'death' (plan.V1_FROM) on, one more:
#:
#: * ``death``: the turn queue's shapes, with ttls of 2 to 3 s, and one process that
#:   dies (run.make_faults): its entry and offer stay in line until they expire; a
#:   grant to it must be undone (nobody hears it), or the lock waits out the offer's
#:   ttl held by nobody (the orphan rule judges these runs).
FOCI_DEATH: dict[str, tuple[str, ...]] = {**FOCI_LAG, "death": ("die",)}
#: From 'step_stall' (plan.V1_FROM) on, one more:
#:
#: * ``block``: plain locks, renewed ones and slots, many short bodies (fan-outs all
#:   the time), under short stalls within steps far apart (run.blocking), as a task's
#:   synchronous work blocks the loop: each shorter than a third of the ttl and than
#:   the nodes' "no reply" watchdog (1 s), more than node_timeout. A node answers at
#:   once, and its reply waits to be read: nothing may time out, fail a quorum or be
#:   lost there (live.py's "kept held" rule judges these runs).
#: * ``chain``: one name, 3 or 4 tasks of 1 or 2 processes, renewed locks whose long
#:   bodies end just after a renewal (Worker._body), and short ones: the handoffs
#:   within a process reserve fencing tokens (PASS_ON) and hand them out with no I/O
#:   (leases, which need the lock fresh), while nodes restart one at a time, each
#:   repaired by the renewal before the next (run.chained_restarts): a lease's token
#:   must still be backed by a quorum of counters (the "backed" rule).
#:   Half the runs that draw ``lease`` (a stream of their own: the draws of the others
#:   stand).
FOCI_BLOCK: dict[str, tuple[str, ...]] = {**FOCI_DEATH, "block": ("block",)}
#: From 'handover' (plan.V1_FROM) on, one more:
#:
#: * ``handover``: one name, one task in each of 2 or 3 processes: handovers that
#:   extend their lock longer before they detach it (always, where other runs do it in
#:   half; the attach past the key's first ttl) and attach it unrenewed, the task
#:   releasing it up to 2 ttls after its body ends with the lock (Worker.op_handover),
#:   and plain and manual locks whose waiters wait 3 to 6 ttls, asleep on the PTTL
#:   they read: an attach that shortens the key must wake them (its ``SHORTENED``
#:   message), or they sleep on while the name is free (live.py's "idle" rule judges
#:   these runs; pub/sub is never refused there: run.make_models).
FOCI_HANDOVER: dict[str, tuple[str, ...]] = {**FOCI_BLOCK, "handover": ()}
#: From 'split' (plan.V1_FROM) on, one more:
#:
#: * ``split``: the turn queue's shapes (as ``turns``) on 3 or 5 nodes, under "split"
#:   faults ('split' (plan.V1_FROM)): a process's next release runs at once on some nodes
#:   and late on the others, and the messages the nodes publish meanwhile come late,
#:   each subscriber's by its own delay. Grants land while a head's own attempt runs,
#:   and are heard after its clean-up.
FOCI_SPLIT: dict[str, tuple[str, ...]] = {**FOCI_HANDOVER, "split": ("split",)}
#: From 'lone' (plan.V1_FROM) on, one more:
#:
#: * ``lone``: one name, two processes of 4 tasks, mostly manual locks whose bodies end
#:   with a shortening extend(); the second process rests between its operations, so
#:   the first's streaks run alone and the second joins the line midway ('lone' (plan.V1_FROM)).
#:   No fault: the liveness rules judge these runs.
FOCI_LONE: dict[str, tuple[str, ...]] = {**FOCI_SPLIT, "lone": ()}
#: From 'grants' (plan.V1_FROM) on, one more:
#:
#: * ``grants``: one name, three processes of 1 or 2 tasks on 3 nodes, renewed locks and
#:   extend()s, every waiter in line, pub/sub never refused (run.make_models), under
#:   rolling pauses (run.paused_nodes): grants that a node makes as it comes back, to
#:   a head that holds the lock by the other nodes since, heard after its renewals
#:   counted that node ('grants' (plan.V1_FROM)).
FOCI_GRANTS: dict[str, tuple[str, ...]] = {**FOCI_LONE, "grants": ("pause",)}
#: Version 1's foci by seed: those of the newest behaviour a seed has (plan.V1_FROM);
#: below 'repair', :data:`FOCI`.
V1_FOCI: tuple[tuple[str, dict[str, tuple[str, ...]]], ...] = (
    ("grants", FOCI_GRANTS),
    ("lone", FOCI_LONE),
    ("split", FOCI_SPLIT),
    ("handover", FOCI_HANDOVER),
    ("step_stall", FOCI_BLOCK),
    ("death", FOCI_DEATH),
    ("lag", FOCI_LAG),
    ("repair", FOCI_LATER),
)
#: Version 4's foci: each either judges a promise that only its runs can (a rule bound
#: to the focus's faults), or reached what the swarm alone did not in a search-alone
#: measurement (docs/project/testing.md, "Measuring the search"). The others' parts of
#: the library are the swarm's. Each focus runs as often as in version 3 (half the runs
#: over 13 foci): ``len(foci) / 26`` of the runs focus, the rest are the swarm's.
FOCI_KEPT: dict[str, tuple[str, ...]] = {
    name: FOCI_GRANTS[name]
    for name in FOCI_GRANTS
    if name not in ("renewal", "lease", "grants")  # (and ``chain``, drawn from ``lease``)
}
#: From version 5 on: version 4's, and ``grants`` again. In a search of 3,000 schedules
#: a mutant, a grants run killed a mutant of the turn queue's grants that version 4's
#: runs did not (docs/project/testing.md, "Measuring the search").
FOCI_KEPT_5: dict[str, tuple[str, ...]] = {**FOCI_KEPT, "grants": FOCI_GRANTS["grants"]}


def focus(
    cfg: Config, rng: random.Random, foci: dict[str, tuple[str, ...]] = FOCI, share: float = 0.5
) -> None:
    """In ``share`` of the runs (half up to version 3), focus ``cfg`` on one of ``foci``
    (the seed's range's, or those a measurement keeps: :data:`FOCI_KEPT_5`), drawn from ``rng``."""
    if rng.random() < 1.0 - share:
        return
    cfg.focus = rng.choice(sorted(foci))
    cfg.names = ("a",)
    if cfg.focus == "lone":  # (one process rests: the other's streaks run alone)
        cfg.processes, cfg.tasks = 2, 4
        cfg.ops = ("manual", "manual", "manual", "lock")
        cfg.ttl = rng.uniform(0.3, 1.5)
        cfg.short = rng.choice((0.7, 0.9))
        cfg.seconds = rng.uniform(4.0, 8.0)
        cfg.resting, cfg.shortened = 1, True
    elif cfg.focus in ("split", "turns"):
        if cfg.focus == "split":  # (as turns, on 3 or 5 nodes)
            cfg.nodes = rng.choice((3, 5))
        cfg.processes = rng.choice((2, 3))
        cfg.tasks = rng.choice((3, 4, 5))
        cfg.ops = ("lock", "lock", "manual", "reentrant")
        cfg.ttl = rng.uniform(0.3, 1.5)
        cfg.short = rng.choice((0.7, 0.9))
        cfg.nudge = rng.choice((0.0, 0.2, 0.5))
        cfg.seconds = rng.uniform(4.0, 8.0)
    elif cfg.focus == "grants":
        cfg.nodes, cfg.processes, cfg.tasks = 3, 3, rng.choice((1, 2))
        cfg.ops = ("lock", "extend", "extend", "manual")
        cfg.ttl = rng.uniform(0.4, 1.2)
        cfg.short = 0.0
        cfg.seconds = rng.uniform(3.0, 6.0)
    elif cfg.focus == "renewal":
        cfg.processes, cfg.tasks = rng.choice((2, 3)), 2
        cfg.ops = ("lock", "lock", "extend", "reentrant")
        cfg.ttl = rng.uniform(0.3, 1.0)
        cfg.long, cfg.short = True, 0.0
    elif cfg.focus == "repair":
        cfg.nodes = rng.choice((3, 5))
        _renewed_work(cfg, rng, (0.3, 0.8), (8.0, 14.0))
    elif cfg.focus == "death":
        cfg.processes = rng.choice((2, 3))
        cfg.tasks = rng.choice((3, 4, 5))
        cfg.ops = ("lock", "lock", "manual")
        cfg.ttl = rng.uniform(2.0, 3.0)
        cfg.short = 0.9
        cfg.seconds = rng.uniform(5.0, 8.0)
    elif cfg.focus == "lag":
        _renewed_work(cfg, rng, (1.2, 3.0), (6.0, 10.0))
    elif cfg.focus == "stall":
        _renewed_work(cfg, rng, (0.3, 1.0))  # (no extend(): see Recorder.dry)
    elif cfg.focus == "block":
        cfg.processes, cfg.tasks = rng.choice((2, 3)), rng.choice((2, 3))
        cfg.names = ("a", "b")
        cfg.ops = ("lock", "lock", "manual", "sem")
        cfg.ttl = rng.uniform(1.8, 3.0)
        cfg.short = rng.choice((0.7, 0.9))
        cfg.seconds = rng.uniform(5.0, 9.0)
    elif cfg.focus == "handover":
        cfg.processes, cfg.tasks = rng.choice((2, 3)), 1
        cfg.ops = ("handover", "handover", "lock", "manual")
        cfg.ttl = rng.uniform(0.5, 1.5)
        cfg.short = 0.0
        cfg.seconds = rng.uniform(5.0, 9.0)
    elif cfg.focus == "sem":
        cfg.processes, cfg.tasks = 3, rng.choice((2, 2, 1))
        cfg.ops = ("sem",)
        cfg.ttl = rng.uniform(0.3, 1.5)
        cfg.long, cfg.short = True, 0.0
    else:
        cfg.processes, cfg.tasks = rng.choice((2, 3)), 3
        cfg.ops = ("lock", "lock", "manual", "handover", "extend")
        cfg.ttl = rng.uniform(0.3, 2.0)
        cfg.short = 0.7
    if cfg.grace is not None or cfg.focus in ("renewal", "sem", "repair", "stall", "lag"):
        # (Renewal and semaphores: always, so that quarantines end while the run goes
        # on.) As make_config sets it, for the ttl set here: a restart_grace shorter than
        # the longest ttl a holder asks for is the user's misconfiguration (API.md: by
        # default it is that ttl), under which a majority restarted empty may vote for
        # a rival while the holder's validity lasts (seed 549755814851).
        assert cfg.ttl is not None  # (every focus sets one)
        cfg.grace = cfg.ttl * (2 if {"extend", "manual"} & set(cfg.ops) else 1)


def focus_on_chains(cfg: Config, rng: random.Random) -> None:
    """The shape of a run focused on chains (see FOCI_BLOCK), drawn from ``rng``."""
    cfg.nodes, cfg.processes, cfg.tasks = 3, rng.choice((1, 2)), rng.choice((3, 4))
    cfg.names = ("a",)
    cfg.ops = ("lock",)
    cfg.ttl = rng.uniform(0.6, 1.5)
    cfg.long, cfg.short = True, 0.5
    cfg.seconds = rng.uniform(6.0, 10.0)
    cfg.grace = cfg.ttl  # (a quarantine that ends: run.chained_restarts)


def _renewed_work(
    cfg: Config,
    rng: random.Random,
    ttls: tuple[float, float],
    seconds: tuple[float, float] | None = None,
) -> None:
    """The shape of the foci on renewal's faults (repair, lag, stall): 2 or 3 processes
    of 1 or 2 tasks, renewed locks and slots with long work, a ttl in ``ttls``, and a
    run of ``seconds`` (if given). Drawn in this order: the seeds replay as drawn."""
    cfg.processes, cfg.tasks = rng.choice((2, 3)), rng.choice((1, 2))
    cfg.ops = ("lock", "lock", "sem")
    cfg.ttl = rng.uniform(*ttls)
    cfg.long, cfg.short = True, 0.0
    if seconds is not None:
        cfg.seconds = rng.uniform(*seconds)


def lock_of(handle: Any, name: str) -> Any:
    """The ``Lock`` of ``name`` that ``handle`` is or holds (a ``LockMany``'s own)."""
    for lock in handle.locks if isinstance(handle, LockMany) else (handle,):
        if lock.name == name:
            return lock
    return None


def key_token(handle: Any, name: str) -> bytes | None:
    """The token ``handle`` keeps in the key of ``name`` (a lease's is the key's, as its
    holder took it; an attached handle's, the one it set). Read from the library's
    state, which the checker compares with the nodes'."""
    lock = lock_of(handle, name)
    hold = lock._hold if lock is not None else None
    return hold.token if hold is not None else None


class Recorder:
    """The run's holdings, counts and history lines."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.holdings: list[Holding] = []
        self.counts: dict[str, int] = {}
        self.crashes: list[str] = []
        #: The liveness rules (live.py): waiters are served, processes take turns.
        self.live = Liveness(world, 1)
        #: What the managers kept once their tasks had finished (live.at_rest).
        self.resting: list[str] = []
        #: See Config.nudge (set by run.run).
        self.nudge_chance = 0.0
        self._nudges = random.Random(f"nudges-{world.seed}")
        self.workers: list[Worker] = []
        #: Tokens of detached locks: the ticket holds them (a dropped ticket leaves its
        #: lock to its ttl, as documented), whoever attaches it or not.
        self.tickets: set[bytes] = set()
        #: Lock keys held by a token no handle has, since when: (name, token) -> time.
        self.orphans: dict[tuple[str, bytes], float] = {}
        self.orphaned: list[str] = []
        #: Whether to look for them: not where the library's bounded memories are made
        #: small (run.MEMORIES). There a grant to an offer its process forgot is never
        #: taken, and the lock waits for its ttl: the price of forgetting, which at the
        #: real size needs more than 4,096 offers sent by one process since.
        self.watch_orphans = True
        #: Each lock handle that has stepped, by id: (the Lock, its name, its latest
        #: holding, its process), read by :meth:`watch` after every command.
        self.watched: dict[int, tuple[Any, str, Holding, int]] = {}
        #: The longest ttl any holding of each name has asked for so far.
        self.longest: dict[str, float] = {}
        #: The writers' waits of each read-write lock, and when each writer's release
        #: returned, by name (see live.writers_first).
        self.writes: list[RWWait] = []
        self.released: dict[str, list[float]] = {}

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def event(self, owner: str, what: str) -> None:
        self.world.trace(f"{owner} {what}")

    def nudge(self, names: list[str]) -> None:
        """A body is ending, its release next: with ``nudge_chance``, a waiter for one
        of ``names`` is cancelled up to 500 µs later (its operation's timeout made to
        expire), while the release hands the lock on to it, or grants it."""
        if not self.nudge_chance or self._nudges.random() >= self.nudge_chance:
            return
        waiting = [w for w in self.workers if w.waiting_for in names and w.scope is not None]
        if not waiting:
            return
        target = self._nudges.choice(waiting)
        scope, delay = target.scope, self._nudges.uniform(0.0, 0.0005)
        loop = asyncio.get_running_loop()
        if self.world.plan.has("models") and self._nudges.random() < 0.5:
            # At its next wake-up instead, within those 500 µs: the cancellation lands
            # after what woke it (a lock handed or leased to it, a grant) and before it
            # runs, so it never takes what it was given; a timer never lands there (the
            # loop runs what is ready first). As another task's cancel() in the same
            # pass of a real loop does.
            assert isinstance(loop, SimLoop)

            def expire() -> None:
                if target.scope is scope and scope is not None and not scope.expired():
                    self.event(target.owner, "nudged: cancelled as it wakes")
                    scope.reschedule(None)  # (its own timer must not fire as well)
                    scope._on_timeout()  # type: ignore[attr-defined]

            loop.cancel_at_wake[target.task] = (loop.time() + delay, expire)
            return

        def cancel() -> None:
            if target.scope is scope and scope is not None and not scope.expired():
                self.event(target.owner, "nudged: cancelled")
                scope.reschedule(loop.time())

        loop.call_later(delay, cancel)

    def holding(self, h: Holding) -> Holding:
        self.holdings.append(h)
        return h

    def look_for_orphans(self, names: tuple[str, ...]) -> None:
        """In a schedule without faults: no lock key stays on a quorum of nodes for
        more than :data:`ORPHAN_LIMIT` with a token that no handle (nor ticket) holds.

        Without faults nothing is lost or late by more than a few hundred µs, so such a
        key is a lock the library left held by nobody (a handoff to a waiter that left,
        a grant nobody took): every waiter waits for its ttl. Read when a task starts an
        operation (waiters that time out start the next one), without touching the
        stores. Also where a process died ("die" faults, its only faults), counting the
        values set since by the living alone (World.holders): a grant to the dead
        process's offer, which nobody hears, must be undone at once.
        """
        world = self.world
        if any(f.kind != "die" for f in world.faults) or self.orphaned or not self.watch_orphans:
            return
        now = world.now
        owned = set(self.tickets)
        for worker in self.workers:
            for handle, name in worker.handles:
                token = key_token(handle, name)
                if token is not None:
                    owned.add(token)
        quorum = len(world.nodes) // 2 + 1
        seen = set()
        for name in names:
            for token, nodes in world.holders(KEY % name.encode()).items():
                if nodes < quorum or token in owned:
                    continue
                seen.add((name, token))
                since = self.orphans.setdefault((name, token), now)
                if now - since > ORPHAN_LIMIT:
                    self.orphaned.append(
                        f"orphan: lock {name!r} held on {nodes} nodes by {token!r}, which no "
                        f"handle holds, from {since:.6f} to {now:.6f} at least "
                        + ("(no fault)" if not world.dead else "(set after a process died)")
                    )
        self.orphans = {k: v for k, v in self.orphans.items() if k in seen}

    def step(self, h: Holding, now: float, remaining: float, handle: Any) -> None:
        """A moment ``h`` believed it held, until ``now + remaining``; for a lock, what
        the nodes keep is read at that moment (the key with the handle's token)."""
        h.step(now, remaining)
        if h.domain[0] != "lock":
            return
        world = self.world
        name = h.domain[1]
        if h.counters is None:
            h.counters = world.counters(KEY % name.encode() + b":fence")
            h.resets = [node.resets for node in world.nodes]
            self.backs(h)
        lock = lock_of(handle, name)
        if lock is not None:
            process = int(h.owner[1:].split("t", maxsplit=1)[0])
            self.watched[id(lock)] = (lock, name, h, process)
            self.follows(h, lock, name, remaining, now)
        hold = lock._hold if lock is not None else None
        self._kept(h, name, hold, remaining, now=now)

    def backs(self, h: Holding) -> None:
        """The backed rule, at a lock holding's first step: a quorum of nodes' counters
        are at least its token (safety.md, "Fencing tokens": before a token is handed out,
        the counters of a majority must be at least it; a lease's is within a reserve
        that a quorum's counters reached). A node that lost its data since the acquire
        began counts as backing it (the fencing rule's exception covers what follows).
        Counters outlive a run (``fence_retention``: an hour at least), so none
        expires."""
        token, counters = h.token, h.counters
        if token is None or counters is None:
            return
        nodes = self.world.nodes
        short = [
            f"n{node.index} {value}"
            for node, value in zip(nodes, counters, strict=True)
            if (value is None or value < token) and node.reset_at <= h.began
        ]
        if len(short) > len(nodes) - (len(nodes) // 2 + 1):
            h.unbacked = f"its token {token}; counters below it: {', '.join(short)}"

    def follows(self, h: Holding, lock: Any, name: str, left: float, now: float) -> None:
        """The followed rule at a step of ``h``, whose lock reads ``left`` s: once an
        ``extend()`` of its hold has settled, the validity follows what the nodes applied
        (API: it completes even if its caller is cancelled or gives up meanwhile). So it
        ends no earlier than a quorum keeps the key, less the drift the library counts
        off, the nodes' own drift and a round trip.

        Read where that is exact: in a run without faults (every command lands and is
        answered within a millisecond), for a lock without renewal (whose extensions
        would overlap the holder's), after an extension with none other in flight."""
        hold = lock._hold
        world = self.world
        if (
            h.unfollowed is not None
            or h.renewed
            or h.tangled
            or world.faults
            or hold is None
            or hold is not h.followed
            or hold.extensions
        ):
            return
        quorum = len(world.nodes) // 2 + 1
        ends = sorted((e for _, e in world.expiries(KEY % name.encode(), hold.token)), reverse=True)
        if len(ends) < quorum:
            return  # (not kept: the kept rule reads that)
        slack = h.longest * (DRIFT_FACTOR + 2.0 * world.drift) + DRIFT_FLOOR + 0.001
        if ends[quorum - 1] - (now + left) > slack:
            h.unfollowed = (
                f"at {now:.6f} it read {left:.6f} s left; a quorum keeps its key until "
                f"{ends[quorum - 1]:.6f} ({ends[quorum - 1] - now - left:.6f} s more)"
            )

    def _kept(
        self, h: Holding, name: str, hold: Any, left: float, *, now: float, when: str = ""
    ) -> None:
        """The kept rule at ``now``: a quorum keeps ``name``'s key with ``hold``'s token
        for the ``left`` seconds the holding reads; else ``h.short`` says where not."""
        if h.short is not None:
            return
        world = self.world
        # A node restarted since the requests that took the key went out (the hold's
        # validity counts from then) may have had it: a stall can hold their replies
        # back past the restart. Its quarantine keeps the others out meanwhile.
        since = h.steps[0][0] if hold is None else min(hold.valid_from, h.steps[0][0])
        token = None if hold is None else hold.token
        short = world.keeping(KEY % name.encode(), token, now + left, since)
        if len(short) > len(world.nodes) - (len(world.nodes) // 2 + 1):
            where = ", ".join(short)
            h.short = f"at {now:.6f}{when} it read {left:.6f} s left; not kept on {where}"

    def dry(self, h: Holding, lock: Any, hold: Any, now: float) -> None:
        """``h``'s lock read ``remaining() == 0`` for ``hold`` at ``now``: from then on,
        the revived rule (check.check_revived) says it never reads more. Unless an
        ``extend()`` of the holder's is under way, or went out just before (within
        :data:`EXTENDING`): one confirmed after the validity ran out sets it anew (the
        nodes kept the key until they applied it), also when its caller stopped
        waiting for it and went on (``extend()`` completes, shielded: see
        Worker._extend), and also when a stall held its reply back longer (seed
        70369044186868: sent 0.36 s before the validity ended, read after a 1.2-s
        stall, within a step, that began as it went out). Left alone, noted
        in docs/project/testing.md; the renewal's confirmation, read late, does not
        (see aiolock/_quorum/renewal.py, ``validity_changed``)."""
        if now - h.extended_at > EXTENDING and not h.extending:
            h.ran_dry = (lock, hold)

    def watch(self) -> None:
        """The kept rule between steps: after every command a node runs, each lock
        handle that has stepped reads ``remaining()``; while it is positive, a quorum
        must keep the key until then. So the moments a body does not step are read
        too: inside ``extend()``, during its own release, a handoff. Reads only."""
        world = self.world
        now = world.now
        for lock, name, h, process in self.watched.values():
            if process in world.dead:
                continue  # (it died: nothing it believes is judged any more)
            hold = lock._hold
            longest = self.longest[name] = max(self.longest.get(name, 0.0), h.longest)
            if hold is None:
                continue  # (it reads no time left: nothing to judge)
            if h.outlives is None:
                # No node keeps the key longer than the longest ttl asked for, from
                # now: else it would outlive a holder that died now by more. Allowed
                # on top, the drift the library counts off a validity for the longest
                # ttl any holding of the name asked for: a lease hands the key on with
                # the validity its holder counted, which the nodes outlast by that
                # much (seed 274927921909: 17.5 ms over a 0.849-s ttl, leased from a
                # 2.2-s one).
                allowance = DRIFT_FACTOR * longest + DRIFT_FLOOR
                limit = now + h.longest * (1.0 + 2.0 * world.drift) + allowance + 0.001
                for index, ends in world.expiries(KEY % name.encode(), hold.token):
                    if ends > limit:
                        h.outlives = (
                            f"at {now:.6f} n{index} keeps its key until {ends:.6f}, "
                            f"{ends - now:.6f} s, its ttl at most {h.longest:.6f} s"
                        )
                        break
            remaining = lock.remaining()
            if remaining <= 0.0:
                self.dry(h, lock, hold, now)  # (as a step reading it now would: see _body)
            else:
                self._kept(h, name, hold, remaining, now=now, when=" (between steps)")
                dry = h.ran_dry
                if dry is not None and dry[0] is lock and dry[1] is hold and h.revived is None:
                    h.revived = f"at {now:.6f} it read {remaining:.6f} s left"


class Worker:
    """One task of one process."""

    def __init__(
        self, rec: Recorder, locks: LockManager, cfg: Config, owner: str, plan: Plan
    ) -> None:
        seed = plan.seed
        self.rec = rec
        self.locks = locks
        self.cfg = cfg
        self.owner = owner
        self.rng = random.Random(f"work-{seed}-{owner}")
        #: From 'models' (plan.V1_FROM) on: a manual lock left to expire may be acquired again by
        #: the same handle, and a reentrant lock may be held without renewal, its inner
        #: level released by hand, perhaps after it expired (each drawn only there).
        self.more = plan.has("models")
        #: The deadlines some extend() calls are given (Worker._extend, from 'models' (plan.V1_FROM)
        #: on): drawn apart, so that the workload's other draws stay as they were.
        self.limits = random.Random(f"limits-{seed}-{owner}")
        self.tight = plan.has("tight")
        #: From 'attach' (plan.V1_FROM) on: whether a handover extends its lock longer before it
        #: detaches it (Worker.op_handover), drawn apart as the limits are.
        self.attaching = random.Random(f"attach-{seed}-{owner}") if plan.has("attach") else None
        #: From 'final' (plan.V1_FROM) on: whether a body that may extend ends with an extend(),
        #: and by how much (Worker._body), drawn apart as the limits are.
        self.finals = random.Random(f"final-{seed}-{owner}") if plan.has("final") else None
        self.process = int(owner[1:].split("t", maxsplit=1)[0])
        self.serial = itertools.count()
        self.cancelled_in_extend = False
        #: The name this task waits for (an acquire with a timeout under way), and the
        #: timeout scope of its operation (see Recorder.nudge).
        self.waiting_for: str | None = None
        #: When the acquire of this operation's lock (or lock_many) began.
        self.began: float | None = None
        self.scope: asyncio.Timeout | None = None
        #: The task this worker runs in (a nudge may cancel it as it wakes).
        self.task: asyncio.Task[Any] | None = None
        #: The handles of the operation under way, with the names they lock.
        self.handles: list[tuple[Any, str]] = []
        rec.workers.append(self)

    def now(self) -> float:
        return time.monotonic()

    async def run(self, end: float) -> None:
        self.task = asyncio.current_task()
        while self.now() < end and self.process not in self.rec.world.dead:
            op = self.rng.choice(self.cfg.ops)
            cancel_after = self.rng.uniform(0.005, 2.0) if self.rng.random() < 0.2 else None
            self.rec.event(
                self.owner,
                f"op {op}" + (f" cancelled after {cancel_after:.3f}" if cancel_after else ""),
            )
            self.handles.clear()
            self.began = None
            self.rec.look_for_orphans(("a", "b", "c"))  # (lock_many takes "c" too)
            try:
                async with asyncio.timeout(cancel_after) as scope:
                    self.scope = scope
                    try:
                        await getattr(self, f"op_{op}")(end)
                    finally:
                        self.scope = None  # (left: a nudge must not touch it)
            except LockTimeout:  # (a TimeoutError too: before it)
                self.rec.count("timeout")
            except TimeoutError:
                self.rec.count("cancelled")
            except LockLost:
                self.rec.count("lost")
            except QuorumError as exc:
                self.rec.count("quorum")
                self.rec.event(self.owner, f"quorum error: {exc}")
                self._explained(exc)
                await asyncio.sleep(self.rng.uniform(0.01, 0.1))
            except LockNotOwned:
                self.rec.count("not_owned")
            except LockError as exc:
                self.rec.count(type(exc).__name__)
            except Exception as exc:  # the library broke a promise of its API
                self.rec.crashes.append(f"{self.owner}: {op}: {exc!r}\n{traceback.format_exc()}")
                self.rec.event(self.owner, f"CRASH {op}: {exc!r}")
                return
            # A worker does something between two operations (never a spin: a try-once
            # acquire that fails at once, again and again, would stop virtual time).
            await asyncio.sleep(self.rng.uniform(0.0005, 0.005))
            if self.process == self.cfg.resting:  # (see 'lone' (plan.V1_FROM))
                await asyncio.sleep(self.rng.uniform(0.05, 0.4))

    # -- helpers -----------------------------------------------------------------------

    def _ttl(self) -> float:
        if self.cfg.ttl is not None:
            return self.cfg.ttl
        return self.rng.uniform(0.3, 3.0)

    def _work(self, scale: float, ttl: float) -> float:
        """How long a body works: up to ``scale`` ttls, or (short) up to 1 % of one."""
        if self.cfg.short and self.rng.random() < self.cfg.short:
            return self.rng.uniform(0.0, 0.01) * ttl
        return self.rng.uniform(0.0, scale) * ttl

    def _timeout(self) -> float:
        if self.cfg.focus == "handover" and self.cfg.ttl is not None:
            # Long waits: a waiter that read the longer PTTL of a handover's extend()
            # is still asleep when the attach's key expires (a new waiter would read
            # the shorter one, and take the lock as it expires).
            return self.rng.uniform(3.0, 6.0) * self.cfg.ttl
        if self.cfg.focus == "grants":  # (waiters in line: offers, grants)
            return self.rng.uniform(0.5, 3.0)
        return self.rng.choice((0.0, self.rng.uniform(0.05, 3.0)))

    async def _body(
        self, handle: Any, holds: list[Holding], seconds: float, *, extend: bool = False
    ) -> None:
        """Work in steps while the handle says it is valid, for ``seconds`` at most."""
        until = self.now() + seconds
        self.cancelled_in_extend = False
        #: The last step's unit of work, written once it is done (see _write).
        done: list[tuple[Holding, float]] = []
        # (A run focused on chains: past its work, a renewed body ends just after a
        # renewal, so that its release may lease the lock on: see focus.)
        chase = self.cfg.focus == "chain" and any(h.renewed for h in holds)
        before = math.inf
        try:
            while True:
                now = self.now()
                if self.process in self.rec.world.dead:
                    return  # (it died: nothing it does is judged any more)
                if done:
                    await self._write(done)
                    now = self.now()
                remaining = handle.remaining()
                if remaining <= 0.0:
                    on_its_way = False
                    for h in holds:
                        lock = lock_of(handle, h.domain[1]) if h.domain[0] == "lock" else None
                        # (Each name's own lock: a lock_many reads 0 once one name ran
                        # out, while the others, renewed, read more: seed 17592226046275
                        # was a false "revived" of such a name.)
                        if lock is not None and lock.remaining() <= 0.0:
                            self.rec.dry(h, lock, lock._hold, now)
                        if not h.renewed:
                            continue
                        if handle.lost is not None and h.told_at is None:
                            # Noted lost, the body's cancellation on its way (this step
                            # woke in the same instant): told now.
                            h.told_at = now
                            on_its_way = True
                        elif h.ran_out is None:
                            h.ran_out = now
                    if on_its_way and self.cfg.await_told:
                        # It must land at the next awaits (anyio delivers it on the
                        # loop's next pass); a body that goes on uncancelled was never
                        # told (a handle that notes the loss and cancels nothing).
                        for _ in range(3):
                            await asyncio.sleep(0)
                        for h in holds:
                            if h.renewed and h.ran_out is None:
                                h.told_at, h.ran_out = None, now
                    return
                for h in holds:
                    self.rec.step(h, now, remaining, handle)
                if self.cfg.fenced:
                    done = [(h, now + remaining) for h in holds if h.domain[0] == "lock"]
                if chase and until <= now < until + holds[0].ttl and remaining <= before:
                    before = remaining
                    await asyncio.sleep(CHASE_STEP)
                    continue
                if now >= until:
                    if extend and self.finals is not None and self.cfg.shortened:
                        # Always, and shorter (see 'lone' (plan.V1_FROM)).
                        await self._extend(handle, holds, factor=self.finals.uniform(0.2, 0.9))
                    elif extend and self.finals is not None and self.finals.random() < 0.5:
                        # Its last batch done, a worker that extends after each one:
                        # released at once after (see 'final' (plan.V1_FROM)).
                        await self._extend(handle, holds, factor=self.finals.uniform(0.2, 1.5))
                    self.rec.nudge([h.domain[1] for h in holds if h.domain[0] == "lock"])
                    return
                if extend and self.rng.random() < 0.08:
                    await self._extend(handle, holds)
                    continue
                await asyncio.sleep(min(until - now, self.rng.uniform(0.002, 0.06)))
        except asyncio.CancelledError:
            if handle.lost is not None:
                for h in holds:
                    h.told_at = self.now()
                    h.told_in_extend = self.cancelled_in_extend
            raise

    async def _write(self, done: list[tuple[Holding, float]]) -> None:
        """Write a unit of work to the fenced resource with each lock's token, as it
        is done: checked at a step, worked on since (a pause may have struck
        meanwhile), written without checking again (Kleppmann's client), and awaited:
        the body goes on once the resource answered."""
        world = self.rec.world
        resource = world.resource
        assert resource is not None  # (Config.fenced)
        for h, valid_until in done:
            if h.token is None:
                continue
            name = h.domain[1]
            self.rec.event(self.owner, f"writes {name!r} token {h.token}")
            there, back = (world.rng.uniform(*BASE_LATENCY) for _ in range(2))
            world.loop.call_at(world.now + there, resource.arrive, name, h.token, h, valid_until)
            await asyncio.sleep(there + back)

    def _explained(self, error: QuorumError) -> None:
        """The rule "a quorum error names its failed nodes" (API.md: "too many nodes
        failed (errors/timeouts) ... ``.errors`` maps node -> exception"): or, none
        failed, it says that the quorum's yes was read after the validity it gave ran
        out (seed 70369244179214 once read "0 of 3 nodes failed")."""
        if not error.errors and "confirmed only after" not in str(error):
            self.rec.world.promises.append(
                f"a quorum error names its failed nodes: {self.owner} at {self.now():.6f}: {error}"
            )

    async def _extend(
        self, handle: Any, holds: list[Holding], *, factor: float | None = None
    ) -> None:
        """``extend()`` by ``factor`` of the handle's ttl (drawn, if not given)."""
        if factor is None:
            factor = (
                self.rng.uniform(0.2, 0.7)
                if self.rng.random() < 0.5
                else self.rng.uniform(1.0, 2.0)
            )
        ttl = max(3 * NODE_TIMEOUT + 0.01, handle.ttl * factor)
        for h in holds:
            h.ttl = min(h.ttl, ttl)
            h.longest = max(h.longest, ttl)
            h.extended_at = self.now()
            lock = lock_of(handle, h.domain[1]) if h.domain[0] == "lock" else None
            if lock is not None and lock._hold is not None:
                if lock._hold.extensions:
                    h.tangled = True
                h.followed = lock._hold
        # From 'models' (plan.V1_FROM) on, 1 extend() in 4 under a deadline of its own (up to 2
        # node timeouts), the body going on when it passes, as a caller that would
        # rather not wait for slow nodes does: extend() completes anyway (shielded),
        # and the validity and the renewal must follow what the nodes applied.
        limit = None
        if self.more and self.limits.random() < 0.25:  # (a stream of its own: see __init__)
            limit = self.limits.uniform(0.0, 2 * NODE_TIMEOUT)
            if self.tight and self.limits.random() < 0.5:
                limit = self.limits.uniform(0.0, 4 * BASE_LATENCY[1])  # (plan.V1_FROM: tight)
        self.rec.event(
            self.owner, f"extend {ttl:.3f}" + (f" within {limit:.4f}" if limit is not None else "")
        )
        for h in holds:
            h.extending += 1
        began = self.now()
        try:
            async with asyncio.timeout(limit):
                await handle.extend(ttl)
        except QuorumError as error:
            self._explained(error)
            # No node failed, but the replies were read after the validity they gave ran
            # out: a stall outlasted the extension's ttl, which a run focused on short
            # blocks allows (seed 70369244179214: 0.449 s, a 0.477-s block), not a loss.
            spent = self.now() - began >= ttl * (1.0 - DRIFT_FACTOR) - DRIFT_FLOOR
            self.rec.count("extend_outlasted" if spent and not error.errors else "extend_quorum")
        except TimeoutError:
            self.rec.count("extend_timed_out")
            # Noted lost while the extend() went on, shielded, past the caller's own
            # deadline: its cancellation waited for the replies, as one delivered
            # inside it does (seed 17592236045824: told 9 ms before the validity
            # ended, after a 50-ms node timeout).
            self.cancelled_in_extend = handle.lost is not None
        except asyncio.CancelledError:
            self.cancelled_in_extend = True
            raise
        finally:
            for h in holds:
                h.extending -= 1

    @contextlib.contextmanager
    def _waiting(self, name: str, timeout: float | None) -> Iterator[Callable[[], None]]:
        """An acquire of the lock ``name`` under way (see live.Liveness.begins); yields
        what to call once it returned (idempotent; called on the way out too)."""
        self.began = self.now()
        if timeout != 0:
            self.waiting_for = name
        wait = self.rec.live.begins(name, self.process, self.owner, timeout)

        def waited() -> None:
            self.waiting_for = None
            self.rec.live.ends(name, wait)

        try:
            yield waited
        finally:
            waited()

    def _mine(self, handle: Any, *names: str) -> Any:
        """``handle``, noted as this operation's (for what it locks: see look_for_orphans),
        from before it acquires: a ``lock_many`` holds its first names while it waits for
        the others."""
        self.handles.extend((handle, name) for name in names)
        return handle

    def _holding(
        self,
        domain: tuple[Any, ...],
        mode: str,
        handle: Any,
        ident: Any,
        token: int | None,
        *,
        renewed: bool,
    ) -> Holding:
        self.rec.event(
            self.owner, f"holds {domain} {mode} token {token} left {handle.remaining():.4f}"
        )
        if domain[0] == "lock":
            # (A lock_many takes its names one after the other: a first try each.)
            first_tries = FIRST_TRY * max(1, len(self.handles))
            waited = self.began is not None and self.now() - self.began >= first_tries
            self.rec.live.held(domain[1], self.process, waited=waited)
        began = -math.inf if self.began is None else self.began
        return self.rec.holding(
            Holding(domain, mode, ident, token, self.owner, handle.ttl, renewed, began=began)
        )

    # -- operations --------------------------------------------------------------------

    async def op_lock(self, end: float, *, extend: bool = False) -> None:
        name = self.rng.choice(self.cfg.names)
        renew = self.rng.random() < 0.7 or self.cfg.focus == "chain"
        ttl, timeout = self._ttl(), self._timeout()
        if self.cfg.focus == "chain":  # (waiters that stay queued: handoffs, leases)
            timeout = 5.0 + 2.0 * timeout
        lock = self._mine(self.locks.lock(name, ttl=ttl, timeout=timeout, auto_renew=renew), name)
        with self._waiting(name, timeout) as waited:
            async with lock:
                waited()
                h = self._holding(
                    ("lock", name), "x", lock, lock.fencing_token, lock.fencing_token, renewed=renew
                )
                scale = 8.0 if renew and self.cfg.long else 2.0
                if self.cfg.focus == "chain":
                    scale = 6.0  # (two restarts or more within a body: run.chained_restarts)
                if renew and self.cfg.focus == "repair":
                    scale = 16.0  # (to outlast restarts far apart: run.spaced_restarts)
                await self._body(lock, [h], self._work(scale, lock.ttl), extend=extend)

    async def op_extend(self, end: float) -> None:
        await self.op_lock(end, extend=True)

    async def op_manual(self, end: float) -> None:
        name = self.rng.choice(self.cfg.names)
        lock = self._mine(self.locks.lock(name, ttl=self._ttl(), auto_renew=False), name)
        timeout = self._timeout()
        h = await self._take(lock, name, timeout)
        if h is None:
            return
        try:
            await self._body(lock, [h], self._work(1.5, lock.ttl), extend=True)
            if self.more and lock.remaining() <= 0.0 and self.rng.random() < 0.5:
                # Expired, never released: the same handle acquires again (what it
                # held is forgotten, its token too: the "at rest" rule reads that).
                self.rec.event(self.owner, "acquires again with the expired handle")
                h = await self._take(lock, name, timeout)
                if h is None:
                    return
                await self._body(lock, [h], self._work(0.5, lock.ttl))
        finally:
            await self._release(lock)

    async def _take(self, lock: Any, name: str, wait: float) -> Holding | None:
        """Acquire the plain ``lock`` by hand (not renewed inside a body): its holding,
        or None when the time ran out (counted)."""
        with self._waiting(name, wait):
            acquired = await lock.acquire(timeout=wait)
        if not acquired:
            self.rec.count("timeout")
            return None
        token = lock.fencing_token
        return self._holding(("lock", name), "x", lock, token, token, renewed=False)

    async def _release(self, handle: Any) -> None:
        """Release by hand: a handle that read no validity left just before must be
        told so (``LockNotOwned``), never released quietly (API.md)."""
        expired = handle.remaining() <= 0.0
        try:
            await handle.release()
        except LockNotOwned:
            return
        if expired:
            self.rec.crashes.append(
                f"contract: {self.owner}: release() of {handle!r}, which read no validity left, "
                "returned quietly (LockNotOwned expected)"
            )

    async def op_reentrant(self, end: float) -> None:
        name = self.rng.choice(self.cfg.names)
        ttl, timeout = self._ttl(), self._timeout()
        if self.more and self.rng.random() < 0.3:
            await self._reentrant_by_hand(name, ttl, timeout)
            return
        outer = self._mine(self.locks.lock(name, ttl=ttl, timeout=timeout, reentrant=True), name)
        with self._waiting(name, timeout) as waited:
            async with outer:
                waited()
                h = self._holding(
                    ("lock", name),
                    "x",
                    outer,
                    outer.fencing_token,
                    outer.fencing_token,
                    renewed=True,
                )
                await self._body(outer, [h], self._work(0.5, outer.ttl))
                inner = self.locks.lock(name, ttl=outer.ttl, timeout=0, reentrant=True)
                async with inner:
                    await self._body(inner, [h], self._work(0.5, outer.ttl))
                await self._body(outer, [h], self._work(0.5, outer.ttl))

    async def _reentrant_by_hand(self, name: str, ttl: float, wait: float) -> None:
        """Two levels of a reentrant lock without renewal, acquired and released by
        hand; the inner one's body may outlive the ttl (then its release must say so)."""
        locks = self.locks
        outer = self._mine(
            locks.lock(name, ttl=ttl, timeout=wait, reentrant=True, auto_renew=False), name
        )
        h = await self._take(outer, name, wait)
        if h is None:
            return
        try:
            inner = locks.lock(name, ttl=ttl, timeout=0, reentrant=True, auto_renew=False)
            if await inner.acquire():
                try:
                    await self._body(inner, [h], self._work(1.5, ttl))
                finally:
                    await self._release(inner)
            await self._body(outer, [h], self._work(0.3, ttl))
        finally:
            await self._release(outer)

    async def op_handover(self, end: float) -> None:
        """Detach the lock and attach it again (as another task or process would)."""
        name = self.rng.choice(self.cfg.names)
        ttl, timeout = self._ttl(), self._timeout()
        lock = self._mine(self.locks.lock(name, ttl=ttl, timeout=timeout), name)
        # (Acquired and attached without ``async with``: no body to cancel on a loss, so
        # the checker's "told" rule does not apply; exclusion and fencing do.)
        h = await self._take(lock, name, timeout)
        if h is None:
            return
        longer = self.attaching is not None and self.attaching.random() < 0.5
        longer = longer or self.cfg.focus == "handover"
        try:
            await self._body(lock, [h], self._work(0.5, lock.ttl))
            if self.attaching is not None and longer:
                # Longer first: the attach then shortens the key (see 'attach' (plan.V1_FROM)), and
                # is not renewed: its body may outlive it by up to 2 ttls, the key left
                # to expire before its release. (Cancelled in it, the lock is released:
                # seed 562949973431919 kept it held and renewed.)
                await self._extend(lock, [h], factor=self.attaching.uniform(*ATTACH_LONGER))
        except BaseException:
            with contextlib.suppress(LockError):
                await lock.release()
            raise
        token = key_token(lock, name)
        if token is not None:
            self.rec.tickets.add(token)
        ticket = lock.detach()
        self.rec.event(self.owner, "detached")
        pause = self.rng.uniform(0.0, 0.3) * lock.ttl
        if self.attaching is not None and longer:
            # Long enough, often, for a waiter that read the PTTL before the extend()
            # to try again meanwhile, and sleep on the longer one.
            pause = self.attaching.uniform(0.2, 1.2) * lock.ttl
            if self.cfg.focus == "handover":  # (its draw stands: the others' do too)
                # Past the key's first ttl, always: a waiter of another process that
                # read the PTTL just after the lock was taken tries again meanwhile,
                # and reads the longer one.
                pause = (1.0 + pause / lock.ttl / 4) * lock.ttl
        await asyncio.sleep(pause)
        again = self._mine(await self.locks.attach(ticket, auto_renew=not longer), name)
        self.rec.event(self.owner, f"attached token {again.fencing_token}")
        try:
            await self._body(again, [h], self._work(3.0 if longer else 1.0, again.ttl))
            if longer and self.attaching is not None and self.cfg.focus == "handover":
                # The task goes on with other work before it releases (its body ends
                # as the lock expires, and a release, even of an expired hold, wakes
                # the waiters): the key is left to expire, as when its process is
                # busy elsewhere, and nothing but a shortening's message tells the
                # waiters of the other processes that slept on the longer PTTL.
                await asyncio.sleep(self.attaching.uniform(0.0, 2.0) * again.ttl)
        finally:
            if longer:
                await self._release(again)
            else:
                with contextlib.suppress(LockNotOwned):
                    await again.release()

    async def op_sem(self, end: float) -> None:
        name = "s-" + self.rng.choice(self.cfg.names)
        sem = self.locks.semaphore(name, 2, ttl=self._ttl(), timeout=self._timeout())
        async with sem:
            h = self._holding(
                ("sem", name, 2),
                "s",
                sem,
                ("sem", self.owner, next(self.serial)),
                sem.fencing_token,
                renewed=True,
            )
            # (Focused on semaphores: long work, which renewal and repair must keep.)
            scale = 6.0 if self.cfg.focus == "sem" and self.cfg.long else 1.5
            scale = 16.0 if self.cfg.focus == "repair" else scale
            await self._body(sem, [h], self._work(scale, sem.ttl))

    async def op_rw(self, end: float) -> None:
        name = "rw-" + self.rng.choice(self.cfg.names)
        rw = self.locks.rwlock(name, ttl=self._ttl(), timeout=self._timeout())
        write = self.rng.random() < 0.5
        handle = rw.write() if write else rw.read()
        self.began = since = self.now()  # (bookkeeping only: no draw, no await)
        held, waits = False, write and rw.timeout != 0  # (a try-once writer leaves no intent)
        try:
            async with handle:
                held = True
                if waits:
                    self.rec.writes.append(RWWait(name, self.owner, since, self.now(), True))
                h = self._holding(
                    ("rw", name),
                    "w" if write else "r",
                    handle,
                    ("rw", self.owner, next(self.serial)),
                    handle.fencing_token,
                    renewed=True,
                )
                await self._body(handle, [h], self._work(1.5, handle.ttl))
        finally:
            # (For live.writers_first: a writer's wait that ended without the lock,
            # and when a writer's release returned.)
            if waits and not held:
                self.rec.writes.append(RWWait(name, self.owner, since, self.now(), False))
            elif write and held:
                self.rec.released.setdefault(name, []).append(self.now())

    async def op_many(self, end: float) -> None:
        names = sorted(set(self.rng.sample(("a", "b", "c"), 2)) | {self.rng.choice(self.cfg.names)})
        many = self._mine(
            self.locks.lock_many(names, ttl=self._ttl(), timeout=self._timeout()), *names
        )
        self.began = self.now()
        async with many:
            tokens = many.fencing_tokens or {}
            holds = [
                self._holding(("lock", n), "x", many, tokens.get(n), tokens.get(n), renewed=True)
                for n in names
            ]
            for h in holds:
                h.drawn = self.began
            await self._body(many, holds, self._work(1.5, many.ttl))


async def run_processes(world: World, cfg: Config, rec: Recorder, plan: Plan) -> None:
    """Every process with its tasks, until the run's end; then the managers close."""
    end = time.monotonic() + cfg.seconds

    async def process(p: int) -> None:
        current_process.set(p)

        def on_event(event: LockEvent) -> None:
            error = f" {event.error}" if event.error is not None else ""
            rec.event(f"p{p}", f"event {event.kind} {event.name} {event.seconds:.4f}{error}")
            if event.kind == "acquired":
                rec.live.taken(event.name, p)

        nodes: list[Any] = list(world.urls)
        if world.cluster:  # (each a cluster of one master: see 'cluster' (plan.V1_FROM))
            cluster: Any = RedisCluster  # (abstract to redis-py 5.0's annotations)
            nodes = [cluster(host=n.host, port=n.port) for n in world.nodes]
        async with LockManager(
            nodes, node_timeout=NODE_TIMEOUT, on_event=on_event, restart_grace=cfg.grace
        ) as locks:
            if p in cfg.out_of_line:  # (as on Redis Cluster: see aiolock/_engine.py)
                engine = locks._engine
                engine.turns = engine.grants = None
                engine.waiting._turns = engine.waiting._grants = None
            elif locks._engine.turns is not None:
                waiting = locks._engine.waiting  # (see Liveness.in_line)

                def joined(key: bytes, waiting: Any = waiting) -> bool:
                    queue = waiting._queues.get(key)
                    return queue is not None and queue.entry is not None

                rec.live.members[p] = (locks._engine.turns.member, joined)
            workers = [Worker(rec, locks, cfg, f"p{p}t{t}", plan) for t in range(cfg.tasks)]
            async with asyncio.TaskGroup() as group:
                for w in workers:
                    group.create_task(w.run(end))
            if p not in world.dead:
                rec.resting.extend(at_rest(p, locks._engine))

    async with asyncio.TaskGroup() as group:
        for p in range(cfg.processes):
            group.create_task(process(p))
