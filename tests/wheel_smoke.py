"""What a stranger does first, on the built wheel: run by ``nox -s release``.

In a venv with the wheel installed (``aiolock-redis[testing,examples]``, not editable;
run from outside the checkout, so ``import aiolock`` is the installed one):
``python -m aiolock servers 3 --port P`` starts three embedded nodes, and

- every Python block of README.md runs as pasted against them (6379-6381 replaced by
  their ports). Nothing is waived: the servers are young, so the quickstart's
  ``wait_ready()`` waits their restart quarantine out, as it would for a reader who
  started them a moment before;
- the FastAPI tutorial: its file, saved as ``fastapi_app.py``, served by uvicorn with
  ``AIOLOCK_NODES`` set; ``/ready`` answers 200 once the quarantine is over (503
  before, never 500), and a charge goes through.

    python tests/wheel_smoke.py README.md examples/fastapi_app.py
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
LOCAL = re.compile(r"(localhost|127\.0\.0\.1):(6379|6380|6381)\b")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _http(method: str, url: str) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, method=method)  # noqa: S310 (http://127.0.0.1)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def tutorial(app_file: str, nodes: str, elsewhere: str) -> int:
    """Serve the tutorial's app with uvicorn; /ready turns 200, then a charge goes through."""
    shutil.copy(app_file, Path(elsewhere) / "fastapi_app.py")
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "fastapi_app:app", "--port", str(port)],
        cwd=elsewhere, env={"AIOLOCK_NODES": nodes.split("=", 1)[1], "PATH": ""},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        codes: list[int] = []
        while time.monotonic() < deadline:
            try:
                code, _body = _http("GET", f"{base}/ready")
            except (ConnectionError, urllib.error.URLError):
                time.sleep(0.2)  # uvicorn not listening yet
                continue
            codes.append(code)
            if code == 200:
                break
            time.sleep(0.5)
        print(f"tutorial: /ready answered {sorted(set(codes))}")
        if not codes or codes[-1] != 200 or set(codes) - {200, 503}:
            return 1
        code, body = _http("POST", f"{base}/orders/42/charge")
        print(f"tutorial: charge answered {code} {body}")
        return 0 if code == 200 and body.get("charged") is True else 1
    finally:
        server.terminate()
        _out, err = server.communicate(timeout=30)
        if "Traceback" in err:
            print(err, file=sys.stderr)


def main(readme: str, app_file: str) -> int:
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
            return tutorial(app_file, nodes, elsewhere)
        finally:
            servers.terminate()
            servers.wait(30)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
