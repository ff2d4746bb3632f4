"""The figures the rules hold the library to, each as its documentation states it.

A rule that imported the library's own constants would move with the code: a changed
constant would change the rule with it, and a broken promise would pass. These are
written down here from the docs instead (docs/explanation/waiting.md, quoted); when a
figure changes, the docs change first, then this file.
"""

from __future__ import annotations

#: "A process told it is another's turn tries anyway after 0.5 s unless a later
#: release comes" (the turn queue's fallback).
FALLBACK = 0.5
#: "Entries expire unless refreshed (every 0.5 s, they live 1.5 s)" (the turn queue's).
ENTRY_LIFE = 1.5
#: The library's default ``drift_factor`` (API.md): a node's clock may run this much
#: fast or slow, and a ttl is counted that much longer or shorter.
DRIFT_FACTOR = 0.01
#: "where pub/sub is refused, a waiter polls every 0.1 s anyway".
POLL_INTERVAL = 0.1
#: "it lets one poll of the process named go by (0.16 s after its release)".
GAVE_WAY_POLL = 0.16
#: "A process hands the lock to its own waiters at most 4 times in a row".
LOCAL_STREAK = 4
#: "a waiter also wakes when the holder's key would expire on enough nodes for a
#: quorum (...), 2 ms after the PTTL it learnt, on its own clock".
EXPIRY_SLACK = 0.002
#: "(...) after 50 ms when no node that answered gave it a PTTL".
UNKNOWN_HOLDER_WAIT = 0.05
#: docs/explanation/safety.md: "the stall watchdog resets a connection silent for 1 s
#: or more only when nothing waits to be read from it".
WATCHDOG = 1.0
