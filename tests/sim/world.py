"""The simulated world: virtual time, a network of ordered connections, nodes, faults.

The seam is the one every asyncio program already has: **the event loop**. The world's
loop keeps virtual time (``loop.time()``, and ``time.monotonic``/``time.time`` while a
run lasts) that jumps to the next timer when nothing is ready, and its
``create_connection`` connects to a simulated node instead of a socket. So the library
runs unchanged: redis-py parses the URL and does the handshake, aiolock takes the
transport over, pipelines, times out, reconnects; a 30 s ttl costs microseconds.

Each connection is two ordered pipes (as TCP): a message sent at ``t`` arrives at
``max(t + latency, the previous message's arrival)``. The latency of every message is
drawn from the world's random stream, so messages on *different* connections of one
client overtake each other when a delay fault is on. Faults (see :class:`Fault`):
delay, slow (one connection of a client), late (a burst of a client's commands held
back on some nodes past its node timeout), sever (with the commands in flight applied
or not), pause, restart empty (with a new run_id or, as after a restore behind the
quarantine's back, the same), failover (another server, empty, takes a node's address
over), pub/sub messages late or lost, client stalls (the loop blocked: time passes,
no client runs; between two batches of callbacks, or from 'step_stall' (plan.V1_FROM) within one,
while the nodes go on), and a process's wall clock stepping (jump).
Node clocks drift: each node's clock runs at its own rate within the drift bound; each
process's wall clock (``time.time``, the fencing floor's) may be off by a skew of its
own (``World.skews``), its monotonic clock not.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import heapq
import math
import os
import random
import secrets
import select
import selectors
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import hiredis

from aiolock._core import tokens
from aiolock._lua import (
    EXTEND_MANY_SCRIPT,
    RELEASE_EITHER_SCRIPT,
    RELEASE_SCRIPT,
    RELEASE_TURN_SCRIPT,
    REPAIR_SCRIPT,
    TURN_JOIN_SCRIPT,
    TURN_LEAVE_SCRIPT,
)

from .given import SHAS as GIVEN_SHAS
from .given import GivenTurns
from .plan import Plan
from .promised import WATCHDOG
from .resource import Resource
from .server import Error, Status, Store, ZSet, encode
from .sleeps import ACQUIRE_SHA, RELEASE_TURN_SHA, Sleeps
from .subs import Subscriptions

#: Which simulated process (manager) is running: set by the workload, read on connect.
current_process: contextvars.ContextVar[int] = contextvars.ContextVar("sim_process", default=-1)

#: The latency of a message on a healthy link: uniform in this range (seconds).
BASE_LATENCY = (40e-6, 160e-6)
#: Virtual time starts here (a monotonic clock is never near zero).
EPOCH = 1000.0
WALL_EPOCH = 1_790_000_000.0
#: Messages a run may deliver (about 100 times a busy run's): then it is stopped as busy.
MAX_DELIVERIES = 300_000
#: Loop iterations a run may take, likewise.
MAX_ITERATIONS = 1_000_000
#: The simulated sockets' file descriptors start here (far above any real one).
SOCKET_FDS = 1 << 24
#: The releases a split fault holds back (see World.split_hold).
_RELEASES = (RELEASE_TURN_SCRIPT.sha, RELEASE_SCRIPT.sha)
#: The EVALSHA of the renewal's batch script (see Link.from_client).
RENEWAL_BATCH = EXTEND_MANY_SCRIPT.sha


class Deadlock(Exception):
    """Nothing is scheduled and nothing can arrive: the run cannot go on."""


class _Selector(selectors.BaseSelector):
    """Never any I/O: a select with a timeout is the clock jumping to the next timer."""

    def __init__(self, world: World) -> None:
        self._world = world
        self._map: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(
            fileobj, fileobj if isinstance(fileobj, int) else fileobj.fileno(), events, data
        )
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        world = self._world
        if timeout is None:
            # Nothing ready: the loop's next timer, alone (see SimLoop).
            if not world.loop.release_next():
                raise Deadlock("nothing scheduled")
            timeout = 0.0
        world.iterations += 1
        if timeout > 0:
            world.now += timeout
        if world.loop.deferred:
            world.loop.thaw()
        # (Running code costs no virtual time: a cost per loop iteration would make the
        # history depend on how many iterations asyncio's version takes for the same
        # work. A run that spins without awaiting a timer is stopped as busy.)
        if world.iterations > world.max_iterations:
            if not world.busy:
                world.busy = True
                world.trace(f"BUSY: {world.iterations} loop iterations, the run is stopped")
                world.loop.stop()
            elif world.iterations > 2 * world.max_iterations:
                # Still spinning while the runner cancels what is left: give up on it.
                raise Deadlock("busy: the loop spins without time passing")
        return []

    def get_map(self) -> Any:
        return self._map

    def close(self) -> None:
        self._map.clear()


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop on the world's virtual clock whose connections are simulated.

    Its timers are released **one at a time**, in the order (due time, order of
    creation), and what each one wakes runs until nothing is ready before the next is
    released, even when several are due in the same instant (after a stall, every timer
    it made overdue; a message queued behind another on a connection, which arrives
    with it). asyncio would run such timers in one batch, and the tasks they wake would
    then interleave by the length of their wake-up chains, which differ between Python
    versions (3.12 rebuilt ``wait_for`` on ``asyncio.timeout``): the same seed gave
    other histories on other versions.
    """

    def __init__(self, world: World, *, ordered: bool = True) -> None:
        self.world = world
        self.ordered = ordered
        self._timers: list[tuple[float, int, asyncio.Handle]] = []
        self._timer_seq = 0
        #: Tasks to cancel as they are next woken, until when, and how (see call_soon).
        self.cancel_at_wake: dict[Any, tuple[float, Callable[[], None]]] = {}
        #: A stall within a step (see 'step_stall' (plan.V1_FROM)): how many more callbacks are
        #: scheduled before it strikes, and how long it lasts.
        self.blocking: list[Any] | None = None
        #: A stall is running the world's timers (see run_world_until).
        self.stalling = False
        #: A stall within a step counts the clients' writes, not the callbacks.
        self.at_writes = world.plan.version >= 2
        #: Processes paused ("freeze" faults): process -> until when. Their callbacks
        #: and timers wait until then; the world's, and the other processes', go on.
        self.frozen: dict[int, float] = {}
        #: The callbacks waiting for their process to thaw (see thaw).
        self.deferred: set[asyncio.Handle] = set()
        #: Each task's process, as its steps are scheduled (version 2: see _frozen_until).
        self._processes: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = (
            weakref.WeakKeyDictionary()
        )
        super().__init__(_Selector(world))

    def time(self) -> float:
        return self.world.now

    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        if not self.ordered:
            return super().call_at(when, callback, *args, context=context)
        self._check_closed()  # type: ignore[attr-defined]
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        self._timer_seq += 1
        heapq.heappush(self._timers, (when, self._timer_seq, timer))
        return timer

    def call_soon(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.Handle:
        """As asyncio's; a task armed in :attr:`cancel_at_wake` is cancelled first, when
        its wake-up is scheduled (what woke it has happened, it has not run yet). A
        stall within a step strikes here: the callback running blocks the loop before
        it schedules this one (a task's own work, or another's, between two awaits)."""
        if self.blocking is not None and not self.at_writes:
            self.count_down()
        if self.cancel_at_wake:
            task = getattr(callback, "__self__", None)
            armed = self.cancel_at_wake.pop(task, None) if task is not None else None
            if armed is not None and self.world.now <= armed[0]:
                armed[1]()
        handle = super().call_soon(callback, *args, context=context)
        if self.at_writes and isinstance(task := getattr(callback, "__self__", None), asyncio.Task):
            self._processes[task] = handle._context.get(current_process, -1)  # type: ignore[attr-defined]
        if self.frozen and (until := self._frozen_until(handle, self.world.now)) is not None:
            self._ready.pop()  # type: ignore[attr-defined]  # (it was appended last)
            self._timer_seq += 1
            heapq.heappush(self._timers, (until, self._timer_seq, handle))
            self.deferred.add(handle)
        return handle

    def thaw(self) -> None:
        """Make ready the callbacks of paused processes whose pause is over, though other
        callbacks are ready too (one that reschedules itself until a paused task runs,
        as an anyio cancel scope's delivery does, would starve them)."""
        now = self.world.now
        due = [e for e in self._timers if e[2] in self.deferred and e[0] <= now + 1e-9]
        if not due:
            return
        self._timers = [e for e in self._timers if e not in due]
        heapq.heapify(self._timers)
        for _when, _seq, handle in sorted(due, key=lambda e: (e[0], e[1])):
            self.deferred.discard(handle)
            if not handle.cancelled():
                self._ready.append(handle)  # type: ignore[attr-defined]

    def count_down(self) -> None:
        """One more callback scheduled (version 1) or write made (version 2) toward a
        stall within a step: it strikes when the count is done. (The callbacks a step
        schedules differ between Python versions, its writes do not: only version 2's
        histories are the same on every version with these stalls.)"""
        if self.blocking is None or self.stalling:
            return
        self.blocking[0] -= 1
        if self.blocking[0] <= 0:
            seconds, self.blocking = self.blocking[1], None
            self.world.trace(f"stall {seconds:.3f}s within a step")
            self.world.stall(seconds)

    def _frozen_until(self, handle: asyncio.Handle, at: float) -> float | None:
        """When ``handle``'s process thaws, if it is paused ``at`` and ``handle`` is its: a
        client's (its task's context names the process; a transport's end, its
        link's), not the world's (messages, nodes, faults)."""
        owner = getattr(handle._callback, "__self__", None)  # type: ignore[attr-defined]
        host = getattr(owner, "_host_task", None)  # (an anyio cancel scope's delivery)
        if isinstance(owner, ClientTransport):
            process = owner.link.process
        elif isinstance(owner, Pipe | SimNode | World | Link | Resource | list | dict | set):
            return None
        elif host is not None:  # (its task's process: it retries until the task runs)
            process = self._processes.get(host, -1)
        else:
            process = handle._context.get(current_process, -1)  # type: ignore[attr-defined]
        until = self.frozen.get(process)
        return until if until is not None and until > at + 1e-9 else None

    def release_next(self) -> bool:
        """Make the next live timer ready, the clock at its time: False if none is left."""
        timers = self._timers
        while timers:
            when, _seq, timer = heapq.heappop(timers)
            if timer.cancelled():
                continue
            if self.frozen and (until := self._frozen_until(timer, when)) is not None:
                self._timer_seq += 1  # (its process is paused: due when it thaws)
                heapq.heappush(timers, (until, self._timer_seq, timer))
                self.deferred.add(timer)
                continue
            self.deferred.discard(timer)
            self.world.now = max(self.world.now, when)
            self._ready.append(timer)  # type: ignore[attr-defined]
            return True
        return False

    def run_world_until(self, end: float) -> None:
        """Run the world's timers due by ``end`` (the nodes' side: see World.stall), in
        order, the clock at each; leave the clients' for after."""
        self.stalling = True
        try:
            while True:
                due = [
                    entry
                    for entry in self._timers
                    if entry[0] <= end and not entry[2].cancelled() and self._world_side(entry[2])
                ]
                if not due:
                    return
                entry = min(due, key=lambda e: (e[0], e[1]))
                self._timers.remove(entry)
                heapq.heapify(self._timers)
                self.world.now = max(self.world.now, entry[0])
                entry[2]._run()
        finally:
            self.stalling = False

    def _world_side(self, timer: asyncio.Handle) -> bool:
        """Whether ``timer`` is the world's, not a client's: a message toward a node, a
        paused node resuming, a fault beginning (but a stall) or ending."""
        owner = getattr(timer._callback, "__self__", None)  # type: ignore[attr-defined]
        if isinstance(owner, Pipe):
            return owner.to_server
        if isinstance(owner, SimNode):
            return True
        if isinstance(owner, World):
            fault: Fault = timer._args[0]
            return fault.kind != "stall"
        world = self.world
        return owner is not None and any(
            owner is faults
            for faults in (
                world._delays,
                world._lags,
                world._late,
                world._pubsub,
                world._subscribing,
            )
        )

    async def create_connection(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: str | None = None,
        port: int | None = None,
        **_kwargs: Any,
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        return await self.world.connect(protocol_factory, str(host), int(port or 6379))


# -- the network -------------------------------------------------------------------------


class Pipe:
    """One direction of a connection: ordered, each message with its own latency."""

    def __init__(
        self,
        world: World,
        arrive: Callable[[bytes], None],
        *,
        to_server: bool = False,
        process: int = -1,
    ) -> None:
        self.world = world
        self.arrive = arrive
        #: Toward a client: its process, which reads nothing while it is paused.
        self.process = process
        #: Toward a node: it goes on while the client's loop is blocked (World.stall).
        self.to_server = to_server
        self.queue: deque[tuple[float, bytes]] = deque()
        self.last = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def send(self, data: bytes, latency: float) -> None:
        at = max(self.world.now + latency, self.last)
        self.last = at
        self.queue.append((at, data))
        if self._timer is None:
            self._schedule()

    def _schedule(self) -> None:
        at = self.queue[0][0]
        self._timer = self.world.loop.call_at(at, self._deliver)

    def _deliver(self) -> None:
        self._timer = None
        world = self.world
        until = world.loop.frozen.get(self.process, 0.0) if not self.to_server else 0.0
        if until > world.now:  # (its process is paused: it waits in the socket)
            self._timer = world.loop.call_at(until, self._deliver)
            return
        world.deliveries += 1
        if world.deliveries > world.max_deliveries and not world.busy:
            world.busy = True  # a run that does not end in reasonable work: stop it
            world.trace(f"BUSY: {world.deliveries} messages delivered, the run is stopped")
            world.loop.stop()
        _at, data = self.queue.popleft()
        if self.queue:
            self._schedule()
        self.arrive(data)

    def cut(self) -> list[bytes]:
        """Stop: return what was still in flight."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        left = [data for _at, data in self.queue]
        self.queue.clear()
        return left


class ClientTransport(asyncio.Transport):
    """The client's end of a simulated connection."""

    def __init__(self, link: Link) -> None:
        super().__init__()
        self.link = link
        self._protocol: Any = None
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        loop = self.link.world.loop
        if loop.blocking is not None and loop.at_writes:
            loop.count_down()  # (it blocks before this write: see SimLoop.count_down)
        if not self._closing and not self.link.dead:
            self.link.from_client(bytes(data))

    def writelines(self, lines: Any) -> None:
        self.write(b"".join(lines))

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self.link.client_closed(graceful=True)

    def abort(self) -> None:
        if not self._closing:
            self._closing = True
            self.link.client_closed(graceful=False)

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return (self.link.node.host, self.link.node.port)
        if name == "socket" and self.link.world.plan.has("sockets"):
            return SimSocket(SOCKET_FDS + self.link.number)
        return default

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol  # type: ignore[no-any-return]

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_reading(self) -> bool:
        return not self._closing

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0)

    def can_write_eof(self) -> bool:
        return False

    def lost(self, exc: Exception | None) -> None:
        """The connection ended (reset by the peer, or our own close)."""
        self._closing = True
        protocol = self._protocol
        if protocol is not None:
            self._protocol = None
            protocol.connection_lost(exc)


class SimSocket:
    """A simulated connection's socket, as ``transport.get_extra_info("socket")``: a
    file descriptor number that :class:`SimPoll` answers for (see 'sockets' (plan.V1_FROM))."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def setsockopt(self, *_args: Any) -> None:
        """(redis-py sets TCP_NODELAY and keep-alives: the world has no TCP options.)"""


class SimPoll:
    """``select.poll()`` while a run goes on: a simulated socket is readable when its
    link has something unread (:meth:`Link.unread`); any other descriptor is the real
    poll's."""

    def __init__(self, world: World, real: Callable[[], Any]) -> None:
        self._world = world
        self._real = real()
        self._ours: set[int] = set()
        self._theirs = 0

    def register(self, fd: Any, eventmask: int = select.POLLIN | select.POLLPRI) -> None:
        number = fd if isinstance(fd, int) else fd.fileno()
        if number >= SOCKET_FDS:
            self._ours.add(number)
        else:
            self._real.register(fd, eventmask)
            self._theirs += 1

    def poll(self, timeout: float | None = None) -> list[tuple[int, int]]:
        links = {SOCKET_FDS + link.number: link for link in self._world.links}
        ours = [(fd, select.POLLIN) for fd in self._ours if fd in links and links[fd].unread()]
        if ours or not self._theirs:
            return ours
        return self._real.poll(timeout)  # type: ignore[no-any-return]


class Link:
    """A connection between a process and a node: two pipes and the server's session."""

    def __init__(self, world: World, node: SimNode, process: int, number: int) -> None:
        self.world = world
        self.node = node
        self.process = process
        self.number = number
        self.name = f"p{process}>n{node.index}#{number}"
        self.kind = "?"  # "commands" or "pubsub", from the first command
        #: It sent a subscription: a pub/sub connection. (``kind`` is read from the first
        #: command, which is the handshake's ``CLIENT SETINFO`` on every connection: it
        #: says "commands" for pub/sub connections too, so the "late" and "slow" faults
        #: hold theirs back as well. Kept so: the seeds found since replay unchanged.)
        self.pubsub = False
        self.transport = ClientTransport(self)
        self.up = Pipe(world, self._at_server, to_server=True)
        self.down = Pipe(world, self._at_client, process=process)
        self.reader = hiredis.Reader()
        self.channels: set[tuple[bytes, bool]] = set()
        self.dead = False
        #: When it was reset (sever), if it was.
        self.died_at: float | None = None
        #: When the client last wrote a renewal batch's chunk here (see from_client).
        self.batch_written = -math.inf
        #: When it went silent (a "silent" fault), and when the client first wrote on it
        #: since (see silence).
        self.silent_since: float | None = None
        self.silent_write: float | None = None

    # client -> node
    def from_client(self, data: bytes) -> None:
        """What the client writes, sent up the link; read for the "one chunk" rule: a
        renewal batch goes one chunk (one script call) at a time on a node's ordered
        connection, the next written once the last one's reply came
        (docs/explanation/safety.md: "an acquire written meanwhile waits for one chunk,
        not the whole batch"). Two written at one instant break it: one chunk's reply
        takes a round trip, and the renewal's rounds are apart in time. (Judged in runs
        without faults: a connection that was down flushes what queued meanwhile, the
        chunks of two batches among it.)"""
        if self.dead and self.process in self.world.dead:
            return  # (its process died: nothing more leaves it)
        if self.silent_since is not None:
            self._written_silent()
            return
        world = self.world
        if RENEWAL_BATCH in data and not world.cluster:  # (a cluster splits by slot)
            if data.count(RENEWAL_BATCH) > 1 or self.batch_written == world.now:
                world.wire.append(
                    f"one chunk: {self.name} wrote a renewal batch's chunks together at "
                    f"{world.now:.6f}"
                )
            self.batch_written = world.now
        if REPAIR_SCRIPT.sha in data:
            self._repairs(data)
        if not self.pubsub:
            self.pubsub = b"SUBSCRIBE\r\n" in data.upper()
        subs = world.subs
        if subs is not None and (self.pubsub or subs.reads(data)):
            subs.wrote(self, data)
        self.up.send(data, world.latency(self, "up") + world.split_hold(self, data))

    def silence(self) -> None:
        """Go silent: what is in flight either way is lost, what the client writes
        from now on vanishes, and nothing comes back, not even a reset."""
        self.silent_since = self.world.now
        self.up.cut()
        self.down.cut()
        self.world.trace(f"link {self.name} silent")

    def _written_silent(self) -> None:
        """The rule "a silent connection is given up": the client writes on a silent
        connection for at most the stall watchdog's time (WATCHDOG) after its first
        write there, plus the time the loop was blocked meanwhile (a block between a
        request's send, where the watchdog looks, and its write at the end of the
        iteration). Every write since the silence is one no reply will come for, so
        by then the oldest request had waited longer than the watchdog, with nothing
        to read: the library resets the connection before it writes again
        (``Node.call_script``), and later requests go out on a new one."""
        world = self.world
        now = world.now
        if self.silent_write is None:
            self.silent_write = now
            return
        first = self.silent_write
        blocked = sum(max(0.0, min(end, now) - max(start, first)) for start, end in world.stalls)
        if now - first > WATCHDOG + blocked + 0.001:
            world.promises.append(
                f"a silent connection is given up: {self.name} silent since "
                f"{self.silent_since:.6f}, written first at {first:.6f}, still at {now:.6f}"
            )
            self.silent_write = math.inf  # (once)

    def _repairs(self, data: bytes) -> None:
        """The "repairs follow a won renewal" rule, read as a client writes a repair:
        it re-creates a key only after the renewal won (docs/explanation/safety.md), so
        a quorum of nodes extended the key with its token at their last renewal
        (SimNode._execute notes each node's; a reply still on its way counts too, and
        a node restarted since: the rule errs on the lenient side)."""
        world = self.world
        reader = hiredis.Reader()
        reader.feed(data)
        while (command := reader.gets()) is not False:
            if len(command) > 5 and command[1] == REPAIR_SCRIPT.sha:
                key, token = command[3], command[5]
                extended = sum(world.renewed.get((key, token), {}).values())
                if extended < len(world.nodes) // 2 + 1:
                    world.promises.append(
                        f"repairs follow a won renewal: {self.name} wrote a repair of "
                        f"{key.decode()} at {world.now:.6f}, its token extended on "
                        f"{extended} nodes at their last renewal"
                    )

    def _at_server(self, data: bytes) -> None:
        if data == b"":  # the client's FIN: the session ends once what came before ran
            self.node.session_ended(self)
            self._finish(None)
            return
        self.reader.feed(data)
        while (command := self.reader.gets()) is not False:
            if self.kind == "?":
                head = command[0].upper()
                self.kind = "pubsub" if head in (b"SUBSCRIBE", b"SSUBSCRIBE") else "commands"
            self.node.receive(self, command)

    # node -> client
    def reply(self, data: bytes) -> None:
        if not self.dead and self.silent_since is None:
            self.down.send(data, self.world.latency(self, "down"))

    def push(self, data: bytes) -> None:
        """A pub/sub message: may come late, or be lost, under a pub/sub fault."""
        if self.dead or self.silent_since is not None:
            return
        fate = self.world.pubsub_fate(self)
        if fate is None:
            return
        self.down.send(data, fate)

    def unread(self) -> bool:
        """Whether the client's socket has something to read: what reached it while
        its loop was blocked (a reply, a message), or the connection's end."""
        queue = self.down.queue
        return self.dead or (bool(queue) and queue[0][0] <= self.world.now)

    def _at_client(self, data: bytes) -> None:
        protocol = self.transport.get_protocol()
        if self.pubsub and not self.dead and self.world.subs is not None:
            self.world.subs.heard(self, data)
        if protocol is not None and not self.dead:
            protocol.data_received(data)  # type: ignore[attr-defined]

    # ends
    def client_closed(self, *, graceful: bool) -> None:
        if graceful:
            self.up.send(b"", self.world.latency(self, "up"))  # FIN after the data
            return
        # RST: what already left arrives first, in order; the rest of the buffer may not
        # (the world decides how much of what is in flight still reaches the node).
        self.sever(apply=self.world.rng.random() < 0.5, tell=True)

    def sever(self, *, apply: bool, tell: bool = True) -> None:
        """Reset: in-flight commands run (``apply``) or vanish; the client hears of it."""
        if self.dead:
            return
        self.dead = True
        self.died_at = self.world.now
        in_flight = self.up.cut()
        self.down.cut()
        if apply:
            for data in in_flight:
                if data:
                    self.reader.feed(data)
            while (command := self.reader.gets()) is not False:
                self.node.receive(self, command)
        self.node.session_ended(self)
        self.world.trace(
            f"link {self.name} reset, in flight {len(in_flight)} {'applied' if apply else 'lost'}"
        )
        if tell:
            self.world.loop.call_at(
                self.world.now + self.world.latency(self, "down"),
                self.transport.lost,
                ConnectionResetError("reset by the simulated network"),
            )

    def _finish(self, exc: Exception | None) -> None:
        self.dead = True
        self.up.cut()
        self.down.cut()
        self.world.loop.call_soon(self.transport.lost, exc)


# -- nodes -------------------------------------------------------------------------------


class SimNode:
    """A Redis node: a store, an identity, a clock that may drift, and its sessions."""

    def __init__(self, world: World, index: int, rate: float) -> None:
        self.world = world
        self.index = index
        self.host, self.port = f"10.0.0.{index + 1}", 6379
        self.url = f"redis://{self.host}:{self.port}"
        self.rate = rate
        #: How far its clock has stepped ("clock" faults), in milliseconds.
        self.jumped_ms = 0.0
        self.store = Store(self.clock_ms, self.publish)
        self.started = world.now - 3600.0  # up for an hour when the run begins
        #: When it last came back empty (a restart or a failover).
        self.reset_at = -math.inf
        #: How many times it lost its data (restarts and failovers).
        self.resets = 0
        self.run_id = self._new_run_id()
        self.sessions: list[Link] = []
        self.paused_until = 0.0
        self.backlog: deque[tuple[Link, list[bytes]]] = deque()
        self.down_until = 0.0
        #: The channels published on by the command running (see _execute), and what.
        self.published: list[bytes] = []
        self.messages: list[tuple[bytes, bytes]] = []
        #: Lock key -> the token a release's grant set there last (see _execute).
        self.granted: dict[bytes, bytes] = {}

    def _new_run_id(self) -> bytes:
        return b"%040x" % self.world.rng.getrandbits(160)

    def clock_ms(self) -> float:
        return (EPOCH + (self.world.now - EPOCH) * self.rate) * 1000.0 + self.jumped_ms

    def ends(self, key: bytes) -> float:
        """When ``key`` ends here, in virtual time (-inf: no such key; inf: no ttl),
        read without touching the store (an expired key is not removed)."""
        if key not in self.store.data:
            return -math.inf
        expiry = self.store.expires.get(key)
        if expiry is None:
            return math.inf
        return EPOCH + ((expiry - self.jumped_ms) / 1000.0 - EPOCH) / self.rate

    def receive(self, link: Link, command: list[bytes]) -> None:
        if self.world.now < self.paused_until or self.backlog:
            self.backlog.append((link, command))
            return
        self._execute(link, command)

    def _execute(self, link: Link, command: list[bytes]) -> None:
        named = self._named(command)
        data = self.store.data
        before = [data.get(key) for key in named]
        sha = command[1] if len(command) > 3 and command[0].upper() == b"EVALSHA" else None
        passing_over = sha == TURN_LEAVE_SCRIPT.sha and len(command) == 8 and command[2] == b"4"
        held = passing_over and self._alive(command[6]) and self._in_line(command[3], command[7])
        repairing = sha == REPAIR_SCRIPT.sha and self._alive(command[3])
        other = data.get(command[3]) if repairing else None
        expired = sha == RELEASE_TURN_SCRIPT.sha and not self._alive(command[3])
        self.published.clear()
        self.messages.clear()
        reply = self._session_command(link, command)
        if sha == TURN_JOIN_SCRIPT.sha and len(command) == 9 and command[2] == b"3":
            offers = data.get(command[5])
            member = command[6] + b" "
            if (
                isinstance(offers, ZSet)
                and self._alive(command[5])
                and any(offer.startswith(member) for offer in offers.scores)
            ):
                self.world.promises.append(
                    f"a refresh without an offer withdraws it: n{self.index} kept "
                    f"{command[6].decode()}'s offer for {command[5].decode()} at "
                    f"{self.world.now:.6f}"
                )
        if expired and not any(
            channel.startswith(command[3] + b":turn:") or channel == command[3] + b":released"
            for channel in self.published
        ):
            self.world.promises.append(
                f"expired releases announce: n{self.index} ran a release of "
                f"{command[3].decode()} that found it expired, and announced nothing, at "
                f"{self.world.now:.6f}"
            )
        if sha == RELEASE_TURN_SCRIPT.sha and any(
            channel.startswith(command[3] + b":turn:") for channel in self.published
        ):
            granted = data.get(command[3])
            if isinstance(granted, bytes):
                self.granted[command[3]] = granted
        elif (
            sha == RELEASE_SCRIPT.sha
            and self.granted.get(command[3]) == command[4] == before[0]
            and data.get(command[3]) is None
            and self.world.on_undone is not None
        ):
            # A grant deleted by a release of its own token that is no holder's: the
            # head's failed attempt's clean-up (aiolock._waiting.grants: its grants there no
            # longer count). A race follows, as after a give-back (see run.py).
            self.world.on_undone(command[3])
        if sha == RELEASE_TURN_SCRIPT.sha and self.world.at_release:
            for fault in self.world.at_release:
                # The releasing process's pub/sub connections drop as the release runs
                # (armed until one is there), or every process's (-1): each hears of it
                # as it would have heard the release.
                if fault.process in (-1, link.process) and self.world.drop(fault, fault.process):
                    self.world.at_release.remove(fault)
                    break
        if sha == RENEWAL_BATCH and isinstance(reply, list):
            count = int(command[2])
            tokens = command[3 + count :: 2]
            renewed = self.world.renewed
            for key, token, one in zip(command[3 : 3 + count], tokens, reply, strict=False):
                renewed.setdefault((key, token), {})[self.index] = one == 1
        elif len(command) > 4 and command[0].upper() == b"SET" and command[3].upper() == b"IFEQ":
            # (One lock's renewal where the server has SET ... IFEQ.)
            ours = self.world.renewed.setdefault((command[1], command[4]), {})
            ours[self.index] = isinstance(reply, Status)
        if sha == RELEASE_EITHER_SCRIPT.sha and self._alive(command[3]):
            left = data.get(command[3])
            if left in (command[4], command[5]):
                self.world.promises.append(
                    f"clean-ups leave no token: n{self.index} kept {command[3].decode()} of "
                    f"token {left!r} after a failed pass-on's clean-up at {self.world.now:.6f}"
                )
        if sha is not None and isinstance(reply, Error) and reply.message.startswith("NOSCRIPT"):
            # "Scripts run in order" (aiolock._io.node.Node.call_script): a script is loaded
            # on a connection before its first EVALSHA there, on the same ordered
            # connection; answered NOSCRIPT, its EVAL retry would run after whatever was
            # written behind it. Nothing flushes a node's scripts but a restart, which
            # drops its connections (seed 140737490355870).
            self.world.promises.append(
                f"scripts run in order: n{self.index} answered {link.name}'s EVALSHA "
                f"{sha[:8].decode()} NOSCRIPT at {self.world.now:.6f}"
            )
        if held and not self._in_line(command[3], command[7]):
            self.world.promises.append(
                f"stays in line: n{self.index} took {command[7].decode()} out of the line of "
                f"{command[6].decode()} at {self.world.now:.6f}, the lock held there"
            )
        if other is not None and other != command[5] and data.get(command[3]) != other:
            self.world.promises.append(
                f"repairs take no key: n{self.index} replaced {command[3].decode()} of token "
                f"{other!r} with a repair's {command[5]!r} at {self.world.now:.6f}"
            )
        subs = self.world.subs
        if subs is not None:
            if sha == TURN_JOIN_SCRIPT.sha and len(command) > 5:
                subs.noted(self.index, command[5])
            elif sha == RELEASE_TURN_SCRIPT.sha and len(command) > 7:
                subs.noted(self.index, command[7])
            subs.check_firm()
            if subs.unannounced:
                subs.check_announced()
            if subs.wake_due:
                subs.check_woken()
        sleeps = self.world.sleeps
        if sleeps is not None:
            if sha == ACQUIRE_SHA:
                sleeps.ran(self.index, link.process, command, reply)
            elif sha == RELEASE_TURN_SHA:
                sleeps.released(link.process, command, self.messages)
        if sha in GIVEN_SHAS and self.world.given is not None:
            self.world.given.ran(link, sha, command, reply, self.messages)
        if reply is not _NO_REPLY:
            link.reply(encode(reply))
        expires = self.store.expires
        for key, old in zip(named, before, strict=True):
            value = data.get(key)
            if value is not old and isinstance(value, bytes):
                self.world.writers[(self.index, key)] = (link.process, self.world.now)
                if subs is not None:
                    subs.set_value(self.index, key, link.process)
            if key in data and key not in expires and key not in self.world.bare:
                self.world.bare[key] = (self.world.now, self.index)
        if self.world.observer is not None:
            self.world.observer()

    def _alive(self, key: bytes) -> bool:
        """Whether ``key`` is alive here, read without touching the store."""
        store = self.store
        expiry = store.expires.get(key)
        return key in store.data and (expiry is None or store.now() <= expiry)

    def _in_line(self, line: bytes, member: bytes) -> bool:
        """Whether ``member`` has an entry in the turn queue ``line`` here (read only)."""
        queue = self.store.data.get(line)
        return self._alive(line) and isinstance(queue, ZSet) and member in queue.scores

    @staticmethod
    def _named(c: list[bytes]) -> list[bytes]:
        """The keys the command ``c`` may write: a script's keys, a command's first. Read
        after it ran: each one left alive without a ttl (the bare rule,
        check.check_bare, judges them), and who set each one's value (World.writers)."""
        name = c[0].upper()
        if name in (b"EVAL", b"EVALSHA"):
            return c[3 : 3 + int(c[2])]
        return c[1:2] if name in _WRITES else []

    def _session_command(self, link: Link, c: list[bytes]) -> Any:
        name = c[0].upper()
        if name == b"INFO":
            uptime = int((self.world.now - self.started) * self.rate)
            server = b"server_name:valkey\r\nvalkey_version:9.1.2\r\n" if self.world.native else b""
            return b"# Server\r\nredis_version:7.2.4\r\n%srun_id:%s\r\nuptime_in_seconds:%d\r\n" % (
                server,
                self.run_id,
                uptime,
            )
        if name in (b"CLIENT", b"SELECT", b"AUTH"):
            return Status(b"OK")
        if name == b"CLUSTER":
            if not self.world.cluster:
                return Error("ERR This instance has cluster support disabled")
            if c[1].upper() != b"SLOTS":  # pragma: no cover - not sent by aiolock
                return Error(f"ERR unknown subcommand '{c[1].decode()}'")
            return [[0, 16383, [self.host.encode(), self.port, b"%040x" % self.index]]]
        if name in _SUBSCRIPTIONS:
            sharded, kind, add = _SUBSCRIPTIONS[name]
            if add and self.world.pubsub_refused:
                return Error(NOPERM_SUBSCRIBE)  # an ACL without +subscribe: one error
            out = b""
            for channel in c[1:]:
                (link.channels.add if add else link.channels.discard)((channel, sharded))
                out += encode([kind, channel, len(link.channels)])
            link.reply(out)
            return _NO_REPLY
        if name == b"PING" and link.channels:
            return [b"pong", b""]
        if self.world.commands is not None:
            self.world.commands.setdefault(self.index, []).append(list(c))
        return self.store.execute(c)

    def publish(self, channel: bytes, message: bytes, sharded: bool) -> int:
        self.published.append(channel)
        self.messages.append((channel, message))
        count = 0
        kind = b"smessage" if sharded else b"message"
        for link in self.sessions:
            if (channel, sharded) in link.channels:
                link.push(encode([kind, channel, message]))
                count += 1
        if not count and b"}:turn:" in channel and self.world.on_undone is not None:
            self.world.on_undone(channel.partition(b":turn:")[0])  # (a grant nobody hears)
        return count

    def session_started(self, link: Link) -> None:
        self.sessions.append(link)

    def session_ended(self, link: Link) -> None:
        if link in self.sessions:
            self.sessions.remove(link)

    def pause(self, seconds: float) -> None:
        self.paused_until = max(self.paused_until, self.world.now + seconds)
        self.world.loop.call_at(self.paused_until, self._resume)

    def _resume(self) -> None:
        if self.world.now < self.paused_until:
            return
        while self.backlog and self.world.now >= self.paused_until:
            # (A link reset meanwhile: its commands had reached the node; they run, the
            # later of the two outcomes a real server may give.)
            link, command = self.backlog.popleft()
            self._execute(link, command)

    def restart(self, down: float, new_run_id: bool, *, failover: bool = False) -> None:
        """Crash and come back empty after ``down`` seconds (no persistence).

        ``failover``: another server takes the address over, empty (a replica promoted
        that had none of our keys yet): a new run_id, and the uptime of a server that
        has been up for long.
        """
        for link in list(self.sessions):
            link.sever(apply=False)
        self.backlog.clear()
        self.paused_until = 0.0
        self.store.flush()
        self.resets += 1
        self.down_until = self.world.now + down
        self.reset_at = self.down_until
        if not failover:
            self.started = self.down_until
        if new_run_id or failover:
            self.run_id = self._new_run_id()


_NO_REPLY: Any = object()
NOPERM_SUBSCRIBE = (
    "NOPERM User default has no permissions to access one of the channels used as arguments"
)
#: Pub/sub commands: (sharded, the reply's kind, subscribe or not).
_SUBSCRIPTIONS: dict[bytes, tuple[bool, bytes, bool]] = {
    b"SUBSCRIBE": (False, b"subscribe", True),
    b"SSUBSCRIBE": (True, b"ssubscribe", True),
    b"UNSUBSCRIBE": (False, b"unsubscribe", False),
    b"SUNSUBSCRIBE": (True, b"sunsubscribe", False),
}
#: Commands that write their first key (the bare rule reads it after them).
_WRITES = frozenset((b"SET", b"SADD", b"ZADD", b"PERSIST", b"INCR", b"HSET", b"RPUSH"))


# -- faults ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One fault of a schedule: at ``at`` (virtual seconds after the start), ``kind``."""

    at: float
    kind: str  # delay, slow, late, sever, pause, restart, failover, pubsub, stall, jump,
    # lag, die, subscribe, drop, split
    node: int = 0
    process: int = -1  # -1: every process
    seconds: float = 0.0  # how long it lasts
    scale: float = 0.0  # delay: the mean extra latency; pubsub, late: a chance; jump: s;
    # subscribe: the most a subscription is held back
    flag: bool = False  # sever, drop: in-flight applied (silent: drawn, unused); restart: new
    # run_id; delay: one link; stall: within a step
    rank: int = 0  # slow: which of the process's command connections (by age); stall
    # within a step: after how many callbacks scheduled; drop: 1 at the next release

    def __str__(self) -> str:
        extra = {
            "delay": f"n{self.node} p{self.process} {'one link' if self.flag else 'all links'} "
            f"{self.seconds:.3f}s mean +{self.scale * 1000:.1f}ms",
            "slow": f"p{self.process} command link {self.rank} on a majority "
            f"{self.seconds:.3f}s mean +{self.scale * 1000:.1f}ms",
            "late": f"p{self.process} {self.seconds:.3f}s bursts held {self.scale:.2f}",
            "sever": f"n{self.node} p{self.process} {'applied' if self.flag else 'lost'}",
            "drop": f"n{self.node if self.node >= 0 else '*'} p{self.process} pub/sub "
            f"{'applied' if self.flag else 'lost'}{' at its next release' if self.rank else ''}",
            "silent": f"n{self.node} p{self.process} a command link",
            "pause": f"n{self.node} {self.seconds:.3f}s",
            "restart": f"n{self.node} down {self.seconds:.3f}s "
            f"{'new' if self.flag else 'same'} run_id",
            "failover": f"n{self.node} down {self.seconds:.3f}s",
            "pubsub": f"n{self.node} p{self.process} {self.seconds:.3f}s loss {self.scale:.2f}",
            "stall": f"{self.seconds:.3f}s"
            + (f" within a step, after {self.rank} callbacks" if self.flag else ""),
            "jump": f"p{self.process} wall clock {self.scale:+.6f}s",
            "lag": f"every link {self.seconds:.3f}s +{self.scale * 1000:.1f}ms each way",
            "die": f"p{self.process}",
            "partition": f"p{self.process} from "
            + ",".join(f"n{i}" for i in range(16) if self.rank >> i & 1)
            + f" {self.seconds:.3f}s",
            "freeze": f"p{self.process} paused {self.seconds:.3f}s",
            "clock": f"n{self.node} clock {self.scale:+.3f}s",
            "split": f"p{self.process} its next release, held up to "
            f"{self.scale * 1000:.0f}ms, messages late for {self.seconds:.3f}s",
            "subscribe": f"n{self.node if self.node >= 0 else '*'} p{self.process} "
            f"{self.seconds:.3f}s held up to {self.scale * 1000:.0f}ms",
        }[self.kind]
        return f"{self.at:8.4f} {self.kind} {extra}"


def only_late_subscriptions(faults: Sequence[Fault]) -> bool:
    """Whether ``faults`` are none, or late subscriptions only: a run without faults
    for the memories' sizes and the "kept held" rule (see 'subscribe_late' (plan.V1_FROM))."""
    return all(fault.kind == "subscribe" for fault in faults)


def quiet(faults: Sequence[Fault]) -> bool:
    """Whether ``faults`` are none, or late subscriptions and dropped pub/sub
    connections only (see 'drop' (plan.V1_FROM)): the library makes up for them, and they touch no
    command: a run without faults for the memories' sizes and the "kept held" rule."""
    return all(fault.kind in ("subscribe", "drop") for fault in faults)


def excusing(faults: Sequence[Fault]) -> bool:
    """Whether ``faults`` excuse a wait or a loss (live.py): any but deaths, late
    subscriptions and dropped pub/sub connections, which the library makes up for."""
    return any(fault.kind not in ("die", "subscribe", "drop") for fault in faults)


@dataclass
class World:
    """Nodes, links, the clock, the random streams and the faults of one run."""

    plan: Plan
    nodes_count: int
    drift: float  # the clocks' rates lie within 1 ± drift
    faults: list[Fault]
    now: float = EPOCH
    history: list[str] = field(default_factory=list)
    nodes: list[SimNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.seed = self.plan.seed
        self.rng = random.Random(f"net-{self.seed}")
        self.loop = SimLoop(self, ordered=self.plan.has("ordered"))
        self.nodes = [
            SimNode(self, i, 1.0 + self.rng.uniform(-self.drift, self.drift))
            for i in range(self.nodes_count)
        ]
        self._by_address = {(n.host, n.port): n for n in self.nodes}
        self._links = 0
        #: Messages delivered so far, and how many a run may deliver before it is stopped
        #: as busy (a livelock spins without end in virtual time; reported, not a failure).
        self.deliveries = 0
        self.max_deliveries = MAX_DELIVERIES
        self.iterations = 0
        self.max_iterations = MAX_ITERATIONS
        self.busy = False
        self.links: list[Link] = []
        self._delays: list[tuple[Fault, set[Link] | None]] = []
        #: Partitions on: (process, node) -> when it heals ("partition" faults).
        self.cuts: dict[tuple[int, int], float] = {}
        #: When each fault applied so far is over (see faults_over).
        self.over: list[float] = []
        #: Each process's pauses ("freeze" faults), as they happened: (start, end).
        self.freezes: dict[int, list[tuple[float, float]]] = {}
        self._lags: list[Fault] = []
        #: The processes that died ("die" faults), and when.
        self.dead: dict[int, float] = {}
        #: (node, key) -> the process whose command last set the key's value there, and
        #: when.
        self.writers: dict[tuple[int, bytes], tuple[int, float]] = {}
        self._pubsub: list[Fault] = []
        self._subscribing: list[Fault] = []
        #: Drops armed to strike at a release (see 'drop' (plan.V1_FROM) and SimNode._execute).
        self.at_release: list[Fault] = []
        self._late: list[Fault] = []
        #: Splits armed, each until its process's next release (see 'split' (plan.V1_FROM)); the
        #: fate of the split release being sent now ((process, instant), node -> how
        #: long it is held back), and the nodes whose messages come late meanwhile
        #: (node, until, the most, the extra drawn for each subscriber link).
        self.splits: list[Fault] = []
        self._split: tuple[tuple[int, float], dict[int, float]] | None = None
        self._split_pubsub: list[tuple[int, float, float, dict[int, float]]] = []
        #: The same for the replies each node sends on the other processes' command
        #: links meanwhile (see split_hold).
        self._split_replies: list[tuple[int, float, float, dict[int, float]]] = []
        #: The fate of the burst being sent now (see :meth:`_held_back`): (process,
        #: instant) and the extra latency per node it is held back on.
        self._burst: tuple[tuple[int, float], dict[int, float]] | None = None
        #: When the loop was blocked (start, end), as it happened (a stall can push the
        #: faults planned during it later).
        self.stalls: list[tuple[float, float]] = []
        #: How far each simulated process's wall clock (``time.time``) is off, in
        #: seconds (see run.make_skews): machines' clocks disagree, and the fencing
        #: floor is the acquirer's clock. None here: every process reads true time.
        self.skews: dict[int, float] = {}
        #: The managers' restart_grace: how long a node that came back empty is out of
        #: the count for acquires (the default's 30 s floor outlasts every run).
        self.grace = math.inf
        #: Called after every command a node runs (the liveness rules read the nodes
        #: then): it must read, never touch, the stores.
        self.observer: Callable[[], None] | None = None
        #: Called with a lock's key when a grant there is undone: by the release that
        #: made it, nobody hearing it (its process gone: aiolock/_lua/release_turn.lua), or
        #: by a release of its token that is no holder's (SimNode._execute).
        self.on_undone: Callable[[bytes], None] | None = None
        #: Each key a command left alive without a ttl, the first time: when, where.
        self.bare: dict[bytes, tuple[float, int]] = {}
        #: Every node refuses SUBSCRIBE and SSUBSCRIBE (from 'models' (plan.V1_FROM) on, some runs).
        self.pubsub_refused = False
        #: What the clients wrote against the "one chunk" rule (Link.from_client).
        self.wire: list[str] = []
        #: What the nodes did against the rules read on them, whatever the faults
        #: ("stays in line", "repairs take no key", "clean-ups leave no token", "expired
        #: releases announce", "a refresh without an offer withdraws it", "scripts run in
        #: order": SimNode._execute; "repairs follow a won renewal": Link.from_client).
        self.promises: list[str] = []
        #: (key, token) -> node -> whether its last renewal batch extended the key there.
        self.renewed: dict[tuple[bytes, bytes], dict[int, bool]] = {}
        #: Every node is a cluster of one master (from 'cluster' (plan.V1_FROM) on, some runs): it
        #: answers ``CLUSTER SLOTS``.
        self.cluster = False
        #: Every node says it is Valkey 9.1 (version 3, half the runs): it has
        #: ``SET ... IFEQ``, and one lock's renewal is that command.
        self.native = False
        #: The rules on a process's subscriptions to its grants (subs.py), where they
        #: are judged (see run.run); None elsewhere.
        self.subs: Subscriptions | None = None
        #: The rule "woken at the quorum's expiry" (sleeps.py; judged where the
        #: liveness rules are: run.run), or None.
        self.sleeps: Sleeps | None = None
        #: The rule "the turn given goes first" (given.py; where subs.py's are judged,
        #: with the library's memory sizes: run.run), or None.
        self.given: GivenTurns | None = None
        #: The fenced resource the bodies write to (resource.py), where a run has one.
        self.resource: Resource | None = None
        #: Each node's commands as its store ran them, where a test records them (the
        #: store against a real server: tests/test_sim.py), else None.
        self.commands: dict[int, list[list[bytes]]] | None = None

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def alias(self, node: SimNode) -> str:
        """A second address of ``node``'s server (another host name that reaches it)."""
        host = f"10.0.1.{node.index + 1}"
        self._by_address[(host, node.port)] = node
        return f"redis://{host}:{node.port}"

    def elapsed(self) -> float:
        return self.now - EPOCH

    def trace(self, line: str) -> None:
        self.history.append(f"{self.elapsed():10.6f} {line}")

    # -- the network -----------------------------------------------------------------

    async def connect(
        self, protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        node = self._by_address.get((host, port))
        process = current_process.get()
        await asyncio.sleep(2 * self.rng.uniform(*BASE_LATENCY))
        if node is not None and (cut := self.cut_for(process, node.index)):
            await asyncio.sleep(cut)  # (its SYNs are retransmitted until the heal)
        if node is None or self.now < node.down_until or process in self.dead:
            raise ConnectionRefusedError(f"{host}:{port}: connection refused (simulated)")
        self._links += 1
        link = Link(self, node, process, self._links)
        self.links.append(link)
        node.session_started(link)
        protocol = protocol_factory()
        link.transport.set_protocol(protocol)
        protocol.connection_made(link.transport)
        return link.transport, protocol

    def latency(self, link: Link, direction: str) -> float:
        latency = self.rng.uniform(*BASE_LATENCY)
        if self._late and direction == "up" and link.kind == "commands":
            latency += self._held_back(link)
        for fault, only in self._delays:
            if (
                (link in only)
                if only is not None
                else (fault.node == link.node.index and fault.process in (-1, link.process))
            ):
                latency += self.rng.expovariate(1.0 / fault.scale)
        for fault in self._lags:  # (steady: within 10 % of its scale)
            latency += fault.scale * self.rng.uniform(0.9, 1.1)
        if self.cuts:
            latency += self.cut_for(link.process, link.node.index)
        if self._split_replies and direction == "down" and not link.pubsub:
            for node, until, most, extras in self._split_replies:  # (see split_hold)
                if node == link.node.index and self.now < until:
                    if link.process not in extras:
                        extras[link.process] = self.rng.uniform(0.0, most)
                    latency += extras[link.process]
        if self._subscribing and direction == "up" and link.pubsub:
            for fault in self._subscribing:  # (node -1: every node)
                if fault.node in (-1, link.node.index) and fault.process in (-1, link.process):
                    latency += self.rng.uniform(0.0, fault.scale)
        return latency

    def _held_back(self, link: Link) -> float:
        """Under a late fault: how long this command is held back (0.0: not at all).

        A *burst* is what a process sends in one instant (a quorum's fan-out, a renewal
        batch, a release): running code costs no virtual time, so a burst's commands
        share ``now``. Each burst of the process is held back with the fault's chance,
        on one node, a majority or all of them, by 0.01 to 1 s per node: mostly past
        the client's node timeout, so the client gives up on the command and it lands
        later, after whatever the client did next (the question the late-message rows
        of the safety table answer). The link's later messages queue behind it (a
        connection is ordered); the process's other connections go on at once.
        """
        process = link.process
        key = (process, self.now)
        if self._burst is None or self._burst[0] != key:
            held: dict[int, float] = {}
            for fault in self._late:
                if fault.process in (-1, process) and self.rng.random() < fault.scale:
                    count = self.rng.choice((1, len(self.nodes) // 2 + 1, len(self.nodes)))
                    for node in self.rng.sample(self.nodes, count):
                        held[node.index] = self.rng.uniform(0.01, 1.0)
                    self.trace(
                        f"p{process} burst held back: "
                        + ", ".join(f"n{i} +{s * 1000:.1f}ms" for i, s in sorted(held.items()))
                    )
                    break
            self._burst = (key, held)
        return self._burst[1].get(link.node.index, 0.0)

    def split_hold(self, link: Link, data: bytes) -> float:
        """Under a split fault (see 'split' (plan.V1_FROM)): how long this write is held back.

        The first release (``RELEASE_TURN``, or a plain ``RELEASE``: a clean-up's too)
        that ``link``'s process writes once a split of it is armed decides the fate of
        the whole burst (every node's copy is written at the same instant): it runs at
        once on 1 to n - 1 nodes and is held back on the others, each by 2 ms up to the
        fault's scale. For the fault's ``seconds`` from then, what each node publishes
        reaches each subscriber link late, by up to that node's own most (drawn once
        per link: a connection stays ordered), and so do its replies to the other
        processes (an attempt decided by some nodes while the others' replies, and its
        clean-up, are on the way). Draws nothing without a split armed."""
        if not self.splits and self._split is None:
            return 0.0
        if _RELEASES[0] not in data and _RELEASES[1] not in data:
            return 0.0
        key = (link.process, self.now)
        if self._split is not None and self._split[0] == key:
            return self._split[1].get(link.node.index, 0.0)
        fault = next((f for f in self.splits if f.process in (-1, link.process)), None)
        if fault is None:
            return 0.0
        self.splits.remove(fault)
        count = len(self.nodes)
        order = self.rng.sample(range(count), count)
        at_once = set(order[: self.rng.randint(1, count - 1)])
        held = {i: self.rng.uniform(0.002, fault.scale) for i in order if i not in at_once}
        self._split = (key, held)
        until = self.now + fault.seconds
        self._split_pubsub = [entry for entry in self._split_pubsub if entry[1] > self.now]
        self._split_replies = [entry for entry in self._split_replies if entry[1] > self.now]
        late, slow = [], []
        for i in range(count):
            most = self.rng.choice((0.0, 0.005, 0.05, 0.2))
            if most:
                self._split_pubsub.append((i, until, most, {}))
                late.append(f"n{i} {most * 1000:.0f}ms")
            most = self.rng.choice((0.0, 0.002, 0.01, 0.05))
            if most:
                self._split_replies.append((i, until, most, {link.process: 0.0}))
                slow.append(f"n{i} {most * 1000:.0f}ms")
        self.trace(
            f"p{link.process} release split: at once on "
            + ", ".join(f"n{i}" for i in sorted(at_once))
            + "; held back: "
            + ", ".join(f"n{i} +{s * 1000:.1f}ms" for i, s in sorted(held.items()))
            + f"; for {fault.seconds:.3f}s messages late up to {', '.join(late) or 'none'}"
            + f", replies to others up to {', '.join(slow) or 'none'}"
        )
        return held.get(link.node.index, 0.0)

    def pubsub_fate(self, link: Link) -> float | None:
        """The latency of a pub/sub message, ``None`` when it is lost."""
        latency = self.rng.uniform(*BASE_LATENCY)
        for node, until, most, extras in self._split_pubsub:  # (see split_hold)
            if node == link.node.index and self.now < until:
                if link.number not in extras:
                    extras[link.number] = self.rng.uniform(0.0, most)
                latency += extras[link.number]
        for fault in self._pubsub:
            if fault.node == link.node.index and fault.process in (-1, link.process):
                if self.rng.random() < fault.scale:
                    return None
                latency += self.rng.expovariate(1.0 / 0.05)
        return latency

    # -- what the nodes keep (for the checker) ---------------------------------------

    def keeping(self, key: bytes, token: bytes | None, until: float, since: float) -> list[str]:
        """The nodes that do *not* keep ``key`` with ``token`` until ``until`` (virtual
        time), each as ``"n<i> <what it keeps>"``; a node restarted since ``since`` keeps
        it, as far as the checker is concerned, while its quarantine lasts (the library
        keeps others out there until ``restart_grace`` after it came back; then the
        holder's key must be back on it: repaired).

        Read without touching the store (an expired key is not removed): sampling
        changes nothing in the run.
        """
        short = []
        for node in self.nodes:
            if node.reset_at > since and node.reset_at + self.grace >= until:
                continue
            value, ends = node.store.data.get(key), node.ends(key)
            if value != token and ends > self.now:
                short.append(f"n{node.index} another token until {ends:.6f}")
            elif ends < until:
                kept = f"until {ends:.6f}" if ends > self.now else "nothing"
                short.append(f"n{node.index} {kept}")
        return short

    def expiries(self, key: bytes, token: bytes) -> list[tuple[int, float]]:
        """Each node that keeps ``key`` with ``token``, and until when (virtual time;
        infinity: no ttl). Read without touching the store."""
        found = []
        for node in self.nodes:
            ends = node.ends(key)
            if node.store.data.get(key) == token and ends > self.now:
                found.append((node.index, ends))
        return found

    def _live(self, key: bytes) -> list[bytes | None]:
        """Each node's string value of ``key`` (None: none, or expired), read without
        touching the stores, as :meth:`keeping` reads."""
        values: list[bytes | None] = []
        for node in self.nodes:
            value = node.store.data.get(key)
            expiry = node.store.expires.get(key)
            alive = expiry is None or expiry > node.clock_ms()
            values.append(value if isinstance(value, bytes) and alive else None)
        return values

    def holders(self, key: bytes) -> dict[bytes, int]:
        """On how many nodes each value of ``key`` lives; once a process died, only the
        values set since, by the living (what the dead held, was granted or was taking
        as it died waits out its ttl)."""
        died = max(self.dead.values(), default=-math.inf)
        counts: dict[bytes, int] = {}
        for index, value in enumerate(self._live(key)):
            writer, at = self.writers.get((index, key), (-1, math.inf))
            if value is not None and writer not in self.dead and at > died:
                counts[value] = counts.get(value, 0) + 1
        return counts

    def counters(self, key: bytes) -> list[int | None]:
        """Each node's fencing counter ``key`` (None: it has none, or it expired)."""
        return [None if value is None else int(value) for value in self._live(key)]

    # -- faults ----------------------------------------------------------------------

    def arm(self) -> None:
        """Schedule every fault of the run."""
        for fault in self.faults:
            self.loop.call_at(EPOCH + fault.at, self._apply, fault)

    def faults_over(self) -> float | None:
        """When the run's faults are over, as applied (a stall pushes the faults planned
        during it later), each with what it leaves behind (:meth:`_lasting`); None while
        one is still to come, or armed (a stall within a step, a split, a drop at a
        release)."""
        loop = self.loop
        if len(self.over) < len(self.faults) or loop.blocking or self.splits or self.at_release:
            return None
        return max([*self.over, *(end + WATCHDOG for _start, end in self.stalls)], default=EPOCH)

    def _lasting(self, fault: Fault) -> float:
        """How long after it is applied ``fault`` may still hold a waiter up: its own
        time; a restarted node's quarantine; the watchdog's second for a reset, silent
        or blocked connection; a delayed message's tail (ten times its mean); a second
        for messages held back or retransmitted."""
        kind, lasting = fault.kind, fault.seconds
        lasting += self.grace if kind in ("restart", "failover") else 0.0
        lasting += WATCHDOG if kind in ("sever", "silent", "drop", "stall", "freeze") else 0.0
        lasting += 10 * fault.scale if kind in ("delay", "slow", "lag", "pubsub") else 0.0
        return lasting + (1.0 if kind in ("late", "partition", "subscribe", "split") else 0.0)

    def _in_force(self, faults: list[Any], fault: Any, seconds: float) -> None:
        """``fault`` is in ``faults`` (those in force, read as messages go) for ``seconds``."""
        faults.append(fault)
        self.loop.call_at(self.now + seconds, faults.remove, fault)

    def _apply(self, fault: Fault) -> None:
        self.trace(f"fault {fault}")
        self.over.append(self.now + self._lasting(fault))
        kind = fault.kind
        node = self.nodes[fault.node] if fault.node < len(self.nodes) else self.nodes[0]
        if kind in ("delay", "slow"):
            # delay: one connection of the process to the node (flag), or all of them;
            # slow: the process's rank-th command connection on a majority of the nodes
            # (one connection of a client slow, the others not: what reorders a client's
            # commands across its connections).
            only: set[Link] | None = None
            if kind == "slow":
                chosen = self.rng.sample(self.nodes, len(self.nodes) // 2 + 1)
                only = set()
                for target in chosen:
                    links = [
                        link
                        for link in target.sessions
                        if link.process == fault.process and link.kind == "commands"
                    ]
                    if len(links) > fault.rank:
                        only.add(links[fault.rank])
            elif fault.flag:
                links = [link for link in node.sessions if fault.process in (-1, link.process)]
                only = {self.rng.choice(links)} if links else set()
            if only is not None:
                self.trace(f"delay on {', '.join(sorted(link.name for link in only))}")
            self._in_force(self._delays, (fault, only), fault.seconds)
        elif kind == "die":
            # Its connections close: what it had sent runs (the kernel sends what was
            # written before the process died), and nothing more comes from it.
            self.dead[fault.process] = self.now
            for link in list(self.links):
                if link.process == fault.process:
                    link.sever(apply=True, tell=False)
        elif kind in ("lag", "late", "pubsub", "subscribe"):
            kinds = {
                "lag": self._lags,
                "late": self._late,
                "pubsub": self._pubsub,
                "subscribe": self._subscribing,
            }
            self._in_force(kinds[kind], fault, fault.seconds)
        elif kind == "sever":
            for link in list(node.sessions):
                if fault.process in (-1, link.process):
                    link.sever(apply=fault.flag)
                    break
        elif kind == "split":  # (from 'split' (plan.V1_FROM) on): armed until the next release
            self.splits.append(fault)
        elif kind == "drop" and fault.rank:  # (from 'drop' (plan.V1_FROM) on)
            self.at_release.append(fault)
        elif kind == "drop":
            self.drop(fault, fault.process)
        elif kind == "silent":  # (from 'sockets' (plan.V1_FROM) on)
            for link in list(node.sessions):
                if fault.process in (-1, link.process) and not link.pubsub:
                    link.silence()
                    break
        elif kind == "pause":
            node.pause(fault.seconds)
        elif kind == "restart":
            node.restart(fault.seconds, fault.flag)
        elif kind == "failover":
            node.restart(fault.seconds, True, failover=True)
        elif kind == "jump":
            # The process's wall clock steps (NTP, an operator, a VM resumed); its
            # monotonic clock, which the library times everything with, does not.
            process = fault.process
            self.skews[process] = self.skews.get(process, 0.0) + fault.scale
        elif kind == "partition":
            # The process and the nodes in the mask (``rank``) reach each other no more,
            # either way, until it heals: what is sent meanwhile arrives after.
            heals = self.now + fault.seconds
            for index in range(len(self.nodes)):
                if fault.rank >> index & 1:
                    self.cuts[(fault.process, index)] = heals
        elif kind == "freeze":
            # One process paused (a GC pause, a VM descheduled): none of its code runs,
            # what reaches it waits in its sockets; the nodes and the others go on.
            until = max(self.now + fault.seconds, self.loop.frozen.get(fault.process, 0.0))
            self.loop.frozen[fault.process] = until
            self.freezes.setdefault(fault.process, []).append((self.now, until))
        elif kind == "clock":
            # A node's clock steps (an operator, NTP stepping): its keys' ttls, which
            # it counts on its own clock, end that much sooner or later.
            node.jumped_ms += fault.scale * 1000.0
        elif kind == "stall" and fault.flag:  # within a step (see 'step_stall' (plan.V1_FROM))
            self.loop.blocking = [fault.rank, fault.seconds]
        elif kind == "stall":
            self.stall(fault.seconds)
        else:  # pragma: no cover - a fault kind without its code
            raise ValueError(kind)

    def cut_for(self, process: int, node: int) -> float:
        """How long a message between ``process`` and ``node`` waits for a partition
        between them to heal (0.0: none): TCP retransmits it then, a retransmission
        timeout after (up to 0.2 s)."""
        heals = self.cuts.get((process, node))
        if heals is None or heals <= self.now:
            return 0.0
        return heals - self.now + self.rng.uniform(0.0, 0.2)

    def drop(self, fault: Fault, process: int) -> bool:
        """Reset ``process``'s pub/sub connections to ``fault``'s node (-1: to every
        node; process -1: every process's); whether there was one."""
        links = [
            link
            for link in self.links
            if link.pubsub
            and not link.dead
            and process in (-1, link.process)
            and fault.node in (-1, link.node.index)
        ]
        for link in links:
            link.sever(apply=fault.flag)
        return bool(links)

    def stall(self, seconds: float) -> None:
        """The clients' loop is blocked for ``seconds``: time passes, no client runs.
        From 'step_stall' (plan.V1_FROM) on, the network and the nodes go on meanwhile (commands
        arrive and run, replies come back and wait to be read, faults begin and end);
        before, everything waited for the stall's end."""
        end = self.now + seconds
        self.stalls.append((self.now, end))
        if self.plan.has("step_stall"):
            self.loop.run_world_until(end)
        self.now = end
        if self.observer is not None:
            # What a body would read first, were one due now (before any reply that
            # came during the stall is read): see Recorder.watch.
            self.observer()


# -- determinism -------------------------------------------------------------------------


@contextmanager
def virtual_process(world: World, seed: int) -> Iterator[None]:
    """Make the process's clocks and randomness the world's for the run's duration.

    ``time.monotonic``/``time.time`` read the virtual clock (``time.time`` off by the
    running process's skew, if the world gives it one); the ``random`` module, the
    ``secrets`` tokens, lock tokens and ``os.urandom`` draw from the run's seed; ``select.poll``
    answers for the simulated sockets (:class:`SimPoll`). Restored after.
    """
    rng = random.Random(f"lib-{seed}")

    def urandom(n: int) -> bytes:
        return rng.randbytes(n)

    def token_bytes(nbytes: int | None = None) -> bytes:
        return rng.randbytes(32 if nbytes is None else nbytes)

    def wall() -> float:
        return WALL_EPOCH + world.now + world.skews.get(current_process.get(), 0.0)

    state = random.getstate()
    with ExitStack() as patched:
        for module, name, value in (
            (select, "poll", functools.partial(SimPoll, world, select.poll)),
            (time, "monotonic", lambda: world.now),
            (time, "monotonic_ns", lambda: int(world.now * 1e9)),
            (time, "time", wall),
            (time, "time_ns", lambda: int(wall() * 1e9)),
            (os, "urandom", urandom),
            (secrets, "token_bytes", token_bytes),
            (tokens, "new_token", lambda: token_bytes(tokens.TOKEN_BYTES)),
        ):
            patched.enter_context(mock.patch.object(module, name, value))
        random.seed(f"lib-random-{seed}")
        try:
            yield
        finally:
            random.setstate(state)


__all__ = [
    "Deadlock",
    "Error",
    "Fault",
    "SimLoop",
    "World",
    "current_process",
    "virtual_process",
]
