"""A fairness rule of the turns, read on the library's release decisions: a release that
only wakes its own waiter reads no line.

* **a wake-up reads no line** (docs/explanation/waiting.md: "Every handoff reads the line
  again, so a process that joins it cuts the streak back to 4; a release that only
  wakes its own waiter (busy with an attempt of its own) reads nothing, and counts as
  'someone may be in line'"): a process's streak of local turns of a name runs past 4
  (``LOCAL_STREAK``, to 32) only while its last look at the line found nobody else in
  it. So once a release that only woke the process's head (``Waiting.released`` said
  local, no taker to pass the lock to: the head was busy with an attempt of its own)
  came with the streak at 4 or more, the process's next release of the name is not
  local again unless a handoff read the line in between (``Waiting.line_seen``: the
  handoff's replies, which may be read after such a wake-up, when its taker released
  at once).

Read on the calls the library's releases make to its waiting (run.run wraps
``Waiting.released`` and ``Waiting.line_seen``), whatever the faults: the order of these
decisions is the library's own. The streak is counted here as the library counts it,
from the local releases, and begun anew at every release that is not local (the
library goes on counting after the late release of an expired hold, so this count is
never above its own). A violation goes to ``World.promises``. It reads, never touches,
the library's state and the random streams: a run's schedule is the same with it or
without.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .promised import LOCAL_STREAK

if TYPE_CHECKING:
    from .world import World


class WakeUps:
    """The rule above, for one run: each manager's local streaks by name."""

    def __init__(self, world: World) -> None:
        self.world = world
        #: (the manager's Waiting, key) -> (local releases in a row, what came last:
        #: "wake" a release that only woke the head, "pass" a handoff or a lease,
        #: "read" a handoff's view of the line).
        self.streaks: dict[tuple[int, bytes], tuple[int, str]] = {}

    def released(self, waiting: Any, key: bytes, local: object, process: int) -> None:
        """``waiting.released(key)`` decided ``local`` (a taker, True or False)."""
        ident = (id(waiting), key)
        if local is False:
            self.streaks.pop(ident, None)
            return
        count, last = self.streaks.get(ident, (0, "read"))
        if last == "wake" and count >= LOCAL_STREAK:
            self.world.promises.append(
                f"a wake-up reads no line: p{process} kept {key.decode()} at "
                f"{self.world.now:.6f} (local turn {count + 1} in a row), its last release "
                "having only woken its head, and no handoff having read the line since"
            )
        self.streaks[ident] = (count + 1, "wake" if local is True else "pass")

    def line_seen(self, waiting: Any, key: bytes) -> None:
        """A handoff's replies said whether others are in ``key``'s line."""
        ident = (id(waiting), key)
        count, _ = self.streaks.get(ident, (0, "read"))
        self.streaks[ident] = (count, "read")
