"""The examples run, and do what they promise, against real servers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import tornado.httpclient
import tornado.httpserver
import tornado.netutil
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from aiolock import LockManager
from aiolock.telemetry import OpenTelemetry, Prometheus
from aiolock.testing import redis_servers

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

import fastapi_app  # noqa: E402
import tornado_app  # noqa: E402


@asynccontextmanager
async def tornado_serving(locks: LockManager, charged: dict[int, int]) -> AsyncIterator[str]:
    """Serve the Tornado example on a free local port; yield the charge URL of order 42."""
    sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
    port = sockets[0].getsockname()[1]
    server = tornado.httpserver.HTTPServer(tornado_app.make_app(locks, charged))
    server.add_sockets(sockets)
    try:
        yield f"http://127.0.0.1:{port}/orders/42/charge"
    finally:
        server.stop()
        await server.close_all_connections()


def run_example(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


async def test_fastapi_concurrent_charges_of_one_order_run_once(urls: list[str]) -> None:
    app = fastapi_app.make_app(urls)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            responses = await asyncio.gather(
                *(client.post("/orders/42/charge") for _ in range(6)),
                client.post("/orders/7/charge"),
            )
            assert (await client.get("/ready")).json() == {"ready": True}
        assert sorted(r.status_code for r in responses[:6]) == [200] + [409] * 5
        assert responses[6].status_code == 200  # another order is not blocked
        assert app.state.charged == {42: 1, 7: 1}
        tokens = [r.json()["fencing_token"] for r in responses if r.status_code == 200]
        assert all(isinstance(token, int) and token > 0 for token in tokens), tokens


async def test_fastapi_answers_503_with_retry_after_never_500_against_fresh_servers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The suite's managers default to restart_grace=0 (conftest); a user's do not.
    monkeypatch.setattr(LockManager, "__init__", LockManager.__init__.__wrapped__)  # type: ignore[attr-defined]
    async with redis_servers(3) as fresh:
        app = fastapi_app.make_app(list(fresh))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                for path in ("/orders/1/charge", "/orders/1/refund"):
                    response = await client.post(path)
                    assert response.status_code == 503, response.text
                    assert response.headers["retry-after"] == "1"
                ready = await client.get("/ready")
                assert ready.status_code == 503
                assert "quarantined" in ready.json()["why"]
            assert app.state.charged == {}


async def test_fastapi_app_exports_lock_metrics_to_opentelemetry_and_prometheus(
    urls: list[str],
) -> None:
    reader = InMemoryMetricReader()
    registry = CollectorRegistry()
    by_kind = {"name": lambda name: name.split(":")[0]}  # "order", not "order:42"
    hooks = [
        OpenTelemetry(meter_provider=MeterProvider(metric_readers=[reader]), **by_kind),
        Prometheus(registry=registry, **by_kind),
    ]
    app = fastapi_app.make_app(urls, hooks)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            codes = await asyncio.gather(*(client.post("/orders/42/charge") for _ in range(3)))
    assert sorted(r.status_code for r in codes) == [200, 409, 409]
    labels = {"outcome": "acquired", "lock": "order"}
    assert registry.get_sample_value("aiolock_acquisitions_total", labels) == 1
    assert (
        registry.get_sample_value("aiolock_timeouts_total", {**labels, "outcome": "timeout"}) == 2
    )
    data = reader.get_metrics_data()
    assert data is not None
    names = {
        metric.name
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert {"aiolock.acquire.duration", "aiolock.hold.duration", "aiolock.acquisitions"} <= names


async def test_fastapi_refund_hands_the_order_lock_to_the_worker(urls: list[str]) -> None:
    app = fastapi_app.make_app(urls)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            queued = await client.post("/orders/42/refund")
            assert queued.status_code == 202
            # The worker holds the order meanwhile: a charge must wait its turn.
            assert (await client.post("/orders/42/charge")).status_code == 409
            for _ in range(100):
                if app.state.refunded:
                    break
                await asyncio.sleep(0.05)
            assert app.state.refunded == {42: 1}
            # The worker releases right after the refund: then charges go through.
            codes = []
            for _ in range(50):
                codes.append((await client.post("/orders/42/charge")).status_code)
                if codes[-1] == 200:
                    break
                await asyncio.sleep(0.05)
            assert codes[-1] == 200, codes
            assert app.state.charged == {42: 1}


async def test_tornado_concurrent_charges_of_one_order_run_once(urls: list[str]) -> None:
    charged: dict[int, int] = {}
    async with LockManager(urls) as locks, tornado_serving(locks, charged) as url:
        client = tornado.httpclient.AsyncHTTPClient()
        responses = await asyncio.gather(
            *(client.fetch(url, method="POST", body=b"", raise_error=False) for _ in range(5))
        )
    assert sorted(r.code for r in responses) == [200, 409, 409, 409, 409]
    assert charged == {42: 1}


async def test_tornado_answers_503_with_retry_after_against_fresh_servers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The suite's managers default to restart_grace=0 (conftest); a user's do not.
    monkeypatch.setattr(LockManager, "__init__", LockManager.__init__.__wrapped__)  # type: ignore[attr-defined]
    charged: dict[int, int] = {}
    async with (
        redis_servers(3) as fresh,
        LockManager(list(fresh)) as locks,
        tornado_serving(locks, charged) as url,
    ):
        client = tornado.httpclient.AsyncHTTPClient()
        response = await client.fetch(url, method="POST", body=b"", raise_error=False)
        assert response.code == 503
        assert response.headers["Retry-After"] == "1"
        assert charged == {}


def test_task_claim_every_job_exactly_once_with_a_worker_killed() -> None:
    result = run_example(
        str(EXAMPLES / "task_claim.py"), "--jobs", "2000", "--workers", "4", "--kill-one"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2000 done exactly once" in result.stdout
    assert "(one killed)" in result.stdout


@pytest.mark.parametrize("example", ["inventory.py", "fenced_store.py", "basic.py", "scheduler.py"])
def test_small_examples_run(example: str) -> None:
    result = run_example(str(EXAMPLES / example))
    assert result.returncode == 0, result.stderr[-3000:]
