"""Shared fixtures: five real Redis-protocol servers for the whole session."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import math
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import redis.asyncio as redis

import aiolock
import aiolock._waiting.turns
from aiolock._bench._common import evalsha_calls
from aiolock.testing import Server, Servers, redis_servers

from . import seam

T = TypeVar("T")


def _under_a_mutant() -> bool:
    return "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", "")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under mutmut, a failed test decides the verdict: do not wait forever to exit.

    A mutant that leaves a vote undecided also hangs the event loop's shutdown (its
    last task waits, shielded, for the vote), and neither pytest-timeout nor mutmut's
    CPU-time limit covers that; mutmut's wall-clock limit is three times the duration
    of every test of the function (up to a quarter of an hour). After the first
    failure the run has 30 s to end, then exits with pytest's "tests failed" status.
    (The test servers die with this process: see ``aiolock.testing``.) The failure is
    noted in ``mutmut-kills.log`` (``mutants/``): mutant, test, phase, last line.
    """
    if report.failed and _under_a_mutant():
        watchdog = threading.Timer(30.0, os._exit, args=(1,))
        watchdog.daemon = True
        watchdog.start()
        # Which test killed which mutant, and how (mutmut keeps no test output): a kill
        # by a test that has nothing to do with the mutation is a flaky test to fix.
        why = report.longreprtext.strip().splitlines()[-1:] or [""]
        with open("mutmut-kills.log", "a") as log:
            mutant = os.environ["MUTANT_UNDER_TEST"]
            log.write(f"{mutant}\t{report.nodeid}\t{report.when}\t{why[0][:300]}\n")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first; under mutmut, fastest first, each with a timeout of its own.

    mutmut passes the tests that cover a mutant as an unordered set and stops at the
    first failure (``-x``): a mutant that a 0.1 s test kills could first wait for 30 s
    of renewal tests. Sorting by the durations of mutmut's own clean run (its
    ``mutmut-stats.json``, in the directory the tests run from) changes no test, only
    how soon the killing one runs. A mutant that leaves a vote undecided makes a test
    wait forever without using CPU (mutmut's CPU-time limit never ends it): each test
    is stopped at three times its own clean duration plus 15 s, instead of the flat
    60 s that the slowest test needs (a hang fails the test: the mutant is detected).
    Outside mutmut, the tests marked ``first`` (the suite's longest) go first: the
    workers of pytest-xdist then end together, instead of one running the longest
    tests alone at the end while the other has nothing left (about 100 s of a 6-minute
    run on 2 cores).
    """
    if not _under_a_mutant():
        items.sort(key=lambda item: item.get_closest_marker("first") is None)
        return
    try:
        with open("mutmut-stats.json") as f:
            durations: dict[str, float] = json.load(f)["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return
    items.sort(key=lambda item: durations.get(item.nodeid, math.inf))
    for item in items:
        duration = durations.get(item.nodeid)
        if duration is not None:
            item.add_marker(pytest.mark.timeout(3 * duration + 15))


@pytest.fixture(autouse=True)
def _no_restart_quarantine_unless_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """A manager that does not choose ``restart_grace`` gets 0 in this suite.

    The suite starts its servers empty (and restarts killed ones empty) itself: with
    the default grace every test would first wait 30 s for their quarantine. The tests
    of the quarantine pass ``restart_grace`` (``None`` included) themselves.
    """
    original = aiolock.LockManager.__init__

    @functools.wraps(original)
    def init(self: aiolock.LockManager, nodes: Any, **kwargs: Any) -> None:
        kwargs.setdefault("restart_grace", 0)
        original(self, nodes, **kwargs)

    monkeypatch.setattr(aiolock.LockManager, "__init__", init)


@pytest.fixture(autouse=True)
def _no_failed_renewal_tick(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> Iterator[None]:
    """A renewal tick that raised is a bug, even though the renewer survives it.

    The renewer logs the exception and retries (so one bad tick never ends renewal for
    every lock): without this check, a broken renewal path would pass any test whose
    lock happens to survive the retries. Tests that inject a failing tick say so.
    """
    yield
    if request.node.get_closest_marker("renewal_tick_may_fail"):
        return
    records = [r for when in ("setup", "call") for r in caplog.get_records(when)]
    failed = [r for r in (*records, *caplog.records) if "a renewal tick failed" in r.getMessage()]
    assert not failed, f"a renewal tick raised: {failed[0].exc_text or failed[0].getMessage()}"


@pytest.fixture(scope="session")
async def _servers() -> AsyncIterator[Servers]:
    async with redis_servers(5) as servers:
        yield servers


@pytest.fixture
async def servers(_servers: Servers) -> AsyncIterator[Servers]:
    """Five live servers, emptied after the test; faults a test injects are undone."""
    yield _servers
    for server in _servers.servers:
        assert isinstance(server, Server)
        server.resume()
        if server.process is None or server.process.poll() is not None:
            await server.restart()
    for url in _servers:
        client = redis.Redis.from_url(url)
        try:
            await client.flushall()
        finally:
            await client.aclose()


@pytest.fixture
def urls(servers: Servers) -> list[str]:
    return list(servers)


@pytest.fixture
async def locks(urls: list[str]) -> AsyncIterator[aiolock.LockManager]:
    async with aiolock.LockManager(urls) as manager:
        yield manager


@pytest.fixture
async def clients(urls: list[str]) -> AsyncIterator[list[redis.Redis]]:
    """A plain redis-py client per server, to look behind the library's back."""
    made = [redis.Redis.from_url(url, socket_timeout=2) for url in urls]
    yield made
    for client in made:
        await client.aclose()


@pytest.fixture
def name() -> str:
    """A lock name of the test's own."""
    return f"test-{uuid.uuid4().hex[:12]}"


def key(name: str, prefix: str = "aiolock:") -> str:
    return f"{prefix}{{{name}}}"


@contextlib.contextmanager
def cycles_of(*types: type) -> Iterator[list[object]]:
    """The objects of ``types`` that the block leaves in reference cycles.

    Such objects are freed only by the garbage collector, not as soon as nothing
    refers to them: one a lock cycle brings on collections, and the full ones with them.
    The list fills as the block ends.
    """
    found: list[object] = []
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found.extend(o for o in gc.garbage if isinstance(o, types))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


async def keys_on(clients: list[redis.Redis], name: str) -> list[bool]:
    """Whether each server has the lock's key, for the servers that answer."""
    return [bool(await c.exists(key(name))) for c in clients]


async def settled(read: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
    """What ``read()`` returns once ``done`` accepts it, or after 2 s.

    acquire(), release() and attach() return once a quorum answered; the requests to
    the other nodes land a moment later.
    """
    deadline = time.monotonic() + 2.0
    while True:
        found = await read()
        if done(found) or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.01)


async def settled_keys(clients: list[redis.Redis], name: str, expected: list[bool]) -> list[bool]:
    """``keys_on`` once it equals ``expected``, or after 2 s (see :func:`settled`)."""
    return await settled(lambda: keys_on(clients, name), expected.__eq__)


async def tokens_on(clients: list[redis.Redis], name: str) -> list[bytes | None]:
    """The lock's value (its holder's token) on each server."""
    return [await c.get(key(name)) for c in clients]


def count_attempts(manager: aiolock.LockManager) -> list[int]:
    """Counts the acquire attempts ``manager`` sends (one each to every node)."""
    quorum = seam.engine(manager).quorum
    attempt = quorum.acquire
    count = [0]

    async def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return await attempt(*args, **kwargs)

    quorum.acquire = counted  # type: ignore[method-assign]
    return count


async def members_on(clients: list[redis.Redis], zset: str, count: int) -> list[list[bytes]]:
    """The members of the sorted set ``zset`` on each server, once every server holds
    ``count`` of them (the turn queue's keys: a join lands on each node in its time)."""
    deadline = time.monotonic() + 10
    while True:
        seen = [list(await client.zrange(zset, 0, -1)) for client in clients]
        if all(len(members) == count for members in seen):
            return seen
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.02)


async def in_line(clients: list[redis.Redis], name: str, members: int) -> list[bytes]:
    """The turn queue of ``name`` once every node has ``members`` entries (in order)."""
    lines = await members_on(clients, key(name) + ":turns", members)
    assert all(line == lines[0] for line in lines), lines
    return lines[0]


class InLine:
    """A holder of ``name``, and two managers waiting for it, first and second in line."""

    def __init__(
        self,
        holder: aiolock.Lock,
        waiting: list[tuple[aiolock.LockManager, aiolock.Lock, asyncio.Task[bool]]],
    ) -> None:
        self.holder = holder
        (self.first, self.first_lock, self.first_waits) = waiting[0]
        (self.second, self.second_lock, self.second_waits) = waiting[1]


async def two_in_line(
    stack: contextlib.AsyncExitStack,
    urls: list[str],
    clients: list[redis.Redis],
    name: str,
    *,
    first_ttl: float = 30,
) -> InLine:
    """A holder of ``name`` (ttl 30 s), and two managers in its turn queue behind it
    (the first one's lock with ``first_ttl``, the second's 30 s)."""
    holder_side = await stack.enter_async_context(aiolock.LockManager(urls))
    holder = holder_side.lock(name, ttl=30, auto_renew=False)
    assert await holder.acquire(timeout=0)
    waiting = []
    for place in (1, 2):
        manager = await stack.enter_async_context(aiolock.LockManager(urls))
        lock = manager.lock(name, ttl=first_ttl if place == 1 else 30, auto_renew=False)
        waiting.append((manager, lock, asyncio.create_task(lock.acquire(timeout=20))))
        await in_line(clients, name, place)
    return InLine(holder, waiting)


class TurnScripts:
    """Counts the turn-queue bookkeeping (``TURN_JOIN``, ``TURN_LEAVE``: see
    ``aiolock/_waiting/turns.py``) that watched managers send, one script to each node per
    call, so that a count of a handoff's scripts can leave it out. The fixture
    ``turn_scripts`` stops the periodic refresh, so that the count is exact."""

    def __init__(self) -> None:
        self.sent = 0

    def watch(self, *managers: aiolock.LockManager) -> None:
        """Count from now what ``managers`` send."""
        self.sent = 0
        for manager in managers:
            turns = seam.engine(manager).turns
            assert turns is not None
            send = turns.broadcast

            def counted(script: Any, args: Any, send: Any = send) -> None:
                self.sent += 1
                send(script, args)

            turns.broadcast = counted


@pytest.fixture
def turn_scripts(monkeypatch: pytest.MonkeyPatch) -> TurnScripts:
    """See :class:`TurnScripts`."""
    monkeypatch.setattr(aiolock._waiting.turns, "REFRESH", 3600.0)
    monkeypatch.setattr(aiolock._waiting.turns, "ENTRY_TTL", 3600.0)
    return TurnScripts()


async def scripts_run(
    clients: list[redis.Redis], *, leaving_out: TurnScripts | None = None
) -> list[int]:
    """How many scripts each node has run since its last ``CONFIG RESETSTAT``: every
    command aiolock sends is one (the commands scripts run inside are left out), but for
    the turn-queue bookkeeping of the managers ``leaving_out`` watches."""
    other = 0 if leaving_out is None else leaving_out.sent
    return [await evalsha_calls(client) - other for client in clients]


async def renewals_run(clients: list[redis.Redis]) -> list[int]:
    """The requests each node has run since its last ``CONFIG RESETSTAT`` in a window in
    which only renewals run: scripts, and ``SET`` (a renewal of one lock is
    ``SET ... IFEQ`` where the server has it). Where other scripts run too, the ``SET``
    calls inside them count as well: use :func:`scripts_run` there."""
    counts = []
    for client in clients:
        stats = await client.info("commandstats")
        set_calls = int(stats.get("cmdstat_set", {}).get("calls", 0))
        counts.append(await evalsha_calls(client) + set_calls)
    return counts


async def elsewhere(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` in a task of its own: another holder than the test's task.

    (A task acquiring a name it already holds through the same manager gets
    ``RuntimeError``, not a wait for itself: contention comes from other tasks.)
    """
    return await asyncio.create_task(coro)
