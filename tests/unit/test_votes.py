"""aiolock/_core/votes.py: Votes, one fan-out's replies counted as they arrive."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from aiolock._core.votes import Votes, fence_of, is_one, is_taken, quorum_size

# Each reply a node can give a release: a yes, a "not yours", a failure.
REPLIES = (1, 0, TimeoutError("node: no reply"))


@pytest.mark.parametrize("early", [True, False])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
async def test_the_waiter_is_set_by_the_reply_that_decides_and_never_before(
    n: int, early: bool
) -> None:
    loop = asyncio.get_running_loop()
    for replies in itertools.product(REPLIES, repeat=n):
        for order in itertools.permutations(range(n)):
            votes = Votes(n, quorum_size(n), is_one, loop.create_future(), early=early)
            for i in order:
                before = votes.decided()
                votes.record(i, replies[i])
                # record() writes decided() out: the two must keep one meaning.
                assert votes.waiter.done() == votes.decided()
                if not before and votes.decided():
                    assert votes.waiter.done()
            assert votes.decided()
            if not early:
                assert votes.yes + votes.no + votes.failed == n


@pytest.mark.parametrize(
    ("reply", "taken", "fence"),
    [
        (1_764_000_000_000_000, True, 1_764_000_000_000_000),  # ACQUIRE and its kin: the token
        ([1, 42, 0], True, 42),  # PASS_ON: [1, fence, others]
        ([0, 5000, b"holder12"], False, None),  # held by someone else: [0, pttl, holder]
        ([0, -1], False, None),  # the read-write lock's: [0, pttl]
        (0, None, None),  # no script that takes a lock replies a bare 0: not understood
        (b"OK", None, None),
        (None, None, None),
        (TimeoutError("node: no reply"), None, None),
    ],
)
def test_a_reply_that_took_the_lock_is_its_fencing_token(
    reply: object, taken: bool | None, fence: int | None
) -> None:
    assert is_taken(reply) is taken
    if taken:
        assert fence_of(reply) == fence
