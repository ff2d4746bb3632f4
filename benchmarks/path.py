"""How far one call travels in the package: modules and functions of one acquire, one release.

    python benchmarks/path.py [--nodes N]

Starts N local servers (5 by default), warms a manager up with a few cycles, then counts
the Python functions of ``aiolock/`` (and their modules) that one uncontended
``acquire()`` and one ``release()`` enter, with ``sys.setprofile``. Also prints the
longest chain of imports under ``import aiolock`` (as ``tests/test_layout.py`` reads it).
Callbacks the event loop runs in between (replies, timers) count for the call they serve.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiolock  # noqa: E402
from aiolock.testing import redis_servers  # noqa: E402
from tests.test_layout import _imports, longest_chain  # noqa: E402

PACKAGE = str(ROOT / "aiolock")


async def traced(call: Callable[[], Awaitable[object]]) -> tuple[set[str], set[str]]:
    """The package's modules and functions that ``call`` enters, until it returns."""
    functions: set[str] = set()

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            path = Path(frame.f_code.co_filename).relative_to(ROOT)
            functions.add(f"{path}:{frame.f_code.co_qualname}")

    sys.setprofile(profile)
    try:
        await call()
    finally:
        sys.setprofile(None)
    modules = {name.split(":")[0] for name in functions}
    return modules, functions


async def main(n: int) -> None:
    async with (
        redis_servers(n) as urls,
        aiolock.LockManager(urls, restart_grace=0) as locks,
    ):
        lock = locks.lock("path:cycle", ttl=10, auto_renew=False)
        for _ in range(20):  # warm: connections, scripts loaded
            await lock.acquire(timeout=0)
            await lock.release()
        acquire = await traced(lambda: lock.acquire(timeout=0))
        release = await traced(lock.release)
    chain = longest_chain(_imports())
    print(f"longest import chain under aiolock: {len(chain)}: {' > '.join(chain)}")
    for what, (modules, functions) in (("acquire", acquire), ("release", release)):
        print(f"{what} on {n} nodes: {len(modules)} modules, {len(functions)} functions")
        for module in sorted(modules):
            print(f"  {module}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5)
    asyncio.run(main(parser.parse_args().nodes))
