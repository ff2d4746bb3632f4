"""aiolock/_core/votes.py: Votes, one fan-out's replies counted as they arrive."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from aiolock._core.votes import Votes, is_one, quorum_size

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
