"""A resource that protects itself with fencing tokens: refuses stale writers.

A lock alone cannot stop a holder that was paused (GC, a blocked event loop, a slow
network) past its lock's validity from writing after someone else took over. The
store remembers the highest fencing token it has seen per key and refuses writes
carrying a lower one::

    async with locks.lock("account:7", ttl=10) as lock:
        balance = store.read("account:7")
        store.write("account:7", new_balance, lock.fencing_token)   # may raise

Run it: ``python examples/fenced_store.py`` (starts local servers).
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from pathlib import Path

import aiolock
from aiolock.testing import redis_servers


class StaleTokenError(Exception):
    """A write carried a fencing token lower than one the store has already seen."""


class FencedStore:
    """A key-value store in SQLite whose writes must carry increasing tokens."""

    def __init__(self, path: str | Path) -> None:
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute(
            "create table if not exists fenced "
            "(key text primary key, value text not null, token integer not null)"
        )

    def write(self, key: str, value: str, token: int) -> None:
        """Store ``value`` unless a write with a token >= ``token`` came first."""
        # One statement: the check and the write cannot be split by another writer.
        cursor = self._db.execute(
            "insert into fenced (key, value, token) values (?, ?, ?) "
            "on conflict (key) do update set value = excluded.value, token = excluded.token "
            "where excluded.token > fenced.token",
            (key, value, token),
        )
        if cursor.rowcount == 0:
            raise StaleTokenError(f"write to {key!r} with stale fencing token {token}")

    def read(self, key: str) -> str | None:
        """The current value, or None."""
        row = self._db.execute("select value from fenced where key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def close(self) -> None:
        """Close the database."""
        self._db.close()


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = FencedStore(Path(tmp) / "store.db")
        # restart_grace=0: the servers were started empty by this script a moment ago. Against
        # long-running servers keep the default: a restarted node then waits out its quarantine.
        async with redis_servers(3) as urls, aiolock.LockManager(urls, restart_grace=0) as locks:
            slow = locks.lock("account:7", ttl=0.3, auto_renew=False)
            await slow.acquire()
            token = slow.fencing_token
            assert token is not None
            print(f"slow holder got token {token}, then pauses for 0.5 s ...")
            await asyncio.sleep(0.5)
            async with locks.lock("account:7", ttl=5) as fast:
                assert fast.fencing_token is not None
                store.write("account:7", "100", fast.fencing_token)
                print(f"another holder wrote 100 with token {fast.fencing_token}")
            try:
                store.write("account:7", "0", token)
            except StaleTokenError as exc:
                print(f"the slow holder wakes up and is refused: {exc}")
            print(f"balance: {store.read('account:7')}")
        store.close()


if __name__ == "__main__":
    asyncio.run(main())
