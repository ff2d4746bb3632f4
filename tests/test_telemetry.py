"""Telemetry hooks: OpenTelemetry and Prometheus, from real lock events."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from aiolock import LockManager, QuorumError
from aiolock.telemetry import OpenTelemetry, Prometheus
from aiolock.testing import Server, Servers


async def cycles(urls: list[str], name: str, hooks: list[Any]) -> None:
    """One acquired-and-released lock, one timeout, on ``name``."""
    async with LockManager(urls, on_event=hooks) as locks, locks.lock(name, ttl=5):
        await asyncio.sleep(0.05)
        assert not await asyncio.create_task(locks.lock(name).acquire(timeout=0.01))


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


async def test_opentelemetry_records_acquire_and_hold_durations_counters_and_spans(
    urls: list[str], name: str
) -> None:
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    otel = OpenTelemetry(
        meter_provider=MeterProvider(metric_readers=[reader]), tracer_provider=tracing
    )
    await cycles(urls, name, [otel])
    found = points(reader)
    acquire = {p.attributes["aiolock.outcome"]: p for p in found["aiolock.acquire.duration"]}
    assert set(acquire) == {"acquired", "timeout"}
    assert acquire["acquired"].count == 1
    hold = found["aiolock.hold.duration"]
    assert [p.attributes["aiolock.outcome"] for p in hold] == ["released"]
    assert hold[0].sum >= 0.05  # held through the body's sleep
    assert [p.value for p in found["aiolock.acquisitions"]] == [1]
    assert [p.value for p in found["aiolock.timeouts"]] == [1]
    # High-cardinality names are left out by default.
    assert all("aiolock.lock" not in p.attributes for ps in found.values() for p in ps)
    spans = exporter.get_finished_spans()
    assert sorted(s.attributes["aiolock.outcome"] for s in spans) == ["acquired", "timeout"]
    assert all(s.name == "aiolock.acquire" and s.end_time >= s.start_time for s in spans)


async def test_prometheus_counts_in_its_own_registry_with_an_optional_bounded_label(
    urls: list[str], name: str
) -> None:
    registry = CollectorRegistry()
    await cycles(urls, name, [Prometheus(registry=registry, name=lambda n: n.split("-")[0])])
    value = registry.get_sample_value
    labels = {"outcome": "acquired", "lock": "test"}
    assert value("aiolock_acquisitions_total", labels) == 1
    assert value("aiolock_acquire_seconds_count", labels) == 1
    assert value("aiolock_timeouts_total", {"outcome": "timeout", "lock": "test"}) == 1
    hold = value("aiolock_hold_seconds_sum", {"outcome": "released", "lock": "test"})
    assert hold is not None
    assert hold >= 0.05
    assert value("aiolock_losses_total", {"outcome": "lost", "lock": "test"}) is None


async def test_a_quorum_error_is_counted_with_the_failed_nodes_on_its_span(
    servers: Servers, name: str
) -> None:
    registry = CollectorRegistry()
    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    hooks = [Prometheus(registry=registry), OpenTelemetry(tracer_provider=tracing)]
    async with LockManager(servers, node_timeout=0.05, on_event=hooks) as locks:
        for server in servers.servers[:3]:
            assert isinstance(server, Server)
            server.kill()
        with pytest.raises(QuorumError):
            await locks.lock(name).acquire(timeout=0)
    assert (
        registry.get_sample_value("aiolock_quorum_errors_total", {"outcome": "quorum_error"}) == 1
    )
    (span,) = exporter.get_finished_spans()
    assert span.attributes["aiolock.nodes_failed"] == 3
    assert span.events[0].name == "exception"


def test_a_missing_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"pip install aiolock-redis\[otel\]"):
        OpenTelemetry()
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"pip install aiolock-redis\[prometheus\]"):
        Prometheus(registry=CollectorRegistry())
