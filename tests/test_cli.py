"""``python -m aiolock``: demo, servers, bench, inspect, --help, as a user runs them."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis.asyncio as redis

from aiolock import LockManager, QuorumError
from aiolock._bench.floor import Floor

from .conftest import key


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiolock", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_help_lists_the_commands() -> None:
    result = run("--help")
    assert result.returncode == 0
    for command in ("demo", "servers", "bench", "inspect", "release"):
        assert command in result.stdout


def test_demo_runs_on_embedded_nodes_and_exits_cleanly() -> None:
    result = run("demo", "--workers", "2", "--rounds", "1")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "worker-0 holds" in out
    assert "worker-1 holds" in out
    assert "node 2 killed" in out
    assert "QuorumError" in out
    assert "acquired again" in out
    assert "LockLost" in out
    assert "done" in out
    assert result.stderr == ""


async def test_servers_run_in_the_foreground_print_their_urls_and_stop_on_ctrl_c() -> None:
    # SIGINT as a terminal delivers it: a suite started in the background (a script's
    # `cmd &`) ignores SIGINT, and a child inherits that (it then never stopped).
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiolock", "servers", "2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert process.stdout is not None
    try:
        nodes: list[str] = []
        async with asyncio.timeout(60):
            while not nodes:
                line = (await process.stdout.readline()).decode()
                assert line, (await process.stderr.read()).decode() if process.stderr else ""
                if line.startswith("AIOLOCK_NODES="):
                    nodes = line.strip().split("=", 1)[1].split(",")
        assert len(nodes) == 2
        async with (
            LockManager(nodes, restart_grace=0) as locks,
            locks.lock("from-the-cli", ttl=5) as lock,
        ):
            assert lock.fencing_token
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        # Stopped with the command: nothing answers on their ports any more.
        async with LockManager(nodes, restart_grace=0, node_timeout=0.2) as locks:
            with pytest.raises(QuorumError):
                await locks.lock("from-the-cli").acquire(timeout=0)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def test_bench_prints_figures_as_json() -> None:
    result = run(
        "bench", "--count", "30", "--json", "--contention-seconds", "0.3",
        "--waiters", "50", "--renewal-locks", "200", "--renewal-seconds", "1",
        "--semaphore-limits", "2,4",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [c["overlaps"] for c in report["contention"]] == [0, 0]
    assert all(c["counter_exact"] for c in report["contention"])
    assert all(c["sections"] > 0 for c in report["contention"])
    crossing = report["contention"][1]  # (4 processes: beside its floor, same nodes)
    assert crossing["cross_process_floor_us"] > 0
    assert crossing["cross_process_floor_ratio"] == pytest.approx(
        crossing["cross_process_p50_us"] / crossing["cross_process_floor_us"]
    )
    assert crossing["cross_process_scripts_us"] > 0  # (the same, carrying the grants)
    assert crossing["cross_process_scripts_ratio"] == pytest.approx(
        crossing["cross_process_p50_us"] / crossing["cross_process_scripts_us"]
    )
    assert report["names"]["tasks"] == 100
    assert report["names"]["cycles_per_second"] > 0
    assert report["waiters"]["handoffs"] == 50
    assert 0 < report["waiters"]["commands_per_handoff_per_node"] < 5
    assert report["renewal"]["locks"] == 200
    assert report["renewal"]["all_owned"] is True
    assert report["renewal"]["rss_mb"] > 0
    assert [s["limit"] for s in report["semaphore"]] == [2, 4]
    # A try on a full semaphore costs a script per node (and a clean-up on nodes that had
    # not answered when the others decided), whatever its limit (not a quorum attempt
    # per slot).
    assert all(s["median_ms"] > 0 and s["scripts_per_try"] <= 10 for s in report["semaphore"])
    figures = {f["name"]: f for f in report["latency"]}
    assert "ping (redis-py)" in figures
    assert "cycle1 acquire+release" in figures
    assert "cycle5 acquire+release" in figures
    assert all(f["median_us"] > 0 and f["samples"] == 30 for f in figures.values())
    # Each cycle also as a ratio to its floor, measured in the same rounds.
    assert {"floor1 (2 PING fan-outs)", "floor5 (2 PING fan-outs)"} <= set(figures)
    for cycle, floor in (("cycle1", "floor1"), ("cycle5", "floor5")):
        both = figures[f"{cycle} acquire+release"], figures[f"{floor} (2 PING fan-outs)"]
        assert both[0]["floor_ratio"] == pytest.approx(both[0]["median_us"] / both[1]["median_us"])
    # And to the same round trips carrying its scripts (the client's share), which are
    # given as a ratio to the floor (the servers' share).
    for n in (1, 5):
        cycle, floor = figures[f"cycle{n} acquire+release"], figures[f"floor{n} (2 PING fan-outs)"]
        scripts = figures[f"scripts{n} (2 script fan-outs)"]
        assert cycle["scripts_ratio"] == pytest.approx(cycle["median_us"] / scripts["median_us"])
        assert scripts["floor_ratio"] == pytest.approx(scripts["median_us"] / floor["median_us"])
    hung = figures["cycle5, 1 node hung"]
    assert hung["scripts_ratio"] == pytest.approx(
        hung["median_us"] / figures["scripts5 (2 script fan-outs)"]["median_us"]
    )
    cpu = {f["name"]: f for f in report["cpu"]}
    assert set(cpu) == {"redis-py Lock, 1 node", "aiolock, 1 node", "aiolock, 5 nodes"}
    assert all(f["client_us"] > 0 and f["server_us"] > 0 and f["cycles"] > 0 for f in cpu.values())
    # The servers' CPU is every server's: five nodes run a cycle's scripts five times.
    assert cpu["aiolock, 5 nodes"]["server_us"] > 2 * cpu["aiolock, 1 node"]["server_us"]


async def test_inspect_shows_the_holder_without_its_token(
    locks: LockManager, clients: list[redis.Redis], name: str, urls: list[str]
) -> None:
    async with locks.lock(name, ttl=20):
        token = await clients[0].get(key(name))
        result = run("inspect", name, "--nodes", *urls)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("held by") == 5
    assert result.stdout.count("fencing counter") == 5
    assert "holder with a quorum (3): none" not in result.stdout
    assert token is not None
    assert token.hex() not in result.stdout
    assert repr(token) not in result.stdout


def test_release_needs_force(urls: list[str]) -> None:
    result = run("release", "x", "--nodes", *urls)
    assert result.returncode == 2
    assert "--force" in result.stderr


async def test_force_release_frees_a_lock_and_wakes_waiters(
    locks: LockManager, clients: list[redis.Redis], name: str, urls: list[str]
) -> None:
    holder = locks.lock(name, ttl=30, auto_renew=False)
    assert await holder.acquire()
    waiter = asyncio.create_task(locks.lock(name, ttl=30).acquire(timeout=20))
    await asyncio.sleep(0.1)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiolock", "release", name, "--force", "--yes", "--nodes", *urls,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    assert out.decode().count("deleted") == 5
    assert await asyncio.wait_for(waiter, 10)  # woken, not left waiting for 30 s


def test_release_asks_for_confirmation(urls: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "aiolock", "release", "x", "--force", "--nodes", *urls],
        input="n\n", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "nothing done" in result.stdout


def test_inspect_needs_nodes_and_never_prints_a_password() -> None:
    result = run("inspect", "x")
    assert result.returncode == 2
    assert "--nodes URL" in result.stderr
    result = run("inspect", "x", "--nodes", "redis://user:s3cret@127.0.0.1:1")
    assert result.returncode == 0, result.stderr
    assert "redis://user:***@127.0.0.1:1: unreachable" in result.stdout
    assert "s3cret" not in result.stdout + result.stderr


def test_bench_compares_with_a_baseline_checkout() -> None:
    """`--baseline` runs the contention figures of both, alternately, and gives ratios.

    Here the baseline is this very checkout: every figure is measured twice, and the
    correctness checks hold on both sides.
    """
    root = str(Path(__file__).resolve().parent.parent)
    result = run(
        "bench", "--json", "--baseline", root, "--baseline-rounds", "1",
        "--contention-seconds", "0.3",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["baseline"] == root
    assert report["ping_us"] > 0
    rows = {row["figure"]: row for row in report["rows"]}
    assert rows["overlaps (all runs)"]["this"] == rows["overlaps (all runs)"]["baseline"] == 0
    assert rows["counter exact (all runs)"]["this"] == 1.0
    assert rows["counter exact (all runs)"]["baseline"] == 1.0
    sections = rows["16 tasks, 1 process: critical sections/s"]
    assert sections["this"] > 0
    assert sections["baseline"] > 0
    assert sections["ratio"] == sections["this"] / sections["baseline"]
    names = rows["100 tasks on 100 names, 1 process: cycles/s"]
    assert names["this"] > 0
    assert names["baseline"] > 0
    assert len(rows) == 9
    bad = run("bench", "--baseline", "/nonexistent-dir-of-aiolock", "--contention-seconds", "0.1")
    assert bad.returncode != 0
    assert "neither a checkout nor a Python interpreter" in bad.stderr


async def test_the_floor_of_a_cycle_with_its_scripts_runs_them_and_checks_their_replies(
    urls: list[str], clients: list[redis.Redis]
) -> None:
    for client in clients:
        await client.script_flush()
    floor = await Floor.open(urls)
    try:
        with pytest.raises(RuntimeError, match="NOSCRIPT"):
            await floor.scripts("floor-test")  # (not loaded yet: an error costs less)
        await floor.load_scripts()
        for _ in range(3):
            await floor.scripts("floor-test", ttl=5)
        await floor.majority(b"*1\r\n$4\r\nPING\r\n", lambda reply: reply == b"PONG")
        await floor.fan_out()  # (every node has answered everything before it)
    finally:
        floor.close()
    for client in clients:
        # Acquired with a fencing token and released, three times, as a lock cycle does.
        assert await client.exists(key("floor-test")) == 0
        assert int(await client.get(key("floor-test") + ":fence")) > 0
        assert 0 < await client.pttl(key("floor-test") + ":fence") <= 3_600_000


async def test_the_floor_of_a_handoff_with_its_scripts_grants_the_lock_on_every_node(
    urls: list[str], clients: list[redis.Redis]
) -> None:
    floor = await Floor.open(urls)
    try:
        await floor.load_scripts()
        assert len(await floor.grants(3, "floor-grant-test", ttl=5)) == 3
    finally:
        floor.close()
    name = key("floor-grant-test")
    for client in clients:
        # Granted to the next process's offer, with a fencing token and its ttl; the
        # releasing process left its own offer at its place, and nobody else's is left.
        assert await client.get(name) == b"bb-token"
        assert 0 < await client.pttl(name) <= 5_000
        assert int(await client.get(name + ":fence")) > 0
        offers = await client.zrange(name + ":turns:offers", 0, -1, withscores=True)
        assert [(offer.split()[0], place) for offer, place in offers] == [(b"aa", 1.0)]
