"""Servers in Docker containers: only when no local binary exists and an engine answers."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

__all__ = ["ContainerServer", "docker_answers"]


def docker_answers(timeout: float = 0.3) -> bool:
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


class ContainerServer:
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
