"""A delay nemesis: an asyncio TCP proxy in front of each node that reads the commands.

Messages that arrive late are what break distributed locks: a command the client gave
up on lands after a later one sent on another connection, or after the key changed
hands. Real networks do this (a TCP retransmission, a middlebox, a paused VM); a test
can do it on purpose with :func:`nemesis`::

    from aiolock.testing import nemesis, redis_servers, script

    async with redis_servers(5) as urls, nemesis(urls) as net:
        async with aiolock.LockManager(net.urls) as locks:
            # The next EXTEND on each of three nodes, and what follows it on its
            # connection, is held back 0.3 s; the other connections flow.
            for node in net[:3]:
                node.hold(script("EXTEND"), 0.3, count=1)
            ...

Each :class:`NodeProxy` parses the requests (RESP, hiredis) of every connection through
it, so a rule can pick commands by name or by aiolock script, on the connections it
chooses, and hold them back **in order**: a request held back holds back every request
behind it on its connection (as TCP would), while the client's other connections go
on, which reorders requests across connections. It can also delay the replies and
pub/sub messages of a connection (:meth:`NodeProxy.delay_replies`), drop one
connection while the others stay up (:meth:`Link.drop`), and black-hole the node
(:meth:`NodeProxy.blackhole`). Nothing is dropped silently except by ``drop`` and
``blackhole``: held requests reach the node when their time comes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Final, overload

import hiredis

from ._held import Link, Matcher, Pipe, Rule, command, pack, script

__all__ = ["Link", "Matcher", "Nemesis", "NodeProxy", "Rule", "command", "nemesis", "script"]

_SUBSCRIBE: Final = frozenset({b"SUBSCRIBE", b"SSUBSCRIBE", b"PSUBSCRIBE"})


class NodeProxy:
    """A proxy in front of one node: its :attr:`url` is what the client connects to."""

    def __init__(self, target_host: str, target_port: int, index: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.index = index
        self.port = 0
        self.links: list[Link] = []
        self.rules: list[Rule] = []
        self._blackholed = False
        self._reply_links: Callable[[Link], bool] | None = None
        self._reply_seconds = 0.0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` of the proxy."""
        return f"redis://127.0.0.1:{self.port}"

    # -- faults ---------------------------------------------------------------------------

    def hold(
        self,
        match: Matcher,
        delay: float,
        *,
        count: int | None = None,
        links: Callable[[Link], bool] | None = None,
    ) -> Rule:
        """Hold back requests that ``match`` by ``delay`` seconds, in order on their link.

        ``delay=math.inf`` holds them until :meth:`flush`. ``count``: for that many
        requests only (default: every one until :meth:`clear`); ``links``: only on the
        connections it accepts (say ``lambda link: link.kind == "commands"``). Returns
        the rule (``matched`` counts).
        """
        if not delay >= 0:
            raise ValueError("delay must be >= 0 (math.inf: until flush())")
        rule = Rule(match, delay, count, links)
        self.rules.append(rule)
        return rule

    def delay_replies(self, seconds: float, *, links: Callable[[Link], bool] | None = None) -> None:
        """Delay what the node sends (replies, pub/sub messages) by ``seconds``, in order.

        ``links``: only on the connections it accepts. ``0`` ends it (what is held
        back still waits its time, or :meth:`flush`); ``math.inf``: until flushed.
        """
        self._reply_seconds = seconds
        self._reply_links = links

    def blackhole(self, on: bool = True) -> None:
        """Drop everything both ways (a node gone off the network), or stop doing so."""
        self._blackholed = on

    def clear(self) -> None:
        """Remove every rule and reply delay; stop black-holing."""
        self.rules.clear()
        self._reply_seconds = 0.0
        self._reply_links = None
        self._blackholed = False

    def flush(self) -> None:
        """Deliver everything held back now, in order (``delay=math.inf``: until then)."""
        for link in self.links:
            link.flush()

    def drop_all(self) -> None:
        """Abort every open connection (new ones are accepted)."""
        for link in self.links:
            if not link.closed:
                link.drop()

    # -- plumbing -------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on a free loopback port."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close the listener and every connection."""
        if self._server is not None:
            self._server.close()
        self.drop_all()
        handlers = list(self._handlers)
        for handler in handlers:
            handler.cancel()
        for handler in handlers:
            with contextlib.suppress(asyncio.CancelledError):
                await handler
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._handlers.add(handler)
        handler.add_done_callback(self._handlers.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = Link(self.index, len(self.links))
        self.links.append(link)
        link._transports.append(writer.transport)  # noqa: SLF001
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.close()
            return
        link._transports.append(up_writer.transport)  # noqa: SLF001
        up, down = Pipe(up_writer), Pipe(writer)
        link._pipes.extend((up, down))  # noqa: SLF001
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(up.run()),
            loop.create_task(down.run()),
            loop.create_task(self._requests(link, reader, up)),
            loop.create_task(self._replies(link, up_reader, down)),
        ]
        link._tasks.extend(tasks)  # noqa: SLF001
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await task
            link.closed = True
            writer.transport.abort()
            up_writer.transport.abort()

    async def _requests(self, link: Link, reader: asyncio.StreamReader, up: Pipe) -> None:
        parser = hiredis.Reader()
        while data := await reader.read(65536):
            if self._blackholed:
                continue
            parser.feed(data)
            while (words := parser.gets()) is not False:
                if not isinstance(words, list):  # not a command array: forward as is
                    up.put(data, 0.0)
                    break
                name = words[0].upper() if words else b""
                link.commands.append(name)
                if name in _SUBSCRIBE:
                    link.kind = "pubsub"
                delay = 0.0
                for rule in self.rules:
                    if rule.applies(link, words):
                        delay = max(delay, rule.delay)
                up.put(pack(words), delay)

    async def _replies(self, link: Link, reader: asyncio.StreamReader, down: Pipe) -> None:
        while data := await reader.read(65536):
            if self._blackholed:
                continue
            links = self._reply_links
            delay = self._reply_seconds if links is None or links(link) else 0.0
            down.put(data, delay)


class Nemesis(Sequence[NodeProxy]):
    """One :class:`NodeProxy` per node, in the order of the URLs given."""

    def __init__(self, proxies: list[NodeProxy]) -> None:
        self._proxies = proxies

    @property
    def urls(self) -> list[str]:
        """The proxies' URLs, for the client to connect to."""
        return [proxy.url for proxy in self._proxies]

    def clear(self) -> None:
        """Clear every proxy's faults."""
        for proxy in self._proxies:
            proxy.clear()

    @overload
    def __getitem__(self, index: int) -> NodeProxy: ...
    @overload
    def __getitem__(self, index: slice) -> list[NodeProxy]: ...
    def __getitem__(self, index: int | slice) -> NodeProxy | list[NodeProxy]:
        return self._proxies[index]

    def __len__(self) -> int:
        return len(self._proxies)

    def __iter__(self) -> Iterator[NodeProxy]:
        return iter(self._proxies)


def _host_port(url: str) -> tuple[str, int]:
    rest = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    host, _, port = rest.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


@contextlib.asynccontextmanager
async def nemesis(urls: Sequence[str]) -> AsyncIterator[Nemesis]:
    """A :class:`NodeProxy` in front of each ``redis://host:port`` URL, closed on exit."""
    made = [NodeProxy(*_host_port(url), index=i) for i, url in enumerate(urls)]
    try:
        for proxy in made:
            await proxy.start()
        yield Nemesis(made)
    finally:
        for proxy in made:
            await proxy.stop()
