"""Runs of ``python -m tests.sim``, each in a fork of one process that imported their
dependencies once.

A named mutant's replay runs the simulation on a copy of the library with the mutant
applied (tests/test_sim.py). A fresh interpreter for each spends most of a replay's
time importing: about 0.7 s of a median 0.8 s. This process imports what
``tests.sim`` imports, except aiolock and the tests (the copy's are imported after the
fork), then forks one child per request. The child runs ``python -m tests.sim ARGS``
in the copy's directory, as a fresh interpreter would there.

Run as a script (``python tests/preloaded.py``, with the environment the runs need).
Requests and answers are JSON lines on stdin and stdout:
``{"cwd": DIR, "argv": [...], "stdout": FILE, "stderr": FILE}`` is answered with
``{"code": EXIT_CODE}`` once the child has exited.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import subprocess
import sys
import traceback

#: Not preloaded: what each run imports from the tree it runs in.
OWN = ("aiolock", "tests", "__main__", "__mp_main__")


def preload(root: str) -> None:
    """Import what ``tests.sim`` imports besides :data:`OWN` (as a throwaway
    interpreter in ``root`` finds it)."""
    found = subprocess.run(
        [sys.executable, "-c", "import sys; b = set(sys.modules); import tests.sim.__main__; "
         "print('\\n'.join(m for m in sys.modules if m not in b))"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for name in found:
        if name.split(".")[0] not in OWN:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: S112 - importable only through its package's own import
                continue


def child(request: dict[str, object]) -> None:
    """In the fork: run ``tests.sim`` as ``python -m`` would in ``request["cwd"]``; exit."""
    code = 1
    try:
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            opened = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        cwd = str(request["cwd"])
        os.chdir(cwd)
        sys.path[0] = cwd  # (this script's directory, as `-m` has the current one)
        sys.argv = ["tests.sim", *map(str, request["argv"])]  # type: ignore[call-overload]
        try:
            runpy.run_module("tests.sim", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:  # reported as a fresh interpreter would
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    preload(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(request)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()
