"""The waiters' pub/sub on a Redis Cluster: sharded where the cluster has it.

Each channel is subscribed with a :class:`~aiolock._io.pubsub.Subscriber` of its own
server's (``SSUBSCRIBE``, Redis 7.0+ and Valkey), or on one connection to any server
(plain ``SUBSCRIBE``) on older ones: see ``_io/pubsub.py`` for why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from redis.crc import key_slot
from redis.exceptions import MovedError

from .cluster import MIN_REFRESH_INTERVAL
from .pubsub import Subscriber

if TYPE_CHECKING:
    from .cluster import Address, ClusterNode

__all__ = ["ClusterSubscriber"]


class ClusterSubscriber:
    """The waiters' pub/sub on a cluster: sharded where the cluster has it.

    With sharded pub/sub each channel is subscribed (``SSUBSCRIBE``) on the master
    serving its slot, one connection per master; a channel whose slot moves (a
    ``MOVED`` reply, or the server dropping it) is subscribed again where the slot
    went, and the waiters are woken (a release may have been missed meanwhile).
    Otherwise one connection to any server, with plain ``SUBSCRIBE``.
    """

    def __init__(
        self,
        node: ClusterNode,
        *,
        on_message: Callable[[bytes, bytes], None],
        on_reset: Callable[[], None],
    ) -> None:
        self.name = node.name
        self._node = node
        self._on_message = on_message
        self._on_reset = on_reset
        self._plain = Subscriber(node.spec, on_message=on_message, on_reset=on_reset)
        self._shards: dict[Address, Subscriber] = {}
        self._where: dict[bytes, Subscriber] = {}

    @property
    def refused(self) -> Exception | None:
        """Why pub/sub is refused on a server we listen on, if it is (see Subscriber)."""
        for subscriber in (self._plain, *self._shards.values()):
            if subscriber.refused is not None:
                return subscriber.refused
        return None

    @property
    def channels(self) -> frozenset[bytes]:
        """The channels subscribed to (or about to be)."""
        return frozenset(self._where)

    def subscribe(self, channel: bytes) -> asyncio.Future[None]:
        """Subscribe to ``channel``; the future is done when the server confirmed it."""
        subscriber = self._plain
        if self._node.sharded_pubsub:
            address = self._node.address_of(key_slot(channel))
            if address is not None:
                subscriber = self._shard(address)
        self._where[channel] = subscriber
        return subscriber.subscribe(channel)

    def confirmation(self, channel: bytes) -> asyncio.Future[None] | None:
        """As :meth:`Subscriber.confirmation`, on the server ``channel`` is subscribed on."""
        subscriber = self._where.get(channel)
        return None if subscriber is None else subscriber.confirmation(channel)

    def unsubscribe(self, channel: bytes) -> None:
        """Stop listening on ``channel``."""
        subscriber = self._where.pop(channel, None)
        if subscriber is not None:
            subscriber.unsubscribe(channel)

    def _shard(self, address: Address) -> Subscriber:
        subscriber = self._shards.get(address)
        if subscriber is None:
            subscriber = self._shards[address] = Subscriber(
                None,
                on_message=self._on_message,
                on_reset=self._on_reset,
                endpoints=[self._node.endpoint(address)],
                sharded=True,
                on_moved=self._moved,
            )
        return subscriber

    def _moved(self, channel: bytes, redirect: Exception | None) -> None:
        if channel not in self._where:
            return  # unsubscribed meanwhile
        if isinstance(redirect, MovedError):
            self._node.redirected(redirect.slot_id, (redirect.host, int(redirect.port)))
        else:
            self._node.redirected(key_slot(channel), None)
        # Subscribed again where the map says now: a second MOVED (the map was stale)
        # comes back here; a release meanwhile may have gone unheard.
        asyncio.get_running_loop().call_later(MIN_REFRESH_INTERVAL, self._resubscribe, channel)
        self._on_reset()

    def _resubscribe(self, channel: bytes) -> None:
        if channel in self._where and not self._node.closed:
            self.subscribe(channel)

    async def aclose(self) -> None:
        """Close every connection."""
        for subscriber in (self._plain, *self._shards.values()):
            await subscriber.aclose()
        self._where.clear()
