"""Sessions: `nox` runs what CI runs (tests on this Python, lint, typing, compat on the
redis-py floor, a short benchmark, the documentation site, the release build); the
redis-py matrix, other Pythons, the demo, benchmarks, peers, chaos and mutants (long)
on demand."""

import glob
import hashlib
import os
import shutil
import sys
from pathlib import Path

import nox

#: Every redis-py minor line we support, floor first (README's support table).
REDIS_PY = [
    "5.0", "5.1", "5.2", "5.3",
    "6.0", "6.1", "6.2", "6.3", "6.4",
    "7.0", "7.1", "7.2", "7.3", "7.4",
    "8.0", "8.1",
]  # fmt: skip
FLOOR, LATEST = REDIS_PY[0], REDIS_PY[-1]
#: The CPython versions of the classifiers, and the one running nox.
THIS_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
#: How the simulation's digests mark a history that differs between Python versions by
#: design (``tests/sim/__main__.py``, ``PER_PYTHON``).
PER_PYTHON = "(this Python's)"
PYTHONS = sorted({"3.11", "3.12", "3.13", THIS_PYTHON}, key=lambda v: tuple(map(int, v.split("."))))
#: What the compat runs cover: nodes, transports, cluster, sentinel, CLI, failures, and
#: the seam with redis-py itself.
COMPAT_TESTS = [
    "tests/test_lock.py", "tests/test_validation.py", "tests/test_transports.py",
    "tests/test_cluster.py", "tests/test_sentinel.py", "tests/test_cli.py",
    "tests/test_failures.py", "tests/test_waiting.py", "tests/test_redis_seam.py",
]  # fmt: skip

#: pytest-xdist: one worker per core, tests handed to whichever is free (worksteal): the
#: simulation's file alone is most of the suite's time, and by file it kept one worker
#: busy while the other idled (tests 11.5 min by file, 9.5 min so, on 2 cores).
PARALLEL = ["-n", "auto", "--dist", "worksteal"]

nox.options.sessions = [
    f"tests-{THIS_PYTHON}", "lint", f"typing({FLOOR})", f"typing({LATEST})",
    f"compat({FLOOR})", "bench_short", "docs", "release",
]  # fmt: skip
nox.options.reuse_existing_virtualenvs = True
# uv makes the venvs and installs (the README's command installs nox[uv]): a default run
# spends about 15 s per session less installing than with pip; virtualenv without it.
nox.options.default_venv_backend = "uv|virtualenv"
# Installed with their bytecode, as pip installs: uv leaves it out, and where
# PYTHONDONTWRITEBYTECODE is set every interpreter the suite starts would compile
# redis-py and the rest again (its tests that start interpreters ran a third slower).
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")
# A Python that is not installed is skipped with a message (`nox -s tests` on a
# machine with one Python); CI runs only the Python running nox.
nox.options.error_on_missing_interpreters = False

# pyenv's interpreters are not on PATH by their versioned names: let nox find them.
_PYENV = os.path.expanduser(os.environ.get("PYENV_ROOT", "~/.pyenv"))
for _bin in sorted(glob.glob(os.path.join(_PYENV, "versions", "3.*", "bin"))):
    if _bin not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] += os.pathsep + _bin

# Pinned: a new ruff release may bring new rules or formatting (markdown, say).
RUFF = "ruff==0.17.6"
PYTHON_PATHS = ["aiolock", "tests", "examples", "benchmarks", "docs/_ext", "noxfile.py"]


def _redis_py(line: str) -> str:
    return f"redis[hiredis]=={line}.*"


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The whole test suite against real servers started by the suite, on each Python."""
    session.install("-e", ".[test]")
    # On every core (each worker starts its own servers); the slowest tests are listed.
    # The long chaos runs (marked slow) are `nox -s chaos`'s.
    default = [*PARALLEL, "--durations=20", "-m", "not slow"]
    session.run("python", "-m", "pytest", *(session.posargs or default))


@nox.session
@nox.parametrize("redis_py", REDIS_PY, ids=REDIS_PY)
def compat(session: nox.Session, redis_py: str) -> None:
    """The tests of nodes, cluster, sentinel, CLI and failures on one redis-py line.

    `nox -s compat` runs every line (about 2 minutes each), `nox -s "compat(6.4)"` one.
    """
    session.install("-e", ".[test]", _redis_py(redis_py))
    session.run("python", "-c", "import redis; print('redis-py', redis.__version__)", silent=False)
    # The benchmark runs of test_cli (half a minute) exercise no redis-py seam.
    default = [*PARALLEL, *COMPAT_TESTS, "-k", "not bench"]
    session.run("python", "-m", "pytest", *(session.posargs or default))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install(RUFF)
    session.run("ruff", "check", *PYTHON_PATHS)
    session.run("ruff", "format", "--check", *PYTHON_PATHS)


@nox.session
@nox.parametrize("redis_py", REDIS_PY, ids=REDIS_PY)
def typing(session: nox.Session, redis_py: str) -> None:
    """mypy --strict on the package, against one redis-py line.

    `nox` runs the floor and the latest; `nox -s typing` every line (their annotations
    differ: 5.3 and 7.4 each caught a narrowing the others let through).
    """
    session.install("-e", ".[test]", "mypy>=1.10", _redis_py(redis_py))
    # tests/test_handles.py: every public handle against the Handle protocol.
    session.run("mypy", "--strict", "aiolock", "tests/test_handles.py", "tests/sim")


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site, strictly: a broken link, snippet or reference fails.

    `nox -s docs -- serve` serves it at http://127.0.0.1:8000 instead.
    """
    session.install("-e", ".[docs]", "pytest>=8", "pytest-asyncio>=0.24", "pytest-timeout>=2.3")
    env = {"NO_MKDOCS_2_WARNING": "1"}  # material's notice about its successor
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", env=env)
    else:
        session.run("mkdocs", "build", "--strict", "--site-dir", "site", env=env)
        # The reference as a reader gets it: every public name, signature and member.
        site = os.path.abspath("site")
        session.run(
            "python", "-m", "pytest", "-q", "tests/test_reference_site.py",
            env={"AIOLOCK_SITE": site},
        )  # fmt: skip


@nox.session
def release(session: nox.Session) -> None:
    """What a release uploads: sdist and wheel built, metadata checked by twine."""
    session.install("build[uv]>=1.2", "twine>=5")
    dist = os.path.join(session.create_tmp(), "dist")
    shutil.rmtree(dist, ignore_errors=True)  # only this build's files are checked
    session.run("python", "-m", "build", "--installer", "uv", "--outdir", dist)
    session.run("twine", "check", "--strict", *glob.glob(os.path.join(dist, "*")))
    # A stranger's first minutes, on the built wheel (not editable): the README's
    # blocks and the FastAPI tutorial, pasted, against `python -m aiolock servers`.
    (wheel,) = glob.glob(os.path.join(dist, "*.whl"))
    session.install("--force-reinstall", "--no-deps", wheel)
    session.install(f"{wheel}[testing,examples]")
    smoke = [os.path.abspath(p) for p in ("tests/wheel_smoke.py", "README.md")]
    session.run("python", *smoke, os.path.abspath("examples/fastapi_app.py"))


@nox.session
def peers(session: nox.Session) -> None:
    """aiolock against redis-py's Lock, pottery and aioredlock (benchmarks/peers.py).

    Its own venv: the peers bring their own clients (aioredlock: aioredis 1.3). Writes
    docs/assets/peers-table.inc and peers.svg, which the docs' performance page shows.
    """
    session.install(
        "-e", ".[testing]", "pottery==3.0.1", "aioredlock==0.7.3", "matplotlib>=3.8"
    )  # fmt: skip
    session.run("python", "benchmarks/peers.py", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The demo on embedded nodes."""
    session.install("-e", ".[testing]")
    session.run("python", "-m", "aiolock", "demo")


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks; `nox -s bench -- --count 200` for a short run."""
    session.install("-e", ".[testing]")
    session.run("python", "-m", "aiolock", "bench", *session.posargs)


@nox.session
def bench_short(session: nox.Session) -> None:
    """A short benchmark run on asyncio and on uvloop: figures printed, nothing asserted."""
    session.install("-e", ".[testing,uvloop]")
    short = ["--count", "300", "--contention-seconds", "0.5", "--waiters", "200"]
    session.run("python", "-m", "aiolock", "bench", *short)
    session.run("python", "-m", "aiolock", "bench", "--uvloop", *short)


@nox.session
def chaos(session: nox.Session) -> None:
    """The chaos tests, all three modes (the default nox runs the short `expire` one),
    and the renewal's guard with a 30-s ttl under hung nodes.

    `nox -s chaos -- 120` runs each for two minutes (default: 60 s).
    """
    session.install("-e", ".[test]")
    seconds = session.posargs[0] if session.posargs else "60"
    guard = "tests/test_renewal.py::test_every_holder_is_told_a_guard_before_its_validity_ends"
    session.run(
        "python", "-m", "pytest", "tests/test_chaos.py", guard, "-s", "-p", "no:randomly",
        "-o", "timeout=0", env={"AIOLOCK_CHAOS_SECONDS": seconds},
    )  # fmt: skip


@nox.session
def sim(session: nox.Session) -> None:
    """The deterministic simulation (tests/sim): an open-ended search of schedules.

    `nox -s sim` searches for 30 minutes from a random seed and stops at the first
    failing one; `nox -s sim -- replay SEED`, `-- shrink SEED`, `-- search --seconds 300`,
    `-- mutants [NAME ...]` (see `python -m tests.sim --help`). Every run of the suite
    searches 1,000 schedules from fresh seeds (tests/test_sim.py).
    """
    session.install("-e", ".[test]")
    session.run("python", "-m", "tests.sim", *(session.posargs or ["search"]))


@nox.session(python=PYTHONS)
def determinism(session: nox.Session) -> None:
    """The simulation's histories, the same byte for byte on every Python version.

    Each Python replays the same schedules: 1,000 plans of the newest generator
    (tests/sim/plan.py, the newest version), 100 from each range of version 1 whose loop
    releases its timers one at a time (2**35 on), and every seed kept as a test, with the
    faults it keeps; it writes their digests under .nox/sim-digests/, keyed by a hash of
    the library's and the simulation's sources, and compares them with those any other
    Python wrote for the same sources, but for the histories that differ between Python
    versions by design, marked as this Python's (a version-1 stall within a step:
    testing.md, "Determinism"). `nox -s determinism` runs them all (3.11 to 3.13).
    """
    session.install("-e", ".[test]")
    sources = sorted([*Path("aiolock").rglob("*.py"), *Path("tests/sim").glob("*.py")])
    fingerprint = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    out = Path(".nox", "sim-digests", fingerprint)
    out.mkdir(parents=True, exist_ok=True)
    sim = ["python", "-m", "tests.sim", "digests"]
    version_1 = range(35, 55)  # (the ranges' exponents: plan.V1_FROM)
    runs = [
        session.run(*sim, "--first", "1", "--count", "1000", silent=True),
        *(
            session.run(*sim, "--version", "1", "--first", str(2**e), "--count", "100", silent=True)
            for e in version_1
        ),
        session.run(*sim, "--kept", silent=True),
    ]
    if not all(isinstance(out, str) for out in runs):
        return  # --install-only: nothing ran, nothing to compare
    digests = "".join(str(out) for out in runs)
    version = session.python if isinstance(session.python, str) else THIS_PYTHON
    (out / f"{version}.txt").write_text(digests)
    others = {f.stem: f.read_text() for f in out.glob("*.txt") if f.stem != version}
    mine = digests.splitlines()
    for other, theirs in sorted(others.items()):
        differ = [
            f"{ours.split()[0]}: {ours.split()[1]} here, {yours.split()[1]} on {other}"
            for ours, yours in zip(mine, theirs.splitlines(), strict=True)
            if ours != yours and not ours.endswith(PER_PYTHON)
        ]
        if differ:
            session.error(f"histories differ from Python {other}'s: {differ[:5]}")
    compared = ", ".join(sorted(others)) or "no other Python yet (run it on another)"
    own = sum(line.endswith(PER_PYTHON) for line in mine)
    session.log(
        f"{len(mine) - own} seeds' histories on Python {version}: equal to those of "
        f"{compared} ({own} more marked as this Python's)"
    )


@nox.session(venv_backend="virtualenv")  # (pip: mutmut's run uninstalls the project)
def mutants(session: nox.Session) -> None:
    """Mutation testing of the safety modules: named mutants, then mutmut (long).

    `nox -s mutants` runs both; `nox -s mutants -- named` only the named mutants (a few
    minutes), `nox -s mutants -- mutmut` only mutmut (about an hour: it runs the covering
    tests of every mutant, fastest first; see tests/conftest.py). Results and the last
    scores: docs/project/testing.md.
    """
    session.install("-e", ".[test]", "mutmut>=3.3")
    parts = session.posargs or ["named", "mutmut"]
    if "named" in parts:
        session.run("python", "tests/mutants.py")
    if "mutmut" in parts:
        # The tests must import the mutated copy in mutants/: with the project itself
        # installed (editable: this tree on sys.path) they import the original, and
        # mutmut finds no test for any mutant. Its dependencies stay.
        session.run("python", "-m", "pip", "uninstall", "-y", "aiolock-redis")
        try:
            # Eight at a time on 2 cores: the tests mostly wait for ttls and timers (two
            # children left the machine idle; eight keep its load about 2).
            session.run("mutmut", "run", "--max-children", "8")
            session.run("mutmut", "results")
        finally:
            session.install("-e", ".")
