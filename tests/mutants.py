"""Named mutants of the safety rules: each must make its tests fail.

    python tests/mutants.py [NAME ...]

mutmut (``nox -s mutants``) mutates Python functions at random; it cannot reach the Lua
scripts (module constants) and spends most of its time on mutants no rule depends on.
This list is the other half: one deliberate break per safety rule, with the tests that
must catch it. Each is applied to the working tree, the tests run, and the file is
restored. Exit status 1 if any mutant survives. Not collected by pytest (no ``test_``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


class Mutant(NamedTuple):
    """One break: ``old`` written as ``new`` in the package's file ``path``.

    ``path`` is a file name (``votes.py``, ``acquire.lua``), found under ``aiolock/``
    wherever the file lives (a move between folders keeps the mutant); where two files
    share the name, the one holding ``old``.
    """

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    # The loss of a held lock, told in time.
    Mutant(
        "lock_many body not cancelled on loss",
        "many.py",
        "            renewals.extend(one)\n        return renewals",
        "            renewals.extend(one)\n        return []",
        ("tests/test_primitives.py",),
    ),
    Mutant(
        "semaphore body not cancelled on loss",
        "semaphore.py",
        "return self._held._renewals() if self._held is not None else None",
        "return [] if self._held is not None else None",
        ("tests/test_primitives.py",),
    ),
    Mutant(
        "semaphore slot taken without NX",
        "sem_acquire.lua",
        "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then\n    redis.call('zadd'",
        "if redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) then\n    redis.call('zadd'",
        ("tests/test_primitives.py",),
    ),
    Mutant(
        "semaphore release deletes another holder's slot",
        "sem_release.lua",
        "if holder == ARGV[1] then",
        "if true then",
        ("tests/test_primitives.py",),
    ),
    # Handoff within a process (one script per node).
    Mutant(
        "handoff without comparing the old token",
        "pass_on.lua",
        "if holder == ARGV[5] then",
        "if true then",
        ("tests/test_waiting.py",),
    ),
    Mutant(
        "a failed handoff's clean-up keeps the waiter's token",
        "release_either.lua",
        "if holder == ARGV[1] or holder == ARGV[2] then",
        "if holder == ARGV[2] then",
        ("tests/test_waiting.py",),
    ),
    Mutant(
        "a lock passed to a waiter that left stays held",
        "handoff.py",
        "if not taker.deliver(attempt) and attempt.acquired:",
        "if not taker.deliver(attempt) and False:",
        ("tests/test_waiting.py",),
    ),
    Mutant(
        "a lock passed to a waiter cancelled before it woke stays held",
        "taker.py",
        "            self.on_dropped()  # passed",
        "            pass  # passed",
        ("tests/test_waiting.py",),
    ),
    Mutant(
        "a release cancelled during its handoff cancels the handoff",
        "handoff.py",
        "    return await outlast(handoff)",
        "    return await handoff",
        ("tests/test_waiting.py",),
    ),
    Mutant(
        "the head attempts while a handoff to it is in flight",
        "head.py",
        "    if offer is not None and offer.claimed:\n        return Act.TAKE, 0.0\n",
        "    if False:\n        return Act.TAKE, 0.0\n",
        ("tests/test_waiting.py",),
    ),
    Mutant(
        "validity after a renewal without drift",
        "renewal.py",
        "expires_at = quorum.expiry(start, hold.ttl)",
        "expires_at = start + hold.ttl",
        ("tests/test_renewal.py",),
    ),
    Mutant(
        "validity after extend() without drift",
        "lock.py",
        "expires_at = quorum.expiry(start, new_ttl)",
        "expires_at = start + new_ttl",
        ("tests/test_lock.py",),
    ),
    Mutant(
        "extend() not shielded from the caller's cancellation",
        "quorum.py",
        "votes = await self._run(script, args, is_one, shielded=True, then=then)",
        "votes = await self._run(script, args, is_one, shielded=False, then=then)",
        ("tests/test_lock.py",),
    ),
    Mutant(
        "a won attempt's agreed fence leaves a node that said held behind",
        "quorum.py",
        '    if False in verdicts:  # (a node said "held": its counter may lag)',
        "    if False:",
        ("tests/unit/test_quorum.py",),
    ),
    Mutant(
        "acquire script ignores the stored fencing counter",
        "_fence.lua",
        "if last and last >= fence then",
        "if false then",
        ("tests/test_fencing.py",),
    ),
    # The loss deadline and the extension bookkeeping.
    Mutant(
        "the renewer with no lock held sleeps until a due that has passed (it spins)",
        "renewal.py",
        "idle = self._last_due if self._last_due > clock() else math.inf",
        "idle = self._last_due",
        ("tests/test_renewal.py::test_locks_taken_one_at_a_time_do_not_wake_the_renewer_each",),
    ),
    Mutant(
        "a lock due before the renewer's sleep ends does not wake it",
        "renewal.py",
        "        if renewal.due < self._sleep_until:",
        "        if False:",
        (
            "tests/test_renewal.py::"
            "test_locks_taken_while_the_renewer_sleeps_with_none_held_are_renewed_in_time",
        ),
    ),
    Mutant(
        "loss deadline checked only between renewal batches (no timer)",
        "renewal.py",
        "self._renewer.deadlines.arm(self, min(self.give_up_at, self.hold_until))",
        "min(self.give_up_at, self.hold_until)",
        ("tests/test_renewal.py::test_every_holder_is_told_a_guard_before_its_validity_ends",),
    ),
    Mutant(
        "a deadline sooner than the one the timer waits for waits with it",
        "renewal.py",
        "if at < self._timer_at or loop is not self._loop:",
        "if loop is not self._loop:",
        (
            "tests/unit/test_deadlines.py::"
            "test_each_deadline_fires_at_its_time_and_a_moved_or_stopped_one_never",
        ),
    ),
    Mutant(
        "a deadline timer left on a loop that ended holds back the next loop's",
        "renewal.py",
        "if at < self._timer_at or loop is not self._loop:",
        "if at < self._timer_at:",
        (
            "tests/unit/test_deadlines.py::"
            "test_a_timer_left_on_a_loop_that_ended_does_not_hold_back_the_next_loop",
        ),
    ),
    Mutant(
        "a stopped renewal's deadline still fires",
        "renewal.py",
        "            if armed.armed != number:  # moved or stopped since\n",
        "            if armed.armed != number and armed.armed:  # moved or stopped since\n",
        (
            "tests/unit/test_deadlines.py::"
            "test_each_deadline_fires_at_its_time_and_a_moved_or_stopped_one_never",
        ),
    ),
    Mutant(
        "extensions in flight together: the later reply wins",
        "hold.py",
        "if (not won or extension.overlapped) and",
        "if (not won) and",
        ("tests/test_lock.py",),
    ),
    Mutant(
        "extend() to a shorter ttl leaves the renewal schedule",
        "hold.py",
        "        if renewal is not None and renewal.active:\n"
        "            renewal.validity_changed(ttl)",
        "        if renewal is not None and renewal.active:\n            pass",
        ("tests/test_lock.py",),
    ),
    Mutant(
        "one server's databases are several nodes",
        "specs.py",
        'return ("tcp", host, int(kwargs.get("port", 6379)))',
        'return ("tcp", host, int(kwargs.get("port", 6379)), kwargs.get("db", 0))',
        ("tests/test_validation.py",),
    ),
    Mutant(
        "same run_id behind two addresses not refused",
        "_engine.py",
        "and other.run_id == node.run_id:",
        "and False:",
        ("tests/test_failures.py",),
    ),
    # Found by mutmut: a renewal path that raises is retried by the renewer's tick
    # handler, so only the suite-wide check in conftest.py catches it.
    Mutant(
        "a renewal retry path that raises",
        "renewal.py",
        "return max(ttl / 10, 2 * self._quorum.node_timeout)",
        "return max(None, 2 * self._quorum.node_timeout)",
        ("tests/test_renewal.py",),
    ),
    # Restart quarantine.
    Mutant(
        "restart quarantine never applied",
        "_engine.py",
        "            self.quorum.veto = self._quarantined\n",
        "            pass\n",
        (
            "tests/test_failures.py::test_a_majority_restarted_empty_is_quarantined_until_the_holder_is_gone",
        ),
    ),
    Mutant(
        "a changed run_id is not a restart",
        "node.py",
        "if self._last_run_id is not None and self.run_id != self._last_run_id:",
        "if False:",
        (
            "tests/test_failures.py::test_a_node_whose_run_id_changed_is_quarantined_whatever_its_uptime",
        ),
    ),
    Mutant(
        "a young server (uptime) is not a restart",
        "node.py",
        "restarted_at = now - int(uptime) if uptime.isdigit() else None",
        "restarted_at = None",
        (
            "tests/test_failures.py::test_a_majority_restarted_empty_is_quarantined_until_the_holder_is_gone",
        ),
    ),
    # Repair after restarts.
    Mutant(
        "no repair of nodes that lost a held lock",
        "renewal.py",
        "                    self._repair(renewal, missing)\n",
        "                    pass\n",
        ("tests/test_failures.py",),
    ),
    Mutant(
        "repair after a renewal that did not win a quorum",
        "renewal.py",
        "            if won and hold.remaining(now) > 0.0:\n",
        "            if batch.missing.get(j):\n"
        "                self._repair(renewal, batch.missing[j])\n"
        "            if won and hold.remaining(now) > 0.0:\n",
        ("tests/test_failures.py",),
    ),
    Mutant(
        "repair overwrites another holder's key",
        "repair.lua",
        "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then\n    local last",
        "if redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) then\n    local last",
        ("tests/test_failures.py",),
    ),
    # Rules of 0.1, in the scripts (out of mutmut's reach).
    Mutant(
        "acquire without NX",
        "acquire.lua",
        "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then",
        "if redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) then",
        ("tests/test_lock.py",),
    ),
    Mutant(
        "release deletes without comparing the token",
        "release.lua",
        "if redis.call('get', KEYS[1]) == ARGV[1] then\n    redis.call('del', KEYS[1])\n"
        "    redis.call('publish', KEYS[1] .. ':released', ARGV[2] or '')",
        "if true then\n    redis.call('del', KEYS[1])\n"
        "    redis.call('publish', KEYS[1] .. ':released', ARGV[2] or '')",
        ("tests/test_lock.py",),
    ),
    Mutant(
        "extend re-creates an expired key",
        "extend.lua",
        "if redis.call('get', KEYS[1]) == ARGV[1] then\n    if redis.call('pttl', KEYS[1]) > "
        "tonumber(ARGV[2]) then\n        redis.call('publish', KEYS[1] .. ':released', 's')\n"
        "    end\n    return redis.call('pexpire', KEYS[1], ARGV[2])\nend\nreturn 0",
        "redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])\nreturn 1",
        ("tests/test_lock.py",),
    ),
    Mutant(
        "renewal batch extends keys of other tokens",
        "extend_many.lua",
        "if redis.pcall('get', KEYS[i]) == ARGV[2 * i - 1] then",
        "if true then",
        ("tests/test_renewal.py",),
    ),
    Mutant(
        "quorum of half the nodes",
        "votes.py",
        "    return n // 2 + 1",
        "    return n // 2",
        ("tests/unit/test_quorum.py",),
    ),
    Mutant(
        "validity without the time the attempt took",
        "quorum.py",
        "            expires_at = self.expiry(start, ttl)\n"
        "            if expires_at > self.clock():\n"
        "                return Attempt(",
        "            expires_at = self.expiry(self.clock(), ttl)\n"
        "            if expires_at > self.clock():\n"
        "                return Attempt(",
        ("tests/unit/test_quorum.py",),
    ),
    # Declared keys, and waiters that cannot hear a release.
    Mutant(
        "the writer's script is not given the readers' keys it asked for",
        "keys_asked.py",
        "        elif rounds >= MAX_KEY_ROUNDS:",
        "        elif rounds >= 0:",
        ("tests/test_primitives.py",),
    ),
    Mutant(
        "a subscription confirmed late does not wake the waiter",
        "queue.py",
        "        self.unconfirmed -= 1\n        self.missed_release()\n",
        "        self.unconfirmed -= 1\n",
        (
            "tests/unit/test_queue.py::"
            "test_a_head_is_deaf_until_every_late_confirmation_came_and_each_wakes_it",
        ),
    ),
    Mutant(
        "a head that cannot hear a release yet sleeps toward the holder's expiry",
        "waiting.py",
        "with move_on_after(min(sleep, FALLBACK) if deaf else sleep):",
        "with move_on_after(sleep):",
        (
            "tests/test_waiting.py::"
            "test_a_waiter_whose_subscriptions_are_not_confirmed_tries_at_the_fallback",
        ),
    ),
    Mutant(
        "a head that cannot hear a release yet polls at once after its process gave way",
        "queue.py",
        "        if self.unconfirmed:\n"
        "            return self.gave_way + _turns.FALLBACK - clock()\n",
        "",
        (
            "tests/unit/test_queue.py::"
            "test_a_deaf_head_whose_process_gave_way_holds_back_until_the_fallback",
        ),
    ),
    Mutant(
        "waiters do not poll where pub/sub is refused",
        "head.py",
        "sleep = min(sleep, POLL_INTERVAL)",
        "sleep = sleep",
        (
            "tests/test_failures.py::"
            "test_pubsub_refused_by_acl_waiters_poll_and_it_is_logged_once_per_node",
        ),
    ),
    Mutant(
        "releases on a sharded cluster announced with a plain PUBLISH",
        "cluster.py",
        "            if self.sharded_pubsub:\n                script = self._as_sharded(script)\n",
        "",
        ("tests/test_cluster.py::test_waiters_use_sharded_pubsub_where_the_cluster_has_it",),
    ),
    # Turns across processes (advice, not safety: liveness and cost).
    Mutant(
        "a process taken out of line joins again only at its next refresh",
        "waiting.py",
        "                queue.entry.taken_out()\n            return\n",
        "                pass\n            return\n",
        (
            "tests/turns/test_heads.py::"
            "test_a_named_process_taken_out_of_line_as_its_lock_expired_joins_again_at_once",
        ),
    ),
    Mutant(
        "turn release deletes without comparing the token",
        "release_turn.lua",
        "if holder and holder ~= ARGV[1] then\n    return 0\nend",
        "if false then\n    return 0\nend",
        ("tests/test_lock.py",),
    ),
    Mutant(
        "every waiting process tries on every release (turns ignored)",
        "queue.py",
        "elif self.entry is None or self.entry.heard(message):",
        "elif self.entry is None or self.entry.heard(message) or True:",
        ("tests/turns/",),
    ),
    Mutant(
        "a turn passed over is never taken (no fallback)",
        "turns.py",
        "self._key, member))\n        self._wake()",
        "self._key, member))",
        ("tests/turns/",),
    ),
    Mutant(
        "a lease ignores the longer ttl of a command its holder sent",
        "hold.py",
        "        self.longest = max(self.longest, ttl)\n",
        "",
        ("tests/test_late.py::test_a_lease_never_leaves_the_key_longer_than_its_takers_ttl",),
    ),
    Mutant(
        "a head that takes over as its process gives way tries at once",
        "waiting.py",
        "wait.tried = wait.hint is not None or wait.queue.gave_way is not None",
        "wait.tried = wait.hint is not None",
        (
            "tests/turns/test_heads.py::"
            "test_a_head_that_leaves_as_its_process_gives_way_does_not_beat_the_process_named",
            "tests/turns/test_heads.py::"
            "test_a_head_still_subscribing_as_its_process_gives_way_does_not_beat_the_process_named",
        ),
    ),
    Mutant(
        "a renewal by SET without IFEQ re-creates a lock taken over",
        "batch.py",
        'return (b"SET", key, token, b"IFEQ", token, b"PX", b"%d" % milliseconds(ttl))',
        'return (b"SET", key, token, b"PX", b"%d" % milliseconds(ttl))',
        (
            "tests/test_renewal.py::test_one_lock_is_renewed_by_set_ifeq_where_the_server_has_it"
            "_else_by_the_script",
        ),
    ),
    Mutant(
        "a renewal by SET IFEQ answered nil counts as a node failed, not as a no",
        "batch.py",
        "    if reply is None or (isinstance(reply, Exception)",
        "    if (isinstance(reply, Exception)",
        (
            "tests/unit/test_set_ifeq.py::test_set_ifeq_s_reply_reads_as_the_script_s",
            "tests/test_renewal.py::test_one_lock_is_renewed_by_set_ifeq_where_the_server_has_it"
            "_else_by_the_script",
        ),
    ),
    Mutant(
        "a release heard before the head is in line wakes it though its process gave way",
        "queue.py",
        "ours = bool(message) and self.entry is None and self.gave_way is not None",
        "ours = False",
        (
            "tests/turns/test_heads.py::"
            "test_a_head_still_subscribing_as_its_process_gives_way_does_not_beat_the_process_named",
        ),
    ),
    Mutant(
        "a polling head tries at its poll just after its process gave way",
        "head.py",
        "back = queue.holding_back(clock)",
        "back = 0.0",
        (
            "tests/turns/test_pubsub.py::"
            "test_where_pubsub_is_refused_a_process_that_gave_way_lets_the_one_named_try_first",
        ),
    ),
    Mutant(
        "a process named is passed over while the lock is held (it took it)",
        "turn_leave.lua",
        "if KEYS[4] and redis.call('exists', KEYS[4]) == 1 then",
        "if false then",
        (
            "tests/turns/test_heads.py::test_a_named_process_that_holds_past_the_fallback_stays_in_line",
        ),
    ),
    Mutant(
        "a process leaving in its turn does not announce the lock free",
        "turns.py",
        "        self._turns.broadcast(TURN_LEAVE_SCRIPT, (*self._keys, self._turns.member))\n"
        "        return self.named",
        "        self._turns.broadcast(TURN_LEAVE_SCRIPT, (*self._keys, self._turns.member))\n"
        "        return False",
        ("tests/turns/",),
    ),
    Mutant(
        "a release names the first in line, not the next after the releasing process",
        "_engine.py",
        "            more_args=(floor, *self.waiting.release_args(key)),",
        "            more_args=(floor,),",
        ("tests/unit/test_turn_decisions.py", "tests/turns/"),
    ),
    Mutant(
        "a handoff never sees another process in line (streaks of LONE_STREAK for all)",
        "pass_on.lua",
        "        others = 1\n",
        "        others = 0\n",
        ("tests/unit/test_turn_decisions.py", "tests/turns/"),
    ),
    Mutant(
        "a process alone in line passes the lock on for ever",
        "waiting.py",
        "LONE_STREAK: Final = 32",
        "LONE_STREAK: Final = 10**9",
        ("tests/test_waiting.py",),
    ),
    # mutmut's survivors in _quorum/renewal.py, pinned by a test outside its selection.
    Mutant(
        "renewal batch waits only node_timeout (latency-bound renewal)",
        "renewal.py",
        "budget = max(quorum.node_timeout, min(min(r.hold.ttl for r in due) / 6, first_deadline))",
        "budget = quorum.node_timeout",
        (
            "tests/test_failures.py::"
            "test_a_majority_slower_than_node_timeout_but_within_the_budget_keeps_the_lock",
        ),
    ),
    # Node I/O (coalesced writes): the order a node runs requests in, and their time.
    Mutant(
        "a script first used on a connection is not loaded before it",
        "node.py",
        "        if script.sha not in self._loaded:",
        "        if False:",
        (
            "tests/test_node_io.py",
            "tests/test_primitives.py::test_semaphore_waiter_is_woken_by_a_release",
        ),
    ),
    Mutant(
        "a fan-out's node_timeout counted from before its requests are written",
        "quorum.py",
        "self._soon(self._stamp, fresh, loop)",
        "self._stamp(fresh, loop)",
        ("tests/test_node_io.py",),
    ),
    # Grants between processes (aiolock/_waiting/grants.py and RELEASE_TURN).
    Mutant(
        "a grant taken without a quorum of nodes",
        "grants.py",
        "        if len(counted) < quorum.quorum:",
        "        if len(counted) < 1:",
        ("tests/test_grants.py",),
    ),
    Mutant(
        "a grant's validity counted from when it was heard, not from the offer",
        "grants.py",
        "        start = min(heard.nodes[i][1] for i in counted)",
        "        start = quorum.clock()",
        ("tests/test_grants.py",),
    ),
    Mutant(
        "a late grant of a held token given back",
        "grants.py",
        "        if token in self._held:\n",
        "        if False:\n",
        (
            "tests/test_grants.py",
            "tests/test_late.py::test_a_late_grant_of_a_token_still_held_and_forgotten_is_left_alone",
        ),
    ),
    Mutant(
        "a grant for a waiter that left kept",
        "grants.py",
        "            self._forget(token)\n            give_back(self._quorum, key, token)\n",
        "            self._forget(token)\n",
        ("tests/test_grants.py",),
    ),
    Mutant(
        "a stale offer granted",
        "release_turn.lua",
        "                if left * 2 >= tonumber(ttl) then",
        "                if true then",
        ("tests/test_grants.py",),
    ),
    Mutant(
        "a grant nobody hears kept",
        "release_turn.lua",
        "'publish', KEYS[1] .. ':turn:' .. turn, message) > 0 then",
        "'publish', KEYS[1] .. ':turn:' .. turn, message) >= 0 then",
        ("tests/test_grants.py",),
    ),
    Mutant(
        "a grant nobody hears kept where the released key had expired",
        "release_turn.lua",
        "                    delete = true\n",
        "",
        ("tests/test_grants.py",),
    ),
    Mutant(
        "the releasing process granted its own offer",
        "release_turn.lua",
        "            if member == turn and turn ~= ARGV[5] then",
        "            if member == turn then",
        ("tests/test_grants.py", "tests/test_waiting.py"),
    ),
    Mutant(
        "an attempt with the token granted to it loses",
        "acquire.lua",
        "if holder == ARGV[1] then\n    redis.call('pexpire', KEYS[1], ARGV[2])",
        "if false then\n    redis.call('pexpire', KEYS[1], ARGV[2])",
        ("tests/test_grants.py",),
    ),
    # Leases: handoffs within a process that send nothing (aiolock/_waiting/lease.py).
    Mutant(
        "a PASS_ON reserves no tokens for the leases after it",
        "pass_on.lua",
        "if ARGV[6] ~= '0' then",
        "if false then",
        ("tests/test_lease.py",),
    ),
    Mutant(
        "a reserve made on fewer than a quorum is used",
        "handoff.py",
        "return fence + reserve if at_fence >= quorum.quorum else None",
        "return fence + reserve",
        ("tests/test_lease.py",),
    ),
    Mutant(
        "a lease hands out the holder's own fencing token",
        "lease.py",
        "        fence + 1,\n",
        "        fence,\n",
        ("tests/test_lease.py",),
    ),
    Mutant(
        "a lock held too long is leased",
        "lease.py",
        "or hold.expires_at < fresh - lease_slack(taker.ttl)\n",
        "or False\n",
        ("tests/test_lease.py",),
    ),
    Mutant(
        "a lock is leased to a waiter with a shorter ttl",
        "lease.py",
        "        or hold.longest > taker.ttl\n",
        "        or False\n",
        (
            "tests/test_lease.py",
            "tests/test_late.py::test_a_lease_never_leaves_the_key_longer_than_its_takers_ttl",
        ),
    ),
    Mutant(
        "a shorter extension in flight does not lower the validity when sent",
        "hold.py",
        "        if expires_at < self.expires_at and not self.ended:\n",
        "        if False:\n",
        ("tests/test_lease.py",),
    ),
    Mutant(
        "a repair raises the counter to the holder's own token only",
        "renewal.py",
        "        fence = hold.reserve\n",
        "        fence = hold.fence\n",
        ("tests/test_failures.py",),
    ),
    Mutant(
        "a lease's taker cancelled before it woke keeps the lock",
        "lease.py",
        "    taker.on_dropped = functools.partial(_give_back_lease,",
        "    taker.on_dropped = None and functools.partial(_give_back_lease,",
        ("tests/test_lease.py",),
    ),
    # Messages that arrive late.
    Mutant(
        "the renewal on connections of its own (a late extend cuts a renewed key)",
        "_engine.py",
        "        self.renewal_nodes = self.nodes\n",
        "        self.renewal_nodes = tuple(\n"
        "            make_node(spec, node_timeout, RENEWAL_SCRIPTS) for spec in specs\n"
        "        )\n",
        (
            "tests/test_late.py::test_a_shorter_extend_given_up_and_landing_late_never_cuts_a_renewed_lock",
        ),
    ),
    Mutant(
        "a detached lock's token stays noted as held (Grants._held grows)",
        "lock.py",
        "        self._engine.forget(hold.token)  # held elsewhere from now on, if anywhere\n",
        "",
        ("tests/test_late.py::test_tokens_held_are_forgotten_when_detached_or_left_to_expire",),
    ),
    Mutant(
        "an expired lock's token stays noted as held when its handle acquires again",
        "lock.py",
        "            self._engine.forget(self._hold.token)\n",
        "",
        ("tests/test_late.py::test_tokens_held_are_forgotten_when_detached_or_left_to_expire",),
    ),
    Mutant(
        "a renewal batch writes every chunk at once on the shared connection",
        "quorum.py",
        "        for ni, node in enumerate(self.nodes):\n            send(ni, node, 0)\n",
        "        for ni, node in enumerate(self.nodes):\n"
        "            for k in range(len(chunks)):\n"
        "                send(ni, node, k)\n",
        (
            "tests/test_late.py::"
            "test_a_renewal_batch_sends_one_chunk_at_a_time_on_the_shared_connection",
        ),
    ),
    Mutant(
        "an inner reentrant level's release after expiry returns quietly",
        "lock.py",
        "            if expired:  # (as the outer level's release will say too)\n",
        "            if False:\n",
        ("tests/test_reentrancy.py",),
    ),
    Mutant(
        "a failed semaphore try writes the index without a ttl",
        "sem_acquire.lua",
        "-- (N may have been written anew above, once expired or lost: never without a ttl.)\n"
        "redis.call('pexpire', KEYS[3], ARGV[3])\n",
        "",
        (
            "tests/test_primitives.py::"
            "test_a_failed_semaphore_try_never_leaves_its_index_without_a_ttl",
        ),
    ),
    Mutant(
        "grants undone by the head's own failed attempt still count",
        "grants.py",
        "        if node in self._undone.get(token, ()):\n",
        "        if False:\n",
        (
            "tests/test_late.py::test_grants_undone_by_the_heads_own_failed_attempt_never_count",
            "tests/test_grants.py::test_grants_from_nodes_the_heads_own_clean_up_released_never_count",
        ),
    ),
    Mutant(
        "a failed attempt's cleaned nodes read from its votes after the decision",
        "grants.py",
        "            self.undone(token, list(outcome.cleaned))\n",
        "            verdicts = outcome.votes.verdicts\n"
        "            self.undone(token, [i for i, y in enumerate(verdicts) if y is not False])\n",
        (
            "tests/unit/test_quorum.py::"
            "test_a_node_the_clean_up_released_never_counts_for_a_grant_though_its_no_came_late",
        ),
    ),
    Mutant(
        "a failing renewal retries ever sooner as its deadline nears, at once past it",
        "renewal.py",
        "                max(quorum.node_timeout, (renewal.give_up_at - now) / 2),\n",
        "                max(0.0, (renewal.give_up_at - now) / 2),\n",
        (
            "tests/test_renewal.py::"
            "test_a_renewal_failing_at_once_past_its_deadline_is_given_up_not_retried",
        ),
    ),
    Mutant(
        "a reconnect ends a failover's quarantine",
        "node.py",
        "self.restarted_at = restarted_at if last is None else max(last, restarted_at)",
        "self.restarted_at = restarted_at",
        ("tests/test_failures.py::test_a_failed_over_nodes_quarantine_outlasts_a_reconnect",),
    ),
    Mutant(
        "a renewal confirmed past its deadline brings the lock back",
        "renewal.py",
        "        if self._renewer.clock() >= min(self.give_up_at, self.hold_until):\n",
        "        if False:\n",
        (
            "tests/test_renewal.py::"
            "test_a_renewal_confirmed_past_its_deadline_does_not_bring_the_lock_back",
        ),
    ),
    Mutant(
        "a lock_many release cancelled midway leaves the other names held",
        "many.py",
        "            except anyio.get_cancelled_exc_class() as exc:\n"
        "                cancelled = cancelled or exc\n",
        "",
        (
            "tests/test_primitives.py::"
            "test_lock_many_release_cancelled_midway_still_releases_every_name",
        ),
    ),
    # Found by the simulation's liveness rules (tests/sim/live.py).
    Mutant(
        "a streak of handoffs starts again whenever the local queue empties",
        "waiting.py",
        "        self._streaks.keep(key, queue)  # the lock may stay with us: its streak goes on\n",
        "",
        (
            "tests/turns/test_order.py::"
            "test_a_process_whose_waiters_come_one_at_a_time_gives_way_after_its_streak",
        ),
    ),
    Mutant(
        "an expired hold's release ends its process's streak of handoffs",
        "waiting.py",
        "            if valid:  # (an expired hold's release: the lock may be with another",
        "            if True:  # (an expired hold's release: the lock may be with another",
        (
            "tests/turns/test_order.py::"
            "test_a_process_whose_waiters_come_one_at_a_time_gives_way_after_its_streak",
        ),
    ),
    Mutant(
        "a release that finds its lock expired announces nothing",
        "release_turn.lua",
        "redis.call('publish', KEYS[1] .. ':released', turn)\nreturn released",
        "if released == 1 then\n    redis.call('publish', KEYS[1] .. ':released', turn)\nend\n"
        "return released",
        (
            "tests/turns/test_order.py::"
            "test_a_release_that_finds_its_lock_expired_still_names_the_next_in_line",
        ),
    ),
    Mutant(
        "a shortening extend() announces nothing",
        "extend.lua",
        "    if redis.call('pttl', KEYS[1]) > tonumber(ARGV[2]) then\n"
        "        redis.call('publish', KEYS[1] .. ':released', 's')\n"
        "    end\n    return redis.call('pexpire'",
        "    if false then\n"
        "        redis.call('publish', KEYS[1] .. ':released', 's')\n"
        "    end\n    return redis.call('pexpire'",
        (
            "tests/turns/test_order.py::"
            "test_a_lock_shortened_and_left_to_expire_wakes_the_other_processes_waiters[extend]",
        ),
    ),
    Mutant(
        # Found reading the scripts for the fix below: an attach() after a longer
        # extend() shortens the key as a shortening extend() does.
        "an attach that shortens the lock announces nothing",
        "handover.lua",
        "    if redis.call('pttl', KEYS[1]) > tonumber(ARGV[3]) then\n"
        "        redis.call('publish', KEYS[1] .. ':released', 's')\n"
        "    end\n    redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])",
        "    redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])",
        (
            "tests/test_handover.py::"
            "test_an_attach_that_shortens_the_lock_wakes_the_other_processes_waiters",
        ),
    ),
    Mutant(
        # Seed 281474996725057 (no fault, on clusters): a handoff within a process to a
        # shorter ttl must announce it.
        "a handoff within a process to a shorter ttl announces nothing",
        "pass_on.lua",
        "    if redis.call('pttl', KEYS[1]) > tonumber(ARGV[2]) then\n"
        "        redis.call('publish', KEYS[1] .. ':released', 's')\n"
        "    end\n    redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])",
        "    redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])",
        (
            "tests/turns/test_order.py::"
            "test_a_lock_shortened_and_left_to_expire_wakes_the_other_processes_waiters[handed-on]",
        ),
    ),
    Mutant(
        "a head offers to take grants though pub/sub is refused",
        "waiting.py",
        "            polling = queue.polling()\n",
        "            polling = False\n",
        (
            "tests/turns/test_pubsub.py::"
            "test_a_process_that_learns_late_that_pubsub_is_refused_stops_offering",
        ),
    ),
    Mutant(
        "a turn queue refresh without an offer keeps the old one",
        "turn_join.lua",
        # (The earlier offer is taken out only when a new one comes.)
        "ipairs(redis.call('zrangebyscore', KEYS[3], at, at)) do",
        "ipairs(ARGV[7] and redis.call('zrangebyscore', KEYS[3], at, at) or {}) do",
        (
            "tests/turns/test_pubsub.py::"
            "test_a_process_that_learns_late_that_pubsub_is_refused_stops_offering",
            "tests/test_grants.py::"
            "test_an_offer_sits_at_its_place_on_the_node_and_a_refresh_without_one_withdraws_it",
        ),
    ),
    Mutant(
        "a releaser's offer sits where its process joined from, not at its place on the node",
        "release_turn.lua",
        "redis.call('zadd', KEYS[5], mine, ",
        "redis.call('zadd', KEYS[5], ARGV[4], ",
        ("tests/test_grants.py::test_a_releaser_s_offer_sits_at_its_place_on_the_node_too",),
    ),
    Mutant(
        "an offer sits where its process joined from, not at its place on the node",
        "turn_join.lua",
        "redis.call('zadd', KEYS[3], place, ",
        "redis.call('zadd', KEYS[3], ARGV[2], ",
        (
            "tests/test_grants.py::"
            "test_an_offer_sits_at_its_place_on_the_node_and_a_refresh_without_one_withdraws_it",
        ),
    ),
    Mutant(
        "a head holding back for one give-way of ours tries though we gave way again",
        "head.py",
        "(not wait.held_back or clock() < wait.deadline)",
        "(not wait.held_back)",
        (
            "tests/turns/test_pubsub.py::"
            "test_where_pubsub_is_refused_a_head_holding_back_holds_back_again_if_we_give_way_again",
        ),
    ),
    Mutant(
        "a head holding back tries though a release claimed its offer meanwhile",
        "head.py",
        "    if offer is not None and offer.claimed:\n        return Act.TAKE, 0.0\n",
        "    if offer is not None and offer.claimed and not wait.held_back:\n"
        "        return Act.TAKE, 0.0\n",
        (
            "tests/turns/test_heads.py::"
            "test_a_head_holding_back_that_a_release_of_ours_hands_the_lock_sends_nothing_of_its_own",
        ),
    ),
    Mutant(
        "a head that learns pub/sub is refused keeps its offer until the refresh",
        "turns.py",
        "        if self.offering and self._head() is None:\n",
        "        if False:\n",
        (
            "tests/turns/test_pubsub.py::"
            "test_a_head_that_learns_pubsub_is_refused_after_offering_withdraws_the_offer_at_once",
            "tests/turns/test_pubsub.py::"
            "test_a_head_whose_pubsub_is_refused_after_its_offer_was_firm_withdraws_it",
        ),
    ),
    Mutant(
        "a grant of a token taken and let go, made again since, is kept",
        "grants.py",
        "            if node not in taken_on or fence > fenced:\n"
        "                give_back(self._quorum, key, token, only=node)\n"
        "            if fence > fenced:\n"
        "                wake()  # our turn, granted to a used offer: our head tries\n",
        "            if node not in taken_on:\n"
        "                give_back(self._quorum, key, token, only=node)\n",
        (
            "tests/turns/test_order.py::test_a_grant_to_an_offer_already_taken_and_let_go_is_given_back",
        ),
    ),
    Mutant(
        "a lost lock's token stays noted as held (Grants._held grows)",
        "renewal.py",
        "        renewer.forget(hold.token)\n",
        "",
        ("tests/test_late.py::test_a_lost_locks_token_is_forgotten_though_its_handle_is_dropped",),
    ),
    Mutant(
        "a handoff's view of the line is dropped when its taker was our last waiter",
        "waiting.py",
        "            self._streaks.seen(key, alone=alone)\n",
        "            pass\n",
        (
            "tests/turns/test_order.py::test_a_process_that_saw_nobody_in_line_gives_way_once_others_join",
        ),
    ),
    Mutant(
        "a release that wakes a busy head goes on believing its process alone in line",
        "waiting.py",
        "queue.alone = False  # (nothing read the line",
        "pass  # (nothing read the line",
        (
            "tests/turns/test_order.py::test_a_process_that_saw_nobody_in_line_gives_way_once_others_join",
        ),
    ),
    Mutant(
        "a handle reads owned while its own release is in flight",
        "lock.py",
        "        hold.end()\n        engine = self._engine\n",
        "        engine = self._engine\n",
        ("tests/test_late.py::test_a_handle_stops_reading_owned_once_its_release_is_on_its_way",),
    ),
    Mutant(
        "an expired hold's release at the streak's limit starts the streak again",
        "waiting.py",
        "        if valid:  # (an expired hold's release may release nothing: the streak goes on)\n"
        "            queue.local_streak = 0\n",
        "        queue.local_streak = 0\n",
        (
            "tests/turns/test_order.py::"
            "test_a_process_whose_waiters_come_one_at_a_time_gives_way_after_its_streak",
        ),
    ),
    Mutant(
        "a grant unheard by a process whose subscription was not in place takes it out of line",
        "release_turn.lua",
        "                    if tentative == '' then\n",
        "                    if true then\n",
        (
            "tests/turns/test_pubsub.py::"
            "test_a_grant_unheard_because_our_subscription_is_not_in_place_yet_keeps_us_in_line",
        ),
    ),
    Mutant(
        "a process offers firmly before its subscriptions to the grants are confirmed",
        "turns.py",
        "        tentative = not self._offer_is_firm()\n",
        "        tentative = False\n",
        (
            "tests/turns/test_pubsub.py::"
            "test_a_grant_unheard_because_our_subscription_is_not_in_place_yet_keeps_us_in_line",
        ),
    ),
    Mutant(
        "a head subscribes to the grants only as it joins the line, with its offer",
        "waiting.py",
        "        if grants is not None and self._turns is not None:\n",
        "        if False:\n",
        (
            "tests/turns/test_pubsub.py::test_a_process_subscribes_to_its_grants_before_it_joins_the_line",
        ),
    ),
    Mutant(
        "a tentative offer stays tentative until the entry's next refresh",
        "turns.py",
        "        if self._tentative and self._refresh is not None and self._offer_is_firm():\n",
        "        if False:\n",
        (
            "tests/turns/test_pubsub.py::"
            "test_a_tentative_offer_is_made_firm_as_soon_as_every_node_confirms",
        ),
    ),
    Mutant(
        "an extend() that finds the lock gone on a majority stops its renewal untold",
        "lock.py",
        "                self._renewal.declare_lost("
        '"the key is gone or held by another token", gone)\n',
        "                pass\n",
        (
            "tests/test_renewal.py::"
            "test_an_extend_that_finds_the_lock_gone_on_a_majority_cancels_the_renewed_body",
        ),
    ),
    Mutant(
        "a subscription confirmed late wakes the head even as its process gives way",
        "queue.py",
        "        if self.gave_way is None:\n            self.wake.set()\n",
        "        if True:\n            self.wake.set()\n",
        (
            "tests/turns/test_heads.py::"
            "test_a_head_whose_subscription_is_confirmed_as_its_process_gives_way_does_not_try",
        ),
    ),
    # Seed 140737491357076 (stopped as busy): waiters whose attempts split the vote must
    # not try again at once and split it again.
    Mutant(
        "a waiter whose attempt split the vote tries again at once",
        "head.py",
        "        return random.uniform(0.0, min(bound, SPLIT_PAUSE_LONGEST))\n",
        "        return 0.0\n",
        (
            "tests/unit/test_head.py::"
            "test_a_split_vote_pauses_at_random_up_to_twice_the_attempt_and_longer_each_time",
            "tests/test_waiting.py::test_waiters_that_split_the_vote_back_off_and_one_of_them_wins",
        ),
    ),
    # The twenty-first session's fix (seed 9007199254741396, stopped as busy): where
    # nobody could win, every attempt split the vote, and the pause stayed as short.
    Mutant(
        "a split vote's pause does not grow with the split votes before it",
        "head.py",
        "        bound = SPLIT_PAUSE * took * 2.0 ** min(before, 30)\n",
        "        bound = SPLIT_PAUSE * took\n",
        (
            "tests/unit/test_head.py::"
            "test_a_split_vote_pauses_at_random_up_to_twice_the_attempt_and_longer_each_time",
            "tests/test_waiting.py::"
            "test_waiters_that_nobody_can_win_back_off_further_at_every_split_vote",
        ),
    ),
    # Seed 140737492368453 (no fault): a shortening of ours, heard only after our release
    # had named another process, must not wake the head.
    Mutant(
        "a shortening heard after its process gave way wakes the head at once",
        "queue.py",
        "        if message == SHORTENED or ours:\n            self._wake_unless_given_way()\n",
        "        if ours:\n            self._wake_unless_given_way()\n"
        "        elif message == SHORTENED:\n            self.wake.set()\n",
        (
            "tests/turns/test_heads.py::"
            "test_a_shortening_heard_after_its_process_gives_way_does_not_wake_the_head",
        ),
    ),
    Mutant(
        "a release that gives way leaves its head's earlier wake-up standing",
        "waiting.py",
        "        queue.wake.clear()  # (stale: see above)\n",
        "",
        (
            "tests/turns/test_heads.py::"
            "test_a_head_woken_before_its_process_gives_way_does_not_try_again_after_it",
        ),
    ),
    # Seed 70368841183464 (every node refusing pub/sub): after its process gave way, a
    # head woken by an expired hold's late release, or by a refusal of pub/sub, must not
    # try at once and beat the process named.
    Mutant(
        "an expired hold's late release wakes the head after its process gave way",
        "waiting.py",
        "        if not valid and queue.gave_way is not None:\n",
        "        if False:\n",
        (
            "tests/turns/test_pubsub.py::"
            "test_where_pubsub_is_refused_an_expired_holds_late_release_leaves_the_turn_given",
        ),
    ),
    Mutant(
        "a pub/sub connection lost or refused wakes the head at once though its process gave way",
        "queue.py",
        "        self.missed_release()\n        if self.subscribed:\n",
        "        self.wake.set()\n        if self.subscribed:\n",
        (
            "tests/turns/test_pubsub.py::"
            "test_where_pubsub_is_refused_an_expired_holds_late_release_leaves_the_turn_given",
        ),
    ),
    # Seed 281474983711000 (pub/sub connections dropped).
    Mutant(
        "a process whose pub/sub connection dropped joins the line again only at its refresh",
        "queue.py",
        "            self.entry.taken_out(ours)\n",
        "",
        (
            "tests/turns/test_pubsub.py::test_a_process_whose_pubsub_connections_drop_joins_the_line_again_at_once",
        ),
    ),
    # Seed 281474985869760 (one pub/sub connection dropped).
    Mutant(
        "a process whose pub/sub connection dropped offers firm before it is subscribed again",
        "queue.py",
        "                ours[:] = [\n",
        "                _ = [\n",
        (
            "tests/turns/test_pubsub.py::"
            "test_a_process_whose_pubsub_connections_drop_offers_tentatively_until_they_are_back",
        ),
    ),
    Mutant(
        "a subscription confirmed again after a reset does not wake the head",
        "queue.py",
        "                        self.confirmed_late(back)\n",
        "                        back.cancel()\n",
        (
            "tests/turns/test_pubsub.py::"
            "test_a_process_whose_pubsub_connections_drop_offers_tentatively_until_they_are_back",
            "tests/unit/test_queue.py::"
            "test_after_a_reset_the_head_is_deaf_until_its_subscriptions_are_back",
        ),
    ),
    # Seed 70368944185082 (nodes that are clusters).
    Mutant(
        "a waiter sleeps to the longest ttl among the nodes that said held",
        "votes.py",
        "        return pttls[max(1, votes.quorum - (votes.n - len(pttls))) - 1] / 1000\n",
        "        return pttls[-1] / 1000\n",
        (
            "tests/test_waiting.py::"
            "test_a_waiter_wakes_when_a_quorum_is_free_not_at_a_rivals_longer_ttl",
        ),
    ),
    # The stall watchdog, and an extend() read late.
    Mutant(
        "a loop blocked past the stall timeout resets a connection whose replies wait unread",
        "node.py",
        " > self._stall_timeout and not unread(transport):\n",
        " > self._stall_timeout:\n",
        (
            "tests/test_node_io.py::"
            "test_a_loop_blocked_past_the_stall_timeout_keeps_a_healthy_connection",
        ),
    ),
    Mutant(
        "the stall watchdog never resets a connection, silent as it may be",
        "node.py",
        "            if pending and now - pending[0][3] > self._stall_timeout and not unread(",
        "            if False and not unread(",
        (
            "tests/test_node_io.py::"
            "test_a_silent_connection_is_reset_once_its_oldest_request_waited_too_long",
        ),
    ),
    # A request the loop blocked in the write buffer.
    Mutant(
        "the stall watchdog times a request from its send, though a block kept it unwritten",
        "node.py",
        "                pending[i] = (callback, script, args, now, index)\n",
        "                pending[i] = (callback, script, args, _sent, index)\n",
        (
            "tests/test_node_io.py::"
            "test_a_request_kept_in_the_write_buffer_through_a_block_is_timed_from_its_write",
        ),
    ),
    Mutant(
        "a script first used while the node is down counts as loaded on its next connection",
        "node.py",
        "            self._loads_due.append(script)\n",
        "            pass\n",
        (
            "tests/test_node_io.py::"
            "test_a_script_first_used_while_the_node_is_down_still_runs_in_order",
        ),
    ),
    # The twenty-first session's fix (seed 18014428509482168, by the rule "scripts run in
    # order"): an EVALSHA queued as a reset lost its script's load went out without it.
    Mutant(
        "an EVALSHA queued as a reset lost its script's load is sent without it",
        "node.py",
        "        loads, self._loads_due = (*self._scripts, *self._loads_due, *lost), []\n",
        "        loads, self._loads_due = (*self._scripts, *self._loads_due), []\n",
        (
            "tests/test_node_io.py::"
            "test_a_script_whose_load_was_lost_with_a_silent_connection_runs_in_order",
        ),
    ),
    Mutant(
        "a renewal batch's budget covers all its script calls, not each",
        "quorum.py",
        "budget) * len(chunks), limit)",
        "budget), limit)",
        (
            "tests/test_renewal.py::"
            "test_a_slow_majority_renews_every_call_of_a_split_batch_within_the_budget",
        ),
    ),
    Mutant(
        "an extend() confirmed after its validity ran out says that no node failed",
        "_engine.py",
        "        if not errors and votes.won:",
        "        if False:",
        ("tests/test_lock.py::test_an_extend_confirmed_after_its_validity_ran_out_says_so",),
    ),
    # Seed 2251799813703477 (subscriptions held back): a subscription made again must not
    # take the reply to the one before for its confirmation.
    Mutant(
        "a subscription made again is confirmed by the reply to the one before",
        "pubsub.py",
        "if owed <= 1 and waiting:",
        "if owed >= 0 and waiting:",
        (
            "tests/test_waiting.py::test_a_subscription_made_again_waits_for_its_own_confirmation",
            "tests/turns/test_pubsub.py::"
            "test_a_process_whose_queue_fills_again_as_its_confirmations_lag_stays_in_line",
        ),
    ),
    # Found by the simulation's version 2 (plan v2:78525548743244): a block within the
    # writes of a fan-out whose requests wait for the iteration's end.
    Mutant(
        "a fan-out's timer set going before its requests are sent",
        "quorum.py",
        "        record, nodes = votes.record, self.nodes\n",
        "        self._timer.start(votes, loop)\n"
        "        record, nodes = votes.record, self.nodes\n",
        (
            "tests/test_node_io.py::"
            "test_a_block_within_a_fan_outs_writes_does_not_eat_its_node_timeout",
        ),
    ),
    Mutant(
        "a reply read after a callback reset its connection still reaches its callback",
        "node.py",
        "            if protocol is not self._protocol:\n"
        "                return  # a callback reset the connection",
        "            if False:\n                return  # a callback reset the connection",
        (
            "tests/test_node_io.py::"
            "test_a_reply_read_after_a_callback_reset_its_connection_is_not_delivered",
        ),
    ),
    Mutant(
        "a request written after a block inside its write is timed from before the block",
        "node.py",
        "                if written - now > self._request_timeout:",
        "                if False:",
        ("tests/test_node_io.py::test_a_block_inside_a_write_is_not_the_node_falling_silent",),
    ),
    # The simulation's own guard, not the library's: with it gone, Kleppmann's scenario
    # (tests/sim/kept.py, SCHEDULES) must show the stale write accepted.
    Mutant(
        "the fenced resource accepts a token lower than one it accepted",
        "tests/sim/resource.py",
        "accepted = token >= self.highest.get(name, token)",
        "accepted = True",
        ("tests/test_sim.py::test_named_mutants_are_caught_by_the_seeds_the_search_found",),
    ),
]


def locate(mutant: Mutant, root: Path = ROOT) -> Path:
    """The file ``mutant`` changes (see :class:`Mutant`)."""
    if "/" in mutant.path:
        return root / mutant.path
    found = sorted((root / "aiolock").rglob(mutant.path))
    if len(found) > 1:  # (e.g. the benchmark's renewal.py): the one with the anchor
        found = [path for path in found if mutant.old in path.read_text()]
    if len(found) != 1:
        raise SystemExit(f"{mutant.name}: {len(found)} files named {mutant.path} in aiolock/")
    return found[0]


def apply(mutant: Mutant, root: Path = ROOT) -> str:
    """Write ``mutant`` into the tree at ``root``; return the file's source before."""
    path = locate(mutant, root)
    source = path.read_text()
    if source.count(mutant.old) != 1:
        raise SystemExit(f"{mutant.name}: its anchor is not found once in {mutant.path}")
    path.write_text(source.replace(mutant.old, mutant.new))
    return source


def run_mutated(mutant: Mutant, command: list[str]) -> subprocess.CompletedProcess[str]:
    """Apply ``mutant``, run ``command`` in the tree, restore the file."""
    path = locate(mutant)
    source = apply(mutant)
    try:
        # No bytecode written: a mutant's must not outlive it (seen once in a clone: a
        # replay after the file was restored still ran the mutant's code).
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        return subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, check=False, env=env
        )
    finally:
        path.write_text(source)


def run(mutant: Mutant) -> bool:
    """Apply ``mutant``, run its tests, restore the file; True when the tests failed."""
    pytest = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly"]
    return run_mutated(mutant, [*pytest, *mutant.tests]).returncode != 0


def main(names: list[str]) -> int:
    chosen = [m for m in MUTANTS if not names or m.name in names]
    survived = []
    for mutant in chosen:
        started = time.monotonic()
        killed = run(mutant)
        verdict = "killed  " if killed else "SURVIVED"
        print(f"{verdict} {time.monotonic() - started:5.1f}s  {mutant.name}", flush=True)
        if not killed:
            survived.append(mutant.name)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} named mutants killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
