"""The seeds kept as tests (tests/test_sim.py), in one place the command line reads too.

What each one found, and when it was first recorded: docs/project/findings.md (made from
this file: ``python -m tests.sim findings``).

``python -m tests.sim digests --kept`` prints their digests, with the faults each keeps,
so ``nox -s determinism`` checks that every kept seed replays the same on every Python.
"""

from __future__ import annotations

from .plan import Plan
from .run import Schedule
from .workload import Config
from .world import Fault

#: Seeds that once failed, replayed on every run: (seed, faults kept or None, why).
REGRESSIONS: list[tuple[int | str, list[int] | None, str]] = [
    (562949973431919, None, "workload: a handover cancelled in its longer extend()"),
    (70368944185082, [0], "a waiter slept to a minority's longest ttl (fixed)"),
    (574, [0, 2], "grants undone by the head's own clean-up were counted (fixed)"),
    (41, None, "a failed semaphore try wrote the index without a ttl (fixed)"),
    (1226, [0, 1, 2], "checker: a step woke in the instant the loss was noted"),
    (1839, None, "checker: a body cancelled inside a shielded extend()"),
    (64, list(range(15)), "checker: stalls back to back delay a tell"),
    (11903222, [0, 1, 2, 3, 4], "checker: acquired with less than the guard left, told at once"),
    (6406101, [2, 4], "a lock_many release cancelled midway left a name held (fixed)"),
    (7, None, "once a livelock of split attempts (stopped as busy), before the schedules shrank"),
    (200016431, None, "a grant the head's clean-up deleted counted: its 'held' came late (fixed)"),
    (8018443683, None, "a renewal failing at once past its deadline spun the loop (fixed)"),
    (35359738591, [0, 2], "a renewal confirmed past its deadline brought the lock back (fixed)"),
    (34459738402, [1, 2, 6, 7], "a reconnect ended a failover's quarantine (fixed)"),
    (139297437666, None, "an expired hold's release ended its process's streak (fixed)"),
    (274927921909, None, "checker: a lease's key outlasts the taker's ttl by the drift"),
    (549755934222, None, "a head taking over as its process gave way beat a poller (fixed)"),
    (549759013951, None, "a late renewal kept a leased key past the taker's ttl (fixed)"),
    (70368841183464, [], "a head woken by an expired hold's late release (fixed)"),
    (4398046615881, None, "a lone streak of 35 with a process out of line (the rule's)"),
    (8796093022271, None, "checker: a race after a give-way won before every node was free"),
    (70032279153, [0, 1], "a repair's SET without NX replaced another holder's key"),
    (1099511628058, None, "a polling head beat the process its release named (fixed)"),
    (17592226047226, [4, 7], "an extend() that found its lock gone left the body untold"),
    (35184382090313, None, "checker: a reconnect flushed two renewal batches at once"),
    (
        35184402095482,
        None,
        "checker: a reader won the race just before a writer's release returned",
    ),
    (35184472094183, None, "checker: a writer heard a release late, subscriptions held back"),
    (17592226046275, [0, 2], "checker: a lock_many read 0 marked its renewed names dry"),
    (17592236045824, [0, 1, 2, 3], "checker: a loss told after a shielded extend() timed out"),
    (17592266044573, [0, 1], "a head woken by a late confirmation beat the process named"),
    (17592286046564, None, "a head woken before its process gave way tried after it"),
    (70369044179252, None, "checker: a wait counted in line by its process's old entry"),
    (70369044186868, [1, 2, 4, 7, 8], "checker: an extend() in flight through a long stall"),
    (35184397102415, [2], "once: a tentative offer stays tentative until the next refresh"),
    (35184422103604, [0, 2], "once: a head subscribes to its grants only as it joins the line"),
    (17592236046470, [0], "once: a grant of a token taken and let go, made again, kept"),
    (70368939179255, [], "once: a release that gives way leaves the head's wake-up"),
    (17592236046488, [0, 1], "once: grants undone by the head's own failed attempt count"),
    (281474982719307, [], "checker: a name taken by a lock_many that failed ends a streak"),
    (2251799815687419, None, "checker: a grant undone by its head's own clean-up ends a streak"),
    (140737490358683, None, "checker: a lock_many's name taken unheld ends a sleep"),
    (140737490355870, [1, 3, 4, 5, 6, 7, 8, 10, 11, 13, 15], "a failed pass-on's clean-up"),
    (
        70368744177692,
        [0, 1, 2, 3],
        "caught the fan-out timer's mutant until the timer's fix moved it",
    ),
    (
        "v2:78525548743244",
        [0],
        "a block within a fan-out's writes ate its node_timeout (fixed); caught the fan-out "
        "timer's mutant until one timer served every fan-out",
    ),
    (
        140737489374714,
        [0],
        "caught the watchdog's write-time mutant until one handle per iteration served the flushes",
    ),
    (
        "v2:166971183357",
        None,
        "checker: a write refused for a token below one whose counter a failover lost, "
        "which the fencing rule allows",
    ),
    (
        "v2:167519440969196",
        [],
        "checker: a head took the lock by its grant, found on the nodes before heard, and "
        "its process left the line unannounced",
    ),
    (
        "v2:27489202677045",
        [0, 1, 2, 4, 5, 7, 8, 9, 10, 11, 12, 14, 15, 16, 17, 24, 25, 27, 28, 30],
        "a head slept toward the holder's expiry while no node had its subscription (fixed)",
    ),
    (
        "v2:84779656823625",
        [1, 2, 3],
        "checker: a head took the lock by its process's handoff as its subscription came "
        "back, and was counted as not woken",
    ),
    (
        "v2:32386808113564",
        None,
        "a head that could not hear a release polled 0.42 s after its process gave way, "
        "every node having confirmed its subscription since (fixed)",
    ),
    (
        35184397092463,
        [0],
        "caught a firm offer before its grants' subscriptions were confirmed until the "
        "sleep of a head that could not hear went on after the confirmations",
    ),
    (
        2251799813703477,
        [1],
        "caught a subscription confirmed by the reply to the one before until the sleep of "
        "a head that could not hear went on after the confirmations",
    ),
    (
        "v2:13310562437074",
        [0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 14, 15, 16, 18, 19, 21, 23, 24, 27, 28, 29, 30],
        "an offer sent from a new place stayed at the old one, where the node kept the "
        "process's entry (its leave lost), after a refresh without an offer (fixed)",
    ),
    (
        "v4:82873774994762",
        None,
        "checker: a lock_many's first name, taken long before its first step, was judged "
        "as begun after a later holding of the name (its token lower): fencing reads when "
        "the acquire began",
    ),
    (
        "v4:153554423610399",
        [0, 2, 3],
        "checker: a head that could not hear a release yet (its subscription held back) "
        "held back until the fallback after its process's release named another, as "
        "documented, and was counted as not woken at the quorum's expiry",
    ),
    (
        "v4:227648486930944",
        [3, 4],
        "checker: the only node restarted empty while a stall held the acquire's reply "
        "back; the holder's key counted as not kept, its quarantine not counted, because "
        "the restart came before the holding's first step (not before its acquire began)",
    ),
    (
        "v2:37192056819182",
        [0],
        "checker: two holdings a node's clock step let overlap, each token in the order "
        "the node gave it, were taken as begun in the order their replies came",
    ),
    (
        140737492368453,
        [],
        "caught a shortening heard after its process gave way until a head still "
        "subscribing as its process gave way waited first",
    ),
]

#: What the search found on its own with a named mutant of tests/mutants.py applied (a
#: fix of issue 31 reverted, or a rule the simulation could not reach before): the
#: name, the seed, the faults its shrinking kept, and the rule that fails.
CAUGHT: list[tuple[str, int | str, list[int], str]] = [
    ("a late grant of a held token given back", 8589934748, [0, 3], "kept"),
    (
        "the renewal on connections of its own (a late extend cuts a renewed key)",
        39359738380,
        [1, 2],
        "kept",
    ),
    ("acquire script ignores the stored fencing counter", 68719476739, [], "fencing"),
    ("a young server (uptime) is not a restart", 68719477587, [1], "exclusion"),
    (
        "a lock_many release cancelled midway leaves the other names held",
        6406101,
        [2, 4],
        "p1t0: lock",  # a crash: RuntimeError, the name still held by the task
    ),
    ("a reconnect ends a failover's quarantine", 34459738402, [1, 2, 6, 7], "exclusion"),
    ("handoff without comparing the old token", 549759015552, [0], "kept"),
    (
        "a script first used on a connection is not loaded before it",
        549759013951,
        [2, 5],
        "clean-ups leave no token",
    ),
    ("a release cancelled during its handoff cancels the handoff", 36673097411, [0], "liveness"),
    ("a grant for a waiter that left kept", 69379949051, [], "orphan"),
    (
        "a streak of handoffs starts again whenever the local queue empties",
        68719476742,
        [],
        "streak",
    ),
    (
        "a streak of handoffs starts again whenever the local queue empties",
        137438990719,
        [],
        "streak",
    ),
    (
        "a lost lock's token stays noted as held (Grants._held grows)",
        137438990545,
        [0, 3],
        "at rest",
    ),
    ("a lock passed to a waiter that left stays held", 140405732318, [], "orphan"),
    ("a stale offer granted", 137956772765, [], "lost without a fault"),
    (
        "a handoff never sees another process in line (streaks of LONE_STREAK for all)",
        140465158935,
        [],
        "streak",
    ),
    (
        "a handoff's view of the line is dropped when its taker was our last waiter",
        139912374606,
        [],
        "streak",
    ),
    (
        "a shorter extension in flight does not lower the validity when sent",
        140353145283,
        [2, 3],
        "kept",
    ),
    ("a handle reads owned while its own release is in flight", 137438953472, [], "kept"),
    ("one server's databases are several nodes", 274877906959, [], "aliases"),
    ("same run_id behind two addresses not refused", 274877906962, [], "aliases"),
    ("waiters do not poll where pub/sub is refused", 274877907051, [], "idle"),
    (
        "a lease's taker cancelled before it woke keeps the lock",
        274877907925,
        [],
        "at rest",
    ),
    (
        "a lock passed to a waiter cancelled before it woke stays held",
        274877907925,
        [],
        "at rest",
    ),
    (
        "an expired lock's token stays noted as held when its handle acquires again",
        274877906978,
        [],
        "at rest",
    ),
    (
        "an inner reentrant level's release after expiry returns quietly",
        274877906957,
        [],
        "contract",
    ),
    ("a lock is leased to a waiter with a shorter ttl", 274877906948, [], "outlives"),
    ("a lock held too long is leased", 274877907592, [], "lost without a fault"),
    (
        "a release names the first in line, not the next after the releasing process",
        278888758378,
        [],
        "streak",
    ),
    (
        "extend() to a shorter ttl leaves the renewal schedule",
        68719476739,
        [],
        "lost without a fault",
    ),
    (
        "a detached lock's token stays noted as held (Grants._held grows)",
        11903222,
        [0, 1, 2, 3, 4],
        "at rest",
    ),
    (
        "no repair of nodes that lost a held lock",
        1099511627802,
        [0, 1],
        "lost under restarts far apart",
    ),
    (
        "a renewal confirmed past its deadline brings the lock back",
        1099511636657,
        [2, 3, 5],
        "revived",
    ),
    (
        "renewal batch waits only node_timeout (latency-bound renewal)",
        2199023255572,
        [1],
        "lost under lag",
    ),
    (
        "a process alone in line passes the lock on for ever",
        2199023257766,
        [],
        "streak",
    ),
    ("the releasing process granted its own offer", 8796093022271, [], "streak"),
    ("a turn passed over is never taken (no fallback)", 4398046519080, [0], "idle"),
    ("extend() not shielded from the caller's cancellation", 8796093022217, [], "followed"),
    ("a PASS_ON reserves no tokens for the leases after it", 8796093022819, [], "fencing"),
    ("a reserve made on fewer than a quorum is used", 549755934222, [], "backed"),
    ("a shortening extend() announces nothing", 4398046531387, [], "idle"),
    ("a renewal retry path that raises", "v2:230495359815842", [1], "logged"),
    ("semaphore release deletes another holder's slot", 17592226044416, [3], "exclusion"),
    (
        "a subscription confirmed late does not wake the waiter",
        1125899913842699,
        [5],
        "woken when subscribed again",
    ),
    ("a failed semaphore try writes the index without a ttl", 1099511627802, [0, 1], "bare key"),
    ("an attempt with the token granted to it loses", 200016431, [], "orphan"),
    ("a grant nobody hears kept", 17592246044659, [0], "orphan"),
    ("every waiting process tries on every release (turns ignored)", 17592236045983, [], "streak"),
    ("a head offers to take grants though pub/sub is refused", 17592186151447, [], "streak"),
    (
        "a head holding back tries though a release claimed its offer meanwhile",
        17592236047098,
        [2],
        "kept",
    ),
    (
        "a grant of a token taken and let go, made again since, is kept",
        140737497359925,
        [0],
        "orphan",
    ),
    (
        "an extend() that finds the lock gone on a majority stops its renewal untold",
        17592226047226,
        [4, 7],
        "untold",
    ),
    (
        "a subscription confirmed late wakes the head even as its process gives way",
        17592266044573,
        [0, 1],
        "streak",
    ),
    (
        "the writer's script is not given the readers' keys it asked for",
        278888758378,
        [],
        "writers first",
    ),
    ("renewal batch extends keys of other tokens", 17592316044439, [0, 3], "kept"),
    (
        "a renewal batch writes every chunk at once on the shared connection",
        35184372088862,
        [],
        "one chunk",
    ),
    (
        "a polling head tries at its poll just after its process gave way",
        70368894222431,
        [],
        "streak",
    ),
    (
        "a grant unheard by a process whose subscription was not in place takes it out of line",
        35184397102415,
        [1, 2],
        "streak",
    ),
    (
        "a head that takes over as its process gives way tries at once",
        35184402088935,
        [0],
        "streak",
    ),
    (
        "an expired hold's release at the streak's limit starts the streak again",
        35184402098707,
        [],
        "streak",
    ),
    (
        "a process taken out of line joins again only at its next refresh",
        35184372089874,
        [],
        "streak",
    ),
    (
        "releases on a sharded cluster announced with a plain PUBLISH",
        70368744177868,
        [],
        "idle",
    ),
    (
        "a fan-out's node_timeout counted from before its requests are written",
        "v2:265983868023316",
        [0],
        "lost under short blocks",
    ),
    (
        "a process named is passed over while the lock is held (it took it)",
        549755813917,
        [],
        "stays in line",
    ),
    ("repair overwrites another holder's key", 17592236046488, [1], "repairs take no key"),
    (
        "a failed handoff's clean-up keeps the waiter's token",
        549759013951,
        [1, 2, 3, 5],
        "clean-ups leave no token",
    ),
    (
        "repair after a renewal that did not win a quorum",
        64,
        [2, 3],
        "repairs follow a won renewal",
    ),
    (
        "a release that finds its lock expired announces nothing",
        1226,
        [0, 1, 2],
        "expired releases announce",
    ),
    (
        "a repair raises the counter to the holder's own token only",
        70368944188242,
        [3, 4],
        "backed",
    ),
    (
        "a turn queue refresh without an offer keeps the old one",
        17592186151447,
        [],
        "a refresh without an offer withdraws it",
    ),
    (
        "an expired hold's release ends its process's streak of handoffs",
        70368894224578,
        [],
        "streak",
    ),
    (
        "an extend() confirmed after its validity ran out says that no node failed",
        "v2:159360518376234",
        [0],
        "a quorum error names its failed nodes",
    ),
    (
        "a renewal batch's budget covers all its script calls, not each",
        70369244182651,
        [0],
        "lost under lag",
    ),
    (
        "a loop blocked past the stall timeout resets a connection whose replies wait unread",
        140737488363442,
        [0],
        "lost under short blocks",
    ),
    (
        "the stall watchdog never resets a connection, silent as it may be",
        140737488355362,
        [3],
        "a silent connection is given up",
    ),
    (
        "the stall watchdog times a request from its send, though a block kept it unwritten",
        "v2:4789153176906",
        [0],
        "lost under short blocks",
    ),
    (
        "a shortening heard after its process gave way wakes the head at once",
        "v2:1333526161",
        [],
        "the turn given goes first",
    ),
    (
        "a waiter whose attempt split the vote tries again at once",
        140737491357076,
        [0, 1, 2, 3],
        "busy",
    ),
    (
        "a script first used while the node is down counts as loaded on its next connection",
        41,
        [8, 11],
        "scripts run in order",
    ),
    (
        "a process whose pub/sub connection dropped joins the line again only at its refresh",
        281474983711000,
        [0],
        "streak",
    ),
    (
        "a handoff within a process to a shorter ttl announces nothing",
        281474996725057,
        [],
        "idle",
    ),
    ("semaphore body not cancelled on loss", 8796093122290, [10], "untold"),
    (
        "a process whose pub/sub connection dropped offers firm before it is subscribed again",
        281474985869760,
        [0],
        "streak",
    ),
    ("an attach that shortens the lock announces nothing", 1125899906842998, [], "idle"),
    (
        "a tentative offer stays tentative until the entry's next refresh",
        139297437666,
        [],
        "firm once confirmed",
    ),
    (
        "a head subscribes to the grants only as it joins the line, with its offer",
        139297437666,
        [],
        "grants with the releases",
    ),
    (
        "a process leaving in its turn does not announce the lock free",
        1125899906843548,
        [],
        "a turn unused is announced",
    ),
    (
        "a subscription confirmed again after a reset does not wake the head",
        1125899913842699,
        [5],
        "woken when subscribed again",
    ),
    (
        "a head that learns pub/sub is refused keeps its offer until the refresh",
        1125899906842792,
        [1],
        "withdrawn at the next attempt",
    ),
    (
        "a waiter sleeps to the longest ttl among the nodes that said held",
        1125899986843135,
        [],
        "woken at the quorum's expiry",
    ),
    (
        "a pub/sub connection lost or refused wakes the head at once though its process gave way",
        1125900056842705,
        [0, 1],
        "the turn given goes first",
    ),
    (
        "an expired hold's late release wakes the head after its process gave way",
        17592236047494,
        [],
        "the turn given goes first",
    ),
    (
        "a release that gives way leaves its head's earlier wake-up standing",
        2251799813689047,
        [1, 2],
        "streak",
    ),
    (
        "grants undone by the head's own failed attempt still count",
        4503599627371043,
        [0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
        "exclusion",
    ),
    (
        "a failed attempt's cleaned nodes read from its votes after the decision",
        4503599627483337,
        [0],
        "exclusion",
    ),
    (
        "a release that wakes a busy head goes on believing its process alone in line",
        9007199254741049,
        [],
        "a wake-up reads no line",
    ),
    (
        "a head holding back for one give-way of ours tries though we gave way again",
        9007199254748187,
        [],
        "the turn given goes first",
    ),
    (
        "a late grant of a held token given back",
        18014398509482024,
        [0, 1, 2],
        "kept",
    ),
    (
        "a split vote's pause does not grow with the split votes before it",
        9007199254741396,
        [0, 1, 2, 3],
        "busy",
    ),
    (
        "an EVALSHA queued as a reset lost its script's load is sent without it",
        18014428509482168,
        [0],
        "scripts run in order",
    ),
    (
        "the fenced resource accepts a token lower than one it accepted",
        "kleppmann",
        [0, 1, 2, 3],
        "fenced",
    ),
    (
        "a fan-out's timer set going before its requests are sent",
        "v2:12529172126650",
        [0],
        "lost under short blocks",
    ),
    (
        "a request written after a block inside its write is timed from before the block",
        "v2:159360518376234",
        [0],
        "lost under short blocks",
    ),
    (
        "a head that cannot hear a release yet sleeps toward the holder's expiry",
        "v2:27489202677045",
        [0, 1, 2, 4, 5, 7, 8, 9, 10, 11, 12, 14, 15, 16, 17, 24, 25, 27, 28, 30],
        "idle",
    ),
]


#: Schedules written out whole, by name (``python -m tests.sim replay NAME``).
SCHEDULES = {
    # Kleppmann's scenario ("How to do distributed locking", 2016), run every time: a
    # holder paused (a GC pause) between its check and its write, past its lock's ttl;
    # the other process takes the lock and writes; the holder wakes and writes with
    # its old token. The lock cannot prevent it: the fenced resource must refuse the
    # stale write (resource.py), and the run count the refusal.
    "kleppmann": Schedule(
        "kleppmann",
        Config(
            nodes=3,
            processes=2,
            tasks=1,
            names=("a",),
            seconds=6.0,
            ops=("lock",),
            ttl=0.5,
            fenced=True,
            await_told=True,
        ),
        tuple(Fault(at, "freeze", process=0, seconds=1.0) for at in (0.4, 1.9, 3.4, 4.9)),
    ),
}


def target(seed: int | str) -> Plan | Schedule:
    """A kept seed as it replays: a schedule's name, ``v2:SEED``, or a bare number (a
    version-1 plan: plan.py)."""
    return SCHEDULES[seed] if isinstance(seed, str) and seed in SCHEDULES else Plan.parse(str(seed))


def kept() -> list[tuple[Plan | Schedule, list[int] | None]]:
    """Every kept plan or schedule with the faults it keeps (None: all), each once (one
    may catch several mutants)."""
    seeds = [(target(seed), keep) for seed, keep, _ in REGRESSIONS]
    seeds += [(target(seed), keep) for _, seed, keep, _ in CAUGHT]
    return [entry for i, entry in enumerate(seeds) if entry not in seeds[:i]]
