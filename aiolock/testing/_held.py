"""What the delay nemesis (``_nemesis.py``) holds back, and the connections it holds it on.

Matchers pick requests by their words; a :class:`Rule` holds the matching ones back; a
:class:`Link` is one client connection through a proxy, whose :class:`_Pipe` in each
direction delivers chunks in order, each no earlier than its time.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

__all__ = ["Link", "Matcher", "Pipe", "Rule", "command", "pack", "script"]

#: A request's words (``[b"EVALSHA", sha, numkeys, ...]``) -> whether a rule applies.
Matcher = Callable[[Sequence[bytes]], bool]
#: The module of the library's scripts (imported when :func:`script` is called).
_SCRIPTS_MODULE: Final = "aiolock._lua"


def command(*names: str) -> Matcher:
    """Match requests whose command is one of ``names`` (case-insensitive)."""
    wanted = frozenset(name.upper().encode() for name in names)
    return lambda words: bool(words) and words[0].upper() in wanted


def script(*names: str) -> Matcher:
    """Match calls of aiolock's Lua scripts, by name: ``script("EXTEND", "EXTEND_MANY")``.

    The names are those of the library's script constants without ``_SCRIPT``
    (``ACQUIRE``, ``RELEASE``, ``EXTEND``, ``EXTEND_MANY``, ``REPAIR``, ``PASS_ON``,
    ``RELEASE_TURN``, ``TURN_JOIN``, ...). Both ``EVALSHA`` and ``EVAL`` match, and
    ``EXTEND_MANY`` also matches what the renewal of one lock is where the server has
    ``SET ... IFEQ`` (Valkey 8.1, Redis 8.4): that command.
    """
    shas: set[bytes] = set()
    sources: set[bytes] = set()
    scripts = importlib.import_module(_SCRIPTS_MODULE).every_script()
    for name in names:
        found = scripts.get(name.lower())
        if found is None:
            raise ValueError(f"aiolock has no script named {name!r}")
        shas.add(found.sha)
        sources.add(found.source)
    renewal = "extend_many" in map(str.lower, names)

    def match(words: Sequence[bytes]) -> bool:
        if len(words) < 2:
            return False
        verb = words[0].upper()
        if verb == b"SET":
            return renewal and len(words) > 3 and words[3].upper() == b"IFEQ"
        if verb == b"EVALSHA":
            return words[1].lower() in shas
        return verb == b"EVAL" and words[1] in sources

    return match


class Rule:
    """Hold back matching requests by ``delay`` seconds (see :meth:`NodeProxy.hold`)."""

    __slots__ = ("count", "delay", "links", "match", "matched")

    def __init__(
        self,
        match: Matcher,
        delay: float,
        count: int | None,
        links: Callable[[Link], bool] | None,
    ) -> None:
        self.match = match
        self.delay = delay
        #: How many more requests it applies to (``None``: no limit).
        self.count = count
        self.links = links
        #: How many requests it held back so far.
        self.matched = 0

    def applies(self, link: Link, words: Sequence[bytes]) -> bool:
        """Whether this request on ``link`` is held back (counts it if so)."""
        if self.count is not None and self.count <= 0:
            return False
        if self.links is not None and not self.links(link):
            return False
        if not self.match(words):
            return False
        self.matched += 1
        if self.count is not None:
            self.count -= 1
        return True


class Link:
    """One client connection through a :class:`NodeProxy`, and its upstream connection."""

    def __init__(self, proxy: int, index: int) -> None:
        #: The index of its proxy (node) in the :class:`Nemesis`.
        self.proxy = proxy
        #: The order in which the proxy accepted it, from 0.
        self.index = index
        #: ``"pubsub"`` once it subscribed to anything, else ``"commands"``.
        self.kind = "commands"
        #: Every command name it sent, in order (upper case); for tests that look.
        self.commands: list[bytes] = []
        self.closed = False
        self._pipes: list[Pipe] = []
        self._transports: list[asyncio.WriteTransport] = []
        self._tasks: list[asyncio.Task[None]] = []

    def flush(self) -> None:
        """Deliver what this connection holds back now, both ways, in order."""
        for pipe in self._pipes:
            pipe.flush()

    def drop(self) -> None:
        """Abort this connection both ways; what it holds back is lost (never applied)."""
        self.closed = True
        for transport in self._transports:
            transport.abort()
        for task in self._tasks:
            task.cancel()

    def __repr__(self) -> str:
        return f"<Link {self.proxy}.{self.index} {self.kind}>"


class Pipe:
    """Writes chunks to ``writer`` in order, each no earlier than its release time."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.queue: deque[tuple[float, bytes]] = deque()
        self.ready = asyncio.Event()
        self.last = 0.0

    def put(self, data: bytes, delay: float) -> None:
        loop = asyncio.get_running_loop()
        # Order is kept: nothing overtakes a chunk held back before it.
        at = max(loop.time() + delay, self.last)
        self.last = at
        if not self.queue and at <= loop.time():
            self.writer.write(data)
            return
        self.queue.append((at, data))
        self.ready.set()

    def flush(self) -> None:
        """Deliver everything held back now, in order."""
        now = asyncio.get_running_loop().time()
        self.queue = deque((now, data) for _, data in self.queue)
        self.last = now
        self.ready.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self.queue:
                self.ready.clear()
                await self.ready.wait()
            at, data = self.queue[0]
            wait = at - loop.time()
            if wait > 0:
                # Until its time, or until flushed (``math.inf``: until flushed).
                self.ready.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.ready.wait(), None if math.isinf(wait) else wait)
                continue
            self.queue.popleft()
            self.writer.write(data)
            await self.writer.drain()


def pack(words: Sequence[bytes]) -> bytes:
    parts = [b"*%d\r\n" % len(words)]
    parts.extend(b"$%d\r\n%s\r\n" % (len(word), word) for word in words)
    return b"".join(parts)
