"""The floor: the least any client can do for the work of one lock cycle.

A cycle (acquire, then release) is two round trips to every node, the second sent when
the first has decided. The floor does the same with nothing of a lock in it: two
sequential PING fan-outs over raw asyncio protocols, one long-lived connection per node,
no parser beyond counting reply lines, no tasks. Every latency figure of ``bench`` is
also given as a ratio to it, measured in the same interleaved rounds, so that what is
left to win is in the figure itself.

The same round trips carrying a cycle's two scripts (:meth:`Floor.scripts`) are the
floor *given the server's work*: the ratio of a cycle to it is what the client adds, and
its own ratio to the PING floor what the scripts cost the servers.

The floor of a handoff between processes (:meth:`Floor.handoffs`) is one PUBLISH heard
by another connection, then one script fan-out: the least a waiter told of a release
does to take the lock. Given the servers' work (:meth:`Floor.grants`), it is the
handoff's own script on every node, a release granting the lock to the next process
in line, until a majority of the grants are heard on that process's connections.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import hiredis
from redis.asyncio.connection import parse_url

from .._core.keys import fence_key, fence_retention, lock_key, turn_keys
from .._core.tokens import new_token
from .._core.votes import milliseconds
from .._lua import ACQUIRE_SCRIPT, RELEASE_TURN_SCRIPT

__all__ = ["Floor"]

_PING = b"*1\r\n$4\r\nPING\r\n"


def _command(*parts: bytes) -> bytes:
    head = b"*%d\r\n" % len(parts)
    return head + b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)


#: A script that does nothing, for the handoff's fan-out: ``EVAL`` it once, then
#: ``EVALSHA``.
_NOOP = b"return 1"
_NOOP_SHA = hashlib.sha1(_NOOP).hexdigest().encode()  # noqa: S324 - Redis's script id


def _taken(reply: Any) -> bool:
    return type(reply) is int and reply > 0  # (ACQUIRE's fencing token)


def _released(reply: Any) -> bool:
    return bool(reply == 1)


class _Line(asyncio.Protocol):
    """One connection, its replies parsed by hiredis and given to requests in order.

    A reply nobody asked for (a pub/sub message) goes to :meth:`next_message`'s future.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: collections.deque[Callable[[Any], None]] = collections.deque()
        self.reader = hiredis.Reader()
        self.message: asyncio.Future[Any] | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if self.waiting:
                self.waiting.popleft()(reply)
            elif self.message is not None and not self.message.done():
                self.message.set_result(reply)

    def next_message(self) -> asyncio.Future[Any]:
        """The next reply that no request waits for."""
        self.message = self.loop.create_future()
        return self.message

    def send(self, request: bytes) -> asyncio.Future[Any]:
        """Write ``request``: its reply, as a future."""
        reply: asyncio.Future[Any] = self.loop.create_future()
        self.waiting.append(reply.set_result)  # (call()'s body inlined: a call less per PING)
        assert self.transport is not None  # noqa: S101 - opened by Floor.open
        self.transport.write(request)
        return reply

    def call(self, request: bytes, callback: Callable[[Any], None]) -> None:
        """Write ``request``: ``callback`` gets its reply."""
        self.waiting.append(callback)
        assert self.transport is not None  # noqa: S101 - opened by Floor.open
        self.transport.write(request)


def _close(lines: Sequence[_Line]) -> None:
    for line in lines:
        if line.transport is not None:
            line.transport.close()


def _lock(name: str, ttl: float) -> tuple[tuple[bytes, ...], bytes, bytes]:
    """The lock ``name``'s keys, ttl and counter retention, as a floor sends them.

    The keys (default prefix): the lock's, its counter's, its turn queue's three; the
    times in milliseconds.
    """
    key = lock_key(b"aiolock:", name)
    px, retention = milliseconds(ttl), milliseconds(fence_retention(ttl))
    return (key, fence_key(key), *turn_keys(key)), b"%d" % px, b"%d" % retention


#: The process a :func:`grant` names, and the token of its offer.
GRANTEE, GRANTEE_TOKEN = b"bb", b"bb-token"


def grant(
    name: str, token: bytes, ttl: float = 10.0
) -> tuple[list[tuple[bytes, ...]], tuple[bytes, ...]]:
    """A release that grants the lock ``name`` to the next process in line, set up afresh.

    The commands that set a node up: the key held with ``token`` by process ``aa``,
    first in line, and :data:`GRANTEE` next, its offer fresh (:data:`GRANTEE_TOKEN`,
    ``ttl``). Then ``RELEASE_TURN``'s arguments (numkeys, keys, ARGV) for ``aa``'s
    release, as a handoff between processes sends it: ``aa`` still waits, and leaves an
    offer of its own.
    """
    keys, px, retention = _lock(name, ttl)
    key, _, turns, live, offers = keys
    now_ms = int(time.time() * 1000)
    now, due = b"%d" % now_ms, b"%d" % (now_ms + 60_000)
    offer = b"%s 7 %s %s %s %s" % (GRANTEE, px, retention, now, GRANTEE_TOKEN)
    setup = [
        (b"SET", key, token, b"PX", px),
        (b"ZADD", turns, b"1", b"aa", b"2", GRANTEE),
        (b"ZADD", live, due, b"aa", due, GRANTEE),
        (b"ZADD", offers, b"2", offer),
    ]
    floor = b"%d" % int(time.time() * 1_000_000)
    own_offer = (b"8", px, retention, token)
    return setup, (b"%d" % len(keys), *keys, token, floor, b"60000", b"1", b"aa", *own_offer)


async def _connect(url: str) -> _Line:
    options: dict[str, Any] = dict(parse_url(url))
    loop = asyncio.get_running_loop()
    if "path" in options:
        _, line = await loop.create_unix_connection(_Line, options["path"])
    else:
        host, port = options.get("host", "localhost"), int(options.get("port", 6379))
        _, line = await loop.create_connection(_Line, host, port)
    if options.get("password"):
        user = str(options.get("username") or "default").encode()
        await line.send(_command(b"AUTH", user, str(options["password"]).encode()))
    if options.get("db"):
        await line.send(_command(b"SELECT", str(options["db"]).encode()))
    return line


class Floor:
    """Raw connections to ``nodes``: :meth:`cycle` is the floor of a lock cycle."""

    def __init__(self, lines: Sequence[_Line], urls: Sequence[str]) -> None:
        self.lines = list(lines)
        self._urls = list(urls)  # (each line's node, for the connections grants() opens)
        self._token = new_token()

    @classmethod
    async def open(cls, nodes: Sequence[str]) -> Floor:
        """One connection per node."""
        return cls([await _connect(url) for url in nodes], nodes)

    def close(self) -> None:
        """Close every connection."""
        _close(self.lines)

    async def fan_out(self, request: bytes = _PING) -> None:
        """``request`` written to every node, then every reply awaited."""
        replies = [line.send(request) for line in self.lines]
        for reply in replies:
            await reply

    async def cycle(self) -> None:
        """Two sequential PING fan-outs: the floor of acquire + release."""
        await self.fan_out()
        await self.fan_out()

    async def load_scripts(self) -> None:
        """Load the scripts :meth:`scripts` sends on every node."""
        for script in (ACQUIRE_SCRIPT, RELEASE_TURN_SCRIPT):
            await self.fan_out(_command(b"SCRIPT", b"LOAD", script.source))

    async def scripts(self, name: str = "bench:floor", ttl: float = 10.0) -> None:
        """An uncontended cycle's two scripts, as two sequential fan-outs.

        ``ACQUIRE`` then ``RELEASE_TURN`` on the lock ``name`` (default prefix), with the
        arguments aiolock sends for a lock nobody waits for (a fresh fencing floor
        each time), each fan-out decided by a majority of replies as a lock's is;
        call :meth:`load_scripts` first.
        """
        keys, px, retention = _lock(name, ttl)
        token, floor = self._token, b"%d" % int(time.time() * 1_000_000)
        acquire = _command(
            b"EVALSHA", ACQUIRE_SCRIPT.sha, b"2", *keys[:2], token, px, retention, floor
        )
        release = _command(
            b"EVALSHA", RELEASE_TURN_SCRIPT.sha, b"%d" % len(keys), *keys, token, floor
        )
        await self.majority(acquire, _taken)
        await self.majority(release, _released)

    async def majority(self, request: bytes, check: Callable[[Any], bool]) -> None:
        """``request`` written to every node; returns once a majority answered.

        As a lock decides: the other replies are read as they come. Each reply of the
        majority must pass ``check`` (an error, NOSCRIPT say, would cost the server less).
        """
        decided: asyncio.Future[None] = self.lines[0].loop.create_future()
        left = len(self.lines) // 2 + 1

        def answered(reply: Any) -> None:
            nonlocal left
            left -= 1
            if decided.done():
                return
            if not check(reply):
                decided.set_exception(RuntimeError(f"the floor's request failed: {reply!r}"))
            elif not left:
                decided.set_result(None)

        for line in self.lines:
            line.call(request, answered)
        await decided

    async def grants(
        self, count: int, name: str = "bench:floor:grants", ttl: float = 10.0
    ) -> list[float]:
        """``count`` floors of a handoff between processes given the servers' work, in seconds.

        Each: the releasing process's ``RELEASE_TURN`` on every node, granting the lock
        ``name`` to the next process in line, whose offer is fresh, as a handoff between
        processes does; until a majority of the grants are heard on that process's own
        connections. Untimed before each, every node is set up afresh: the key held,
        both processes in line. Call :meth:`load_scripts` first.
        """
        channel = lock_key(b"aiolock:", name) + b":turn:" + GRANTEE
        listeners = [await _connect(url) for url in self._urls]
        try:
            for listener in listeners:
                await listener.send(_command(b"SUBSCRIBE", channel))
            out = []
            for _ in range(count):
                setup, args = grant(name, self._token, ttl)
                for command in setup:
                    await self.fan_out(_command(*command))
                release = _command(b"EVALSHA", RELEASE_TURN_SCRIPT.sha, *args)
                started = time.perf_counter()
                heard = [listener.next_message() for listener in listeners]
                replies = [line.send(release) for line in self.lines]
                left = len(self.lines) // 2 + 1
                for message in asyncio.as_completed(heard):
                    await message
                    left -= 1
                    if not left:
                        break
                out.append(time.perf_counter() - started)
                for reply in replies:
                    if await reply != 1:
                        raise RuntimeError(f"the floor's release failed: {reply.result()!r}")
                await asyncio.gather(*heard)
            return out
        finally:
            _close(listeners)

    async def handoffs(self, url: str, count: int) -> list[float]:
        """``count`` handoff floors, in seconds.

        Each: a PUBLISH on the first node heard by a subscriber's own connection, then
        a script's fan-out to every node.
        """
        listener = await _connect(url)
        try:
            channel = b"aiolock-bench-floor"
            await listener.send(_command(b"SUBSCRIBE", channel))
            publish = _command(b"PUBLISH", channel, b"")
            noop = _command(b"EVALSHA", _NOOP_SHA, b"0")
            await self.fan_out(_command(b"EVAL", _NOOP, b"0"))  # (loaded everywhere)
            out = []
            for _ in range(count):
                started = time.perf_counter()
                heard = listener.next_message()
                self.lines[0].send(publish)
                await heard
                await self.fan_out(noop)
                out.append(time.perf_counter() - started)
            return out
        finally:
            _close([listener])
