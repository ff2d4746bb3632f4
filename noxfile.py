"""Sessions: tests, lint, typing, bench_short (the default, what CI runs); demo, bench,
chaos and mutants (long) on demand."""

import nox

nox.options.sessions = ["tests", "lint", "typing", "bench_short"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

# Pinned: a new ruff release may bring new rules or formatting (markdown, say).
RUFF = "ruff==0.17.6"
PYTHON_PATHS = ["aiolock", "tests", "examples", "benchmarks", "noxfile.py"]


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite against real servers started by the suite."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install(RUFF)
    session.run("ruff", "check", *PYTHON_PATHS)
    session.run("ruff", "format", "--check", *PYTHON_PATHS)


@nox.session
def typing(session: nox.Session) -> None:
    """mypy --strict on the package."""
    session.install("-e", ".[test]", "mypy>=1.10")
    session.run("mypy", "--strict", "aiolock")


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
    """The chaos test, long: `nox -s chaos -- 120` for two minutes (default 60 s)."""
    session.install("-e", ".[test]")
    seconds = session.posargs[0] if session.posargs else "60"
    session.run(
        "python", "-m", "pytest", "tests/test_chaos.py", "-s", "-p", "no:randomly",
        "-o", "timeout=0", env={"AIOLOCK_CHAOS_SECONDS": seconds},
    )  # fmt: skip


@nox.session
def mutants(session: nox.Session) -> None:
    """Mutation testing of the safety modules: named mutants, then mutmut (long).

    `nox -s mutants` runs both; `nox -s mutants -- named` only the named mutants (a few
    minutes), `nox -s mutants -- mutmut` only mutmut (hours: it runs the covering tests
    of every mutant). Results and the last scores: docs/testing.md.
    """
    session.install("-e", ".[test]", "mutmut>=3.3")
    parts = session.posargs or ["named", "mutmut"]
    if "named" in parts:
        session.run("python", "tests/mutants.py")
    if "mutmut" in parts:
        # The tests must import the mutated copy in mutants/: with the project itself
        # installed (editable: this tree on sys.path) they import the original, and
        # mutmut finds no test for any mutant. Its dependencies stay.
        session.run("python", "-m", "pip", "uninstall", "-y", "aiolock")
        try:
            session.run("mutmut", "run", "--max-children", "2")
            session.run("mutmut", "results")
        finally:
            session.install("-e", ".")
