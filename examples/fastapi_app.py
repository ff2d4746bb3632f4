"""FastAPI: one LockManager for the app's lifetime, a lock per order, 409 when busy.

    python -m pip install 'aiolock-redis[testing]' fastapi uvicorn
    python -m aiolock servers 3        # local nodes; prints AIOLOCK_NODES=...
    AIOLOCK_NODES=redis://127.0.0.1:... uvicorn fastapi_app:app

Busy (``LockTimeout``) answers 409; the nodes failing (``QuorumError``: down, or
servers started a moment ago still in their restart quarantine) answer 503 with
``Retry-After``, never a 500. ``GET /ready`` is a readiness probe: 503 until a quorum
of nodes counts (``LockManager.wait_ready``).

The manager is created in the app's lifespan (one set of connections per process,
closed at shutdown) and handed to endpoints by a dependency.

``POST /orders/{id}/refund`` hands its lock to a background worker: the handler takes
the order's lock, ``detach()``es it into a ticket and queues the job (202 at once);
the worker ``attach()``es the ticket (in a real deployment: another process reading a
job queue), does the work and releases. Meanwhile the order stays locked.
"""

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Annotated

# --8<-- [start:app]
from fastapi import Depends, FastAPI, HTTPException, Request, Response

import aiolock


def get_locks(request: Request) -> aiolock.LockManager:
    """The dependency: the app's manager."""
    return request.app.state.locks  # type: ignore[no-any-return]


Locks = Annotated[aiolock.LockManager, Depends(get_locks)]
Hook = Callable[[aiolock.LockEvent], object]


def make_app(nodes: list[str], telemetry: Sequence[Hook] = ()) -> FastAPI:
    """The app; ``telemetry``: on_event hooks, say ``[OpenTelemetry(), Prometheus()]``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with aiolock.LockManager(nodes, on_event=list(telemetry)) as locks:
            app.state.locks = locks
            app.state.charged = {}
            app.state.refunded = {}
            app.state.jobs = asyncio.Queue()
            worker = asyncio.create_task(refund_worker(locks, app.state.jobs, app.state.refunded))
            try:
                yield
            finally:
                worker.cancel()

    app = FastAPI(lifespan=lifespan)

    @app.get("/ready")
    async def ready(locks: Locks, response: Response) -> dict[str, object]:
        """Readiness probe: can a lock be taken now (a quorum of nodes counts)?"""
        try:
            await locks.wait_ready(timeout=0)
        except aiolock.QuorumError as exc:
            response.status_code = 503
            return {"ready": False, "why": str(exc)}
        return {"ready": True}

    # --8<-- [end:app]

    # --8<-- [start:charge]
    @app.post("/orders/{order_id}/charge")
    async def charge(order_id: int, locks: Locks, request: Request) -> dict[str, object]:
        try:
            async with locks.lock(f"order:{order_id}", ttl=10, timeout=0.05) as lock:
                charged: dict[int, int] = request.app.state.charged
                charged[order_id] = charged.get(order_id, 0) + 1
                await asyncio.sleep(0.2)  # the payment provider's call
                return {"order": order_id, "charged": True, "fencing_token": lock.fencing_token}
        except aiolock.LockTimeout:
            raise HTTPException(409, f"order {order_id} is being charged already") from None
        except aiolock.QuorumError:
            raise unavailable() from None

    # --8<-- [end:charge]

    # --8<-- [start:refund]
    @app.post("/orders/{order_id}/refund", status_code=202)
    async def refund(order_id: int, locks: Locks, request: Request) -> dict[str, object]:
        lock = locks.lock(f"order:{order_id}", ttl=10)
        try:
            if not await lock.acquire(timeout=0.05):
                raise HTTPException(409, f"order {order_id} is busy")
        except aiolock.QuorumError:
            raise unavailable() from None
        # The lock goes with the job: a ticket (a secret: it carries the lock's token).
        await request.app.state.jobs.put((order_id, lock.detach()))
        return {"order": order_id, "refund": "queued"}

    return app


def unavailable() -> HTTPException:
    """503: the lock's nodes failed (down, or just started: see ``/ready``); retry soon."""
    return HTTPException(503, "locks are unavailable, retry shortly", {"Retry-After": "1"})


async def refund_worker(
    locks: aiolock.LockManager, jobs: "asyncio.Queue[tuple[int, str]]", done: dict[int, int]
) -> None:
    """Takes each job's lock over, does the refund, releases the order."""
    while True:
        order_id, ticket = await jobs.get()
        try:
            lock = await locks.attach(ticket)
        except aiolock.LockNotOwned:
            continue  # the lock expired before the job was picked up: drop the job
        try:
            await asyncio.sleep(0.2)  # the payment provider's refund call
            done[order_id] = done.get(order_id, 0) + 1
        finally:
            await lock.release()
    # --8<-- [end:refund]


def _telemetry() -> list[Hook]:
    """Metrics if the extras are installed (pip install aiolock-redis[otel,prometheus])."""
    try:
        from aiolock.telemetry import OpenTelemetry, Prometheus  # noqa: PLC0415

        return [OpenTelemetry(name=lambda name: name.split(":")[0]), Prometheus()]
    except ImportError:
        return []


app = make_app(os.environ.get("AIOLOCK_NODES", "redis://127.0.0.1:6379").split(","), _telemetry())
