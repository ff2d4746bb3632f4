"""The turn queue's decisions, without servers: who a release names, what a handoff sees.

The scripts run on the simulation's store (tests/sim/server.py: our Lua on Lua 5.1, the
commands they call modelled); the engine's side is read from the arguments it sends.
"""

from __future__ import annotations

from typing import Any

import pytest

import aiolock
from aiolock._core.keys import fence_key, turn_keys
from aiolock._lua import PASS_ON_SCRIPT, RELEASE_TURN_SCRIPT, Script
from tests.sim.server import Store

from .. import seam

KEY = b"aiolock:{n}"
TURNS = list(turn_keys(KEY))  # the queue, the entries' expiries, the offers
LIFE = b"60000"


class Node:
    """One simulated node, its clock at ``now`` ms, recording what it publishes."""

    def __init__(self) -> None:
        self.now = 1_000_000.0
        self.published: list[tuple[bytes, bytes]] = []
        self.store = Store(lambda: self.now, self._publish)

    def _publish(self, channel: bytes, message: bytes, _sharded: bool) -> int:
        self.published.append((channel, message))
        return 1

    def run(self, script: Script, keys: list[bytes], args: list[bytes]) -> Any:
        return self.store.execute([b"EVAL", script.source, b"%d" % len(keys), *keys, *args])

    def call(self, *words: bytes) -> Any:
        return self.store.execute(list(words))

    def line(self, *members: bytes) -> None:
        """Members in line, in this order (their places 1, 2, ...), alive a minute."""
        for place, member in enumerate(members, 1):
            self.call(b"ZADD", TURNS[0], b"%d" % place, member)
            self.call(b"ZADD", TURNS[1], b"%d" % (self.now + 60_000), member)

    def named(self) -> bytes:
        """What the last release published on the lock's release channel."""
        released = [m for c, m in self.published if c == KEY + b":released"]
        return released[-1]


def _release_turn(node: Node, place: bytes | None, member: bytes | None) -> Any:
    node.call(b"SET", KEY, b"tok", b"PX", b"10000")
    ours = [] if place is None or member is None else [LIFE, place, member]
    keys = [KEY, fence_key(KEY), *TURNS]
    return node.run(RELEASE_TURN_SCRIPT, keys, [b"tok", b"1", *ours])


@pytest.mark.parametrize(
    ("releaser", "place", "expected"),
    [(b"B", b"2", b"C"), (b"C", b"3", b"A"), (b"A", b"1", b"B")],
    ids=["the-next-after-it", "round-to-the-first", "the-second"],
)
def test_a_release_names_the_process_after_the_releasing_one_going_round(
    releaser: bytes, place: bytes, expected: bytes
) -> None:
    node = Node()
    node.line(b"A", b"B", b"C")
    assert _release_turn(node, place, releaser) == 1
    assert node.named() == expected


def test_a_release_of_a_process_out_of_line_names_the_first_in_line() -> None:
    node = Node()
    node.line(b"A", b"B", b"C")
    assert _release_turn(node, None, None) == 1
    assert node.named() == b"A"


def test_a_release_with_nobody_in_line_names_nobody() -> None:
    node = Node()
    assert _release_turn(node, None, None) == 1
    assert node.named() == b""


def _pass_on(node: Node, member: bytes) -> Any:
    node.call(b"SET", KEY, b"old", b"PX", b"10000")
    keys = [KEY, fence_key(KEY), TURNS[0]]
    return node.run(PASS_ON_SCRIPT, keys, [b"new", b"10000", b"60000", b"7", b"old", b"0", member])


@pytest.mark.parametrize(
    ("line", "others"),
    [((b"A",), 0), ((), 0), ((b"A", b"B"), 1), ((b"B",), 1), ((b"B", b"A"), 1)],
    ids=["only-us", "nobody", "us-and-another", "another-only", "another-first"],
)
def test_a_handoff_tells_whether_another_process_is_in_line(
    line: tuple[bytes, ...], others: int
) -> None:
    node = Node()
    node.line(*line)
    reply = _pass_on(node, b"A")
    assert reply[0] == 1
    assert reply[2] == others
    assert node.call(b"GET", KEY) == b"new"


async def test_a_release_sends_its_process_place_in_line_and_member() -> None:
    # Without them the script names the first in line (the test above), not the next
    # after this process: the same process would be named again and again.
    locks = aiolock.LockManager(["redis://127.0.0.1:1"], restart_grace=0)
    engine = seam.engine(locks)
    sent: dict[str, Any] = {}

    async def release(key: bytes, token: bytes, **kwargs: Any) -> Any:
        sent.update(kwargs, key=key, token=token)
        return None

    engine.quorum.release = release  # type: ignore[method-assign]
    engine.waiting.release_args = lambda key: (LIFE, b"2", b"B")  # type: ignore[method-assign]
    await engine.release(KEY, b"tok")
    assert sent["script"] is RELEASE_TURN_SCRIPT
    assert sent["more_keys"] == (fence_key(KEY), *TURNS)
    assert sent["more_args"][1:] == (LIFE, b"2", b"B")
    await locks.aclose()
