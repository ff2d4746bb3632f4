"""FastAPI: one LockManager for the app's lifetime, a lock per order, 409 when busy.

    pip install fastapi uvicorn
    AIOLOCK_NODES=redis://127.0.0.1:6379 uvicorn examples.fastapi_app:app

The manager is created in the app's lifespan (one set of connections per process,
closed at shutdown) and handed to endpoints by a dependency.
"""

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request

import aiolock


def get_locks(request: Request) -> aiolock.LockManager:
    """The dependency: the app's manager."""
    return request.app.state.locks  # type: ignore[no-any-return]


Locks = Annotated[aiolock.LockManager, Depends(get_locks)]


def make_app(nodes: list[str]) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with aiolock.LockManager(nodes) as locks:
            app.state.locks = locks
            app.state.charged = {}
            yield

    app = FastAPI(lifespan=lifespan)

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

    return app


app = make_app(os.environ.get("AIOLOCK_NODES", "redis://127.0.0.1:6379").split(","))
