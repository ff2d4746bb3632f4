"""The checker: the chaos checker's rules over a simulated history.

Safety (a violation fails the run):

* **exclusion**: two holdings of one lock name never overlap: a step of one (a moment
  it believed it held the lock, ``remaining() > 0``) never falls between the first and
  the last step of another. A semaphore never has more than ``limit`` holdings at once;
  a write lock never shares its time with any other holding of its rwlock.
* **fencing**: the tokens of one name increase in the order its holdings began, unless
  more than a minority of the nodes had lost the counter that made the earlier token
  (restarted empty since it was made, or never given it) when the later began: then
  only the acquirers' wall clocks order them, as safety.md ("Fencing tokens") says. Read
  from the nodes at each lock holding's first step. In a run without faults every
  node got every write, so only a counter that expired counts as lost there: a
  counter below a token its holder was given is the library's own doing (a lease's
  token that no handoff reserved). (From version 1's ``skew`` on the
  processes' wall clocks differ: before, one clock for all kept tokens increasing
  whatever the counters did.)
* **backed**: at a lock holding's first step, a quorum of nodes' fencing counters are
  at least its token, but for nodes that lost their data since its acquire began
  (safety.md, "Fencing tokens": a token is handed out only once a majority's counters
  reached it; a lease's, once a quorum confirmed the reserve it comes from). Read
  from the nodes (``Recorder.backs``).
* **kept**: at every step of a lock's holding, a quorum of nodes keep the lock's key
  at least until the step's validity ends (a node restarted since the holding's
  acquire began counts as keeping it while its quarantine lasts, ``restart_grace`` after it came
  back: the quarantine keeps the others out there; then the holder must have repaired
  its key there). The real-server
  suite's ``watching`` rule (tests/test_late.py), read at every step without a
  sampling delay, and between steps after every command a node runs, for every lock
  handle that has stepped (``Recorder.watch``: inside ``extend()``, during a release
  or a handoff). It needs no rival: a key cut short under a holder is a violation
  even when nobody happened to take the lock in the gap.
* **outlives**: no node keeps a lock's key, with its holder's token, longer from now
  than the longest ttl the holding asked for (its handle's, or an ``extend()``'s), its
  clock's drift allowed, and the library's drift allowance for the longest ttl any
  holding of the name asked for (a lease passes the key on with its holder's counted
  validity, which the nodes outlast by that): a holder that died now would leave its
  lock held by nobody for longer than it asked. Read after every command
  (``Recorder.watch``).
* **told in time**: a renewed holder whose lock is lost is told (its body cancelled)
  before its last validity estimate ends, at least half the guard before it (a body
  inside ``extend()`` a node_timeout later: the extension is shielded), unless a
  client stall overlapped the time it was due to be told (the loop was blocked); a renewed body
  never finds ``remaining() == 0`` without having been told.
* **revived**: a lock whose body read ``remaining() == 0`` never reads more again,
  for that hold: the holder may have acted on it (API.md: a lost lock stays lost),
  even when a renewal's confirmation is read after its deadline (a loop stall held
  it). Read after every command a node runs (``Recorder.watch``).
* **followed** (from version 1's ``tight`` on, where such deadlines are drawn): once
  an ``extend()`` has settled, also one whose caller gave up waiting for it, the
  lock's validity follows what the nodes applied (API.md: it completes even if
  cancelled): it ends no earlier than a quorum keeps the key, less the drift
  allowances and a round trip. Read at a holder's steps, in runs without faults, for
  locks without renewal, after an extension with no other in flight
  (``Recorder.follows``).
* **no stray key**: once every manager has closed and the longest ttl has passed, no
  node keeps a lock or slot key, and no key of ours lives without a ttl but the fencing
  counters.
* **no bare key**: no command leaves a key it names alive without a ttl, but the
  fencing counters and the readers' set (read after every command a node runs:
  ``SimNode._note_bare``). The stray-key rule sees such a key only if nothing set a ttl
  on it again before the end (a failed semaphore try that wrote the index anew
  without one, found once by seed 41, was hidden by the next successful try).
* **no crash**: no operation raises anything but the documented ``LockError``\\ s and
  the cancellation asked for; the loop reports no exception in a callback; the
  library logs nothing at ERROR (a renewal tick that raised is caught and logged, and
  the run goes on: ``run.Logged``).
* **contract**: a release by hand of a handle that read no validity left just before
  raises ``LockNotOwned`` (``Worker._release``).
* **aliases** (from version 1's ``models``, in the runs that model it): managers given
  one server twice refuse to start, before any I/O for another database number, at
  connect for a second address (``run.aliases_refused``).

Liveness, in schedules without faults (live.py): no waiter waits while its name is free
on every node ("idle"), a process hands a name to its own waiters only so many times in
a row while another waits ("streak"), nothing is lost ("kept held"), and a manager at
rest keeps no renewal, queue or held token ("at rest", with faults too); with the
no-orphan rule (workload.Recorder.look_for_orphans). A run stopped as busy (a livelock)
is reported apart.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .workload import NODE_TIMEOUT, Holding


def _span(h: Holding) -> tuple[float, float]:
    return h.steps[0][0], h.steps[-1][0]


def _drawn(h: Holding) -> float:
    """The earliest ``h``'s token can have been drawn: its first step, or when its
    ``lock_many`` began (which takes its first name long before that)."""
    return h.steps[0][0] if h.drawn is None else min(h.drawn, h.steps[0][0])


def _noted(holdings: list[Holding], rule: str, attr: str, what: str = "") -> list[str]:
    """Each holding's first breach of ``rule``, as the run described it in ``attr``."""
    return [
        f"{rule}: {h.owner} {h.domain} token {h.token}: {what}{getattr(h, attr)}"
        for h in holdings
        if getattr(h, attr) is not None
    ]


def check_outlives(holdings: list[Holding]) -> list[str]:
    return _noted(holdings, "outlives", "outlives")


def check_exclusion(holdings: list[Holding], *, faults: bool = True) -> list[str]:
    """The exclusion and fencing rules; ``faults``: whether the run had any (see
    :func:`counters_lost`)."""
    problems: list[str] = []
    by_domain: dict[tuple[Any, ...], list[Holding]] = defaultdict(list)
    # One record per acquisition (levels, detach + attach: one Holding, see workload.py),
    # never merged by token: records once merged by token hid a lease that handed out
    # its holder's own token (two holders, one token: the fencing rule below sees it).
    for h in holdings:
        if h.steps:
            by_domain[h.domain].append(h)
    for domain, group in sorted(by_domain.items(), key=lambda kv: repr(kv[0])):
        group.sort(key=lambda h: _span(h)[0])
        kind = domain[0]
        if kind == "lock":
            problems += _check_fencing(domain, group, faults=faults)
        # Every holding against those that began before it and were still working.
        for i, b in enumerate(group):
            first_b, _last_b = _span(b)
            overlapping = [a for a in group[:i] if _span(a)[1] > first_b]
            if kind == "lock" and overlapping:
                a = overlapping[0]
                problems.append(
                    f"exclusion: {domain}: {b.owner} (token {b.token}) began at {first_b:.6f} "
                    f"while {a.owner} (token {a.token}) still held it until {_span(a)[1]:.6f} "
                    f"(its steps believed valid until {a.steps[-1][1]:.6f})"
                )
            elif kind == "sem" and len(overlapping) + 1 > domain[2]:
                owners = ", ".join(a.owner for a in overlapping)
                problems.append(
                    f"exclusion: {domain}: {b.owner} began at {first_b:.6f} while "
                    f"{owners} held slots"
                )
            elif kind == "rw":
                clash = [a for a in overlapping if "w" in (a.mode, b.mode)]
                if clash:
                    problems.append(
                        f"exclusion: {domain}: {b.owner} ({b.mode}) began at "
                        f"{first_b:.6f} while {clash[0].owner} ({clash[0].mode}) held it"
                    )
    return problems


def _check_fencing(domain: Any, group: list[Holding], *, faults: bool) -> list[str]:
    """Tokens increase in acquisition order: in the order ``group``'s holdings began.

    Only where one's token was drawn after the other ended (``_drawn``) is that order
    the order in which the nodes gave them the lock. Two holdings that overlap broke
    exclusion (a rule of its own), and which of them the nodes gave the lock first their
    replies do not tell: a token that does not increase there is reported as ``fencing,
    overlapping``, which binds where exclusion does (a run whose faults break the timing
    assumptions judges it as advisory: see run.BINDING; the fenced resource binds
    there).
    """
    problems: list[str] = []
    for i, b in enumerate(group):
        if b.token is None:
            continue
        for a in group[:i]:
            if a.token is None or b.token > a.token or counters_lost(a, b, faults=faults):
                continue
            rule = "fencing" if _span(a)[1] <= _drawn(b) else "fencing, overlapping"
            problems.append(
                f"{rule}: {domain} token {b.token} ({b.owner}) began after {a.token} ({a.owner})"
            )
            break  # (its first)
    return problems


def counters_lost(a: Holding, b: Holding, *, faults: bool = True) -> bool:
    """Whether so many nodes had lost the counter that made ``a``'s token when ``b``
    began that ``b``'s quorum may have met none of them: the one case where the promise
    of increasing tokens rests on the acquirers' wall clocks alone
    (safety.md, "Fencing tokens": more than a minority failed in total, never given the
    token, or restarted empty since).

    The nodes that had a counter at least ``a``'s token when ``a`` began, and have not
    lost their data since (restart, failover), still have one (counters never
    decrease while they exist): when they are more than a minority, ``b``'s quorum
    includes one of them. (Read from what the nodes lost, not from their counters
    when ``b`` began: a library whose counters go back must not excuse itself.)

    Without ``faults`` no node failed or was left out, so a live counter below ``a``'s
    token means no write ever gave it that token: not lost, never made. Only a counter
    that had expired (``fence_retention``) counts as lost then. (The search found this
    exception excusing a PASS_ON that reserved no tokens: the leases after it handed
    out tokens no counter had, and a process whose wall clock was behind was given
    one of them again.)
    """
    if a.token is None or a.counters is None or a.resets is None or b.resets is None:
        return False
    nodes = len(a.counters)
    kept = sum(
        1
        for value, before, after in zip(a.counters, a.resets, b.resets, strict=True)
        if value is not None and (value >= a.token or not faults) and before == after
    )
    return kept < nodes - (nodes // 2 + 1) + 1


def check_kept(holdings: list[Holding]) -> list[str]:
    return _noted(holdings, "kept", "short")


def _stalled(stalls: list[tuple[float, float]], start: float, end: float) -> bool:
    """Whether the loop was blocked at some moment from ``start`` to ``end``."""
    return any(s_start <= end and s_end >= start for s_start, s_end in stalls)


def check_revived(holdings: list[Holding]) -> list[str]:
    """The revived rule: a lock's validity, once its holder read it run out, never comes
    back (``Holding.revived``)."""
    return _noted(holdings, "revived", "revived", "it read remaining() == 0, then ")


def check_backed(holdings: list[Holding]) -> list[str]:
    """The backed rule: a lock's token, when its holding began, was backed by a quorum
    of counters (``Holding.unbacked``)."""
    return _noted(holdings, "backed", "unbacked", "at its first step, ")


def check_followed(holdings: list[Holding]) -> list[str]:
    """The followed rule: after an ``extend()`` settled, the validity is what the
    nodes applied (``Holding.unfollowed``)."""
    return _noted(holdings, "followed", "unfollowed", "after extend(), ")


def check_told(
    holdings: list[Holding],
    stalls: list[tuple[float, float]],
    freezes: dict[int, list[tuple[float, float]]] | None = None,
) -> list[str]:
    """The told-in-time rule; ``stalls``: when the loop was blocked (every process),
    ``freezes``: when each process was paused (its own code only): a process that
    does not run is told nothing."""
    problems: list[str] = []
    for h in holdings:
        if not h.renewed or not h.steps:
            continue
        process = int(h.owner[1:].split("t")[0])
        blocked = [*stalls, *(freezes or {}).get(process, [])]
        last_now, valid_until = h.steps[-1]
        guard = min(h.ttl / 5, max(3 * NODE_TIMEOUT, 0.05))
        if h.told_at is not None:
            margin = valid_until - h.told_at
            first_now, first_valid = h.steps[0]
            if first_valid - first_now < guard:
                # Acquired with less than the guard left (a slow last attempt): told at
                # once, which cannot be guard / 2 early. (A finding: acquire() returns
                # such a lock; see docs/project/testing.md.)
                continue
            if h.told_in_extend:
                # An extend() in flight is shielded: the body's cancellation waits for
                # its replies, at most a node_timeout (the body does nothing meanwhile).
                margin += NODE_TIMEOUT + 0.001
            if margin < guard / 2 and not _stalled(
                blocked, min(last_now, valid_until - 2 * guard), h.told_at
            ):
                problems.append(
                    f"told late: {h.owner} {h.domain} token {h.token} told at "
                    f"{h.told_at:.6f}, {margin * 1000:.1f} ms before its validity "
                    f"ended (guard {guard * 1000:.0f} ms)"
                )
        elif h.ran_out is not None and not _stalled(
            blocked, min(last_now, valid_until - 2 * guard), h.ran_out
        ):
            problems.append(
                f"untold: {h.owner} {h.domain} token {h.token} found remaining() == 0 "
                f"at {h.ran_out:.6f} without being told (last step {last_now:.6f}, "
                f"valid until {valid_until:.6f})"
            )
    return problems


def may_be_bare(key: bytes) -> bool:
    """Whether ``key`` may live without a ttl: a fencing counter (it must outlive every
    holder), or the readers' set. Known, left for an issue: a reader that never
    releases on a node leaves its id in the readers' set, which has no ttl (only a
    writer's try prunes it). A ttl on the set alone would be unsafe (renewal extends
    only the reader's own key). Memory, not exclusion."""
    return key.endswith((b":fence", b":rw:r"))


def check_bare(bare: dict[bytes, tuple[float, int]]) -> list[str]:
    """The bare rule: ``bare`` maps each key a command left without a ttl to when and
    where it first did (World.bare)."""
    return [
        f"bare key: at {when:.6f} n{node} keeps {key!r} without a ttl"
        for key, (when, node) in sorted(bare.items(), key=lambda item: item[1])
        if not may_be_bare(key)
    ][:1]


def check_keys(keys: dict[int, dict[bytes, float | None]]) -> list[str]:
    """``keys``: per node, the keys alive after the managers closed and the ttls passed."""
    problems = []
    for node, alive in sorted(keys.items()):
        for key, expiry in sorted(alive.items()):
            if may_be_bare(key):
                continue
            if expiry is None:
                problems.append(f"stray key: node {node} keeps {key!r} without a ttl")
            elif key.endswith(b"}") or b":slot:" in key:
                problems.append(f"stray key: node {node} keeps {key!r} after every holder left")
    return problems
