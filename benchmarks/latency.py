"""Uncontended acquire+release latency, next to a raw PING, in one run.

    python benchmarks/latency.py [--count N] [--json] [--nodes URL ...]

Same as ``python -m aiolock bench``.
"""

from __future__ import annotations

import sys

from aiolock._cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
