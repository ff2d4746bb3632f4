"""The floor: the least any client can do for the work of one lock cycle.

A cycle (acquire, then release) is two round trips to every node, the second sent when
the first has decided. The floor does the same with nothing of a lock in it: two
sequential PING fan-outs over raw asyncio protocols, one long-lived connection per node,
no parser beyond counting reply lines, no tasks. Every latency figure of ``bench`` is
also given as a ratio to it, measured in the same interleaved rounds, so that what is
left to win is in the figure itself.

The floor of a handoff between processes is one PUBLISH heard by another connection,
then one script fan-out (the least a waiter told of a release does to take the lock).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any, cast

from redis.asyncio.connection import parse_url

__all__ = ["Floor"]

_PING = b"*1\r\n$4\r\nPING\r\n"


def _command(*parts: bytes) -> bytes:
    head = b"*%d\r\n" % len(parts)
    return head + b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)


class _Line(asyncio.Protocol):
    """One connection; each request's reply is one line (``+PONG``, ``:1``, ...)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: collections.deque[asyncio.Future[bytes]] = collections.deque()
        self.buffer = b""
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data
        while (end := buffer.find(b"\r\n")) >= 0:
            line, buffer = buffer[:end], buffer[end + 2 :]
            if line.startswith((b"*", b">")):  # a push: its lines are read as they come
                continue
            if self.waiting:
                self.waiting.popleft().set_result(line)
        self.buffer = buffer

    def send(self, request: bytes) -> asyncio.Future[bytes]:
        reply: asyncio.Future[bytes] = self.loop.create_future()
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
