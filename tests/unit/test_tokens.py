"""aiolock/_core/tokens.py: lock tokens, drawn from the OS in batches."""

from __future__ import annotations

import subprocess
import sys

from aiolock._core import tokens


def test_tokens_are_of_their_size_and_never_repeat_across_batches() -> None:
    drawn = [tokens.new_token() for _ in range(5 * tokens.BATCH + 3)]
    assert {len(token) for token in drawn} == {tokens.TOKEN_BYTES}
    assert len(set(drawn)) == len(drawn)


# Run in a fresh process: forking this one (threads of the test run may be alive) warns.
FORKED = """
import os
from aiolock._core import tokens

tokens.new_token()  # a batch drawn: its rest waits in the parent
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the child: its next tokens, to the parent
    os.close(read)
    os.write(write, b"".join(tokens.new_token() for _ in range(tokens.BATCH)))
    os._exit(0)
os.close(write)
with os.fdopen(read, "rb") as pipe:
    data = pipe.read()
os.waitpid(pid, 0)
size = tokens.TOKEN_BYTES
child = {data[i : i + size] for i in range(0, len(data), size)}
parent = {tokens.new_token() for _ in range(tokens.BATCH)}
print(len(child), len(child & parent))
"""


def test_a_forked_child_never_takes_a_token_its_parent_drew() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORKED], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == [str(tokens.BATCH), "0"]
