"""Tornado: a RequestHandler that takes a lock per order, 409 when busy.

python -m pip install 'aiolock-redis[examples]'
AIOLOCK_NODES=redis://127.0.0.1:6379 python examples/tornado_app.py

Busy (``LockTimeout``) answers 409; the nodes failing (``QuorumError``: down, or just
started and still in their restart quarantine) answer 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import json
import os

import tornado.web

import aiolock


class ChargeHandler(tornado.web.RequestHandler):
    def initialize(self, locks: aiolock.LockManager, charged: dict[int, int]) -> None:
        self.locks = locks
        self.charged = charged

    async def post(self, order_id: str) -> None:
        oid = int(order_id)
        try:
            async with self.locks.lock(f"order:{oid}", ttl=10, timeout=0.05) as lock:
                self.charged[oid] = self.charged.get(oid, 0) + 1
                await asyncio.sleep(0.2)  # the payment provider's call
                self.write(json.dumps({"order": oid, "fencing_token": lock.fencing_token}))
        except aiolock.LockTimeout:
            self.set_status(409)
            self.write(json.dumps({"error": f"order {oid} is being charged already"}))
        except aiolock.QuorumError:
            self.set_status(503)
            self.set_header("Retry-After", "1")
            self.write(json.dumps({"error": "locks are unavailable, retry shortly"}))


def make_app(locks: aiolock.LockManager, charged: dict[int, int]) -> tornado.web.Application:
    args = {"locks": locks, "charged": charged}
    return tornado.web.Application([(r"/orders/(\d+)/charge", ChargeHandler, args)])


async def main() -> None:
    nodes = os.environ.get("AIOLOCK_NODES", "redis://127.0.0.1:6379").split(",")
    async with aiolock.LockManager(nodes) as locks:
        make_app(locks, {}).listen(8888)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
