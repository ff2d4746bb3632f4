"""The deterministic simulation's command line (``nox -s sim`` runs it).

    python -m tests.sim search [--first N] [--count K | --seconds S] [--jobs J] [--where T,..]
    python -m tests.sim replay SEED [--keep 0,3] [--around 40]
    python -m tests.sim shrink SEED
    python -m tests.sim mutants [NAME ...] [--count K | --seconds S] [--first N] [--where T,..]
    python -m tests.sim digests [--first N] [--count K | --kept]
    python -m tests.sim regressions [--first-for NAME | --part I/N]
    python -m tests.sim findings
    python -m tests.sim refind [NAME ...] [--count K] [--jobs J]

``search`` plays seeds first, first + 1, ... and stops at the first failing one, which
it prints with the command that replays it (``--where``: only the seeds whose run has
every tag given, see ``run.shape``: ``--where focus=turns,pubsub_refused``); ``replay``
plays one seed (with only the faults numbered in ``--keep``) and prints its history
around the first violation (or whole, with ``--around 0``) and its digest; ``shrink``
finds the fewest faults of a failing seed that still fail; ``mutants`` applies each
named mutant of tests/mutants.py in turn, replays the seeds kept as tests (what the
suite replays on every run) and, if none fails, searches until the simulation kills it
or its budget is spent (``--count``: that many schedules, which finds the same on a busy
machine as on an idle one, as seeds are judged in order; ``--seconds``: that long);
``regressions`` replays the kept seeds and reports those that fail (``--first-for NAME``:
the seeds kept for that named mutant first, stopping at the first failure, as
``mutants`` does; ``--part I/N``: every N-th seed from the I-th, as the suite
shares them out; a kept seed whose run is stopped as busy, a livelock, fails too, as its
replay does, though a search reports such seeds apart); ``digests`` prints each seed's
history digest, one per line (or each seed kept as a test, with the faults it keeps:
``--kept``); ``nox -s determinism`` compares them across Python versions, but for
the lines marked as this Python's (a version-1 stall within a step: ``Result.portable``);
``refind`` checks that each ``kept.CAUGHT`` seed still kills its mutant, and prints a
new entry for each that does not (see :func:`refind`).

The history is the same, byte for byte, for the same seed: ``PYTHONHASHSEED`` is fixed
(the command re-executes itself with ``PYTHONHASHSEED=0`` when it is not).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING

from .kept import CAUGHT, REGRESSIONS, SCHEDULES, kept, target
from .plan import LATEST, Plan
from .run import Result, Schedule, run, shape, shrink

if TYPE_CHECKING:
    from tests.mutants import Mutant

ROOT = Path(__file__).resolve().parents[2]


def _show(result: Result, around: int) -> None:
    lines = result.history
    if around and result.failed:
        first = next(i for i, line in enumerate(lines) if "VIOLATION" in line)
        header = [
            line
            for line in lines
            if " planned #" in line or " config " in line or " wall clocks " in line
        ]
        print("\n".join(header))
        print("...")
        lines = lines[max(len(header), first - around) : first + 5]
    print("\n".join(lines))
    print(
        f"seed {result.plan}: {'FAILED' if result.failed else 'ok'}, {result.holdings} "
        f"holdings, {len(result.faults)} faults, counts {result.counts}, digest {result.digest()}"
    )
    for problem in result.violations:
        print("VIOLATION", problem)


class _Runaway(KeyboardInterrupt):
    """Raised by the alarm into whatever runs: a KeyboardInterrupt, the one kind that
    asyncio lets out of a task and that no ``except Exception`` in the library swallows
    (an Exception was: the renewer logged it as a failed tick and the run went on)."""


def _alarm(_signum: int, _frame: object) -> None:
    raise _Runaway


#: How ``digests`` marks a history that differs between Python versions by design.
PER_PYTHON = "(this Python's)"
#: What a kept seed's replay says when its run was stopped as busy (a livelock: see
#: World.max_deliveries); a search reports such seeds apart.
BUSY = "busy: the run was stopped as a livelock (too many messages)"
#: CPU seconds a schedule may take before the search reports it (normal: under 3 s).
#: CPU, not real time: a loop that spins burns it, while a schedule held up by the
#: machine's other work, or by a search paused (SIGSTOP), does not, and is judged alike.
RUNAWAY_SECONDS = 60
#: The address space a search worker may use (a schedule normally needs well under 1 GiB).
#: Over it, the schedule is reported with its seed: a worker the kernel kills for memory
#: (a runaway schedule can reach tens of GB) would lose its seed, and hang the pool.
MEMORY_LIMIT = 4 << 30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _guarded(plan: Plan | Schedule, keep: list[int] | None = None) -> Result | str:
    """Play ``plan`` within the runaway limits: its result, or why it ran away.

    (The memory limit is set once per process: by the pool's initializer, or replay.)
    """
    signal.signal(signal.SIGPROF, _alarm)
    signal.setitimer(signal.ITIMER_PROF, RUNAWAY_SECONDS)  # (the process's CPU time)
    try:
        return run(plan, keep)
    except _Runaway:  # neither busy nor stopped: a task that never awaits?
        return f"runaway: over {RUNAWAY_SECONDS} s of CPU time"
    except MemoryError:
        return f"runaway: over {MEMORY_LIMIT >> 30} GiB of memory"
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


def _one(plan: Plan) -> tuple[Plan, bool, int, list[str], bool]:
    result = _guarded(plan)
    if isinstance(result, str):
        return plan, True, 0, [result], False
    return plan, result.failed, result.holdings, result.violations, result.busy


def search(
    first: int,
    count: int | None,
    seconds: float | None,
    jobs: int,
    where: frozenset[str] = frozenset(),
    *,
    version: int = LATEST,
) -> int:
    """Play seeds until one fails (exit 1), ``count`` pass, or ``seconds`` run out.

    ``where``: only the seeds whose run has these tags (``run.shape``); ``count``
    counts the seeds looked at.

    Seeds go to the workers one at a time, a few per worker ahead, and come back in
    order. A worker that dies (killed by the kernel, or aborted by a Lua panic) breaks
    the pool: the seeds it may have been playing are printed, and the search fails,
    rather than wait for ever for a result that will never come.
    """
    started = time.monotonic()
    span = range(first, first + count) if count is not None else range(first, 2**62)
    plans = (Plan(seed, version) for seed in span)
    seeds = plans if not where else (plan for plan in plans if where <= shape(plan))
    played = holdings = 0
    busy: list[Plan] = []
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_limit_memory) as pool:
        ahead: deque[tuple[Plan, Future[tuple[Plan, bool, int, list[str], bool]]]] = deque()

        def fill() -> None:
            while len(ahead) < 4 * jobs and (seed := next(seeds, None)) is not None:
                ahead.append((seed, pool.submit(_one, seed)))

        fill()
        while ahead:
            seed, future = ahead.popleft()
            try:
                seed, failed, held, violations, stopped = future.result()
            except BrokenProcessPool:
                playing = [seed, *(s for s, _ in ahead)]
                print(
                    f"a search worker died (killed for memory, or aborted) while playing one "
                    f"of seeds {playing}, after {played} schedules: replay each with "
                    f"python -m tests.sim replay SEED"
                )
                return 1
            played += 1
            holdings += held
            if stopped:
                busy.append(seed)
            if failed:
                took = time.monotonic() - started
                print(f"seed {seed} FAILED after {played} schedules ({took:.1f} s):")
                for problem in violations:
                    print("  ", problem.splitlines()[0])
                print(
                    f"replay: python -m tests.sim replay {seed}   "
                    f"(nox -s sim -- replay {seed}); shrink: python -m tests.sim shrink {seed}; "
                    f"keep it: {seed} in tests/sim/kept.py",
                    flush=True,
                )
                pool.shutdown(cancel_futures=True)
                return 1
            if seconds is not None and time.monotonic() - started > seconds:
                pool.shutdown(cancel_futures=True)
                break
            fill()
    took = time.monotonic() - started
    print(
        f"{played} schedules from seed {Plan(first, version)}, {holdings} holdings checked, "
        f"no violation, {took:.1f} s ({played / took:.0f} schedules/s)"
    )
    if busy:  # liveness, reported apart
        shown = ", ".join(map(str, busy[:10]))
        print(f"{len(busy)} stopped as busy (a livelock?): seeds {shown}")
    return 0


def _shown(seed: Plan | Schedule, keep: list[int] | None) -> str:
    """The seed as ``replay`` takes it: ``--keep ''`` keeps no fault, none given all."""
    return f"{seed}" + ("" if keep is None else f" --keep '{','.join(map(str, keep))}'")


def regressions(first_for: str | None = None, part: tuple[int, int] = (0, 1)) -> int:
    """Replay the kept seeds (with the faults each keeps); 1 if any fails.

    ``first_for``: a named mutant's name; the seeds kept for it go first (as the
    suite runs a mutant's own tests first: ``tests/mutants.py``), and the first failure
    ends the replay. ``part``: (i, n), every n-th seed from the i-th, as the suite
    shares them among its workers; every failure is then reported.
    """
    seeds = kept()
    if first_for is not None:
        own = [(target(seed), keep) for name, seed, keep, _ in CAUGHT if name == first_for]
        seeds = own + [entry for entry in seeds if entry not in own]
    index, parts = part
    seeds = seeds[index::parts]
    failed = 0
    for seed, keep in seeds:
        result = _guarded(seed, keep)
        shown = _shown(seed, keep)
        if isinstance(result, str) or result.failed or result.busy:
            problems = [result] if isinstance(result, str) else result.violations or [BUSY]
            print(f"kept seed {shown} FAILED:")
            for problem in problems:
                print("  ", problem.splitlines()[0])
            failed += 1
            if first_for is not None:
                return 1
    if failed:
        print(f"{failed} of {len(seeds)} kept seeds failed")
        return 1
    print(f"{len(seeds)} kept seeds replayed, no violation")
    return 0


def mutants(
    names: list[str],
    budget: tuple[str, float],
    jobs: int,
    first: int | None,
    where: str | None = None,
    *,
    version: int = LATEST,
    search_only: bool = False,
) -> int:
    """Each named mutant applied in turn; the kept seeds (unless ``search_only``), then
    the search (from ``first``, else search's default), must find a violation within
    ``budget``: ``("--count", schedules)`` or ``("--seconds", seconds)``."""
    from tests.mutants import MUTANTS, run_mutated

    chosen = [m for m in MUTANTS if not names or m.name in names]
    survived = []
    for mutant in chosen:
        started = time.monotonic()
        search = ["search", budget[0], f"{budget[1]:g}", "--jobs", str(jobs)]
        search += ["--first", str(first)] if first is not None else []
        search += ["--where", where] if where else []
        search += ["--version", str(version)]
        replay = ["regressions", "--first-for", mutant.name]
        out = (
            None
            if search_only
            else run_mutated(mutant, [sys.executable, "-m", "tests.sim", *replay])
        )
        if out is None or out.returncode != 1:  # (the kept seeds let it through: search)
            out = run_mutated(mutant, [sys.executable, "-m", "tests.sim", *search])
        took = time.monotonic() - started
        killed = out.returncode == 1
        lines = out.stdout.strip().splitlines()
        found = [i for i, line in enumerate(lines) if "FAILED" in line]  # kept or searched
        detail = (
            " / ".join(lines[found[0] : found[0] + 2])
            if found
            else lines[-1]
            if lines
            else out.stderr[-300:]
        )
        print(
            f"{'killed  ' if killed else 'SURVIVED'} {took:6.1f}s  {mutant.name}: {detail}",
            flush=True,
        )
        if not killed:
            survived.append(mutant.name)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} named mutants killed by the simulation")
    return 1 if survived else 0


def refind(names: list[str], count: int, jobs: int) -> int:
    """Each ``kept.CAUGHT`` entry (of the mutants named, else all) that no longer
    catches its mutant on its rule, found again (see :func:`_found_again`); prints the
    entry for kept.py. A change to the library's timing moves every history after it
    (docs/project/testing.md). Each mutant is applied to this tree while its commands
    run, as ``mutants`` does."""
    from tests.mutants import MUTANTS

    by_name = {m.name: m for m in MUTANTS}
    lost = 0
    for name, seed, keep, rule in CAUGHT:
        if names and name not in names:
            continue
        sim = functools.partial(_mutated, by_name[name])
        if f"VIOLATION {rule}:" in sim("replay", str(seed), "--keep", ",".join(map(str, keep))):
            print(f"still caught  {name}", flush=True)
            continue
        found = _found_again(sim, name, target(seed), count, jobs)
        broke = re.search(r"^VIOLATION ([^:]+):", found[2], re.MULTILINE) if found else None
        if found is None or broke is None:
            print(f"NOT FOUND     {name}: no kept seed, nor {count} schedules after {seed}")
            lost += 1
            continue
        plan, faults, _ = found
        kept_faults = [int(n) for n in faults.split(",") if n]
        entry = (name, int(plan) if plan.isdigit() else plan, kept_faults, broke[1])
        print(f"found again   {entry!r},", flush=True)
    return 1 if lost else 0


def _mutated(mutant: Mutant, *args: str) -> str:
    """What ``python -m tests.sim ARGS`` prints with ``mutant`` applied."""
    from tests.mutants import run_mutated

    return run_mutated(mutant, [sys.executable, "-m", "tests.sim", *args]).stdout


def _found_again(
    sim: Callable[..., str], name: str, plan: Plan | Schedule, count: int, jobs: int
) -> tuple[str, str, str] | None:
    """A plan that kills the mutant ``sim`` runs with: ``(plan, faults kept, its
    replay)``. Another kept seed, with the faults it keeps (all, if it keeps all), else
    the first of ``count`` schedules from the seed after ``plan``'s in its version (the
    generator's aim), else of about ``count`` of the newest version's with ``plan``'s
    focus and kinds of fault (:func:`_aim`), shrunk."""
    out = sim("regressions", "--first-for", name)
    kept_seed = re.search(r"^kept seed (\S+)(?: --keep '([\d,]*)')? FAILED:", out, re.MULTILINE)
    if kept_seed is not None:
        found, faults = kept_seed[1], kept_seed[2]
        if faults is not None:
            return found, faults, sim("replay", found, "--keep", faults)
        out = sim("replay", found)
        played = re.search(r"holdings, (\d+) faults", out)
        return found, ",".join(map(str, range(int(played[1]) if played else 0))), out
    if not isinstance(plan, Plan):
        return None
    searches = [("--version", str(plan.version), "--count", str(count))]
    aim = _aim(plan)
    alike = sum(aim <= shape(Plan(seed)) for seed in range(1, 1501))  # (of the newest's)
    if alike:  # (so many looked at that about ``count`` are played)
        searches.append(("--where", ",".join(sorted(aim)), "--count", str(count * 1500 // alike)))
    for search in searches:
        out = sim("search", "--first", str(plan.seed + 1), *search, "--jobs", str(jobs))
        searched = re.search(r"^seed (\S+) FAILED", out, re.MULTILINE)
        if searched is not None:
            out = sim("shrink", searched[1])
            return searched[1], out.rstrip().rsplit("--keep", 1)[-1].strip(), out
    return None


#: The tags of a plan's shape (``run.shape``) that an aimed search keeps, with its focus.
AIMED = frozenset({"late_subscriptions", "pubsub_refused", "drops", "no_fault"})


def _aim(plan: Plan) -> frozenset[str]:
    """What a search for plans like ``plan`` asks of them: its focus and its faults'
    kinds of trouble (not its node count, which the newest version draws apart)."""
    return frozenset(tag for tag in shape(plan) if tag.startswith("focus=") or tag in AIMED)


def findings() -> int:
    """Print docs/project/findings.md: every kept seed or schedule, what it found, and
    the first commit that recorded it (``git log -S``)."""

    def first(seed: int | str) -> str:
        log = ["git", "log", f"-S{seed}", "--format=%h %ad", "--date=short", "--reverse"]
        out = subprocess.run(
            [*log, "--", "tests/", "docs/"], capture_output=True, text=True, check=False
        )
        return out.stdout.split("\n")[0] or "(not yet committed)"

    def kept(faults: list[int] | None) -> str:
        return "all" if faults is None else ",".join(map(str, faults)) or "none"

    print(FINDINGS_HEAD)
    print("| plan | faults kept | what broke | first recorded |\n| --- | --- | --- | --- |")
    for seed, faults, why in REGRESSIONS:
        print(f"| `{seed}` | {kept(faults)} | {why} | {first(seed)} |")
    print("\n## Named mutants the simulation kills\n")
    print("| plan | faults kept | named mutant | rule that fails | first recorded |")
    print("| --- | --- | --- | --- | --- |")
    for name, seed, faults, rule in CAUGHT:
        print(f"| `{seed}` | {kept(faults)} | {name} | {rule} | {first(seed)} |")
    return 0


FINDINGS_HEAD = """# Findings of the simulation

What the simulation (docs/project/testing.md) found, one row per schedule kept as a
test: its plan (a bare number is a version-1 plan, `v2:N` a version-2 one, a name a
schedule written out whole), the faults its shrinking kept, and what broke. "First
recorded" is the first commit that names it; the commit messages around it tell the
story. Made by `python -m tests.sim findings > docs/project/findings.md`.

## Regressions
"""


def _target(text: str) -> Plan | Schedule:
    """A plan (``v2:SEED``, ``SEED``) or a kept schedule's name (kept.SCHEDULES)."""
    return SCHEDULES[text] if text in SCHEDULES else Plan.parse(text)


def main(argv: list[str]) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        return subprocess.call([sys.executable, "-m", "tests.sim", *argv], env=env, cwd=ROOT)
    parser = argparse.ArgumentParser(prog="python -m tests.sim")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("search")
    first = int.from_bytes(os.urandom(6), "big")  # (fresh seeds on every search)
    s.add_argument("--first", type=int, default=first)
    s.add_argument("--version", type=int, default=LATEST, help="the generator's (plan.py)")
    s.add_argument("--count", type=int)
    s.add_argument("--seconds", type=float)
    s.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    s.add_argument("--where", default="", help="tags every seed's run must have (run.shape)")
    r = sub.add_parser("replay")
    r.add_argument("seed", type=_target, help="v2:SEED, SEED (version 1), or a schedule's name")
    r.add_argument("--keep", type=lambda v: [int(x) for x in v.split(",") if x])
    r.add_argument("--around", type=int, default=40)
    k = sub.add_parser("shrink")
    k.add_argument("seed", type=_target)
    m = sub.add_parser("mutants")
    m.add_argument("names", nargs="*")
    spent = m.add_mutually_exclusive_group()
    spent.add_argument("--count", type=int, help="schedules searched per mutant")
    spent.add_argument("--seconds", type=float, default=300.0)
    m.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    m.add_argument("--first", type=int)
    m.add_argument("--where", help="as search's")
    m.add_argument("--version", type=int, default=LATEST, help="as search's")
    m.add_argument("--search-only", action="store_true", help="no kept seed: the search alone")
    d = sub.add_parser("digests")
    d.add_argument("--first", type=int, default=1)
    d.add_argument("--count", type=int, default=20)
    d.add_argument("--version", type=int, default=LATEST)
    d.add_argument("--kept", action="store_true", help="the seeds kept as tests, instead")
    sub.add_parser("findings")
    f = sub.add_parser("refind")
    f.add_argument("names", nargs="*")
    f.add_argument("--count", type=int, default=1000, help="schedules searched per entry")
    f.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    g = sub.add_parser("regressions")
    g.add_argument("--first-for", help="a named mutant: the seeds kept for it first")
    g.add_argument(
        "--part", default="0/1", metavar="I/N", help="every N-th kept seed from the I-th"
    )
    args = parser.parse_args(argv)
    if args.command == "findings":
        return findings()
    if args.command == "refind":
        return refind(args.names, args.count, args.jobs)
    if args.command == "regressions":
        _limit_memory()
        index, parts = map(int, args.part.split("/"))
        return regressions(args.first_for, (index, parts))
    if args.command == "digests":
        span = range(args.first, args.first + args.count)
        seeds = kept() if args.kept else [(Plan(seed, args.version), None) for seed in span]
        for seed, keep in seeds:
            result = run(seed, keep)
            shown = _shown(seed, keep)
            mark = "" if result.portable else f" {PER_PYTHON}"
            print(f"{shown} {result.digest()} {len(result.history)} lines{mark}", flush=True)
        return 0
    if args.command == "search":
        if args.count is None and args.seconds is None:
            args.seconds = 1800.0
        print(
            f"searching from seed {Plan(args.first, args.version)} ({args.jobs} jobs)", flush=True
        )
        where = frozenset(tag for tag in args.where.split(",") if tag)
        return search(args.first, args.count, args.seconds, args.jobs, where, version=args.version)
    if args.command == "replay":
        _limit_memory()
        played = _guarded(args.seed, args.keep)
        if isinstance(played, str):
            print(f"seed {args.seed}: FAILED, {played}")
            return 1
        _show(played, args.around)
        if played.busy:  # (a search reports it apart; a seed replayed fails on it)
            print(f"VIOLATION {BUSY}")
        return 1 if played.failed or played.busy else 0
    if args.command == "shrink":
        keep, result = shrink(args.seed)
        _show(result, 40)
        print(
            f"shrunk to {len(keep)} of its faults: "
            f"python -m tests.sim replay {args.seed} --keep {','.join(map(str, keep))}"
        )
        return 1 if result.failed else 0
    return mutants(
        args.names,
        ("--count", args.count) if args.count is not None else ("--seconds", args.seconds),
        args.jobs,
        args.first,
        args.where,
        version=args.version,
        search_only=args.search_only,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
