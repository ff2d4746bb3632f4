"""One Redis node: pipelined requests on one connection.

A lock cycle is a handful of tiny commands, so the cost per command of the client
decides the speed of the library. Instead of redis-py's pooled client (pool checkout,
retry wrapper and response callbacks on every call) each node keeps **one long-lived
connection** on which requests are written at once and replies are matched to
requests in order, parsed by hiredis straight from ``data_received``: no task, no
future and no lock per request.

redis-py still does what it does well: URL parsing, connecting, TLS, AUTH/ACL and
SELECT are done by a :class:`redis.asyncio.Connection`, whose transport is then taken
over (see _io/protocol.py). Pub/sub has its own connection: _io/pubsub.py.

One ordered connection per node also means that a release written before another
task's acquire reaches the node first, and that a clean-up written after a timed-out
request runs after it on the node.

Requests never raise: every outcome goes to the request's callback, a failure as an
exception passed as a value (``ConnectionError``, ``TimeoutError``, a ``ResponseError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError

from .._core.calls import Callback, Soon, ignore
from .._core.cancel import join
from .._core.events import logger
from .._lua import Script
from .protocol import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    Endpoint,
    ReplyProtocol,
    ReplyReader,
    as_connection_error,
    has_set_ifeq,
    pack,
    pack_evalsha,
    parse_info,
    parse_version,
    unread,
)
from .redis import error_from_reply
from .specs import NodeSpec

__all__ = ["Node"]

#: How long a node may leave its oldest request unanswered, nothing to read from it, before
#: its connection counts as stalled (a hung or blackholed node) and is reset, at least.
MIN_STALL_TIMEOUT: Final = 1.0
#: The oldest server version aiolock's scripts run on (``SET ... GET``).
OLDEST_SERVER: Final = (6, 2)
#: Asked first on every connection: who the server is (see Node._on_info).
_INFO_SERVER: Final = (b"INFO", b"server")
#: Most requests held back for one write: a full buffer is written at once.
COALESCE_REQUESTS: Final = 16

# A request waiting for its reply: (callback, script or None, args after the script's
# name, monotonic time it was written, the index a fan-out's callback takes or None).
_Pending = tuple[Callable[..., None], Script | None, tuple[bytes, ...], float, int | None]
# A request waiting for a connection: (packed bytes, callback, script, args, deadline,
# index).
_Queued = tuple[bytes, Callable[..., None], Script | None, tuple[bytes, ...], float, int | None]


def _answer(callback: Callable[..., None], index: int | None, reply: Any) -> None:
    """Give ``reply`` (or a failure) to a request's callback (a fan-out's: with ``index``)."""
    if index is None:
        callback(reply)
    else:
        callback(index, reply)


#: The last EVALSHA packed: (script, args, bytes). A fan-out hands the same ``args``
#: tuple to every node, so it is packed once, not once per node. Held here, the tuple
#: cannot be freed and its identity reused; read and replaced whole (one reference).
_last_packed: tuple[object, object, bytes] = (None, None, b"")


class Node(ReplyReader):
    """A connection to one Redis node with pipelined, callback-based requests.

    ``spec`` is what the user gave (URL or client); the node only borrows a client's
    settings to open its own connection and never closes the client.
    """

    def __init__(
        self,
        spec: NodeSpec,
        *,
        request_timeout: float,
        connect_timeout: float = 2.0,
        scripts: tuple[Script, ...] = (),
        endpoint: Endpoint | None = None,
        soon: Soon | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        #: Where the requests held back in a loop iteration are flushed from (shared by
        #: the manager's nodes and fan-outs: see Soon).
        self._soon = Soon() if soon is None else soon
        self._endpoint = endpoint if endpoint is not None else Endpoint(spec, connect_timeout)
        self.name = self._endpoint.name
        self._request_timeout = request_timeout
        self._stall_timeout = max(MIN_STALL_TIMEOUT, 20 * request_timeout)
        self._scripts = scripts
        # Scripts loaded on the connection (or the next): as it opens, then each at first use.
        self._loaded = {script.sha for script in scripts}
        self._loads_due: list[Script] = []  # first used with no connection: load on the next
        self._pending: deque[_Pending] = deque()
        self._queued: list[_Queued] = []
        # Requests written in this loop iteration, and the connection they are for.
        self._buffered: list[bytes] | None = None
        self._buffered_for: asyncio.Transport | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._retry_at = 0.0
        self._backoff = BACKOFF_FIRST
        self._last_error: Exception = RedisConnectionError(f"{self.name}: not connected yet")
        self._closed = False
        #: The server's ``run_id`` on this connection (``None``: not known yet, INFO denied).
        self.run_id: bytes | None = None
        #: Since when the node counts as restarted (monotonic): its server's start, or when
        #: its ``run_id`` changed; ``None`` if unknown (``INFO`` denied); see restart_grace.
        self.restarted_at: float | None = None
        #: Whether we saw the ``run_id`` change (else: a server first seen young).
        self.restart_seen = False
        self._last_run_id: bytes | None = None
        #: The server's ``redis_version`` (Valkey's: the Redis it matches), e.g. ``(7, 2)``.
        self.server_version: tuple[int, ...] | None = None
        #: Whether the server on this connection has ``SET ... IFEQ`` (told by its INFO;
        #: ``False`` until then): one lock's renewal is then that command, not a script.
        self.set_ifeq = False
        #: Called with the node when a new connection told who the server is.
        self.on_identity: Callable[[Node], None] | None = None
        self._identified: asyncio.Future[None] | None = None
        self._info_denied_logged = False
        #: When set, every reply is replaced by this error (no vote: see :meth:`refuse`).
        self._refused: Exception | None = None

    def __repr__(self) -> str:
        state = "connected" if self._transport is not None else "disconnected"
        return f"<Node {self.name} {state}>"

    @property
    def refusal(self) -> Exception | None:
        """Why the node's requests fail at once, if :meth:`refuse` was called."""
        return self._refused

    def refuse(self, error: Exception | None) -> None:
        """Fail every request with ``error`` until called with ``None`` or reconnected.

        For a node found to be the same server as another: no second vote.
        """
        self._refused = error

    @property
    def last_error(self) -> Exception:
        """Why the node is not connected, as its requests would fail with it."""
        return self._last_error

    @property
    def connected(self) -> bool:
        """Whether the connection is up now."""
        return self._transport is not None

    # -- requests ---------------------------------------------------------------

    def call(self, args: tuple[bytes, ...], callback: Callback) -> None:
        """Send one command; ``callback`` gets the reply or an exception."""
        self.call_script(None, args, callback)

    def call_script(
        self,
        script: Script | None,
        args: tuple[bytes, ...],
        callback: Callable[..., None],
        index: int | None = None,
    ) -> None:
        """Run ``script`` with ``args`` (numkeys, keys, argv) via EVALSHA.

        ``None``: ``args`` are a whole command (:meth:`call`). ``index``: the callback
        is a fan-out's, called ``callback(index, reply)`` (:meth:`call_for_vote`). A
        script not loaded on this connection yet is loaded first, on the same ordered
        connection: an EVALSHA answered NOSCRIPT and retried with EVAL would run after
        the requests written behind it (a release after the next attempt).
        """
        global _last_packed  # noqa: PLW0603 - a one-entry cache
        if script is None:
            packed = pack(args)
        else:
            if script.sha not in self._loaded:
                self._load(script)
            last = _last_packed  # (a fan-out's requests are packed once, for every node)
            if last[1] is args and last[0] is script:
                packed = last[2]
            else:
                packed = pack_evalsha(script.sha, args)
                _last_packed = (script, args, packed)
        if self._refused is not None:
            _answer(callback, index, self._refused)
            return
        transport = self._transport
        now = time.monotonic()
        if transport is not None:
            pending = self._pending
            if pending and now - pending[0][3] > self._stall_timeout and not unread(transport):
                self._reset(TimeoutError(f"{self.name}: no reply for {self._stall_timeout:.2f}s"))
            else:
                pending.append((callback, script, args, now, index))
                buffered = self._buffered
                if (
                    buffered is not None
                    and self._buffered_for is transport
                    and len(buffered) < COALESCE_REQUESTS - 1
                ):
                    buffered.append(packed)  # (_write's usual case, without its call)
                    return
                self._write(packed)  # (after: _flush restamps what it writes)
                written = time.monotonic()
                if written - now > self._request_timeout:
                    # Blocked inside the write (a GC pause, not the node): timed from now.
                    pending[-1] = (callback, script, args, written, index)
                return
        if self._closed:
            closed = RedisConnectionError(f"{self.name}: the lock manager is closed")
            _answer(callback, index, closed)
            return
        if self._connecting is None:
            if now < self._retry_at:
                # Back-off after a failed connect: fail fast (a failed vote) until then.
                _answer(callback, index, self._last_error)
                return
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        self._queued.append((packed, callback, script, args, now + self._request_timeout, index))

    #: Run a fan-out's script: ``record(index, reply)`` counts the reply (no callback
    #: object made per node and request: fewer young objects in flight, fewer
    #: collections of the garbage collector's youngest generation).
    call_for_vote = call_script

    def _load(self, script: Script) -> None:
        """Load ``script``, first used on this connection, ahead of its first EVALSHA."""
        self._loaded.add(script.sha)
        if self._transport is None:  # (loaded first on connect: else NOSCRIPT)
            self._loads_due.append(script)
        self.call((b"SCRIPT", b"LOAD", script.source), ignore)

    def _write(self, packed: bytes) -> None:
        # A loop iteration's first request is written at once; the node's later ones
        # leave together at its end (call_soon), or once COALESCE_REQUESTS wait. System
        # calls, not bytes, cost: 100 tasks on 100 names ran 2.4x as many cycles a second.
        # The wait counts neither against node_timeout (WriteTimer) nor the watchdog (_flush).
        transport = self._transport
        if transport is None:
            return
        buffered = self._buffered
        if buffered is not None and self._buffered_for is transport:
            buffered.append(packed)
            if len(buffered) >= COALESCE_REQUESTS:
                self._flush(transport)
            return
        transport.write(packed)
        self._buffered, self._buffered_for = [], transport
        self._soon(self._flush, transport)

    def _flush(self, transport: asyncio.Transport) -> None:
        buffered = self._buffered
        # Only to their connection: after a reset their callbacks failed already.
        if buffered is None or self._buffered_for is not transport:
            return
        self._buffered = self._buffered_for = None
        if buffered and transport is self._transport:
            transport.write(buffered[0] if len(buffered) == 1 else b"".join(buffered))
            # Written a node_timeout or more after they were sent (a task blocked the loop):
            # for the watchdog, their wait counts from now.
            pending, now = self._pending, time.monotonic()
            first = max(0, len(pending) - len(buffered))
            if first < len(pending) and now - pending[first][3] > self._request_timeout:
                for i in range(first, len(pending)):
                    callback, script, args, _sent, index = pending[i]
                    pending[i] = (callback, script, args, now, index)

    # -- connection -------------------------------------------------------------

    async def connect(self) -> None:
        """Connect now (if not yet connected), without raising on failure."""
        if self._transport is not None or self._closed:
            return
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        await join(self._connecting)
        identified = self._identified
        if identified is not None and not identified.done():
            await join(identified)

    async def _connect(self) -> None:
        try:
            opened = await self._endpoint.open(self)
        except Exception as exc:  # every failure is a failed vote, never a crash
            self._connecting = None
            self._last_error = as_connection_error(self.name, exc)
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX)
            queued, self._queued = self._queued, []
            for _packed, callback, _script, _args, _deadline, index in queued:
                _answer(callback, index, self._last_error)
            return
        except BaseException:
            self._connecting = None
            raise
        self._connecting = None
        self._backoff = BACKOFF_FIRST
        self._retry_at = 0.0
        self._attach(opened)
        transport = opened[0]
        now = time.monotonic()
        # Who the server is, first: its reply comes before any other, so every reply is
        # counted knowing it (same-server check, restart quarantine). Once per connection.
        self.run_id = None
        self._refused = None
        self.set_ifeq = False  # (until this server's INFO says)
        self._identified = asyncio.get_running_loop().create_future()
        transport.write(pack(_INFO_SERVER))
        self._pending.append((self._on_info, None, _INFO_SERVER, now, None))
        # The scripts next, before any EVALSHA: those first used while down too, and those
        # of EVALSHAs queued as a reset lost their load.
        lost = [q[2] for q in self._queued if q[2] is not None and q[2].sha not in self._loaded]
        self._loaded.update(script.sha for script in lost)
        loads, self._loads_due = (*self._scripts, *self._loads_due, *lost), []
        for loaded in loads:
            load = (b"SCRIPT", b"LOAD", loaded.source)
            transport.write(pack(load))
            self._pending.append((ignore, None, load, now, None))
        queued, self._queued = self._queued, []
        for packed, callback, script, args, deadline, index in queued:
            if now > deadline:
                # Given up on: sent now, it would only leave a stray key or a stale release.
                _answer(callback, index, TimeoutError(f"{self.name}: not connected in time"))
            else:
                transport.write(packed)
                self._pending.append((callback, script, args, now, index))

    def _on_info(self, reply: Any) -> None:
        if isinstance(reply, bytes | str):
            fields = parse_info(reply)
            now = time.monotonic()
            self.server_version = version = parse_version(fields.get("redis_version", ""))
            self.set_ifeq = has_set_ifeq(fields)
            if version is not None and version < OLDEST_SERVER:
                # Our scripts would fail with a Lua error on every call: say why.
                self._refused = RedisError(
                    f"{self.name}: Redis {fields['redis_version']} is older than "
                    f"{'.'.join(map(str, OLDEST_SERVER))}, the oldest aiolock supports "
                    "(its scripts use SET ... GET)"
                )
            self.run_id = fields.get("run_id", "").encode() or None
            uptime = fields.get("uptime_in_seconds", "")
            # Whole seconds, rounded down: the start looks later, never earlier.
            restarted_at = now - int(uptime) if uptime.isdigit() else None
            if self.run_id is not None:
                if self._last_run_id is not None and self.run_id != self._last_run_id:
                    # Another server at the address (restarted, a promoted replica): now.
                    restarted_at = now if restarted_at is None else max(restarted_at, now)
                    self.restart_seen = True
                self._last_run_id = self.run_id
            if restarted_at is not None:
                # Never earlier: a failover's server has a long uptime (the quarantine goes on).
                last = self.restarted_at
                self.restarted_at = restarted_at if last is None else max(last, restarted_at)
        elif not self._info_denied_logged and not isinstance(reply, RedisConnectionError):
            self._info_denied_logged = True
            logger.warning(
                "aiolock: %s: cannot read INFO server (%s): this node cannot be checked "
                "for restarts or for being the same server as another node; allow +info",
                self.name,
                reply,
            )
        identified = self._identified
        if identified is not None and not identified.done():
            identified.set_result(None)
        if self.on_identity is not None:
            self.on_identity(self)

    def on_data(self, protocol: ReplyProtocol, data: bytes) -> None:
        reader = self._fed(protocol, data)
        if reader is None:
            return
        pending = self._pending
        while True:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError as exc:
                self._reset(RedisConnectionError(f"{self.name}: protocol error: {exc}"))
                return
            if reply is False:
                return
            if not pending:
                self._reset(RedisConnectionError(f"{self.name}: reply without a request"))
                return
            callback, script, sent_args, _sent, index = pending.popleft()
            if isinstance(reply, hiredis.ReplyError):
                error = error_from_reply(self.name, str(reply))
                if script is not None and isinstance(error, NoScriptError):
                    # Flushed since (SCRIPT FLUSH): send the source; requests after it run first.
                    retry = (b"EVAL", script.source, *sent_args)
                    if self._transport is not None:
                        pending.append((callback, None, retry, time.monotonic(), index))
                        self._write(pack(retry))
                        continue
                reply = error
            if self._refused is not None and callback != self._on_info:
                reply = self._refused
            if index is None:
                callback(reply)
            else:
                callback(index, reply)
            if protocol is not self._protocol:
                return  # a callback reset the connection: its replies failed already

    def on_lost(self, protocol: ReplyProtocol, exc: Exception | None) -> None:
        if not self._current(protocol):
            return
        reason = f": {exc}" if exc is not None else ""
        self._reset(RedisConnectionError(f"{self.name}: connection lost{reason}"))

    def _reset(self, error: Exception) -> None:
        """Drop the connection and fail every request still waiting for a reply."""
        self._last_error = error
        self.set_ifeq = False  # (the next server may not have it)
        self._loaded = {script.sha for script in self._scripts}
        self._detach()
        pending, self._pending = self._pending, deque()
        for callback, _script, _args, _sent, index in pending:
            _answer(callback, index, error)

    async def aclose(self) -> None:
        """Close the connection; requests still waiting fail with ConnectionError."""
        self._closed = True
        connecting = self._connecting
        if connecting is not None:
            connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await connecting
            self._connecting = None
        queued, self._queued = self._queued, []
        error = RedisConnectionError(f"{self.name}: the lock manager is closed")
        for _packed, callback, _script, _args, _deadline, index in queued:
            _answer(callback, index, error)
        # Graceful: releases already written still reach the node.
        if self._transport is not None:
            self._flush(self._transport)
        if self._detach(graceful=True):
            pending, self._pending = self._pending, deque()
            for callback, _script, _args, _sent, index in pending:
                _answer(callback, index, error)
