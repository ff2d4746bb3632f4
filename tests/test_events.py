"""Observability: the on_event hook and the log, which never carry a token."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio as redis

from aiolock import LockEvent, LockLost, LockManager, QuorumError
from aiolock.testing import Server, Servers

from .conftest import elsewhere, key


async def test_events_for_acquire_release_timeout_and_loss(
    urls: list[str], clients: list[redis.Redis], name: str
) -> None:
    events: list[LockEvent] = []
    async with LockManager(urls, on_event=events.append) as locks:
        async with locks.lock(name, ttl=5):
            await asyncio.sleep(0.05)
            assert await elsewhere(locks.lock(name).acquire(timeout=0.1)) is False
        with pytest.raises(LockLost):
            async with locks.lock(name, ttl=0.6):
                for client in clients:
                    await client.delete(key(name))
                await asyncio.sleep(5)
    kinds = [e.kind for e in events]
    assert kinds[:3] == ["acquired", "timeout", "released"]
    assert "lost" in kinds
    released = events[2]
    assert released.name == name
    assert released.seconds >= 0.05
    # How long each took: an uncontended acquire a moment, the timeout its 0.1 s wait.
    assert 0.0 <= events[0].seconds < 1.0, events[0]
    assert 0.1 <= events[1].seconds < 1.0, events[1]
    lost = next(e for e in events if e.kind == "lost")
    assert isinstance(lost.error, LockLost)
    assert lost.name == name
    assert 0.0 < lost.seconds < 5.0  # held until the loss, from acquisition


async def test_outage_event_and_warning_log_never_show_tokens(
    servers: Servers, clients: list[redis.Redis], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[LockEvent] = []
    caplog.set_level(logging.DEBUG, logger="aiolock")
    async with LockManager(servers, on_event=events.append) as locks:
        async with locks.lock(name, ttl=5):
            token = await clients[0].get(key(name))
        for server in servers.servers[:3]:
            assert isinstance(server, Server)
            server.kill()
        with pytest.raises(QuorumError):
            await locks.lock(name).acquire(timeout=0)
    assert events[-1].kind == "quorum_error"
    assert any(
        r.levelno == logging.WARNING and "quorum_error" in r.getMessage() for r in caplog.records
    )
    assert any("acquired" in r.getMessage() for r in caplog.records)
    assert token is not None
    text = caplog.text
    assert token.hex() not in text
    assert repr(token)[2:-1] not in text


async def test_a_failing_hook_does_not_break_the_lock(
    urls: list[str], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_event: LockEvent) -> None:
        raise RuntimeError("metrics backend down")

    async with LockManager(urls, on_event=broken) as locks, locks.lock(name, ttl=5) as lock:
        assert lock.owned
    assert "on_event hook failed" in caplog.text


def test_on_event_must_be_callable() -> None:
    with pytest.raises(TypeError):
        LockManager(["redis://127.0.0.1:1"], on_event=42)  # type: ignore[arg-type]


async def test_on_event_takes_a_sequence_and_a_failing_hook_spares_the_others(
    urls: list[str], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    first: list[LockEvent] = []
    last: list[LockEvent] = []

    def broken(_event: LockEvent) -> None:
        raise RuntimeError("metrics backend down")

    hooks = [first.append, broken, last.append]
    async with LockManager(urls, on_event=hooks) as locks, locks.lock(name, ttl=5):
        pass
    assert [e.kind for e in first] == ["acquired", "released"]
    assert [e.kind for e in last] == ["acquired", "released"]
    assert first == last  # the same events, in the same order
    assert caplog.text.count("on_event hook failed") == 2


def test_on_event_must_be_callable_or_a_sequence_of_callables() -> None:
    for bad in (42, [print, 42], "abc"):
        with pytest.raises(TypeError, match="on_event must be callable"):
            LockManager(["redis://127.0.0.1:1"], on_event=bad)  # type: ignore[arg-type]
