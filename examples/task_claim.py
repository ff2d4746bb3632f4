"""Many worker processes share a job table; every job is done exactly once.

    python examples/task_claim.py --jobs 2000 --workers 4 --kill-one

Starts embedded Redis-protocol nodes, fills a SQLite job table, and runs worker
processes. Each worker picks undone jobs at random and claims one with a lock named
after it (``timeout=0``: busy jobs are skipped, not waited for). A worker killed in
the middle of a job never finishes it; its lock expires after ``ttl`` and another
worker takes the job over. The job is marked done by a conditional write (``where
done = 0``) that also records the lock's fencing token: a worker paused past its
lock's validity cannot mark a job twice. At the end the table is checked: every job
done, and done once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import aiolock
from aiolock.testing import redis_servers

TTL = 2.0


def connect(db: str) -> sqlite3.Connection:
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    conn.execute("pragma journal_mode = wal")
    conn.execute("pragma synchronous = normal")
    return conn


def create(db: str, jobs: int) -> None:
    conn = connect(db)
    conn.execute(
        "create table jobs (id integer primary key, done integer not null default 0, "
        "done_by integer, token integer, attempts integer not null default 0)"
    )
    conn.executemany("insert into jobs (id) values (?)", [(i,) for i in range(jobs)])
    conn.close()


# --8<-- [start:worker]
async def work(db: str, urls: list[str]) -> None:
    conn = connect(db)
    me = os.getpid()
    rng = random.Random(me)
    # restart_grace=0: the servers were started empty by this script a moment ago. Against
    # long-running servers keep the default: a restarted node then waits out its quarantine.
    async with aiolock.LockManager(urls, restart_grace=0) as locks:
        while True:
            todo = [row[0] for row in conn.execute("select id from jobs where done = 0 limit 200")]
            if not todo:
                break
            rng.shuffle(todo)
            claimed = False
            for job in todo[:20]:
                lock = locks.lock(f"job:{job}", ttl=TTL, timeout=0)
                if not await lock.acquire():
                    continue  # someone else is on it
                claimed = True
                try:
                    # Check again under the lock: it may have been done since we looked.
                    if conn.execute("select done from jobs where id = ?", (job,)).fetchone()[0]:
                        continue
                    conn.execute("update jobs set attempts = attempts + 1 where id = ?", (job,))
                    await asyncio.sleep(rng.uniform(0.001, 0.004))  # the work itself
                    conn.execute(
                        "update jobs set done = 1, done_by = ?, token = ? "
                        "where id = ? and done = 0",
                        (me, lock.fencing_token, job),
                    )
                finally:
                    await lock.release()
            if not claimed:
                await asyncio.sleep(0.05)  # all candidates busy (or expiring): look again
    conn.close()


# --8<-- [end:worker]


def check(db: str, jobs: int) -> tuple[int, int, int]:
    """(jobs done, jobs started more than once, workers that finished jobs)."""
    conn = connect(db)
    done = conn.execute("select count(*) from jobs where done = 1").fetchone()[0]
    retried = conn.execute("select count(*) from jobs where attempts > 1").fetchone()[0]
    workers = conn.execute("select count(distinct done_by) from jobs").fetchone()[0]
    conn.close()
    return done, retried, workers


async def run(jobs: int, workers: int, kill_one: bool) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "jobs.db")
        create(db, jobs)
        async with redis_servers(3) as urls:
            procs = [
                await asyncio.create_subprocess_exec(sys.executable, __file__, "worker", db, *urls)
                for _ in range(workers)
            ]
            killed = None
            conn = connect(db)
            started = time.monotonic()
            while any(p.returncode is None for p in procs):
                done = conn.execute("select count(*) from jobs where done = 1").fetchone()[0]
                if sys.stderr.isatty():
                    bar = "#" * (40 * done // jobs)
                    print(f"\r[{bar:<40}] {done}/{jobs}", end="", file=sys.stderr, flush=True)
                if kill_one and killed is None and done >= jobs // 3:
                    killed = procs[0]
                    killed.send_signal(signal.SIGKILL)  # in the middle of a job, likely
                await asyncio.sleep(0.05)
            conn.close()
            if sys.stderr.isatty():
                print(file=sys.stderr)
            for proc in procs:
                await proc.wait()
        done, retried, distinct = check(db, jobs)
    elapsed = time.monotonic() - started
    print(
        f"{jobs} jobs, {workers} workers{' (one killed)' if killed else ''}: {done} done "
        f"exactly once by {distinct} workers in {elapsed:.1f}s; {retried} taken over "
        "(started by a worker that died)"
    )
    return 0 if done == jobs else 1


def main() -> int:
    if sys.argv[1:2] == ["worker"]:
        asyncio.run(work(sys.argv[2], sys.argv[3:]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kill-one", action="store_true", help="SIGKILL a worker mid-run")
    args = parser.parse_args()
    return asyncio.run(run(args.jobs, args.workers, args.kill_one))


if __name__ == "__main__":
    sys.exit(main())
