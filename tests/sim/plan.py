"""Which generator draws a schedule: a *plan* is a seed and the generator's version.

A schedule is named by its plan, written ``v5:SEED`` (or a bare ``SEED`` for version 1).
The version says how every draw is made, so a kept plan replays the same schedule
whatever later versions add:

* **Version 1** grew one behaviour at a time, each switched on from a seed of its own
  (:data:`V1_FROM`): a seed's size chose what its run could do. Every seed kept before
  version 2 is a version-1 plan, and replays as it did when it was found.
* **Version 2** has every behaviour on, and draws a *swarm* per run (Groce et al.,
  "Swarm testing", 2012; ``workload.make_config`` and ``run.swarm_faults``): which fault
  kinds, which features and which knobs the run uses, each within its documented bounds.
* **Version 3** is version 2 with one draw more: in half the runs the nodes say they
  are Valkey 9.1, whose ``SET`` takes ``IFEQ`` (one lock's renewal is then that
  command, not a script).
* **Version 4** is version 3 with fewer foci: only those a measurement keeps
  (``workload.FOCI_KEPT``), each in as many runs as before; the other runs are the
  swarm's.
* **Version 5** is version 4 with the ``grants`` focus back (``workload.FOCI_KEPT_5``).
  The search draws plans of the newest version from fresh random seeds.

A new generator is a new version: the draws of the versions before stay as they are,
so that their kept plans keep their meaning.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The newest version: what the search draws.
LATEST = 5

#: Version 1: the seed from which each behaviour is on (docs/project/testing.md,
#: "Version 1"). Version 2 has them all.
V1_FROM = {
    "swarm": 2**32,  # unfocused runs draw 1 to 3 fault kinds, not all of them
    "late": 2**33,  # "late" bursts; the library's bounded memories made small
    "leases": 2**34,  # one ttl per run, short bodies: leases are made
    "ordered": 2**35,  # timers released one at a time; "failover" faults
    "skew": 2**36,  # a wall clock per process, "jump" faults, restart_grace drawn
    "live": 2**37,  # more runs without faults, for the liveness rules
    "models": 2**38,  # pub/sub refused, one server given twice
    "focus": 2**39,  # half the runs focused on one part of the library
    "repair": 2**40,  # foci: repair (spaced restarts), stall
    "lag": 2**41,  # focus: lag (steady latency past node_timeout)
    "death": 2**42,  # focus: death (one process dies)
    "tight": 2**43,  # extend() deadlines shorter than a round trip
    "subscribe_late": 2**44,  # subscriptions held back, in runs without faults
    "chunks": 2**45,  # the renewal's batches in small chunks
    "cluster": 2**46,  # each node a Redis Cluster of one master
    "step_stall": 2**46,  # stalls within a step; the nodes go on during a stall
    "sockets": 2**47,  # a pollable socket per connection; "silent" faults; long blocks
    "drop": 2**48,  # pub/sub connections dropped, in runs without faults
    "attach": 2**49,  # handovers that extend longer before they detach
    "handover": 2**50,  # focus: handover
    "final": 2**51,  # bodies that end with an extend()
    "split": 2**52,  # focus: split releases
    "lone": 2**53,  # focus: lone streaks
    "grants": 2**54,  # focus: grants under rolling pauses
}


@dataclass(frozen=True)
class Plan:
    """A schedule's name: its ``seed`` and the ``version`` of the generator."""

    seed: int
    version: int = LATEST

    def has(self, behaviour: str) -> bool:
        """Whether runs of this plan have ``behaviour`` (a key of :data:`V1_FROM`)."""
        return self.version >= 2 or self.seed >= V1_FROM[behaviour]

    def __str__(self) -> str:
        return str(self.seed) if self.version == 1 else f"v{self.version}:{self.seed}"

    @classmethod
    def parse(cls, text: str) -> Plan:
        """``v5:123``, ``v2:123`` or ``123`` (version 1)."""
        if ":" not in text:
            return cls(int(text), 1)
        version, seed = text.split(":", 1)
        if not version.startswith("v") or not 1 <= int(version[1:]) <= LATEST:
            raise ValueError(f"{text!r}: not a plan (v1:SEED .. v{LATEST}:SEED, or SEED)")
        return cls(int(seed), int(version[1:]))
