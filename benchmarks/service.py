"""A real service's figure: a FastAPI endpoint with and without a 5-node lock, side by side.

    pip install -e '.[examples,testing,uvloop]'
    python benchmarks/service.py [--seconds 5] [--rounds 3] [--connections 32] [--checkout DIR]

Starts 5 embedded nodes and one uvicorn worker serving two endpoints of one app:
``/plain`` answers at once, ``/locked`` takes a lock of its own name on the 5 nodes
(``async with locks.lock(...)``, no renewal) and answers inside it. A load generator in
a process of its own (asyncio, on uvloop when installed: keep-alive HTTP/1.1 over
``--connections`` connections, each sending its next request as the last one's answer
arrives) drives each endpoint for ``--seconds`` in turn, ``--rounds`` times,
interleaved; the medians of requests per second are reported side by side, with their
ratio (``--checkout``: the worker imports the aiolock of another checkout, a ``git
worktree`` of the commit to compare with). Everything runs on one machine, as a small
service's host would: the servers, the worker and the load generator share its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from asyncio.subprocess import PIPE
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aiolock.testing import redis_servers  # noqa: E402

#: The app uvicorn serves (``NODES``: the nodes' URLs, comma-separated).
APP = """
import itertools, os
from contextlib import asynccontextmanager
from fastapi import FastAPI
from aiolock import LockManager

locks = LockManager(os.environ["NODES"].split(","), restart_grace=0)
numbers = itertools.count()

@asynccontextmanager
async def lifespan(app):
    async with locks:
        yield

app = FastAPI(lifespan=lifespan)

@app.get("/plain")
async def plain():
    return {"n": next(numbers)}

@app.get("/locked")
async def locked():
    n = next(numbers)
    async with locks.lock(f"service:{n}", ttl=10, timeout=5, auto_renew=False):
        return {"n": n}
"""

#: The load generator: prints the responses per second of one path.
LOAD = """
import asyncio, sys, time
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
seconds, connections = float(sys.argv[4]), int(sys.argv[5])
request = f"GET {path} HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n".encode()

class Client(asyncio.Protocol):
    def __init__(self, counts):
        self.counts, self.buffer = counts, b""
    def connection_made(self, transport):
        self.transport = transport
        transport.write(request)
    def data_received(self, data):
        buffer = self.buffer + data
        while (end := buffer.find(b"\\r\\n\\r\\n")) >= 0:
            head = buffer[:end].lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15:].split(b"\\r\\n", 1)[0]) if at >= 0 else 0
            if len(buffer) < end + 4 + length:
                break
            if not head.startswith(b"http/1.1 200"):
                raise SystemExit(head.split(b"\\r\\n", 1)[0].decode())
            buffer = buffer[end + 4 + length:]
            self.counts[0] += 1
            self.transport.write(request)
        self.buffer = buffer

async def main():
    loop = asyncio.get_running_loop()
    counts = [0]
    transports = [
        (await loop.create_connection(lambda: Client(counts), host, port))[0]
        for _ in range(connections)
    ]
    await asyncio.sleep(min(1.0, seconds / 5))  # warm-up
    start, before = time.perf_counter(), counts[0]
    await asyncio.sleep(seconds)
    print((counts[0] - before) / (time.perf_counter() - start))
    for transport in transports:
        transport.close()

try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_for_port(port: int, worker: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if worker.returncode is not None:
            raise RuntimeError("the uvicorn worker exited")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        return
    raise RuntimeError("the uvicorn worker did not listen within 30 s")


async def _load(port: int, path: str, seconds: float, connections: int) -> float:
    args = ["127.0.0.1", str(port), path, str(seconds), str(connections)]
    load = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LOAD, *args, stdout=PIPE, stderr=PIPE
    )
    out, err = await load.communicate()
    if load.returncode:
        raise RuntimeError(f"the load generator failed on {path}: {err.decode()[-1000:]}")
    return float(out)


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the aiolock to serve")
    args = parser.parse_args(argv)
    rates: dict[str, list[float]] = {"/plain": [], "/locked": []}
    async with redis_servers(5) as servers:
        with tempfile.TemporaryDirectory(prefix="aiolock-service-") as tmp:
            (Path(tmp) / "service_app.py").write_text(APP)
            served = str(args.checkout.resolve())
            env = {**os.environ, "NODES": ",".join(servers), "PYTHONPATH": served}
            port = _free_port()
            worker = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "uvicorn", "service_app:app", "--port", str(port),
                "--log-level", "warning", "--no-access-log", "--app-dir", tmp, env=env,
            )  # fmt: skip
            try:
                await _wait_for_port(port, worker)
                for _ in range(args.rounds):
                    for path, out in rates.items():
                        out.append(await _load(port, path, args.seconds, args.connections))
            finally:
                worker.terminate()
                await worker.wait()
    plain, locked = (statistics.median(rates[p]) for p in ("/plain", "/locked"))
    figures = {
        "connections": args.connections,
        "rounds": args.rounds,
        "plain_per_second": plain,
        "locked_per_second": locked,
        "ratio": locked / plain,
        "runs": rates,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(
            f"# uvicorn + FastAPI, one worker, {args.connections} connections, medians of "
            f"{args.rounds} interleaved rounds"
        )
        print(f"endpoint without a lock:     {plain:6.0f} req/s")
        print(f"endpoint with a 5-node lock: {locked:6.0f} req/s ({locked / plain:.0%} of it)")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
