"""A fenced resource: the storage a lock protects, which checks fencing tokens.

A body works in units: it reads ``remaining()`` (a step), works, and only then writes
the unit's result, with its lock's fencing token, over the network
(``Worker._body``). Between the check and the write a process may be paused ("freeze"
faults) past its validity while another process takes the lock and writes: Kleppmann's
scenario ("How to do distributed locking", 2016). The lock cannot prevent it; the
resource must refuse the stale write, as API.md's fencing tokens promise it can: it
refuses a token lower than one it has accepted.

Rules, over the resource's history:

* **fenced**: no two holdings' accepted writes interleave on one name (once a write
  of another holding is accepted, no later write of an earlier one is). Binding in
  every run, those that break the timing assumptions too.
* **refused while valid**: no write is refused that arrived while its holder's last
  step still called the lock valid (a later holder wrote while it held the lock),
  unless the tokens above it come only from holdings that the fencing rule's exception
  covers (check.py: the counter that made them lost on a majority, the acquirers' wall
  clocks alone ordering the tokens). Advisory where the run breaks the timing
  assumptions (run.broken).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Write:
    """One write as it reached the resource."""

    at: float
    name: str
    token: int
    holding: Any  # workload.Holding
    valid_until: float  # its holder's last step: valid until then, it believed
    accepted: bool


@dataclass
class Resource:
    """Per name: the highest token accepted; every write, in arrival order."""

    now: Callable[[], float]
    trace: Callable[[str], None]
    highest: dict[str, int] = field(default_factory=dict)
    writes: list[Write] = field(default_factory=list)

    def arrive(self, name: str, token: int, holding: Any, valid_until: float) -> None:
        """The write of ``holding`` (token ``token``) arrives: accepted unless a higher
        token was accepted before."""
        accepted = token >= self.highest.get(name, token)
        if accepted:
            self.highest[name] = token
        self.writes.append(Write(self.now(), name, token, holding, valid_until, accepted))
        self.trace(f"resource {name!r} token {token}: {'accepted' if accepted else 'REFUSED'}")

    @property
    def refused(self) -> int:
        return sum(not w.accepted for w in self.writes)


def check_fenced(resource: Resource) -> list[str]:
    """The fenced rule: accepted writes of one name never go back to a holding that
    another holding's accepted write followed."""
    over: dict[str, set[int]] = {}  # name -> the holdings whose writes were followed
    last: dict[str, Write] = {}
    for w in (w for w in resource.writes if w.accepted):
        before, last[w.name] = last.get(w.name), w
        if before is None or before.holding is w.holding:
            continue
        followed = over.setdefault(w.name, set())
        if id(w.holding) in followed:
            return [
                f"fenced: {w.name!r}: a write of {w.holding.owner} (token {w.token}) was "
                f"accepted at {w.at:.6f} after {before.holding.owner} (token "
                f"{before.token}) had written: their writes interleave"
            ]
        followed.add(id(before.holding))
    return []


def check_refused(
    resource: Resource, lost: Callable[[Any, Any], bool] = lambda _a, _b: False
) -> list[str]:
    """The refused-while-valid rule.

    ``lost(a, b)``: the fencing rule's one exception (check.counters_lost), where
    holding ``b``'s token may be below the earlier ``a``'s: a write refused for a token
    that only such holdings' accepted writes exceed is what the fencing rule allows.
    """
    problems = []
    for w in resource.writes:
        if w.accepted or w.at >= w.valid_until:
            continue
        above = {
            id(a.holding): a.holding
            for a in resource.writes
            if a.accepted and a.name == w.name and a.token > w.token and a.at <= w.at
        }
        if above and all(lost(a, w.holding) for a in above.values()):
            continue
        problems.append(
            f"refused while valid: {w.name!r}: the write of {w.holding.owner} (token "
            f"{w.token}) was refused at {w.at:.6f}, its lock valid until {w.valid_until:.6f}"
        )
    return problems[:1]
