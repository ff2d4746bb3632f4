"""aiolock/_core/cancel.py: scopes, and waiting on work the caller must not cancel."""

from __future__ import annotations

import asyncio

import anyio

from aiolock._core.cancel import done_within, move_on_after, shielded


async def test_done_within_returns_when_the_future_is_done() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    loop.call_soon(future.set_result, 1)
    await asyncio.wait_for(done_within(future, 60.0), 10.0)
    assert future.result() == 1


async def test_done_within_returns_after_its_time_leaving_the_future_pending() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    await asyncio.wait_for(done_within(future, 0.01), 10.0)
    assert not future.done()
    future.set_result(1)  # (its callback was taken off: nothing runs on a waiter gone)
    await asyncio.sleep(0)


async def test_cancelling_a_caller_of_done_within_leaves_the_future_alone() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(done_within(future, None))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert waiting.cancelled()
    assert not future.cancelled()
    future.set_result(1)
    await asyncio.sleep(0)


async def test_scopes_are_anyios_and_keep_its_meaning() -> None:
    with move_on_after(0.01) as scope:
        await asyncio.sleep(10)
    assert isinstance(scope, anyio.CancelScope)
    assert scope.cancelled_caught
    with shielded() as outer:
        outer.cancel()
        await asyncio.sleep(0)  # (a shielded scope's own cancel still ends it)
    assert outer.cancelled_caught
    with anyio.CancelScope() as outer:
        with shielded():
            outer.cancel()
            await asyncio.sleep(0)  # not cancelled here: shielded
            reached = True
    assert reached
    assert shielded(shield=False).shield is False
