"""Pub/sub: one connection per node for the waiters' release messages.

:class:`Subscriber` listens on one server; ``_cluster_pubsub.ClusterSubscriber`` on a
cluster, sharded where the cluster has it (see ``_waiting/waiting.py`` for how the waiters use
them).

**Sharded pub/sub** on Redis 7.0+ and Valkey: on a cluster, releases are announced
with ``SPUBLISH`` (to the channel's shard only: a plain ``PUBLISH`` is broadcast to
every server of the cluster, and ElastiCache Serverless offers only the sharded
kind), and waiters ``SSUBSCRIBE`` on the master of the channel's slot. Each channel
shares its lock's hash tag, so the release script publishes within its own slot
(see ``_cluster.ClusterNode``). On older servers: ``PUBLISH``, heard on any server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError

from .._core.events import logger
from .protocol import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    Endpoint,
    ReplyProtocol,
    ReplyReader,
    is_moved,
    pack,
    subscriber_endpoints,
)
from .redis import error_from_reply
from .specs import NodeSpec, node_name

__all__ = ["Listener", "Subscriber"]


class Listener(Protocol):
    """Pub/sub on one node (:class:`Subscriber`, or a cluster's ``ClusterSubscriber``)."""

    @property
    def refused(self) -> Exception | None: ...

    def subscribe(self, channel: bytes) -> asyncio.Future[None]: ...

    def confirmation(self, channel: bytes) -> asyncio.Future[None] | None: ...

    def unsubscribe(self, channel: bytes) -> None: ...

    async def aclose(self) -> None: ...


#: After pub/sub was refused by a node, how long before a new subscription tries again.
PUBSUB_RETRY: Final = 30.0
#: Connections lost before the node confirmed any subscription on them, in a row,
#: after which pub/sub counts as refused (a proxy that closes on SUBSCRIBE).
PUBSUB_DROPS: Final = 3


def _confirm(waiting: list[asyncio.Future[None]]) -> None:
    """Let the waiters of a subscription go on (confirmed, or nothing to wait for)."""
    for future in waiting:
        if not future.done():
            future.set_result(None)


class Subscriber(ReplyReader):
    """One pub/sub connection to a node, shared by every channel the manager waits on.

    Connected on first use and subscribed only to the channels someone waits on. If
    the connection is lost, ``on_reset`` is called (a message may have been missed)
    and the connection is re-established in the background while channels remain.

    Where the node refuses pub/sub (an ACL without ``+subscribe``, a proxy without
    it), :attr:`refused` says why (a WARNING is logged once), subscriptions are
    confirmed at once and the waiters poll instead (see ``Waiting``); a new
    subscription tries again after :data:`PUBSUB_RETRY` seconds.

    ``sharded``: sharded pub/sub (``SSUBSCRIBE``, Redis 7.0+) on one server of a
    cluster, given by ``endpoints``; a channel whose slot is served elsewhere (a
    ``MOVED`` reply, or the server dropping it after a slot migration) is handed to
    ``on_moved`` with the redirect, if any (see ``_cluster.ClusterSubscriber``).
    """

    def __init__(
        self,
        spec: NodeSpec | None,
        *,
        on_message: Callable[[bytes, bytes], None],
        on_reset: Callable[[], None],
        connect_timeout: float = 2.0,
        endpoints: list[Endpoint] | None = None,
        sharded: bool = False,
        on_moved: Callable[[bytes, Exception | None], None] | None = None,
    ) -> None:
        super().__init__()
        if endpoints is None:
            if spec is None:  # pragma: no cover - programming error
                raise TypeError("a subscriber needs a spec or endpoints")
            # A cluster gives one endpoint per server: any of them hears every
            # PUBLISH, so the subscriber moves on to the next one when a connect fails.
            endpoints = subscriber_endpoints(spec, connect_timeout)
            self.name = node_name(spec)
        else:
            self.name = endpoints[0].name
        self._endpoints = endpoints
        self._endpoint_index = 0
        self._sharded = sharded
        self._unsubscribe_command = b"SUNSUBSCRIBE" if sharded else b"UNSUBSCRIBE"
        self._on_moved = on_moved
        # Sharded: the channels asked for and not yet confirmed, in order (an error
        # reply names no channel: it answers the oldest request).
        self._asked: deque[bytes] = deque()
        self._on_message = on_message
        self._on_reset = on_reset
        self._channels: dict[bytes, list[asyncio.Future[None]]] = {}
        # Per channel, the (un)subscribe requests written on this connection whose reply
        # has not come: the node answers each in order, and only the last one's reply
        # says where the channel stands (see _answered).
        self._owed: dict[bytes, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: Why the node does not do pub/sub for us, if it does not (see the class).
        self.refused: Exception | None = None
        self._refused_at = 0.0
        self._refusal_logged = False
        self._confirmed_on_connection = False
        self._drops = 0

    @property
    def channels(self) -> frozenset[bytes]:
        """The channels subscribed to (or about to be)."""
        return frozenset(self._channels)

    def subscribe(self, channel: bytes) -> asyncio.Future[None]:
        """Subscribe to ``channel``; the future is done when the node confirmed it."""
        confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.refused is not None:
            if time.monotonic() - self._refused_at < PUBSUB_RETRY:
                confirmed.set_result(None)  # nothing to wait for: the waiter polls
                return confirmed
            self.refused = None  # try again (the ACL may have been fixed)
            self._drops = 0
        waiting = self._channels.get(channel)
        if waiting is None:
            self._channels[channel] = [confirmed]
            if self._transport is not None:
                self._ask((channel,))
            else:
                self._ensure_connecting()
        elif not waiting:
            confirmed.set_result(None)  # already confirmed
        else:
            waiting.append(confirmed)
        return confirmed

    def confirmation(self, channel: bytes) -> asyncio.Future[None] | None:
        """A future done once the node confirms our subscription to ``channel``.

        Asked for again on a new connection, after a reset. None: confirmed already,
        or not subscribed.
        """
        waiting = self._channels.get(channel)
        if not waiting:
            return None
        confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting.append(confirmed)
        return confirmed

    def unsubscribe(self, channel: bytes) -> None:
        """Stop listening on ``channel``."""
        waiting = self._channels.pop(channel, None)
        if waiting is None:
            return
        for future in waiting:
            if not future.done():
                future.cancel()
        if self._transport is not None:
            self._owed[channel] = self._owed.get(channel, 0) + 1
            self._transport.write(pack((self._unsubscribe_command, channel)))

    def _ask(self, channels: tuple[bytes, ...]) -> None:
        transport = self._transport
        if transport is None:
            return
        for channel in channels:
            self._owed[channel] = self._owed.get(channel, 0) + 1
        if not self._sharded:
            transport.write(pack((b"SUBSCRIBE", *channels)))
            return
        for channel in channels:  # one slot per SSUBSCRIBE: one channel each
            self._asked.append(channel)
            transport.write(pack((b"SSUBSCRIBE", channel)))

    def _ensure_connecting(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._keep_connected())

    async def _keep_connected(self) -> None:
        backoff = BACKOFF_FIRST
        try:
            while self._channels and not self._closed:
                endpoint = self._endpoints[self._endpoint_index % len(self._endpoints)]
                try:
                    opened = await endpoint.open(self)
                except Exception:  # retried with back-off while channels need it
                    self._endpoint_index += 1
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                    continue
                self._attach(opened)
                self._confirmed_on_connection = False
                self._asked.clear()
                self._owed.clear()
                if self._channels:
                    self._ask(tuple(self._channels))
                return
        finally:
            self._task = None

    def on_data(self, protocol: ReplyProtocol, data: bytes) -> None:
        reader = self._fed(protocol, data)
        if reader is None:
            return
        while True:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError:
                self._reset()
                return
            if reply is False or not self._on_reply(reply):
                return

    def _on_reply(self, reply: Any) -> bool:
        """One reply read; whether to read on (not after a refusal)."""
        if isinstance(reply, hiredis.ReplyError):  # SUBSCRIBE refused (NOPERM, ...)
            error = error_from_reply(self.name, str(reply))
            asked = self._asked.popleft() if self._asked else None
            if asked is not None and self._on_moved is not None and is_moved(error):
                self._answered(asked)
                self._moved(asked, error)
                return True
            self._refuse(error)
            return False
        if not isinstance(reply, list) or len(reply) < 3:
            return True
        kind, channel = reply[0], reply[1]
        if kind in (b"message", b"smessage"):
            self._on_message(channel, reply[2])
        elif kind in (b"unsubscribe", b"sunsubscribe"):
            ours = self._answered(channel)
            if not ours and kind == b"sunsubscribe" and channel in self._channels:
                # Not asked for: its slot moved away.
                self._moved(channel, None)
        elif kind in (b"subscribe", b"ssubscribe"):
            self._subscribed(channel)
        return True

    def _subscribed(self, channel: bytes) -> None:
        """The server confirmed a subscription to ``channel`` on this connection."""
        if self._asked and self._asked[0] == channel:
            self._asked.popleft()
        self._confirmed_on_connection = True
        self._drops = 0
        owed = self._answered(channel)
        waiting = self._channels.get(channel)
        if owed <= 1 and waiting:  # (the reply to the last request)
            _confirm(waiting)
            waiting.clear()

    def _answered(self, channel: bytes) -> int:
        """A reply to a request of ours on ``channel`` came: how many were owed.

        0: it answers none of ours (a server drops a sharded channel unasked).

        Only the reply to the last request confirms a subscription: a ``SUBSCRIBE``
        whose reply is still on its way when the channel is let go and asked for again
        (a queue that empties and fills at once) is answered before the node has read
        the ``UNSUBSCRIBE`` and the new ``SUBSCRIBE``. Taken for the new one's, it said
        subscribed while the node was about to drop the channel: the waiters' process
        offered firmly to take the lock, and a grant to it went unheard.
        """
        owed = self._owed.pop(channel, 0)
        if owed > 1:
            self._owed[channel] = owed - 1
        return owed

    def on_lost(self, protocol: ReplyProtocol, exc: Exception | None) -> None:
        if not self._current(protocol):
            return
        if self._channels and not self._confirmed_on_connection:
            self._drops += 1
            if self._drops >= PUBSUB_DROPS:
                reason = f": {exc}" if exc is not None else ""
                self._refuse(
                    RedisConnectionError(f"{self.name}: connection closed on SUBSCRIBE{reason}")
                )
                return
        self._reset()

    def _moved(self, channel: bytes, redirect: Exception | None) -> None:
        """``channel`` is served by another server now: hand it over (see __init__)."""
        _confirm(self._channels.pop(channel, []))
        if self._on_moved is not None:
            self._on_moved(channel, redirect)

    def _refuse(self, error: Exception) -> None:
        """The node does not do pub/sub for us: let the waiters poll (see the class)."""
        self.refused = error
        self._refused_at = time.monotonic()
        if not self._refusal_logged:
            self._refusal_logged = True
            logger.warning(
                "aiolock: %s: pub/sub unavailable (%s): waiters poll instead, at most "
                "until the holder's ttl; allow +subscribe +unsubscribe and the channels",
                self.name,
                error,
            )
        channels, self._channels = self._channels, {}
        for waiting in channels.values():
            _confirm(waiting)
        # No channels left: the connection is dropped and not reopened; the waiters,
        # woken by on_reset, now poll.
        self._reset()

    def _reset(self) -> None:
        self._detach()
        # Every channel is asked for again on the next connection: not confirmed until
        # then (see confirmation). Nobody awaits these futures; they are confirmed,
        # or cancelled with their channel.
        loop = asyncio.get_running_loop()
        for waiting in self._channels.values():
            if not waiting:
                waiting.append(loop.create_future())
        # Messages may have been lost while the connection was going down.
        self._on_reset()
        if self._channels:
            self._ensure_connecting()

    async def aclose(self) -> None:
        """Close the connection and stop reconnecting."""
        self._closed = True
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._detach(graceful=True)
        for waiting in self._channels.values():
            for future in waiting:
                if not future.done():
                    future.cancel()
        self._channels.clear()
