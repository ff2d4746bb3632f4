"""The seeds kept as tests (tests/test_sim.py), in one place the command line reads too.

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
    # The fifteenth session's 30-minute search from 2**49 + 2e7 (10,608 schedules, 847 s,
    # 2 jobs): a handover cancelled inside the extend() it makes before it detaches
    # (from 'attach' (plan.V1_FROM)) left its lock held and renewed ("at rest"): the workload's own
    # fault (the extend() was outside the try that releases), mended.
    (562949973431919, None, "workload: a handover cancelled in its longer extend()"),
    # Found on main by the tenth session's 30-minute search (7,419 schedules; nodes
    # that are clusters, focus death): a failed attempt read a rival's fresh key on one
    # node of three, cleaned up just after, and the head slept its whole ttl while the
    # name was free (fixed: it wakes when enough nodes are free for a quorum). It killed
    # "a waiter sleeps to the longest ttl among the nodes that said held" until the
    # fifteenth session's fix (a handoff to a shorter ttl announced) changed every
    # cluster's scripts, and so the timing of every run of clusters from its start; not
    # found again in 11,984 schedules (10,254 of them of clusters), 2,300 s of search.
    # (Killed again since by a rule that reads every sleep: sleeps.py, CAUGHT.)
    (70368944185082, [0], "a waiter slept to a minority's longest ttl (fixed)"),
    (574, [0, 2], "grants undone by the head's own clean-up were counted (fixed)"),
    (41, None, "a failed semaphore try wrote the index without a ttl (fixed)"),
    (1226, [0, 1, 2], "checker: a step woke in the instant the loss was noted"),
    (1839, None, "checker: a body cancelled inside a shielded extend()"),
    # Kept for the checker's stall window counted from the last step. No kept seed
    # reaches that case any more (with the old window every one passes, and 3,079
    # schedules from 2**47 and 5,270 focused on stalls found none); this one stays for
    # its schedule, and kills three named mutants. Its last fault (a sever at 3.94 s)
    # is left out: with it, two events of one instant come in another order on 3.12
    # and 3.13 than on 3.11 (below 2**35, asyncio's batches; testing.md, Determinism).
    (64, list(range(15)), "checker: stalls back to back delay a tell"),
    (11903222, [0, 1, 2, 3, 4], "checker: acquired with less than the guard left, told at once"),
    (6406101, [2, 4], "a lock_many release cancelled midway left a name held (fixed)"),
    (7, None, "once a livelock of split attempts (stopped as busy), before the schedules shrank"),
    (200016431, None, "a grant the head's clean-up deleted counted: its 'held' came late (fixed)"),
    (8018443683, None, "a renewal failing at once past its deadline spun the loop (fixed)"),
    (35359738591, [0, 2], "a renewal confirmed past its deadline brought the lock back (fixed)"),
    (34459738402, [1, 2, 6, 7], "a reconnect ended a failover's quarantine (fixed)"),
    # Found on main by the 30-minute search from 2**37 (9,747 schedules, no fault): a
    # handle whose lock had expired long before released it, and ended the streak of
    # the process that held the lock by then (fixed; the real-server test pins it). It
    # failed with its mutant until the streak rule learnt that a key can expire between
    # two commands: the lock had, and was taken again by the same process.
    (139297437666, None, "an expired hold's release ended its process's streak (fixed)"),
    # The 30-minute search from 2**38 at 7e68a66 (14,966 schedules, no fault): the
    # outlives rule allowed no drift for a lease, whose key the nodes keep as long as
    # its holder's longer ttl made them (17.5 ms over a 0.849-s ttl).
    (274927921909, None, "checker: a lease's key outlasts the taker's ttl by the drift"),
    # From 2**39, focused on turns, every node refusing pub/sub: the same as the head
    # that takes over and tries at once (CAUGHT), where the process named polls.
    (549755934222, None, "a head taking over as its process gave way beat a poller (fixed)"),
    # From 2**39, not focused (16 faults: delays, clock jumps): a renewal of a 0.58-s
    # holder, slow on one node, landed after a lease to a 0.49-s taker and kept the key
    # 0.58 s from then (fixed: no lease to a shorter ttl than the holder's commands').
    (549759013951, None, "a late renewal kept a leased key past the taker's ttl (fixed)"),
    # Found on main in the tenth session (a 240-s search of runs focused on turns with
    # pub/sub refused, from 2**46 + 9.7e7, 46 schedules; shrunk to no fault): a task's
    # manual lock expired, another task of its process won the race for it, and its
    # release at the streak's end named the other process; the expired hold's release
    # came just after and, counted as a new streak's first, woke the head, which took
    # the lock before the process named polled (8 in a row; fixed). Its mutant was
    # killed here until the waiters' wake-ups changed (Attempt.holder_ttl) moved this
    # schedule; 2,000 schedules of its shape did not find it again.
    (70368841183464, [], "a head woken by an expired hold's late release (fixed)"),
    # From 2**42, focused on turns with a process out of line, no fault: a streak of 35
    # holdings on main, where the rule's first limit there was 34 (now 48).
    (4398046615881, None, "a lone streak of 35 with a process out of line (the rule's)"),
    # From 2**43, focused on turns with a process out of line, no fault: at its lone
    # streak's end p0 gave way and its head, hearing the release from the first node,
    # won the race with the process out of line before the release reached the last
    # node; "free on every node" never read, the rule counted 49 holdings in a row
    # (the streak now ends there once the name is free on a quorum: Liveness.racing).
    (8796093022271, None, "checker: a race after a give-way won before every node was free"),
    # Seeds that caught a named mutant until two library fixes (a shortening EXTEND
    # announced; no offers where pub/sub is refused) changed their schedules, kept as
    # regressions (the mutants survive the simulation since; the suite kills them):
    # two "late" bursts, a repair's SET without NX replacing the key of the process
    # that held the lock by then ("repair overwrites another holder's key", faults 0
    # and 1); pub/sub refused, at a streak's end a polling head whose poll was due
    # tried and won ("a polling head tries at its poll just after its process gave
    # way", found on main, fixed).
    (70032279153, [0, 1], "a repair's SET without NX replaced another holder's key"),
    (1099511628058, None, "a polling head beat the process its release named (fixed)"),
    # Found on main while searching for mutants in the seventh session (from 2**44 +
    # 3e7 and 4e7): an extend() under its caller's own deadline found the lock gone on
    # a majority and stopped the renewal without a word (two restarts; fixed), and two
    # false alarms of the checker: a lock_many's names marked run dry when another name
    # ran out ("revived"), and a loss told after a shielded extend() outlived its
    # caller's deadline, counted without the node timeout it waited ("told late").
    (17592226047226, [4, 7], "an extend() that found its lock gone left the body untold"),
    # The ninth session's first 30-minute search on main (from 2**45 + 1e7, 1,482
    # schedules): a connection back after a pause and a stall sent two renewal batches'
    # chunks at one instant, which the "one chunk" rule read as one batch's (it now
    # judges runs without faults only).
    (35184382090313, None, "checker: a reconnect flushed two renewal batches at once"),
    # The second (from 2**45 + 3e7, 6,651 schedules, no fault): a reader of the process
    # whose writer released took the lock 26 µs before that release returned, which the
    # "writers first" rule excused only after it (now within 50 ms either way).
    (
        35184402095482,
        None,
        "checker: a reader won the race just before a writer's release returned",
    ),
    # The third (from 2**45 + 7e7, 5,352 schedules; every process's subscriptions to
    # n0 held back): a waiting writer heard another writer's release late, and a new
    # reader took the lock 50 ms after it, twice (the race now lasts 0.4 s there).
    (35184472094183, None, "checker: a writer heard a release late, subscriptions held back"),
    (17592226046275, [0, 2], "checker: a lock_many read 0 marked its renewed names dry"),
    (17592236045824, [0, 1, 2, 3], "checker: a loss told after a shielded extend() timed out"),
    # A 2-job search from 2**44 + 8e7 (158 schedules; fixed in the eighth session): a node
    # confirmed a head's subscription just as its process's release named the other
    # process; woken by the confirmation, the head tried at once and won (two late
    # subscriptions; streak of 8).
    (17592266044573, [0, 1], "a head woken by a late confirmation beat the process named"),
    # The eighth session's 30-minute search on main, from 2**44 + 1e8 (2 jobs): after
    # 2,149 schedules (138 s), a streak of 8 with no fault (shrunk from 3): a head woken
    # again during its attempt (a shortening extend() announced by three nodes) tried
    # again at once after its process's release had named another process, and won.
    (17592286046564, None, "a head woken before its process gave way tried after it"),
    # The tenth session's last searches on main (from 2**46 + 3e8), two false alarms of
    # the checker: a wait begun as its process's previous queue left the line, counted
    # as in line (streak: its TURN_LEAVE on the way, the new queue out of line for 0.1 s
    # while its subscriptions were held back); and an extend() sent 0.36 s before the
    # validity ended, read after a 1.2-s stall that began as it went out (revived).
    (70369044179252, None, "checker: a wait counted in line by its process's old entry"),
    # (The second with 5 of its 11 faults: with all, its last stall within a step
    # strikes 2 callbacks later on 3.13 than on 3.11, after a reconnect through
    # asyncio's streams; docs/project/testing.md, Determinism.)
    (70369044186868, [1, 2, 4, 7, 8], "checker: an extend() in flight through a long stall"),
    # Kills of two tentative-offer mutants (ninth session) that were the first false
    # alarm's: each counted a wait begun as its process's previous queue left the line.
    # With the rule mended, neither mutant fails there, nor in 2,700 schedules of its
    # shape each (eleventh session); the seeds pass on main and stay.
    (35184397102415, [2], "once: a tentative offer stays tentative until the next refresh"),
    (35184422103604, [0, 2], "once: a head subscribes to its grants only as it joins the line"),
    # A kill that the thirteenth session's fix (a shortening heard after a release of
    # ours gave way) moved: its schedule no longer fails on its mutant (replaced in
    # CAUGHT by a seed found again); it passes on main and stays.
    (17592236046470, [0], "once: a grant of a token taken and let go, made again, kept"),
    # Likewise, a kill that the same fix moved, not found again (3,872 schedules of its
    # shape, 900 s): no fault, a head woken during its attempt, before its process's
    # release named another process, tried again after that release and won (found on
    # main; fixed: the release that gives way clears the head's wake-up).
    (70368939179255, [], "once: a release that gives way leaves the head's wake-up"),
    # Kills that the thirteenth session's second fix (a pause after a split vote) moved
    # (each seed's schedule changed before its mutant's moment; neither 10 minutes of
    # search nor its seed with one fault more or less found them again): they pass on
    # main and stay. Two faults: grants the head's own failed attempt had undone were
    # counted, and the waiter read 0.22 s left on a key no node kept.
    (17592236046488, [0, 1], "once: grants undone by the head's own failed attempt count"),
    # The first search from 2**48 (fourteenth session; shrunk to no fault): a lock_many
    # of another process took the name between two holdings of a process and let it go
    # unheld (its other name timed out); the streak rule saw only bodies, and read the
    # holder's 3 before and 5 after as 8 in a row (now the manager's "acquired" event
    # ends another process's streak: Liveness.taken).
    (281474982719307, [], "checker: a name taken by a lock_many that failed ends a streak"),
    # The nineteenth session's 30-minute search on main from 2**51 + 2e6 (2,172
    # schedules in; focused on a process's death, no fault before it): p1's release
    # at its streak's end granted p0 the lock on two nodes of three; p0's head, woken
    # by the shortening extend() just before, had an attempt under way that failed,
    # and its clean-up deleted the grants; p1's head won the race that followed, 8
    # holdings in a row. A grant undone so now ends a streak, as a give-back does.
    (2251799815687419, None, "checker: a grant undone by its head's own clean-up ends a streak"),
    # Found by the twenty-first session's search from 2**47 + 2e6 against a named
    # mutant (3,356 schedules), failing on main too, no fault needed: p1t2's attempt on
    # "a" failed, the holder's key 306 ms from its end; p1t1's lock_many took "a" as it
    # expired, timed out on "b" and let it go unheld; p1t2 took "a" then, 0.75 s on.
    # The sleeps rule ("woken at the quorum's expiry") was told of holdings only, not of
    # a name taken unheld: it is now excused by the manager's "acquired" event too.
    (140737490358683, None, "checker: a lock_many's name taken unheld ends a sleep"),
    # Kept for "a script first used while the node is down counts as loaded on its next
    # connection" until the twenty-first session's split pause moved its schedule (see
    # CAUGHT): a regression since.
    (140737490355870, [1, 3, 4, 5, 6, 7, 8, 10, 11, 13, 15], "a failed pass-on's clean-up"),
]

#: What the search found on its own with a named mutant of tests/mutants.py applied (a
#: fix of issue 31 reverted, or a rule the simulation could not reach before): the
#: name, the seed, the faults its shrinking kept, and the rule that fails.
CAUGHT: list[tuple[str, int | str, list[int], str]] = [
    # Two pauses: a grant came late from a node the renewal had counted since, and was
    # given back there (the holder's key kept on one node of three).
    ("a late grant of a held token given back", 8589934748, [0, 3], "kept"),
    # The renewal on connections of its own (issue 31's break 1), found from where the
    # search started then (2**35: one timer at a time, failovers): a delay on one node
    # and a "late" burst cut the renewed key with a late EXTEND. (Its first seed,
    # 8589935337, and break 2's second, 35359738677, stopped catching theirs when the
    # seventh session moved the grants' subscription: see the end of this list.)
    (
        "the renewal on connections of its own (a late extend cuts a renewed key)",
        39359738380,
        [1, 2],
        "kept",
    ),
    # From 2**36 (wall clocks apart): no fault at all. p0's clock is 49 s ahead, p1's
    # 50 s behind; with the counters ignored, a token is the acquirer's (or the
    # releaser's) clock, and p1's next one fell 99 s below p0's.
    ("acquire script ignores the stored fencing counter", 68719476739, [], "fencing"),
    # One restart with the same run_id (a restore behind the quarantine's back): only
    # the server's uptime tells the library it lost its keys.
    ("a young server (uptime) is not a restart", 68719477587, [1], "exclusion"),
    # Seeds of REGRESSIONS that still show their bug with its mutant (checked here, so
    # that a change to what a seed draws cannot quietly disarm them: 574 and
    # 35359738591 no longer show theirs; 41, below, shows another).
    (
        "a lock_many release cancelled midway leaves the other names held",
        6406101,
        [2, 4],
        "p1t0: lock",  # a crash: RuntimeError, the name still held by the task
    ),
    ("a reconnect ends a failover's quarantine", 34459738402, [1, 2, 6, 7], "exclusion"),
    # Found by the mutant table's searches at 29b7edf (30 s each, from 2**35), and
    # missed by the next table's 30 s from 2**36: kept, so that every table has them.
    # (37949490764 [1, 2] until a shortening EXTEND announced itself, which changed
    # its schedule; now the regression seed 549759013951, shrunk on that mutant: a
    # handoff passed on a key another process held by then. Found again after the
    # fifteenth session's fix, a handoff to a shorter ttl announced, moved that
    # schedule: 1,601 schedules from 549759013952, 386 s, shrunk to one fault.)
    ("handoff without comparing the old token", 549759015552, [0], "kept"),
    # (38608921387 [1, 2, 3, 4] until the waiters' wake-ups changed, tenth session:
    # Attempt.holder_ttl; then the seed above, shrunk on this mutant, which leaves a
    # failed handoff's token where its clean-up, loaded late, ran first; faults 2 and 5
    # since the fifteenth session's fix, a handoff to a shorter ttl announced, moved
    # the schedule of [2, 3, 5].)
    (
        "a script first used on a connection is not loaded before it",
        549759013951,
        [2, 5],
        "clean-ups leave no token",
    ),
    ("a release cancelled during its handoff cancels the handoff", 36673097411, [0], "liveness"),
    # Found by the table at 5b829b3's searches (from 2**36), with no fault: the orphan
    # rule's first kills (a lock granted to a waiter that had left, and to an attempt
    # that then lost and walked away, held by nobody until its ttl; that one's seed
    # stopped catching it in the seventh session: 200016431 does, below).
    ("a grant for a waiter that left kept", 69379949051, [], "orphan"),
    # The liveness rules' finds in the library (live.py), no fault in the first two: a
    # process held a name 8 times in a row while others waited, its streak restarted
    # when its local queue emptied (by a handoff; by a waiter that gave up); a lost
    # lock's token left in Grants._held (a stall and a pub/sub delay).
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
    # Found by the table at c825ca9 (from 2**37), no fault: the liveness rules'.
    ("a stale offer granted", 137956772765, [], "lost without a fault"),
    (
        "a handoff never sees another process in line (streaks of LONE_STREAK for all)",
        140465158935,
        [],
        "streak",
    ),
    # Found on main by a search from 2**37 (11,911 schedules, no fault): a handoff to
    # the last waiter of a process read that another process was in line, but its
    # taker had left the queue by then, and the process went on alone (LONE_STREAK).
    (
        "a handoff's view of the line is dropped when its taker was our last waiter",
        139912374606,
        [],
        "streak",
    ),
    # Killed at 5b829b3 by a search and missed by c825ca9's 30 s: found again from
    # 2**37 (476 schedules), shrunk to two pauses.
    (
        "a shorter extension in flight does not lower the validity when sent",
        140353145283,
        [2, 3],
        "kept",
    ),
    # The kept rule read between steps too (Recorder.watch), first schedule from 2**37,
    # no fault: a handle read owned during its own release, the key already deleted
    # on the nodes that had applied it.
    ("a handle reads owned while its own release is in flight", 137438953472, [], "kept"),
    # The deployments modelled from 2**38 (run.make_models): the managers given one
    # server twice, as another database number and as a second address; and every
    # node refusing pub/sub, where waiters that do not poll sleep until the holder's
    # PTTL with the lock free (108 schedules from 2**38, no fault).
    ("one server's databases are several nodes", 274877906959, [], "aliases"),
    ("same run_id behind two addresses not refused", 274877906962, [], "aliases"),
    ("waiters do not poll where pub/sub is refused", 274877907051, [], "idle"),
    # From 2**38 half the nudges cancel their waiter as it is next woken (a timer never
    # lands between what woke a task and its running): found after 982 schedules, no
    # fault. A lease and a handoff to a waiter cancelled before it woke, kept.
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
    # From 2**38 a manual lock left to expire may be acquired again by its handle, and
    # a reentrant lock held without renewal, its levels released by hand (a release
    # that read no validity left must raise LockNotOwned): found after 35 and 14
    # schedules, shrunk to no fault.
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
    # The outlives rule (a key kept longer than its holding's longest ttl): a lease to
    # a waiter with a shorter ttl, 5 schedules from 2**38; a lease of a lock held too
    # long, 648 schedules (lost without a fault: a lock_many's taker lost the name it
    # was leased at its first renewal, not confirmed before the leased validity ran
    # out). Both shrunk to no fault.
    ("a lock is leased to a waiter with a shorter ttl", 274877906948, [], "outlives"),
    ("a lock held too long is leased", 274877907592, [], "lost without a fault"),
    # A 150-s search from 2**38 (171 schedules, no fault): the streak rule.
    (
        "a release names the first in line, not the next after the releasing process",
        278888758378,
        [],
        "streak",
    ),
    # Kept seeds that show more once the new rules look (the same table).
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
    # Focused on repair (from 2**40): n1 restarted at 0.17 s, n0 at 4.38 s; without
    # repair a lock and a slot, held since the start, were on one node of three after
    # the second restart, and lost.
    (
        "no repair of nodes that lost a held lock",
        1099511627802,
        [0, 1],
        "lost under restarts far apart",
    ),
    # Focused on stalls (from 2**40): a renewal's replies, slowed by 100 ms on the
    # holder's command connection, arrived during a 0.67-s stall that outlasted the
    # lock's validity, and were read before the deadline's timer: the lock came back
    # to life after the stall's end had read it run out.
    (
        "a renewal confirmed past its deadline brings the lock back",
        1099511636657,
        [2, 3, 5],
        "revived",
    ),
    # Focused on lag (from 2**41): a 3.3-s spell of 54 ms more each way on every link;
    # a renewal that waited only node_timeout (50 ms) for a 0.11-s round trip failed
    # until the deadline, and a lock and a slot of 1.9 s were lost.
    (
        "renewal batch waits only node_timeout (latency-bound renewal)",
        2199023255572,
        [1],
        "lost under lag",
    ),
    # Focused on turns (from 2**41), one process waiting out of line (as an older
    # aiolock's, or on Redis Cluster): the process in line, its handoffs finding
    # nobody else in line, must end its streak after 32 (LONE_STREAK) and release the
    # lock for all; with the mutant it held the name 49 times in a row (no fault).
    (
        "a process alone in line passes the lock on for ever",
        2199023257766,
        [],
        "streak",
    ),
    # The same focus: at its lone streak's end the release named the releasing process
    # itself, the only one in line, and granted the lock to its own head's offer.
    # (2199023258478 until a shortening EXTEND announced itself, which changed its
    # schedule; now the regression seed 8796093022271, whose lone streak's end it
    # turns into 49 holdings in a row.)
    ("the releasing process granted its own offer", 8796093022271, [], "streak"),
    # The same focus, the liveness rules on (a death excuses nothing there): p0 died
    # in line; a release named it, with its offer too old to be granted; without the
    # fallback p1's waiter never tried, the lock free on every node for 0.83 s.
    ("a turn passed over is never taken (no fallback)", 4398046519080, [0], "idle"),
    # From 2**43 (an extend() under a deadline shorter than a round trip), no fault: the
    # caller gave up on an extend() to 1.49 s; unshielded, its fan-out was cancelled and
    # the validity stayed the old one, 0.1 s short of what every node applied.
    ("extend() not shielded from the caller's cancellation", 8796093022217, [], "followed"),
    # From 2**43, focused on leases, no fault, the processes' wall clocks 60 s and 24 s
    # ahead: leases after a PASS_ON that reserved nothing handed out tokens no counter
    # had, and a later acquire, its floor behind them, was given one again. The
    # fencing rule had excused it as counters "never given" the token, which without
    # faults only the library can cause (check._counters_lost).
    ("a PASS_ON reserves no tokens for the leases after it", 8796093022819, [], "fencing"),
    # From 2**43, focused on leases: two delays (n1's links 20 ms slower, 0.67 s long):
    # a PASS_ON's reserve was confirmed on fewer than a quorum, and a lease took its
    # token from it: at the lease's first step 2 of 3 counters were below its token.
    # (Since the fifteenth session's fix, a handoff to a shorter ttl announced, which
    # moved that schedule: a regression seed kept for another case, which has no fault
    # but every node refusing pub/sub; 4 of 5 counters below the lease's token.)
    ("a reserve made on fewer than a quorum is used", 549755934222, [], "backed"),
    # From 2**42, focused on turns, no fault: a holder shortened its 1.3-s lock to 0.46 s
    # and let it expire; a waiter of another process slept 0.64 s on the PTTL it had
    # learnt, the name free. Found on main (fixed: a shortening EXTEND announces itself).
    ("a shortening extend() announces nothing", 4398046531387, [], "idle"),
    # Found again in the seventh session, after the fix for seed 17592196048300 moved the
    # grants' subscription before the first attempt (every schedule with a turn queue
    # changed; the entries these replace caught their mutants no longer): kept seeds that
    # still catch theirs, and seeds the search found, from 2**44 + 3e7 or 4e7 on, shrunk
    # with the mutant applied. A renewal failing on three faults, then the retry raising
    # (all 16 since the fourteenth session's fix, a process that lost a pub/sub
    # connection joining the line again at once, moved the schedule of these three).
    ("a renewal retry path that raises", 41, list(range(16)), "logged"),
    # Two renewals' faults and no process to hold the semaphore's other slot: the release
    # deleted the slot of another holder (one fault).
    ("semaphore release deletes another holder's slot", 17592226044416, [3], "exclusion"),
    # Subscriptions held back (two spells): the confirmation after the attempt did not wake
    # the waiter, which slept while the lock stayed free (the first spell alone since
    # the fifteenth session's fix, a handoff to a shorter ttl announced).
    ("a subscription confirmed late does not wake the waiter", 17592226044771, [0], "idle"),
    # Two restarts far apart (the repair's seed): a failed try left the index bare.
    ("a failed semaphore try writes the index without a ttl", 1099511627802, [0, 1], "bare key"),
    # No fault: a head's own attempt, with the token granted to it, lost, and the grant
    # was left to nobody (a kept seed of REGRESSIONS).
    ("an attempt with the token granted to it loses", 200016431, [], "orphan"),
    # A process died: a grant nobody heard stayed on the nodes (one fault).
    ("a grant nobody hears kept", 17592246044659, [0], "orphan"),
    # No fault, focused on turns: with turns ignored, p0 held the name 8 times in a row.
    ("every waiting process tries on every release (turns ignored)", 17592236045983, [], "streak"),
    # Every node refusing pub/sub (a kept seed): with offers made there, p1 held the name
    # 8 times in a row.
    ("a head offers to take grants though pub/sub is refused", 17592186151447, [], "streak"),
    # One fault, pub/sub refused: the head holding back tried with the token a release of
    # its own process had claimed, and its clean-up deleted the handoff's key on a
    # majority (the break of seed 8796103035398, found again).
    (
        "a head holding back tries though a release claimed its offer meanwhile",
        17592236047098,
        [2],
        "kept",
    ),
    # A process died: a new grant of a token taken and let go was kept, the lock left to
    # nobody (one fault). Found again (thirteenth session: the first seed, 17592236046470,
    # moved by that session's fix) after 294 schedules focused on death (39 s), from
    # 2**47 + 9e6.
    (
        "a grant of a token taken and let go, made again since, is kept",
        140737497359925,
        [0],
        "orphan",
    ),
    # Found on main (two restarts: the key gone from 2 of 3 nodes): an extend() under its
    # caller's own 0.4-ms deadline found the lock gone and stopped the renewal without a
    # word; the body ran on untold (fixed: extend() declares the loss).
    (
        "an extend() that finds the lock gone on a majority stops its renewal untold",
        17592226047226,
        [4, 7],
        "untold",
    ),
    # Found on main (two subscriptions held back): a head woken by a node's late
    # confirmation, just as its process gave way, beat the process named (fixed: it
    # waits the fallback then).
    (
        "a subscription confirmed late wakes the head even as its process gives way",
        17592266044573,
        [0, 1],
        "streak",
    ),
    # The "writers first" rule's first kill (ninth session), by a kept seed with no
    # fault: a writer not given the readers' keys it asked for counts the node held and
    # leaves no intent, and a reader that came after it took the lock while it waited.
    (
        "the writer's script is not given the readers' keys it asked for",
        278888758378,
        [],
        "writers first",
    ),
    # Lost in the seventh session, found again by a search from 2**44 + 1.3e8 (24
    # schedules; one fault, a pause of n0 for 2.6 s): a renewal that extended another
    # token's key on a node counted it as ours, and the holder read 0.38 s left that a
    # quorum did not keep. (With fault 3 too since the fifteenth session's fix, a
    # handoff to a shorter ttl announced, moved the schedule of fault 0 alone.)
    ("renewal batch extends keys of other tokens", 17592316044439, [0, 3], "kept"),
    # The "one chunk" rule's first kill, in the 31st schedule from 'chunks' (plan.V1_FROM) (its
    # renewal in chunks of one lock; shrunk to no fault): every chunk of a batch of
    # two, written at one instant on each node's ordered connection.
    (
        "a renewal batch writes every chunk at once on the shared connection",
        35184372088862,
        [],
        "one chunk",
    ),
    # A 2-minute search for this mutant alone over runs focused on turns with pub/sub
    # refused (search --where focus=turns,pubsub_refused, from 2**45 + 2e7: 583 such
    # schedules; shrunk to no fault): at its streak's end p0 gave way, and its polling
    # head tried at the poll that came due and won; 8 holdings in a row. Found again
    # after the waiters' wake-ups changed (Attempt.holder_ttl, tenth session): 394
    # such schedules from 2**46 + 1.5e8, no fault.
    (
        "a polling head tries at its poll just after its process gave way",
        70368894222431,
        [],
        "streak",
    ),
    # The first kill of a tentative offer's mutant: a 3-minute search over runs focused
    # on turns with subscriptions held back (search --where
    # focus=turns,late_subscriptions, from 2**45 + 2.5e7: 443 such schedules; shrunk
    # to two spells): a grant published before the node had the process's subscription
    # to it, unheard, took a live process out of line; the other held the name 8 times
    # in a row.
    (
        "a grant unheard by a process whose subscription was not in place takes it out of line",
        35184397102415,
        [1, 2],
        "streak",
    ),
    # The same search for the next tentative-offer mutant (134 such schedules; shrunk
    # to one spell): an offer made firm before the node confirmed the subscription,
    # its grant unheard, took the live process out of line; 8 holdings in a row.
    (
        "a process offers firmly before its subscriptions to the grants are confirmed",
        35184397092463,
        [0],
        "streak",
    ),
    # Lost in the seventh session; a 150-s search over runs focused on turns (--where
    # focus=turns, from 2**45 + 3e7) found it in its 7th schedule (shrunk to one spell
    # of p1's subscriptions held back): a head that took over as its process gave way
    # tried at once and won; 8 holdings in a row.
    (
        "a head that takes over as its process gives way tries at once",
        35184402088935,
        [0],
        "streak",
    ),
    # Lost in the seventh session; the same 150-s search over runs focused on turns
    # found it after 590 schedules (shrunk to no fault): a release of an expired hold at
    # the streak's limit started the streak again; 8 holdings in a row.
    (
        "an expired hold's release at the streak's limit starts the streak again",
        35184402098707,
        [],
        "streak",
    ),
    # Found on main in the ninth session (the first search from 'chunks' (plan.V1_FROM), 43
    # schedules; shrunk to no fault): a process named by a release took the lock and
    # held it past its ttl; it expired just before the other process's fallback, which
    # took it out of line; out of line until its next refresh, it waited while the
    # other held the name 8 times in a row (fixed: it is told, and joins again at once).
    (
        "a process taken out of line joins again only at its next refresh",
        35184372089874,
        [],
        "streak",
    ),
    # The first search over runs whose nodes are clusters of one master ('cluster' (plan.V1_FROM),
    # --where cluster; 36 schedules, 3.2 s; no fault): releases announced with PUBLISH,
    # which no SSUBSCRIBE hears; a waiter slept to the holder's PTTL while 'a' was free.
    (
        "releases on a sharded cluster announced with a plain PUBLISH",
        70368744177868,
        [],
        "idle",
    ),
    # The first run focused on short blocks ('step_stall' (plan.V1_FROM), --where focus=block; 1
    # schedule; its 4 stalls within steps, none of them dropped keeps it failing): a
    # fan-out's timer started before a node's requests were written, the loop blocked
    # between, timed the nodes out, their replies waiting to be read (QuorumError).
    (
        "a fan-out's node_timeout counted from before its requests are written",
        70368744177692,
        [0, 1, 2, 3],
        "lost under short blocks",
    ),
    # Found on main by the first schedules focused on turns (from 2**39, no fault): a
    # process named held the lock past the others' fallback, was taken out of line, and
    # the next holder's handoffs found nobody else waiting: 8 holdings in a row (fixed).
    # Since the ninth session a process taken out is told and joins again at once, and
    # the streak no longer shows the mutant; the "stays in line" rule (tenth session)
    # reads the pass over itself, on the node.
    (
        "a process named is passed over while the lock is held (it took it)",
        549755813917,
        [],
        "stays in line",
    ),
    # The "repairs take no key" rule (tenth session) reads the REPAIR on the node: it
    # kills the mutant on a kept seed (a key re-created on a node where another's key
    # had landed meanwhile). (Found again on the kept seeds after waiters' wake-ups
    # changed: Attempt.holder_ttl, tenth session; with fault 1 alone since the
    # fourteenth session's fix moved the schedule of faults 0 and 1.)
    ("repair overwrites another holder's key", 17592236046488, [1], "repairs take no key"),
    # "clean-ups leave no token" (tenth session) reads RELEASE_EITHER on the node: it
    # kills the mutant on a seed kept for another (a handoff that failed its quorum,
    # the waiter's token left on a node by the clean-up; with fault 3 too since the
    # fifteenth session's fix, a handoff to a shorter ttl announced).
    (
        "a failed handoff's clean-up keeps the waiter's token",
        549759013951,
        [1, 2, 3, 5],
        "clean-ups leave no token",
    ),
    # "repairs follow a won renewal" (tenth session) reads each repair as the client
    # writes it: the renewal before it had extended the key on a quorum. It kills the
    # mutant on a regression seed, shrunk with it applied to two restarts (2 nodes of
    # 3): a read-write lock's reader key re-created after a renewal that did not win.
    (
        "repair after a renewal that did not win a quorum",
        64,
        [2, 3],
        "repairs follow a won renewal",
    ),
    # "expired releases announce" (tenth session) reads RELEASE_TURN on the node: one
    # that finds the key expired still names the next in line or announces the lock
    # free. It kills the mutant on the first kept seed (1226, faults 0 to 2).
    (
        "a release that finds its lock expired announces nothing",
        1226,
        [0, 1, 2],
        "expired releases announce",
    ),
    # The first 195 runs focused on chains (tenth session, --where focus=chain, 24 s;
    # shrunk with the mutant applied to two restarts): a holder's renewals repaired two
    # nodes of three, their counters raised to its own token only; its release leased
    # the lock on with a token reserved above it, which no quorum of counters backed.
    # (That seed, 70368744185414 [2, 3], lost it when the sixteenth session's fix moved
    # its schedule; found again from 2**46 + 2e8 focused on chains: 275 schedules, 23 s,
    # shrunk with the mutant applied to two restarts.)
    (
        "a repair raises the counter to the holder's own token only",
        70368944188242,
        [3, 4],
        "backed",
    ),
    # "a refresh without an offer withdraws it" (tenth session) reads TURN_JOIN on the
    # node: it kills the mutant on the seed kept for the head that offered where
    # pub/sub is refused (its offer withdrawn by a refresh without one).
    (
        "a turn queue refresh without an offer keeps the old one",
        17592186151447,
        [],
        "a refresh without an offer withdraws it",
    ),
    # A 240-s search of runs focused on turns with pub/sub refused (tenth session,
    # from 2**46 + 1.2e8, 361 schedules; shrunk to no fault): an expired hold's release
    # with no waiter of ours queued ended the process's streak, which its next waiters
    # then began anew (8 in a row). Found again after the waiters' wake-ups changed
    # (Attempt.holder_ttl): 411 such schedules from 2**46 + 1.5e8, no fault.
    (
        "an expired hold's release ends its process's streak of handoffs",
        70368894224578,
        [],
        "streak",
    ),
    # Found on main by the eleventh session's first 30-minute search (from 2**46 + 5e8,
    # 1,551 schedules, 102 s; focus block, its four blocks all needed): an extend() to
    # 0.449 s, a 0.477-s block as it went out; every node applied it, and it failed on
    # reading the replies, rightly, but said "0 of 3 nodes failed" (fixed). The block
    # focus's rule counts such an extend() apart; the rule "a quorum error names its
    # failed nodes" reads every QuorumError a worker catches.
    (
        "an extend() confirmed after its validity ran out says that no node failed",
        70369244179214,
        [0, 1, 2, 3],
        "a quorum error names its failed nodes",
    ),
    # The eleventh session's second 30-minute search on main (from 2**46 + 5e8 + 1551,
    # 3,437 schedules, 195 s), focused on lag (shrunk to one spell): a renewal batch
    # split into two script calls (BATCH_LIMIT 1, as with over 1,000 locks), a round
    # trip each of 0.11 s against a budget of 0.2 s for the batch: the second call's
    # lock failed every renewal and was lost (fixed: the budget is each call's).
    (
        "a renewal batch's budget covers all its script calls, not each",
        70369244182651,
        [0],
        "lost under lag",
    ),
    # The twelfth session's two, once the world gave its connections sockets (from
    # 'sockets' (plan.V1_FROM), 2**47): a block of 1.256 s, past the stall watchdog's second, in a
    # run focused on blocks with long ones (387 schedules, 98 s, focus block; its one
    # fault): the replies that came meanwhile waited in the socket, and the mutant
    # reset the connection anyway, failing what was in flight (an acquire: a quorum
    # error). And one command link gone silent (35 schedules, 9 s, unfocused; shrunk
    # from 12 faults to it): the mutant kept writing on it, 1.3 s after its first
    # write there; ours reset it at its next request after the watchdog's second.
    # (The first found again after the fifteenth session's fix, a handoff to a shorter
    # ttl announced, moved its schedule: 1,065 schedules from 140737488362378, 275 s,
    # shrunk to one fault; an extend() failed on a quorum.)
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
    # Found on main by the twelfth session's first search from 2**47 (from 2**47 + 1e6,
    # 19,387 schedules, 1,093 s; focus block with long blocks, shrunk to its first
    # block): a release queued behind a turn-queue script in one iteration, a block of
    # 1.356 s before the iteration's end wrote it, then an acquire sent as its first
    # replies were read: the watchdog timed the release from its send, found nothing to
    # read (it had just been written) and reset every connection; the release failed
    # with "no reply for 1.00s" (fixed: a request's wait counts from its write).
    (
        "the stall watchdog times a request from its send, though a block kept it unwritten",
        140737489374714,
        [0],
        "lost under short blocks",
    ),
    # Found on main by the twelfth session's last search from 2**47 (from 2**47 + 4e6,
    # 13,126 schedules, 876 s; focus turns, no fault): a holder shortened its lock with
    # extend() and released it at once, ending its process's streak; the nodes'
    # announcement of the shortening was heard after the release went out, woke the
    # head, whose attempt followed the release on every connection: 8 holdings in a row
    # (fixed: a shortening heard after a release of ours gave way wakes the head only at
    # the fallback, as a missed release does).
    (
        "a shortening heard after its process gave way wakes the head at once",
        140737492368453,
        [],
        "streak",
    ),
    # Stopped as busy in the twelfth session's 20-minute search from 2**47 + 3e6 (5
    # nodes, a restart, 3 processes): a stale key held 2 nodes, and the three processes'
    # waiters, each first on another of the 3 free nodes, split the vote; each
    # clean-up woke them all, and they split it again at once, about 1,850 messages
    # per process per 50 ms, until the run was stopped (fixed: a waiter whose attempt
    # split the vote pauses at random before it tries again). A kept seed stopped as
    # busy fails.
    (
        "a waiter whose attempt split the vote tries again at once",
        140737491357076,
        [0, 1, 2, 3],
        "busy",
    ),
    # Found on main by the twelfth session's second search from 2**47 (from 2**47 + 2e6,
    # 543 schedules, 32 s; unfocused, shrunk to 11 of its 16 faults, silent connections
    # and restarts among them): a failed pass-on's clean-up script was first used while
    # its node was down (its SCRIPT LOAD failed fast), yet counted as loaded; on the next
    # connection, to the node restarted empty, its EVALSHA was answered NOSCRIPT and the
    # EVAL retry ran after a turn-queue script written behind it (fixed: scripts first
    # used with no connection up are loaded as the next one opens).
    # Its kill, lost to the thirteenth session's split pause, came back with the
    # fourteenth session's fix (a process that lost a pub/sub connection joins the line
    # again at once), which moved its schedule again: the clean-up's EVAL retry, run
    # after a later script, deleted nothing. Lost again to the twenty-first session's
    # split pause (its seed a regression since), and not found in 6,052 schedules from
    # 2**47 + 2e6 nor 6,061 from 2**54 + 5e10: the harm needs a later script to matter.
    # The rule "scripts run in order" reads the cause instead, a NOSCRIPT reply (in 300
    # runs from 2**47 + 2e6: 147 in 32 runs with the mutant, none without); kept seed
    # 41 kills it in 2.4 s (shrunk with the mutant applied to 2 of its faults).
    (
        "a script first used while the node is down counts as loaded on its next connection",
        41,
        [8, 11],
        "scripts run in order",
    ),
    # Found on main by the first search of runs whose pub/sub connections drop
    # (fourteenth session, from 2**48 + 7e6, --where drops; 19 schedules, 3.4 s; one
    # fault, every process's pub/sub connections dropped as a release ran): the release
    # granted the lock to the other process, which no node could tell any more; each
    # gave the grant back and took that process out of line, telling nobody, and the
    # holder's process handed the lock to its own waiters 15 times in a row, alone in
    # line for the half second until the other's refresh (fixed: a process that loses
    # a pub/sub connection joins the line again at once).
    (
        "a process whose pub/sub connection dropped joins the line again only at its refresh",
        281474983711000,
        [0],
        "streak",
    ),
    # Found on main by the 30-minute search from 2**48 + 2e7 (fourteenth session, 14,402
    # schedules, 1,068 s; no fault, on clusters, where no turn queue wakes anyone): a
    # waiter slept on the PTTL of a lock that its holder then handed on within its
    # process (PASS_ON) to a task with a shorter ttl; that task's lock expired in its
    # body, its release found it gone and sent nothing, and the name stayed free 0.661 s
    # with the waiter asleep (fixed: such a handoff is announced as a shortening is).
    (
        "a handoff within a process to a shorter ttl announces nothing",
        281474996725057,
        [],
        "idle",
    ),
    # Killed by the mutant table's kept seeds until the fix above moved their schedules;
    # found again (fifteenth session, from 2**43 + 1e5, focused on semaphores: 3
    # schedules, 0.7 s; shrunk to one fault): a slot's renewal failed, and its body
    # found remaining() == 0 without being told.
    ("semaphore body not cancelled on loss", 8796093122290, [10], "untold"),
    # Found on main by the sixteenth session's search from 2**48 + 9e6 (runs focused on
    # turns with dropped pub/sub connections: 2,135 schedules, 519 s; shrunk to the one
    # drop): a process's pub/sub connections dropped just as the holder's release named
    # it; it joined the line again at once, its offer firm, and the release's grant
    # found no subscription yet: undone, and the process taken out of line, telling
    # nobody, until its refresh 0.5 s later; the holder's process, alone in line as its
    # handoffs saw it, held the name 8 times in a row (fixed: until the new connections
    # confirm its subscriptions, its offer is tentative, and the confirmations wake it).
    (
        "a process whose pub/sub connection dropped offers firm before it is subscribed again",
        281474985869760,
        [0],
        "streak",
    ),
    # The first runs focused on handovers (sixteenth session, from 2**50, --where
    # focus=handover: 14 schedules, 1.1 s; shrunk with the mutant applied to no fault):
    # a lock extended to 4.35 s, detached, and attached 1.7 s later, its key reset to
    # 1.47 s; the other process's waiter had read the longer PTTL meanwhile, and slept
    # on while the attached lock expired unreleased, the name free (1 s at least).
    ("an attach that shortens the lock announces nothing", 1125899906842998, [], "idle"),
    # The wire rules on a process's subscription to its grants (subs.py, seventeenth
    # session), on a seed kept for another fix (no fault, 3 nodes): both mutants, costs
    # only for every rule before them, break them at the first wait. p1's offer stayed
    # tentative 0.37 s after every node had confirmed its subscription; and p1 joined
    # the line subscribing to its grants only then, a round trip after its release
    # channel.
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
    # The third wire rule of subs.py (seventeenth session): found by the search from
    # 2**50 against the mutant (925 schedules, 106 s; no fault: runs focused on turns,
    # 3 nodes, a process waiting out of line): p0 heard a release name it, its waiters
    # left without taking the lock, and it left the line announcing nothing (the others
    # would have waited for the fallback, half a second: within the idle rule).
    (
        "a process leaving in its turn does not announce the lock free",
        1125899906843548,
        [],
        "a turn unused is announced",
    ),
    # The fourth (seventeenth session): found by the search from 2**50 + 7e6 focused on
    # dropped pub/sub connections, against the mutant (8 schedules, 2.3 s; shrunk with
    # it applied to the one drop, fault 5): p1's connections dropped while its head
    # waited for {b}; once the new connection confirmed its subscription to the
    # releases again, its head did not try for a second (it slept on the PTTL its last
    # attempt read, while the release it had missed named its process).
    (
        "a subscription confirmed again after a reset does not wake the head",
        1125899913842699,
        [5],
        "woken when subscribed again",
    ),
    # The fifth (seventeenth session): found by the search from 2**50 among runs with
    # pub/sub refused and subscriptions held back, against the mutant (4 schedules,
    # 0.9 s; shrunk with it applied to one fault, p1's subscriptions held up to 0.3 s):
    # p1's head joined the line with an offer after its wait for confirmations ran out,
    # then read the refusal, and tried with the offer still on the nodes.
    (
        "a head that learns pub/sub is refused keeps its offer until the refresh",
        1125899906842792,
        [1],
        "withdrawn at the next attempt",
    ),
    # The rule of sleeps.py (eighteenth session), "woken at the quorum's expiry": found
    # by the search from 2**50 + 8e7 against the mutant (512 schedules, 88 s; no
    # fault): p1's attempt on {a} read 369 ms left on four nodes of five and a rival's
    # fresh key, cleaned up since, on the fifth (942 ms); it slept the longest.
    (
        "a waiter sleeps to the longest ttl among the nodes that said held",
        1125899986843135,
        [],
        "woken at the quorum's expiry",
    ),
    # The rule of given.py (eighteenth session), "the turn given goes first": found by
    # the search from 2**50 + 9.5e7 against the mutant (82 schedules, 10.5 s; runs
    # focused on turns, 3 nodes, shrunk with it applied to two drops of pub/sub
    # connections): every pub/sub connection dropped as p1's release named p0, at its
    # streak's end; p1's head, told of the drop, tried again 1 ms later, not at the
    # fallback.
    (
        "a pub/sub connection lost or refused wakes the head at once though its process gave way",
        1125900056842705,
        [0, 1],
        "the turn given goes first",
    ),
    # The same rule kills, on a seed kept for "turns ignored" (no fault, on turns),
    # "an expired hold's late release wakes the head after its process gave way" (its
    # own seed, 70368841183464, lost it in the fifteenth session): p1's release named
    # another process, and the late release of a hold of p1's that had expired woke its
    # head, which tried 9 ms after, its sleep due 0.32 s later.
    (
        "an expired hold's late release wakes the head after its process gave way",
        17592236045983,
        [],
        "the turn given goes first",
    ),
    # From 'final' (plan.V1_FROM) (nineteenth session), a body may end with an extend(): found by
    # the search focused on turns from 2**51 against the mutant (215 schedules, 85 s;
    # shrunk with it applied to two drops of pub/sub connections): p1's tasks ended
    # bodies with a shortening extend() and released at once, its head woken by the
    # shortening during its attempt; after the release that gave way it tried again at
    # once and won, 8 holdings in a row (a lost kill since the thirteenth session).
    (
        "a release that gives way leaves its head's earlier wake-up standing",
        2251799813689047,
        [1, 2],
        "streak",
    ),
    # Found on main by the first search from 2**51 (nineteenth session: focused on
    # turns, 946 schedules, 279 s; shrunk to its one spell of subscriptions held
    # back): p0's queue emptied while the nodes' confirmations of its subscriptions
    # were on their way, and a new waiter subscribed again at once. The old
    # confirmations were taken for the new ones, its offer went firm while two nodes
    # had it on no channel, and the release that named it granted the lock to nobody
    # there: undone, p0 taken out of line, p1 held the name 8 times in a row. Fixed:
    # only the reply to a channel's last request confirms (Subscriber._answered).
    (
        "a subscription made again is confirmed by the reply to the one before",
        2251799813703477,
        [1],
        "streak",
    ),
    # From 'split' (plan.V1_FROM) (twentieth session), releases split across the nodes: found by
    # the search focused on them from 2**52 + 1e5 against the mutant (581 schedules,
    # 130 s; shrunk with it applied to one split, 3 nodes): p0's head tried as p2's
    # release came; its ACQUIREs found p2's key on every node, n2's "held" coming
    # late, after the decision. p2's release granted p0's offer on n0 and n2, p0's
    # clean-up (sent to n2, its verdict unknown then) deleted the grant there; read
    # from the votes after the clean-up, n2 said "held" and was not counted as
    # cleaned, so its grant, heard 50 ms later, counted: p0 took the lock held on n0
    # alone, while p1 took n1 and n2.
    # The same search against "grants undone by the head's own failed attempt still
    # count" (26 schedules, 8 s from 2**52; shrunk with it applied to 12 of its 32
    # splits, 3 nodes): p1's head's own attempts with its offer's token failed about
    # 2.0 s, as p0's release granted that offer; their clean-ups, one of them split
    # (at once on n0, 0.55 and 1.06 s late on n1 and n2), released the token on the
    # three nodes, the grants included. The grants' messages from n0 and n2, heard at
    # 2.21 and 2.26 s, counted: p1 took the lock, and by 2.53 s it was held on n0
    # alone ("kept"); p2 took it then ("exclusion").
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
    # The rule of lone.py (twentieth session), "a wake-up reads no line", in the first
    # run focused on lone streaks from 2**53 (0.5 s; 4 late subscriptions, which it
    # does not need: it fails without them too): p0's streak, begun
    # while p1 rested, ran on past 4 local turns after releases that only woke its
    # busy head (woken by its own bodies' shortening extend()s), 26 times in the run.
    # (Kept seed 2199023257766 also catches it, in 13 s: local turn 10 in a row.)
    (
        "a release that wakes a busy head goes on believing its process alone in line",
        9007199254741049,
        [],
        "a wake-up reads no line",
    ),
    # Found on main by the first search focused on lone streaks (twentieth session:
    # 324 schedules from 2**53, 101 s; every node refusing pub/sub, no fault needed):
    # an expired hold's late release of p0's gave way, and p0's polling head held back
    # for it; 0.11 s later another task of p0's released the name, naming p1 again,
    # and the head, still in the wait for the first, tried when that wait ended, 50
    # ms after the second release, before p1's poll. Fixed: the head holds back again
    # for the later give-way (Waiting.acquire).
    (
        "a head holding back for one give-way of ours tries though we gave way again",
        9007199254748187,
        [],
        "the turn given goes first",
    ),
    # From 'grants' (plan.V1_FROM) (twenty-first session), runs focused on grants under rolling
    # pauses: issue 31's second break, which the search from 2**53 no longer reached
    # in 5 minutes (4,029 schedules), found by the default search from 2**54 against
    # the mutant in 41 schedules (2.8 s; shrunk with it applied to 3 of its pauses).
    (
        "a late grant of a held token given back",
        18014398509482024,
        [0, 1, 2],
        "kept",
    ),
    # Seen as busy by the searches from 2**53 (twentieth and twenty-first sessions; on
    # main, where a search reports it apart): a stale key held 2 nodes of 5, a third
    # had failed over (quarantined), so nobody could win; the 2 waiters' attempts took
    # the 2 free nodes and split the vote, and each clean-up woke the other at once:
    # 300,000 messages by 5.2 s. Fixed: the split pause doubles at every split vote of
    # a wait (_votes.split_pause).
    (
        "a split vote's pause does not grow with the split votes before it",
        9007199254741396,
        [0, 1, 2, 3],
        "busy",
    ),
    # Found on main by the rule "scripts run in order" in the twenty-first session's
    # 30-minute search from 2**54 + 3e10 (185 schedules, 11.8 s; shrunk to its one
    # fault, a slow command link): a read-write lock's script, first used on a
    # connection gone silent, counted as loaded; its next EVALSHA reset that connection
    # (the watchdog) as it was sent, and went out on the new one without a load: NOSCRIPT.
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
