"""The quorum engine and validity maths with fake nodes and an injected clock.

Pure logic only: every test that touches Redis runs on real servers elsewhere.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from aiolock._core.batch import BATCH_BYTES, batch_chunks
from aiolock._core.calls import Callback, Record
from aiolock._core.votes import DRIFT_FLOOR, Votes, drift, quorum_size
from aiolock._lua import ACQUIRE_SCRIPT, RAISE_FENCE_SCRIPT, RELEASE_SCRIPT, Script
from aiolock._quorum.keys_asked import MAX_KEY_ROUNDS
from aiolock._quorum.quorum import Quorum
from aiolock._waiting.grants import Grants
from aiolock._waiting.taker import Taker

from ..conftest import cycles_of

TAKEN = 1  # ACQUIRE's reply when the key was set: its fencing token
HELD = [0, 5000]  # ... when someone else holds it, 5 s to live


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeNode:
    """Answers each request after ``delay`` seconds (never if None) with ``reply``."""

    def __init__(
        self,
        name: str,
        reply: Any = TAKEN,
        delay: float | None = 0.0,
        clock: FakeClock | None = None,
        advance: float = 0.0,
        *,
        released: int = 1,
    ) -> None:
        self.spec = name
        self.released = released  # the clean-up's reply: 1 deleted the token, 0 nothing
        self.name = name
        self.reply = reply
        self.delay = delay
        self.clock = clock
        self.advance = advance
        self.calls: list[tuple[bytes, ...]] = []

    def _answer(self, callback: Callback, reply: Any) -> None:
        if self.clock is not None:
            self.clock.now += self.advance
        callback(reply)

    def call(self, args: tuple[bytes, ...], callback: Callback) -> None:
        self.calls.append(args)
        reply = self.reply(args) if callable(self.reply) else self.reply
        if self.delay is not None:
            asyncio.get_running_loop().call_later(self.delay, self._answer, callback, reply)

    set_ifeq = False

    def call_script(self, script: Script, args: tuple[bytes, ...], callback: Callback) -> None:
        if script is RELEASE_SCRIPT and not isinstance(self.reply, Exception):
            # The clean-up after a failed attempt deletes what this node took.
            self.calls.append((b"EVALSHA", script.sha, *args))
            if self.delay is not None:
                loop = asyncio.get_running_loop()
                loop.call_later(self.delay, self._answer, callback, self.released)
            return
        self.call((b"EVALSHA", script.sha, *args), callback)

    def call_for_vote(
        self, script: Script, args: tuple[bytes, ...], record: Record, index: int
    ) -> None:
        self.call_script(script, args, functools.partial(record, index))

    def scripts(self) -> list[str]:
        names = {ACQUIRE_SCRIPT.sha: "acquire", RELEASE_SCRIPT.sha: "release"}
        return [names.get(call[1], "other") for call in self.calls]


def make(nodes: list[FakeNode], clock: FakeClock | None = None, **kw: Any) -> Quorum:
    return Quorum(
        nodes,
        node_timeout=kw.get("node_timeout", 0.05),
        drift_factor=kw.get("drift_factor", 0.01),
        clock=clock or FakeClock(),
    )


@pytest.mark.parametrize(("n", "q"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)])
def test_quorum_is_a_strict_majority(n: int, q: int) -> None:
    assert quorum_size(n) == q


def test_validity_subtracts_elapsed_and_drift() -> None:
    assert drift(10.0, 0.01) == pytest.approx(0.1 + DRIFT_FLOOR)
    expiry = make([FakeNode("n")]).expiry  # start + ttl - drift
    assert expiry(100.0, 10.0) - 100.5 == pytest.approx(10.0 - 0.5 - 0.102)
    assert expiry(100.0, 1.0) - 100.999 < 0


async def test_acquire_validity_is_measured_from_before_first_request() -> None:
    clock = FakeClock()
    nodes = [FakeNode(f"n{i}", clock=clock, advance=0.1) for i in range(3)]
    quorum = make(nodes, clock)
    start = clock.now
    attempt = await quorum.acquire(b"k", b"t", 10.0)
    assert attempt.acquired
    # Decided after two replies (0.2 s on the fake clock); expiry counts from start.
    assert attempt.expires_at == pytest.approx(start + 10.0 - drift(10.0, 0.01))


async def test_acquire_fails_when_validity_is_used_up_and_cleans_up() -> None:
    clock = FakeClock()
    nodes = [FakeNode(f"n{i}", clock=clock, advance=0.6) for i in range(3)]
    quorum = make(nodes, clock)
    attempt = await quorum.acquire(b"k", b"t", 1.0)
    assert not attempt.acquired
    assert not attempt.votes.outage
    # Every node that said yes is asked to release.
    for node in nodes:
        assert node.scripts() == ["acquire", "release"]


async def test_acquire_decides_without_waiting_for_a_slow_node() -> None:
    nodes = [FakeNode(f"n{i}") for i in range(4)] + [FakeNode("slow", delay=None)]
    quorum = make(nodes, node_timeout=5.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    attempt = await quorum.acquire(b"k", b"t", 10.0)
    assert attempt.acquired
    assert loop.time() - started < 1.0


async def test_contention_is_not_an_outage_and_definite_noes_are_not_cleaned() -> None:
    nodes = [FakeNode(f"n{i}", reply=HELD) for i in range(3)] + [FakeNode("a"), FakeNode("b")]
    quorum = make(nodes)
    attempt = await quorum.acquire(b"k", b"t", 10.0)
    assert not attempt.acquired
    assert not attempt.votes.outage
    assert attempt.votes.no == 3
    # No release is sent to nodes that said "held by someone else".
    for node in nodes[:3]:
        assert node.scripts() == ["acquire"]
    for node in nodes[3:]:
        assert node.scripts() == ["acquire", "release"]
    assert attempt.holder_ttl() == 5.0


async def test_failing_nodes_are_an_outage_with_errors_per_node() -> None:
    boom = ConnectionError("down")
    nodes = [FakeNode(f"n{i}", reply=boom) for i in range(3)] + [FakeNode("a"), FakeNode("b")]
    quorum = make(nodes)
    attempt = await quorum.acquire(b"k", b"t", 10.0)
    assert not attempt.acquired
    assert attempt.votes.outage
    assert attempt.votes.errors(quorum.nodes) == {"n0": boom, "n1": boom, "n2": boom}
    # The clean-up reaches every node that may hold the key, failed ones included.
    for node in nodes:
        assert node.scripts() == ["acquire", "release"]
    assert attempt.holder_ttl() is None


async def test_unanswered_nodes_time_out_after_node_timeout() -> None:
    nodes = [FakeNode(f"n{i}", delay=None) for i in range(3)]
    quorum = make(nodes, node_timeout=0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()
    attempt = await quorum.acquire(b"k", b"t", 10.0)
    elapsed = loop.time() - started
    assert attempt.votes.outage
    errors = attempt.votes.errors(quorum.nodes)
    assert sorted(errors) == ["n0", "n1", "n2"]  # each node's own error, named
    for spec, error in errors.items():
        assert isinstance(error, TimeoutError)
        assert str(error) == f"{spec}: no reply within 0.05s"
    # One timeout for the attempt and one for its clean-up, not one per node.
    assert elapsed < 0.5


async def test_each_fan_out_times_out_from_its_own_start_and_a_decided_one_never() -> None:
    """One loop timer serves every fan-out of a quorum (FanOutTimer): each pending one
    still times out node_timeout after its own start, and one decided before its time
    keeps the replies that come after, never a timeout."""
    loop = asyncio.get_running_loop()
    late = make([FakeNode("a"), FakeNode("b"), FakeNode("c", delay=0.12)], node_timeout=0.05)
    decided = await late.release(b"k", b"t")  # a and b decide it; c answers at 0.12 s
    await asyncio.sleep(0.2)
    assert decided.replies == [1, 1, 1]
    silent = make([FakeNode(f"n{i}", delay=None) for i in range(3)], node_timeout=0.05)

    async def one(after: float) -> tuple[float, bool]:
        await asyncio.sleep(after)
        started = loop.time()
        votes = await silent.release(b"k", b"t")
        return loop.time() - started, votes.outage

    timed = await asyncio.wait_for(asyncio.gather(*(one(d) for d in (0, 0.02, 0.04))), 5)
    for took, outage in timed:
        assert outage
        assert 0.049 <= took < 0.5, timed


async def test_a_decided_fan_out_is_not_kept_until_the_timer_fires() -> None:
    """The fan-outs decided before the next one starts leave the timer's queue then, not
    a node_timeout later: kept, each would outlive the young garbage collections."""
    quorum = make([FakeNode(f"n{i}", reply=1) for i in range(3)], node_timeout=30.0)
    for _ in range(50):
        assert (await quorum.release(b"k", b"t")).won
    await asyncio.sleep(0)  # (the last fan-out's stamp)
    assert len(quorum._timer._due) == 1


async def test_cancelled_acquire_still_cleans_up_every_node() -> None:
    nodes = [FakeNode(f"n{i}", delay=0.2) for i in range(3)]
    quorum = make(nodes, node_timeout=1.0)
    task = asyncio.create_task(quorum.acquire(b"k", b"t", 10.0))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for node in nodes:
        assert node.scripts() == ["acquire", "release"]


async def test_release_completes_when_cancelled_midway() -> None:
    nodes = [FakeNode(f"n{i}", reply=1, delay=0.1) for i in range(3)]
    quorum = make(nodes, node_timeout=1.0)
    task = asyncio.create_task(quorum.release(b"k", b"t"))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The cancellation waited for the outcome: the replies were counted.
    for node in nodes:
        assert len(node.calls) == 1


async def test_extend_is_decided_by_majority() -> None:
    clock = FakeClock()
    nodes = [FakeNode("a", reply=1), FakeNode("b", reply=1), FakeNode("c", reply=0)]
    quorum = make(nodes, clock)
    votes, expires_at = await quorum.extend(b"k", b"t", 5.0)
    assert votes.won
    assert expires_at == pytest.approx(clock.now + 5.0 - drift(5.0, 0.01))
    nodes = [FakeNode("a", reply=0), FakeNode("b", reply=0), FakeNode("c", reply=1)]
    votes, expires_at = await make(nodes, clock).extend(b"k", b"t", 5.0)
    assert not votes.won
    assert expires_at is None
    assert votes.no == 2


async def test_extend_many_counts_each_lock_per_node() -> None:
    replies = [[1, 0, 1], [1, 0, 0], ConnectionError("x")]
    nodes = [FakeNode(f"n{i}", reply=replies[i]) for i in range(3)]
    quorum = make(nodes)
    batch = await quorum.extend_many([(b"a", b"t", 1.0), (b"b", b"t", 1.0), (b"c", b"t", 1.0)])
    assert batch.yes == [2, 0, 1]
    assert batch.no == [0, 2, 1]
    assert batch.failed == [1, 1, 1]
    assert set(batch.errors) == {"n2"}
    # One script call per node for the whole batch.
    assert all(len(node.calls) == 1 for node in nodes)


async def test_release_completes_when_an_anyio_scope_is_cancelled_midway() -> None:
    nodes = [FakeNode(f"n{i}", reply=1, delay=0.1) for i in range(3)]
    quorum = make(nodes, node_timeout=1.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with anyio.move_on_after(0.01) as scope:
        await quorum.release(b"k", b"t")
    # The scope's cancellation was held back until the replies were in.
    assert scope.cancelled_caught
    assert loop.time() - started >= 0.09


async def test_extend_many_completes_when_cancelled_midway() -> None:
    nodes = [FakeNode(f"n{i}", reply=[1], delay=0.1) for i in range(3)]
    quorum = make(nodes, node_timeout=1.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.create_task(quorum.extend_many([(b"a", b"t", 1.0)]))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The cancellation was held back until every node had answered (the renewal's
    # outcome is known: a node that extended is not left unaccounted for).
    assert loop.time() - started >= 0.09


def test_a_renewal_batch_is_split_by_count_and_by_bytes() -> None:
    assert batch_chunks([]) == []
    # Short names: BATCH_LIMIT locks a call.
    assert batch_chunks([40] * 2500) == [(0, 1000), (1000, 2000), (2000, 2500)]
    # Names of 4 KB: at most BATCH_BYTES a call (15 of 4,116 bytes, not 16).
    big = 4096 + 20
    chunks = batch_chunks([big] * 100)
    assert all(hi - lo == 15 for lo, hi in chunks[:-1])
    assert chunks[-1] == (90, 100)
    assert all((hi - lo) * big <= BATCH_BYTES for lo, hi in chunks)
    # An item larger than the budget alone still goes, in a call of its own.
    assert batch_chunks([10, BATCH_BYTES + 1, 10]) == [(0, 1), (1, 2), (2, 3)]


async def test_a_node_that_keeps_asking_for_keys_counts_as_held_after_the_bound() -> None:
    # The writer's script asks for the readers' keys ({2, ids...}) and is sent again
    # with them; a node whose readers keep changing is given up on after
    # MAX_KEY_ROUNDS more rounds: "held", holder's ttl unknown; never "taken".
    asks = [2, b"reader"]
    nodes = [FakeNode(f"n{i}", reply=asks) for i in range(3)]
    quorum = make(nodes)

    def keys_asked(reply: Any) -> tuple[bytes, ...] | None:
        if type(reply) is list and reply and reply[0] == 2:
            return tuple(b"k:" + member for member in reply[1:])
        return None

    attempt = await quorum.acquire(b"k", b"t", 10.0, keys_asked=keys_asked)
    assert attempt.expires_at is None
    assert attempt.votes.no == 3  # held by someone, not failed, not taken
    assert attempt.votes.yes == 0
    assert attempt.holder_ttl() is None  # ttl unknown
    for node in nodes:
        asked = [call for call in node.calls if call[1] == ACQUIRE_SCRIPT.sha]
        assert len(asked) == 1 + MAX_KEY_ROUNDS
        # Each round declares the keys the node asked for, once each.
        assert [call.count(b"k:reader") for call in asked] == [0] + [1] * MAX_KEY_ROUNDS


async def test_replies_that_ask_for_keys_leave_no_reference_cycle() -> None:
    """The fan-out's votes are freed once nothing refers to them, not by the garbage
    collector: the helper that sends a script again with the keys asked must not refer
    to itself."""
    nodes = [FakeNode(f"n{i}", reply=[2, b"reader"]) for i in range(3)]
    quorum = make(nodes)

    def keys_asked(reply: Any) -> tuple[bytes, ...] | None:
        return (b"k:reader",) if type(reply) is list and reply[0] == 2 else None

    await quorum.acquire(b"k", b"t", 10.0, keys_asked=keys_asked)  # (warm)
    with cycles_of(Votes) as cyclic:
        attempt = await quorum.acquire(b"k", b"t", 10.0, keys_asked=keys_asked)
        assert attempt.votes.no == 3
        del attempt
    assert cyclic == []


def _raises(nodes: list[FakeNode]) -> list[int]:
    return [sum(c[1] == RAISE_FENCE_SCRIPT.sha for c in node.calls) for node in nodes]


async def test_a_fencing_token_the_granting_nodes_agree_on_costs_no_request_more() -> None:
    # The usual case: every node that answered granted with the same counter (the
    # floor sent); failed nodes are left alone (the next floor brings them up).
    nodes = [FakeNode(f"n{i}", reply=100) for i in range(3)]
    nodes += [FakeNode(f"n{i}", reply=ConnectionError("down")) for i in range(3, 5)]
    attempt = await make(nodes).acquire(b"k", b"t", 10.0)
    assert attempt.acquired
    assert attempt.fence == 100
    assert _raises(nodes) == [0, 0, 0, 0, 0]


async def test_a_node_that_said_held_has_its_counter_raised_though_the_grants_agree() -> None:
    # Four nodes grant with 100; the fifth says "held" (a stale key there): its
    # counter may lag behind the token, so it is raised to it, in the background.
    nodes = [FakeNode(f"n{i}", reply=100) for i in range(4)]
    nodes.append(FakeNode("n4", reply=[0, 5000]))
    attempt = await make(nodes).acquire(b"k", b"t", 10.0)
    assert attempt.fence == 100
    assert _raises(nodes) == [0, 0, 0, 0, 1]


async def test_a_fencing_token_no_majority_confirmed_is_not_handed_out() -> None:
    # Every node grants the lock, but their counters disagree: two are at 100, three
    # at 50. Token 100 must first be durable on a majority; when raising the three
    # fails, the attempt does not acquire (a token a majority never saw could be
    # handed out again to a later holder), and the key is given back everywhere.
    def answer(counter: int) -> Callable[[tuple[bytes, ...]], Any]:
        def reply(args: tuple[bytes, ...]) -> Any:
            if args[1] == ACQUIRE_SCRIPT.sha:
                return counter
            return ConnectionError("the counter could not be raised")

        return reply

    nodes = [FakeNode(f"n{i}", reply=answer(100 if i < 2 else 50)) for i in range(5)]
    attempt = await make(nodes).acquire(b"k", b"t", 10.0)
    assert not attempt.acquired
    assert attempt.fence is None
    assert all(node.scripts().count("release") == 1 for node in nodes)
    # The three behind were asked to raise their counter to 100; the two at it were not.
    raised = [[c for c in node.calls if c[1] == RAISE_FENCE_SCRIPT.sha] for node in nodes]
    assert [len(calls) for calls in raised] == [0, 0, 1, 1, 1]
    assert all(calls[0][-2] == b"100" for calls in raised[2:])


async def test_a_node_the_clean_up_released_never_counts_for_a_grant_though_its_no_came_late() -> (
    None
):
    """Found by the simulation (seed 200016431, with no fault at all).

    The head's attempt was decided lost by two "held" replies before node 1 answered:
    its clean-up released the token on node 1, deleting a grant that had just landed
    there, and node 1's "held" came after the decision. The nodes whose grants no longer
    count are the ones the clean-up released, not the ones still unanswered when the
    attempt returns: counted, node 1 made a quorum with node 2, and the process took a
    lock held on one node of three (another process acquired it too).
    """
    nodes = [FakeNode("n0", reply=HELD), FakeNode("n1", reply=HELD, delay=0.02)]
    nodes.append(FakeNode("n2", reply=HELD))
    quorum = Quorum(nodes, node_timeout=0.5, drift_factor=0.01, clock=time.monotonic)
    attempt = await quorum.acquire(b"k", b"t", 10.0)
    assert not attempt.acquired
    assert [node.scripts() for node in nodes] == [["acquire"], ["acquire", "release"], ["acquire"]]
    assert attempt.votes.verdicts[1] is False  # its "held" came after the decision
    grants = Grants(quorum)
    head = Taker(b"t", 10.0)
    grants.tried(b"t", attempt)
    sent = time.monotonic()
    for node in (1, 2):  # node 1's grant message, for the grant the clean-up deleted
        grants.heard(node, b"k", (b"t", 10.0, sent), 42, head=head, wake=lambda: None)
    assert not head.future.done()  # node 2's grant alone counts: the head tries itself


async def test_a_grant_from_a_node_where_the_clean_up_deleted_nothing_still_counts() -> None:
    # The clean-up found no token of ours there (it replied 0): any grant of the token
    # came after it and stands. Leaving it out would cost the head an attempt, or a wait.
    nodes = [FakeNode("n0", reply=HELD), FakeNode("n1", reply=HELD, delay=0.02, released=0)]
    nodes.append(FakeNode("n2", reply=HELD))
    quorum = Quorum(nodes, node_timeout=0.5, drift_factor=0.01, clock=time.monotonic)
    attempt = await quorum.acquire(b"k", b"t", 10.0)
    assert nodes[1].scripts() == ["acquire", "release"]
    assert attempt.cleaned == ()
    grants = Grants(quorum)
    head = Taker(b"t", 10.0)
    grants.tried(b"t", attempt)
    sent = time.monotonic()
    for node in (1, 2):
        grants.heard(node, b"k", (b"t", 10.0, sent), 42, head=head, wake=lambda: None)
    assert head.future.done()  # nodes 1 and 2: a quorum of 3
