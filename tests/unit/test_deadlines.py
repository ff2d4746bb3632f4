"""aiolock/_quorum/renewal.py: Deadlines, the renewals' deadlines on one loop timer.

Each deadline is what tells a holder that its lock is lost in time ("told a guard
before its validity ends"): it must fire at its time whatever else is armed, moved or
stopped, and never for an entry that was moved or stopped.
"""

from __future__ import annotations

import asyncio

from aiolock._quorum.renewal import Deadlines


class Armed:
    """What Deadlines needs of a renewal: its latest entry, and what to call."""

    def __init__(self, fired: list[tuple[str, float]], name: str, clock: asyncio.AbstractEventLoop):
        self.armed = 0
        self.name = name
        self._fired = fired
        self._loop = clock

    def deadline_passed(self) -> None:
        self._fired.append((self.name, self._loop.time()))


async def test_each_deadline_fires_at_its_time_and_a_moved_or_stopped_one_never() -> None:
    loop = asyncio.get_running_loop()
    fired: list[tuple[str, float]] = []
    deadlines = Deadlines(loop.time)
    start = loop.time()
    a, b, c, d, e = (Armed(fired, name, loop) for name in "abcde")
    deadlines.arm(a, start + 0.20)
    deadlines.arm(b, start + 0.05)
    deadlines.arm(c, start + 0.10)
    deadlines.arm(d, start + 0.02)
    deadlines.arm(e, start + 0.15)
    deadlines.arm(c, start + 0.30)  # moved later: only the new one counts
    deadlines.disarm(d)  # stopped: never
    deadlines.arm(b, start + 0.01)  # moved sooner: the timer follows
    deadlines.disarm(e)  # stopped, and under the top: never either
    await asyncio.sleep(0.4)
    assert [name for name, _ in fired] == ["b", "a", "c"]
    for (_, at), due in zip(fired, (0.01, 0.20, 0.30), strict=True):
        assert start + due <= at < start + due + 0.05
    assert deadlines.pending() == 0


async def test_stopped_entries_are_dropped_before_they_pile_up() -> None:
    loop = asyncio.get_running_loop()
    fired: list[tuple[str, float]] = []
    deadlines = Deadlines(loop.time)
    keep = Armed(fired, "kept", loop)
    deadlines.arm(keep, loop.time() + 0.05)
    for i in range(10_000):  # lock cycles: each armed, then stopped at its release
        cycle = Armed(fired, f"cycle {i}", loop)
        deadlines.arm(cycle, loop.time() + 30)
        deadlines.disarm(cycle)
    assert deadlines.pending() < 200
    await asyncio.sleep(0.1)
    assert [name for name, _ in fired] == ["kept"]


async def test_a_deadline_armed_again_as_it_fires_fires_again() -> None:
    """A renewal whose deadline fires a hair early (the loop's clock and ours) arms it
    again for the rest, from inside the callback."""
    loop = asyncio.get_running_loop()
    fired: list[tuple[str, float]] = []
    deadlines = Deadlines(loop.time)

    class Again(Armed):
        def deadline_passed(self) -> None:
            super().deadline_passed()
            if len(fired) == 1:
                deadlines.arm(self, loop.time() + 0.02)

    deadlines.arm(Again(fired, "again", loop), loop.time() + 0.01)
    await asyncio.sleep(0.1)
    assert [name for name, _ in fired] == ["again", "again"]


def test_a_timer_left_on_a_loop_that_ended_does_not_hold_back_the_next_loop() -> None:
    fired: list[tuple[str, float]] = []
    deadlines: Deadlines | None = None

    async def arm(name: str, after: float, wait: float) -> None:
        nonlocal deadlines
        loop = asyncio.get_running_loop()
        if deadlines is None:
            deadlines = Deadlines(loop.time)
        deadlines.arm(Armed(fired, name, loop), loop.time() + after)
        await asyncio.sleep(wait)

    asyncio.run(arm("first", 0.05, 0.0))  # its loop ends before the deadline
    asyncio.run(arm("second", 0.5, 0.6))  # later than the first's: still fires
    # (The first, past due, fires on the next loop that arms a deadline.)
    assert [name for name, _ in fired] == ["first", "second"]


async def test_stopped_entries_at_the_top_leave_at_the_next_arm() -> None:
    """Locks released in the order they were taken: each one's entry, stopped, leaves
    the heap when the next lock is armed (kept, it would keep its renewal and hold
    alive past the young garbage collections)."""
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop.time)
    for i in range(50):
        cycle = Armed([], f"cycle {i}", loop)
        deadlines.arm(cycle, loop.time() + 30)
        deadlines.disarm(cycle)
    assert deadlines.pending() == 1
