"""The floor: the least any client can do for the work of one lock cycle.

A cycle (acquire, then release) is two round trips to every node, the second sent when
the first has decided. The floor does the same with nothing of a lock in it: two
sequential PING fan-outs over raw asyncio protocols, one long-lived connection per node,
no parser beyond counting reply lines, no tasks. Every latency figure of ``bench`` is
also given as a ratio to it, measured in the same interleaved rounds, so that what is
left to win is in the figure itself.

The floor of a handoff between processes (:meth:`Floor.handoff`) is one PUBLISH heard
by another connection, then one script fan-out: the least a waiter told of a release
does to take the lock.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import time
from collections.abc import Sequence
from typing import Any, cast

import hiredis
from redis.asyncio.connection import parse_url

__all__ = ["Floor"]

_PING = b"*1\r\n$4\r\nPING\r\n"


def _command(*parts: bytes) -> bytes:
    head = b"*%d\r\n" % len(parts)
    return head + b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)


#: A script that does nothing, for the handoff's fan-out: ``EVAL`` it once, then
#: ``EVALSHA``.
_NOOP = b"return 1"
_NOOP_SHA = hashlib.sha1(_NOOP).hexdigest().encode()  # noqa: S324 - Redis's script id


class _Line(asyncio.Protocol):
    """One connection, its replies parsed by hiredis and matched to requests in order.

    A reply nobody asked for (a pub/sub message) goes to :meth:`next_message`'s future.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.reader = hiredis.Reader()
        self.message: asyncio.Future[Any] | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if self.waiting:
                self.waiting.popleft().set_result(reply)
            elif self.message is not None and not self.message.done():
                self.message.set_result(reply)

    def next_message(self) -> asyncio.Future[Any]:
        """The next reply that no request waits for."""
        self.message = self.loop.create_future()
        return self.message

    def send(self, request: bytes) -> asyncio.Future[Any]:
        reply: asyncio.Future[Any] = self.loop.create_future()
        self.waiting.append(reply)
        assert self.transport is not None  # noqa: S101 - opened by Floor.open
        self.transport.write(request)
        return reply


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

    def __init__(self, lines: Sequence[_Line]) -> None:
        self.lines = list(lines)

    @classmethod
    async def open(cls, nodes: Sequence[str]) -> Floor:
        """One connection per node."""
        return cls([await _connect(url) for url in nodes])

    def close(self) -> None:
        """Close every connection."""
        for line in self.lines:
            if line.transport is not None:
                line.transport.close()

    async def fan_out(self, request: bytes = _PING) -> None:
        """``request`` written to every node, then every reply awaited."""
        replies = [line.send(request) for line in self.lines]
        for reply in replies:
            await reply

    async def cycle(self) -> None:
        """Two sequential PING fan-outs: the floor of acquire + release."""
        await self.fan_out()
        await self.fan_out()

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
            if listener.transport is not None:
                listener.transport.close()
