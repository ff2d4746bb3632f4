"""aiolock/_core/calls.py: Soon, the callbacks a manager runs once an iteration's
requests are written (its nodes' flushes, then its fan-outs' timers)."""

from __future__ import annotations

import asyncio

from aiolock._core.calls import Soon


async def test_soon_runs_its_callbacks_in_order_on_one_loop_handle() -> None:
    loop = asyncio.get_running_loop()
    soon = Soon()
    ran: list[object] = []
    handles = 0
    call_soon = loop.call_soon

    def counted(*args: object, **kwargs: object) -> asyncio.Handle:
        nonlocal handles
        handles += 1
        return call_soon(*args, **kwargs)  # type: ignore[arg-type]

    loop.call_soon = counted  # type: ignore[method-assign]
    try:
        soon(ran.append, "flush a")
        loop.call_soon(ran.append, "another task's step")  # (given before: runs before)
        soon(ran.append, "flush b")
        soon(ran.append, "timer")
        assert ran == []  # not before the iteration's end
        assert handles == 2  # one for Soon's three callbacks, one for the other
        await asyncio.sleep(0)
        assert ran == ["flush a", "flush b", "timer", "another task's step"]
        handles = 0
        soon(ran.append, "next iteration")  # given while none is due: a handle of its own
        assert handles == 1
        await asyncio.sleep(0)
        assert ran[-1] == "next iteration"
    finally:
        loop.call_soon = call_soon  # type: ignore[method-assign]


async def test_a_callback_that_raises_is_reported_and_the_others_still_run() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    soon = Soon()
    ran: list[str] = []

    def broken() -> None:
        raise RuntimeError("broken")

    try:
        soon(ran.append, "before")
        soon(broken)
        soon(ran.append, "after")
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert ran == ["before", "after"]
    assert [type(c["exception"]) for c in reported] == [RuntimeError]


def test_a_batch_left_on_a_loop_that_ended_does_not_hold_back_the_next_loop() -> None:
    soon = Soon()
    ran: list[str] = []

    async def leave_one() -> None:
        asyncio.get_running_loop().stop()  # the loop ends with this iteration,
        soon(ran.append, "never run")  # before the handle runs

    first = asyncio.new_event_loop()
    first.run_until_complete(leave_one())
    first.close()

    async def later() -> None:
        soon(ran.append, "on the new loop")
        await asyncio.sleep(0)

    asyncio.run(later())
    assert ran == ["on the new loop"]
