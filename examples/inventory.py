"""Concurrent stock decrements that never oversell.

    python examples/inventory.py

Many buyers (tasks in several "processes": managers) race for 20 items; the stock is
read and written under a lock named after the product, so exactly 20 are sold.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as redis

import aiolock
from aiolock.testing import redis_servers


async def buy(locks: aiolock.LockManager, store: redis.Redis, product: str) -> bool:
    async with locks.lock(f"stock:{product}", ttl=5, timeout=10):
        left = int(await store.get(f"stock:{product}") or 0)
        if left <= 0:
            return False
        await asyncio.sleep(0)  # anything may happen between read and write
        await store.set(f"stock:{product}", left - 1)
        return True


async def main(buyers: int = 100, stock: int = 20) -> int:
    async with redis_servers(3) as urls:
        store = redis.Redis.from_url(urls[0])
        await store.set("stock:widget", stock)
        # restart_grace=0: the servers were started empty by this script a moment ago. Against
        # long-running servers keep the default: a restarted node then waits out its quarantine.
        managers = [aiolock.LockManager(urls, restart_grace=0) for _ in range(4)]
        try:
            results = await asyncio.gather(
                *(buy(managers[i % 4], store, "widget") for i in range(buyers))
            )
        finally:
            for manager in managers:
                await manager.aclose()
        sold = sum(results)
        left = int(await store.get("stock:widget") or 0)
        await store.aclose()
    print(f"{buyers} buyers, {stock} in stock: sold {sold}, left {left}")
    assert sold == stock
    assert left == 0
    return sold


if __name__ == "__main__":
    asyncio.run(main())
