"""The Lua scripts the nodes run: one file each, beside this module, read whole.

Each ``<name>.lua`` is headed by comment lines (its KEYS, ARGV and what it returns) and a
blank line; the nodes run what follows. A line ``--+ _part.lua`` stands for the lines of
the shared part ``_part.lua`` (its body, after its own header); ``--+ _part.lua A=B``
writes ``B`` wherever the part says ``A``. Nothing else is rewritten: what the nodes
run, and its SHA1, is the file as a reader sees it with its parts in place
(``tests/unit/test_lua.py`` pins every SHA1).

Every script touches only keys of one lock name, all sharing one hash tag, so the
scripts also run on Redis Cluster nodes. On a cluster with sharded pub/sub a script that
announces runs as :meth:`Script.sharded` gives it.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib.resources import files
from typing import Final

__all__ = [
    "ACQUIRE_SCRIPT",
    "EXTEND_MANY_SCRIPT",
    "EXTEND_SCRIPT",
    "FORCE_RELEASE_SCRIPT",
    "HANDOVER_SCRIPT",
    "INSPECT_SCRIPT",
    "NOT_FREE",
    "PASS_ON_SCRIPT",
    "RAISE_FENCE_SCRIPT",
    "RELEASE_EITHER_SCRIPT",
    "RELEASE_SCRIPT",
    "RELEASE_TURN_SCRIPT",
    "REPAIR_SCRIPT",
    "RW_READ_SCRIPT",
    "RW_RELEASE_SCRIPT",
    "RW_WRITE_SCRIPT",
    "SCRIPTS",
    "SEM_ACQUIRE_SCRIPT",
    "SEM_CHECKS",
    "SEM_FREE_REPORTED",
    "SEM_RELEASE_SCRIPT",
    "SHORTENED",
    "TURN_JOIN_SCRIPT",
    "TURN_LEAVE_SCRIPT",
    "TURN_SCRIPTS",
    "Script",
    "every_script",
    "source_of",
]

_PART = re.compile(r"--\+ (_\w+\.lua)((?: \S+=\S+)*)")


def _body(name: str) -> str:
    """A file's text after its header (the leading comment lines and one blank line)."""
    lines = files(__name__).joinpath(name).read_text(encoding="utf-8").splitlines(keepends=True)
    start = 0
    while start < len(lines) and lines[start].startswith("--"):
        start += 1
    if start < len(lines) and lines[start] == "\n":
        start += 1
    return "".join(lines[start:])


def _renamed(text: str, renames: dict[str, str]) -> str:
    """``text`` with each key of ``renames`` written as its value (all in one pass)."""
    if not renames:
        return text
    return re.sub("|".join(map(re.escape, renames)), lambda m: renames[m[0]], text)


@cache
def source_of(name: str) -> bytes:
    """What the nodes run for ``name`` (a file name): its body with its parts in place."""
    out: list[str] = []
    for line in _body(name).splitlines(keepends=True):
        part = _PART.fullmatch(line.rstrip("\n"))
        if part is None:
            out.append(line)
            continue
        renames = dict(pair.split("=", 1) for pair in part[2].split())
        out.append(_renamed(source_of(part[1]).decode(), renames))
    return "".join(out).encode()


class Script:
    """A Lua script with its SHA1, run with EVALSHA and re-sent with EVAL on NOSCRIPT.

    ``per_key_args``: when non-zero, the script treats each key alike, with that many
    arguments of its own (key *i* owns ``ARGV[per_key_args*(i-1)+1 ...]``), and replies
    with one value per key. Such a call may be split by the keys' hash slots (see
    :class:`aiolock._io.cluster.ClusterNode`); any other must keep its keys in one slot.
    """

    __slots__ = ("name", "per_key_args", "sha", "source")

    def __init__(self, source: bytes, *, per_key_args: int = 0, name: str = "") -> None:
        self.name = name
        self.source = source
        self.per_key_args = per_key_args
        # SHA1 names the script for EVALSHA; it is not used for security.
        self.sha = hashlib.sha1(source, usedforsecurity=False).hexdigest().encode()

    @classmethod
    def load(cls, name: str, *, per_key_args: int = 0) -> Script:
        """The script of the file ``name``.lua."""
        return cls(source_of(f"{name}.lua"), per_key_args=per_key_args, name=name)

    def __repr__(self) -> str:
        return f"<Script {self.name or self.sha.decode()[:12]}>"

    def sharded(self) -> Script:
        """The script announcing with ``SPUBLISH`` (never failing its caller for it).

        The one difference between the two texts: each ``redis.call('publish'`` is a
        ``redis.pcall('spublish'`` (a server before 7.0 refuses SPUBLISH; a release must
        not fail for it). Both SHA1s are pinned by the tests.
        """
        source = self.source.replace(b"redis.call('publish'", b"redis.pcall('spublish'")
        return Script(source, per_key_args=self.per_key_args, name=f"{self.name}, sharded")


#: The message of a release after which the lock is not free for the waiters of other
#: processes, who then do not try: it goes to a waiter of the releasing process (see
#: _waiting/), or it was the clean-up of a lost race, whose winner holds the lock.
NOT_FREE: Final = b"l"
#: The message of an ``EXTEND`` that shortened the lock, or of a ``PASS_ON`` or a
#: ``HANDOVER`` to a shorter ttl than the key had left: the waiters of every process
#: try again, and so learn when it now expires (the lock is held: nobody's turn is
#: used, nobody is named).
SHORTENED: Final = b"s"
#: How many slots with no note a failed semaphore try learns of, per node (written in
#: sem_acquire.lua).
SEM_FREE_REPORTED: Final = 4
#: How many slots whose note has run out a failed semaphore try learns of, per node; the
#: caller sends at most as many along to be checked (written in sem_acquire.lua).
SEM_CHECKS: Final = 16

# The lock's.
ACQUIRE_SCRIPT: Final = Script.load("acquire")
RELEASE_SCRIPT: Final = Script.load("release")
RAISE_FENCE_SCRIPT: Final = Script.load("raise_fence")
EXTEND_SCRIPT: Final = Script.load("extend")
EXTEND_MANY_SCRIPT: Final = Script.load("extend_many", per_key_args=2)
REPAIR_SCRIPT: Final = Script.load("repair")
INSPECT_SCRIPT: Final = Script.load("inspect")
HANDOVER_SCRIPT: Final = Script.load("handover")
PASS_ON_SCRIPT: Final = Script.load("pass_on")
RELEASE_EITHER_SCRIPT: Final = Script.load("release_either")
FORCE_RELEASE_SCRIPT: Final = Script.load("force_release")
# The turn queue's (see _waiting/turns.py).
RELEASE_TURN_SCRIPT: Final = Script.load("release_turn")
TURN_JOIN_SCRIPT: Final = Script.load("turn_join")
TURN_LEAVE_SCRIPT: Final = Script.load("turn_leave")
# The read-write lock's and the semaphore's.
RW_READ_SCRIPT: Final = Script.load("rw_read")
RW_WRITE_SCRIPT: Final = Script.load("rw_write")
RW_RELEASE_SCRIPT: Final = Script.load("rw_release")
SEM_ACQUIRE_SCRIPT: Final = Script.load("sem_acquire")
SEM_RELEASE_SCRIPT: Final = Script.load("sem_release")

#: Loaded on each node's first connection: the hot path's.
SCRIPTS: Final = (
    ACQUIRE_SCRIPT,
    RELEASE_SCRIPT,
    EXTEND_SCRIPT,
    RAISE_FENCE_SCRIPT,
    PASS_ON_SCRIPT,
)
#: Loaded with the hot path's scripts on each connection.
TURN_SCRIPTS: Final = (RELEASE_TURN_SCRIPT, TURN_JOIN_SCRIPT, TURN_LEAVE_SCRIPT)
# The others are loaded on first use (NOSCRIPT fallback): most applications never
# need the read-write lock's (the renewal's two are loaded with SCRIPTS: _engine.py).


def every_script() -> dict[str, Script]:
    """Every script of the library, by name (the file's, without ``.lua``)."""
    return {s.name: s for s in globals().values() if isinstance(s, Script)}
