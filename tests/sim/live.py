"""Liveness rules, checked in schedules without faults: waiters are served.

Safety says nobody else holds a lock while you do; these rules say a waiter is not kept
waiting for nothing, nothing is lost for no reason, and nothing is left behind. They are
read while the run goes on, without touching the stores and without a timer of their
own (a timer would change the schedule): at every command a node executes, and when a
wait begins or ends. All but "at rest" apply only where nothing excuses a wait: no
fault in the schedule (no message is lost, no node is down, every latency is below a
millisecond) and the library's real memory sizes (a grant to an offer its process
forgot is never taken: see Recorder.watch_orphans).

* **idle**: no plain-lock waiter (``timeout > 0``) waits for more than
  :data:`IDLE_LIMIT` while its name is free on every node. The library wakes waiters
  by a release's message or a grant, and otherwise by the holder's PTTL, a dropped
  subscription or the turn queue's fallback (0.5 s): docs/explanation/waiting.md,
  "a lost message costs at most one ttl", "a killed waiter, or a lost message, delays
  the others by about 0.5 s". Without faults no message is lost; a waiter cancelled
  as its process is named costs the fallback.
* **streak**: while another process has a waiter for a name, a process hands it to its
  own waiters at most 4 times in a row (docs/explanation/waiting.md: "A process hands
  the lock to its own waiters at most 4 times in a row"; then its release names the
  next process in line): it holds the name at most :data:`STREAK_LIMIT` times in a
  row, the name never free in between (on every node at once: released, or expired
  between two commands, which lets anyone's attempt take it). Counted again from a
  newcomer's first try (the turns are among waiters: a release that names a process
  without granting it the lock, its offer too old, lets a first try in) and from a
  grant given back (to an offer whose waiter has left since: the race that follows
  goes to whoever tries first), or undone by its head's own failed attempt (under
  way as the grant came, its clean-up deletes the token everywhere: the race that
  follows goes to whoever tries first too; seed 2251799815687419, SimNode._execute).
* **kept held**: nothing is lost without a fault. No renewed holder is told its lock
  is lost, and nothing raises ``LockLost`` or ``QuorumError``: every node answers
  within a millisecond, and a renewal comes every third of a ttl. Judged too (from
  'repair' (plan.V1_FROM)) in runs focused on repair, whose only faults are restarts of
  one node at a time, far apart (run.spaced_restarts): a renewal repairs a restarted
  node before the next restart, so a quorum keeps the key throughout
  (docs/explanation/failure-modes.md: "a minority restarted empty while a lock is
  held" costs "nothing: after one renewal the lock is on every node again"), unless
  the holding was young (see lost_needlessly); and (from 'lag' (plan.V1_FROM)) in runs
  focused on lag, whose only faults are a steady latency on every link, a round trip
  longer than node_timeout but well within the renewal's budget (run.lagging): a
  renewal waits for its replies up to a sixth of the ttl (aiolock/_quorum/renewal.py:
  "Renewal is not latency-bound"); and (from 'step_stall' (plan.V1_FROM)) in runs focused
  on short blocks, whose only faults are stalls within steps, each longer than
  node_timeout and shorter than a third of the ttl, far apart (run.blocking): every
  node answers at once, its reply waits to be read, and a fan-out's timer counts
  from its writes (aiolock/_quorum/quorum.py, FanOutTimer), so no operation fails a quorum;
  but an ``extend()`` to a ttl shorter than a block that struck while it was out,
  whose replies are read after the validity they gave ran out (it fails, and says so:
  counted as "extend_outlasted"; seed 70369244179214).
* **writers first**: no reader whose acquire began :data:`INTENT_AFTER` or more after
  a writer began to wait takes the read-write lock while that writer still waits
  (docs/guide/primitives.md: "a waiting writer keeps new readers out until the current
  ones are done"), but in the race right after a writer's release: see writers_first.
* **at rest**: once a process's tasks have all finished (every lock released), its
  manager keeps no renewal, no local wait queue and no token noted as held
  (``Grants._held``, which gives late grants back): what is left there is a leak,
  or a lock the library still believes it holds. (This one holds with faults too.)

How long a waiter sleeps after a failed attempt (no longer than a quorum needs) is
judged where these are, by sleeps.py ("woken at the quorum's expiry"); how soon a head
tries after its process's release named another process (no sooner than its own sleep
ends), by given.py ("the turn given goes first").

Not a rule: that the other processes take a name at most so many times in a row while
a process waits. The library's turns do not promise it today (docs/project/testing.md,
"Left alone, liveness": a process that joins the line again during its own turn, or
whose clock is behind, or whose offer is too old, can make another wait a second
round), and a bound loose enough for all three caught nothing.

A violation here is a broken promise of the waiting docs, or bookkeeping gone wrong,
not of exclusion: the search reports it with the others ("idle:", "streak:", "lost
without a fault:", "at rest:").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .promised import DRIFT_FACTOR, ENTRY_LIFE, FALLBACK
from .world import excusing

if TYPE_CHECKING:
    from .sleeps import Sleeps
    from .workload import Holding, RWWait
    from .world import World

#: How long a waiter may wait while its name is free on every node, in a schedule
#: without faults (seconds): the turn queue's fallback (0.5 s, and up to 10 % of
#: jitter), and a margin. The fallback is the documented cost of a waiter of the named
#: process cancelled before it heard it was named: its process leaves the line
#: without announcing the lock free, and the others wait it out ("a killed waiter ...
#: delays the others by about 0.5 s"; seed 139534766359, a nudge, 0.36 s). With 0.25
#: s that seed failed; without a cancellation the longest wait seen is 36 ms.
IDLE_LIMIT = 0.6
#: Another process's waiter counts for "streak" once it has waited this long: its first
#: attempt has failed and its process has joined the line (a round trip, under a
#: millisecond without faults).
JOINED_AFTER = 0.01
#: A name's key, and its turn queue, on the nodes (see Liveness.in_line).
KEY = b"aiolock:{%s}"
TURNS = b"aiolock:{%s}:turns"
#: The most holdings of a name in a row by one process while another waits: its turn and
#: 4 handoffs, and 2 more for the handoffs that may follow before the holder's process
#: knows that another process is in line (each handoff tells it; before, its streak
#: could run to 32, the limit when nobody else is in line).
STREAK_LIMIT = 7
#: The same where a process waits out of line (workload.Config.out_of_line): a process
#: whose handoffs find nobody else in line hands the lock to its own waiters up to 32
#: times in a row (LONE_STREAK), then releases it for all (docs/explanation/waiting.md:
#: "the release that ends it is for processes that wait without taking turns"); the
#: name is then free, and counting starts again. Half as much again as that: releases
#: of expired holds and handoffs before the process learns of the line stretch it as
#: they stretch the other (main reached 35: seed 4398046615881).
OUT_OF_LINE_STREAK_LIMIT = 48
#: An acquire that returns sooner than this after it began took the lock at its first
#: try (a round trip is under a millisecond without faults): see Liveness.held.
FIRST_TRY = 0.001
#: A holding restarted on this many ttls after it began may be lost (see
#: lost_needlessly): its renewals, a third of a ttl apart, have not yet
#: put its key on every node.
YOUNG = 2.0
#: A lock's key on the nodes (the default prefix).
KEY = b"aiolock:{%s}"
#: By this long after a writer began to wait, its first attempt has reached every
#: node (a round trip, under a millisecond without faults): see writers_first.
INTENT_AFTER = 0.01
#: A reader that took a read-write lock this close to a writer's release returning
#: (before or after) may have won the race that followed it (see writers_first).
RACE = 0.05
#: The same where subscriptions are held back (up to 0.3 s: run.late_subscriptions).
LATE_RACE = 0.4


class Liveness:
    """The waits of one run and what the rules above make of them."""

    def __init__(self, world: World, processes: int) -> None:
        self.world = world
        self.processes = processes
        #: Whether the rules apply (see the module's docstring); set before the run.
        self.on = True
        self.problems: list[str] = []
        #: The streak rule's limit (see run.run), and the longest streak seen.
        self.streak_limit = STREAK_LIMIT
        #: Whether a process waits out of line (see run.run): the streak then ends when
        #: the name is free on a quorum, not on every node. A process that gives way
        #: there races the one out of line on equal terms: a release reaches the nodes
        #: one by one, and an attempt that heard it from the first may take that node
        #: again before the last is free, and win (seed 8796093022271: "free on every
        #: node" missed such a race, and read a streak given way and begun anew as one
        #: of 49). In line, a process that gives way names the next, and waits for it:
        #: only the name free on every node ends a streak there (else a head that
        #: tries at once as its process gives way, which wins most such races, would
        #: go unseen).
        self.racing = False
        self.longest_streak = 0
        self._serial = itertools.count()
        #: name -> wait id -> (since, process, owner)
        self.waits: dict[str, dict[int, tuple[float, int, str]]] = {}
        #: name -> since when it is free on every node (sampled; None: held somewhere)
        self.free_since: dict[str, float | None] = {}
        #: name -> when it was last seen free (see racing), and when its last holding began
        self.last_free: dict[str, float] = {}
        self.last_held: dict[str, float] = {}
        #: name -> (process, its holdings in a row while another process waited)
        self.streaks: dict[str, tuple[int, int]] = {}
        #: Where subscriptions are held back ("subscribe" faults), each process's
        #: member in the turn queues (set by the workload; none: it waits out of line),
        #: and whether its queue for a lock key has joined the line (its Queue.entry).
        self.late = any(fault.kind == "subscribe" for fault in world.faults)
        self.members: dict[int, tuple[bytes, Callable[[bytes], bool]]] = {}
        #: There, the waits whose process was seen in line since they began.
        self.joined: set[int] = set()
        #: name -> each node's expiry of its key at the last sample (node milliseconds;
        #: -inf: none, inf: no ttl): a key can expire between two commands
        self.expiries: dict[str, list[float]] = {}
        #: Whether the progress rule judges the run (run.judged_after_heal), the
        #: longest ttl each name's holdings asked for (the Recorder's), and what it
        #: found (advisory: run.py).
        self.progress = False
        self.longest: dict[str, float] = {}
        self.unhealed: list[str] = []
        #: The rule "woken at the quorum's expiry" (sleeps.py), told of waits that end
        #: and holdings that begin.
        self.sleeps: Sleeps | None = None

    def _active(self) -> bool:
        # (A process's death excuses nothing here: what it held waits out its ttl,
        # which the holder's PTTL wakes the waiters for; a turn it does not use costs
        # the fallback. Its own waits end at its death: see Worker.run.)
        # Nor does a late subscription: the confirmation wakes the waiter.
        return self.on and not excusing(self.world.faults) and not self.problems

    # -- what the workload tells ------------------------------------------------------

    def begins(self, name: str, process: int, owner: str, timeout: float | None) -> int | None:
        """A waiter for the lock ``name`` begins: its id (None: not watched)."""
        if (not self._active() and not self.progress) or timeout == 0:
            return None
        wait = next(self._serial)
        self.waits.setdefault(name, {})[wait] = (self.world.now, process, owner)
        self.sample()
        return wait

    def ends(self, name: str, wait: int | None) -> None:
        """The wait ``wait`` ended (held, timed out or cancelled); idempotent."""
        waits = self.waits.get(name, {})
        if wait is None or wait not in waits:
            return
        self.sample()
        if self.sleeps is not None:
            self.sleeps.excused(name, waits[wait][1])
        del waits[wait]
        self.joined.discard(wait)

    def held(self, name: str, process: int, *, waited: bool) -> None:
        """A holding of the lock ``name`` by ``process`` began; ``waited``: its acquire
        waited (else it took the lock at its first try)."""
        if self.sleeps is not None:
            self.sleeps.excused(name, process)
        if self.world.subs is not None:
            self.world.subs.took(process, KEY % name.encode())
        if not self._active():
            return
        now = self.world.now
        fresh = self.last_free.get(name, -1.0) >= self.last_held.get(name, -1.0)
        self.last_held[name] = now
        if not waited or fresh:
            # A newcomer's first try, or the name was free since the last holding
            # began (taken, not handed over): a new streak.
            self.given_back(name)
        dead = self.world.dead
        others = any(
            p != process
            and p not in dead
            and now - since >= JOINED_AFTER
            and (not self.late or p not in self.members or wait in self.joined)
            for wait, (since, p, _) in self.waits.get(name, {}).items()
        )
        who, count = self.streaks.get(name, (process, 0))
        count = (count if who == process else 0) + (1 if others else 0)
        self.streaks[name] = (process, count)
        self.longest_streak = max(self.longest_streak, count)
        if count > self.streak_limit:
            self.problems.append(
                f"streak: p{process} took {name!r} {count} times in a row at {now:.6f}, "
                f"never free, while another process waited (at most {self.streak_limit}, "
                f"{self._faults()})"
            )

    def in_line(self, name: str, process: int) -> bool:
        """Whether a quorum of nodes has ``process``'s entry in ``name``'s turn queue.

        For "streak" where subscriptions are held back: a waiter of JOINED_AFTER has
        joined the line elsewhere (a round trip), but there a head joins only once its
        subscriptions are confirmed, or after 0.1 s (Waiting._subscribe's wait), and a
        waiter that gives up sooner never does: its process waits out of line, which
        the docs allow (seed 17592186244675: 0.02-s waits, subscriptions 0.3 s late).
        There a wait counts once its process was seen in line (``joined``, sampled).
        Only its queue's place counts, not the place of a queue before it, whose last
        waiter left as this one began, its TURN_LEAVE on the way (seed 70369044179252:
        a wait counted from then, its process out of line for 0.1 s, and a lone streak
        read as one of 8).
        """
        member, joined = self.members[process]
        if not joined(KEY % name.encode()):
            return False
        world = self.world
        key = TURNS % name.encode()
        entries = 0
        for node in world.nodes:
            line = node.store.data.get(key)
            if line is not None and node.ends(key) > world.now and member in line.scores:
                entries += 1
        return entries >= len(world.nodes) // 2 + 1

    def taken(self, name: str, process: int) -> None:
        """``process`` acquired the lock ``name`` (its manager's event), a body to follow
        or not: a ``lock_many`` that took it, then timed out on another name, let it go
        unheld (seed 281474982719307: the streak of the process that held it before and
        after, read as one of 8). Another process's streak ends there. Its sleep after a
        failed attempt ends there too (sleeps.py: seed 140737490358683, the lock_many's
        task took the name its other task's wait had failed on, and let it go unheld)."""
        if self.sleeps is not None:
            self.sleeps.excused(name, process)
        who, _ = self.streaks.get(name, (process, 0))
        if who != process:
            self.given_back(name)

    def given_back(self, name: str) -> None:
        """A grant of ``name`` was given back (or a new streak begins): counted again."""
        self.streaks.pop(name, None)

    # -- what the nodes show ---------------------------------------------------------

    def sample(self) -> None:
        """Read whether each waited-for name is free on every node (after a node ran a
        command, or as a wait begins or ends), and judge the waits."""
        active = self._active()
        now = self.world.now
        healed = None if active or not self.progress else self.world.faults_over()
        if not active and (healed is None or now < healed or self.unhealed):
            return
        for name in self.last_held.keys() | self.waits.keys():
            waits = self.waits.get(name, {})
            if self.late:
                for wait, (_since, p, _owner) in waits.items():
                    if wait not in self.joined and p in self.members and self.in_line(name, p):
                        self.joined.add(wait)
            if self._expired_since(name):
                # Free on every node just before the command just run (which may have
                # taken it): expired since the last sample, as no command ran between.
                self.last_free[name] = now
            values = self.world._live(KEY % name.encode())
            if sum(v is None for v in values) >= (
                len(values) // 2 + 1 if self.racing else len(values)
            ):
                self.last_free[name] = now
            if any(v is not None for v in values):
                self.free_since[name] = None
                continue
            if not waits:
                self.free_since[name] = None
                continue
            if self._left_by_the_dead(name):
                # Expired under a holder that died: nothing announced it, and the
                # waiters wake at the PTTL they learnt, up to one ttl (a shortening
                # extend() announced itself: they learnt the shorter one).
                self.free_since[name] = None
                continue
            free = self.free_since.get(name)
            if free is None:
                self.free_since[name] = free = now
            for since, p, owner in waits.values():
                if p in self.world.dead:
                    continue  # (it died waiting)
                idle = now - max(free, since)
                if healed is not None:
                    idle = min(idle, now - self._settled(name, healed))
                    if idle > IDLE_LIMIT:
                        self.unhealed.append(
                            f"progress after heal: {owner} waited for {name!r} from "
                            f"{since:.6f}; free on every node from {max(free, since):.6f} "
                            f"to {now:.6f}, the faults over at {healed:.6f}"
                        )
                        return
                    continue
                if idle > IDLE_LIMIT:
                    self.problems.append(
                        f"idle: {owner} waited for {name!r} from {since:.6f}; it was free on "
                        f"every node from {max(free, since):.6f} to {now:.6f} at least "
                        f"({idle:.3f} s, {self._faults()})"
                    )
                    return

    def _settled(self, name: str, healed: float) -> float:
        """When a waiter of ``name`` must have woken since the faults ended: a release
        it missed costs at most the ttl it learnt ("a lost message costs at most one
        ttl"), on the slowest clock; a turn it was not given, the fallback; an entry of
        a process that left, its life."""
        longest = self.longest.get(name, 0.0) * (1 + 2 * DRIFT_FACTOR)
        return healed + longest + FALLBACK + ENTRY_LIFE

    def _faults(self) -> str:
        """The faults of the run, as a violation names them (none but deaths, late
        subscriptions and dropped pub/sub connections)."""
        late = any(fault.kind == "subscribe" for fault in self.world.faults)
        dropped = any(fault.kind == "drop" for fault in self.world.faults)
        but = [f"the death of {', '.join(f'p{p}' for p in sorted(self.world.dead))}"]
        but = (but if self.world.dead else []) + (["late subscriptions"] if late else [])
        but += ["dropped pub/sub connections"] if dropped else []
        return f"no fault but {' and '.join(but)}" if but else "no fault"

    def _left_by_the_dead(self, name: str) -> bool:
        """Whether the last value of ``name``'s key, on a quorum of nodes, was set by a
        process that has died since (World.writers)."""
        world = self.world
        if not world.dead:
            return False
        key = KEY % name.encode()
        dead = sum(
            world.writers.get((i, key), (-1, 0.0))[0] in world.dead for i in range(len(world.nodes))
        )
        return dead >= len(world.nodes) // 2 + 1

    def _expired_since(self, name: str) -> bool:
        """Whether every node's key of ``name``, as the last sample saw it, is gone or
        expired by now; and note each node's expiry for the next sample."""
        key = KEY % name.encode()
        nodes = self.world.nodes
        seen = self.expiries.get(name)
        gone = seen is not None and all(
            expiry <= node.clock_ms() for node, expiry in zip(nodes, seen, strict=True)
        )
        expiries = []
        for node in nodes:
            expiry = node.store.expires.get(key)
            alive = isinstance(node.store.data.get(key), bytes) and (
                expiry is None or expiry > node.clock_ms()
            )
            expiries.append(-math.inf if not alive else math.inf if expiry is None else expiry)
        self.expiries[name] = expiries
        return gone


def lost_without_a_fault(
    holdings: list[Holding], counts: dict[str, int], why: str = "lost without a fault"
) -> list[str]:
    """The "kept held" rule, over a run without faults (see the module's docstring), or
    one focused on short blocks (``why``: run.blocking)."""
    problems = [
        f"{why}: {h.owner} {h.domain} token {h.token} told at {h.told_at:.6f}"
        for h in holdings
        if h.renewed and h.told_at is not None
    ]
    problems += [
        f"{why}: {counts[what]} operations ended in {what}"
        for what in ("lost", "quorum", "extend_quorum")
        if counts.get(what)
    ]
    return problems


def lost_needlessly(holdings: list[Holding], focus: str, faults: list[float]) -> list[str]:
    """The "kept held" rule, over a run focused on ``focus``, its faults at ``faults``
    (world time): ``repair``, whose only faults are restarts far apart
    (run.spaced_restarts), or ``lag``, whose only faults are a steady latency within
    the renewal's budget (run.lagging). Under lag, no renewed holding is told lost.
    Under restarts, only if the restart before the tell came less than :data:`YOUNG`
    ttls after the holding began: its acquire may have won on a bare quorum (a split
    vote: the others held by a rival's key, cleaned up just after), and the key is on
    every node only once a renewal repaired the rest, a third of a ttl in (seed
    1099511639461: a lock taken on 3 nodes of 5, one of them restarted 0.15 s later,
    before its first renewal). Its release may then raise ``QuorumError`` too; under
    lag every release times out: the counts are not read.
    """
    why = "lost under restarts far apart" if focus == "repair" else "lost under lag"
    problems = []
    for h in holdings:
        if not h.renewed or h.told_at is None or not h.steps:
            continue
        before = [at for at in faults if at <= h.told_at] if focus == "repair" else []
        if before and before[-1] - h.steps[0][0] < YOUNG * h.ttl:
            continue
        problems.append(
            f"{why}: {h.owner} {h.domain} token {h.token} told at {h.told_at:.6f}, began "
            f"at {h.steps[0][0]:.6f}"
            + (f", the last restart at {before[-1]:.6f}" if before else "")
        )
    return problems


def writers_first(
    holdings: list[Holding],
    writes: list[RWWait],
    released: dict[str, list[float]],
    *,
    late: bool = False,
) -> list[str]:
    """The "writers first" rule, over a run without faults: a waiting writer keeps new
    readers out until the current ones are done (docs/guide/primitives.md, "writers
    are not starved"; aiolock/_handles/rwlock.py: a writer that finds readers leaves an intent
    on the nodes, which new readers respect).

    No reader whose acquire began :data:`INTENT_AFTER` or more after a writer began to
    wait (``timeout`` other than 0) takes the read-write lock while that writer still
    waits: by then the writer's first attempt has left its intent, or found another
    writer holding. In that case only, a reader may win the race that follows that
    writer's release: unless it took the lock within :data:`RACE` of a writer's
    release returning (before it too: a reader of the releasing process is woken as the
    release is written, and its acquire may be decided first: seed 35184402095482), it
    broke the rule. ``late``: subscriptions are held back in the run; a writer may hear
    that release only when its subscription is confirmed, up to 0.3 s later, and the
    race lasts :data:`LATE_RACE` (seed 35184472094183: a new reader took the lock
    twice, 45 and 50 ms after a writer's release, before the waiting writer tried);
    so too where pub/sub is refused, where every waiter polls, a writer every 0.1 s
    and 10 % (aiolock/_waiting/queue.py, ``POLL_INTERVAL``; seed 1125899915848300: a reader
    took the lock 57 ms after a writer's release, the waiting writer 0.18 s after it).
    """
    race = LATE_RACE if late else RACE
    problems = []
    for w in writes:
        for r in holdings:
            if r.domain != ("rw", w.name) or r.mode != "r" or not r.steps:
                continue
            took = r.steps[0][0]
            if not (w.since + INTENT_AFTER <= r.began and took < w.until):
                continue
            if any(abs(took - at) <= race for at in released.get(w.name, [])):
                continue
            problems.append(
                f"writers first: {r.owner} began to read {w.name!r} at {r.began:.6f} and "
                f"took it at {took:.6f}, while {w.owner} waited to write from "
                f"{w.since:.6f} to {w.until:.6f} ({'took it' if w.got else 'gave up'} then; "
                "no fault)"
            )
            break
    return problems


def at_rest(process: int, engine: Any) -> list[str]:
    """The "at rest" rule for one manager's engine, its tasks all finished."""
    left = []
    if len(engine.renewer):
        left.append(f"{len(engine.renewer)} renewals")
    if engine.waiting._queues:
        left.append(f"wait queues for {sorted(engine.waiting._queues)}")
    if engine.grants is not None and engine.grants._held:
        left.append(f"{len(engine.grants._held)} tokens noted as held")
    return [f"at rest: p{process} keeps {', '.join(left)}"] if left else []
