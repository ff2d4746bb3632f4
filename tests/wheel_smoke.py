"""What a stranger does first, on the built wheel: run by ``nox -s release``.

In a venv with the wheel installed (not editable; run from outside the checkout, so
``import aiolock`` is the installed one): ``python -m aiolock servers 3 --port P``
starts three embedded nodes, and every Python block of README.md runs as pasted
against them (6379-6381 replaced by their ports). Nothing is waived: the servers are
young, so the quickstart's ``wait_ready()`` waits their restart quarantine out, as it
would for a reader who started them a moment before.

    python tests/wheel_smoke.py README.md
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
LOCAL = re.compile(r"(localhost|127\.0\.0\.1):(6379|6380|6381)\b")


def main(readme: str) -> int:
    blocks = BLOCK.findall(Path(readme).read_text())
    assert blocks, f"no Python block in {readme}"
    with tempfile.TemporaryDirectory() as elsewhere:
        for base in range(21000, 60000, 997):
            servers = subprocess.Popen(
                [sys.executable, "-m", "aiolock", "servers", "3", "--port", str(base)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=elsewhere,
            )  # fmt: skip
            assert servers.stdout is not None
            nodes = ""
            for line in servers.stdout:
                if line.startswith("AIOLOCK_NODES="):
                    nodes = line.strip()
                    break
            if nodes:
                break
            servers.wait()  # a port taken: another base
        else:
            print("could not start the servers", file=sys.stderr)
            return 1
        try:
            print(nodes)
            ports = {str(6379 + i): str(base + i) for i in range(3)}
            for i, block in enumerate(blocks):
                program = LOCAL.sub(lambda m: f"{m.group(1)}:{ports[m.group(2)]}", block)
                result = subprocess.run(
                    [sys.executable, "-c", program],
                    capture_output=True, text=True, timeout=120, check=False, cwd=elsewhere,
                )  # fmt: skip
                print(f"README block {i}: exit {result.returncode}\n{result.stdout}")
                if result.returncode != 0:
                    print(result.stderr, file=sys.stderr)
                    return 1
        finally:
            servers.terminate()
            servers.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
