"""Promises of the waiting docs (docs/explanation/waiting.md) about a process's
subscriptions and turns, read on the wire:

* **grants with the releases** ("A process subscribes to its grants before its first
  attempt, with the release channels"): when a process writes its entry in a name's
  line (``TURN_JOIN``) with an offer, every live pub/sub connection of its manager on which it
  subscribed to the name's release channel at an earlier instant carries its
  subscription to its grants for that name, written no later than the release
  channel's. (A connection counts as the manager's once it carried a subscription to
  its grants, for any name.) (Subscribed to its grants only as it joins, its offer is
  tentative at every join: a grant in the round trip that follows is undone.)
* **firm once confirmed** ("an offer it sends before every node confirmed that
  subscription is *tentative* (...; it is sent again, firm, as soon as the last node
  confirms)"): no node keeps a process's tentative offer longer than
  :data:`FIRM_AFTER` after the last node's confirmation of its subscription to the
  grants reached the process (each on a live connection). (An offer left tentative
  until the entry's next refresh, half a second later, costs the grants that come
  meanwhile.)
* **a turn unused is announced** ("If none of its waiters takes the lock after all,
  the last one to leave announces it free"): a manager that leaves a name's line
  (``TURN_LEAVE``, its last waiter gone) after it heard a release name it, and
  neither heard a grant since nor holds the name's key on a quorum of nodes, set by
  itself or granted to its offer (its waiter did not take the lock), publishes the
  release channel's "free" message within :data:`ANNOUNCED_WITHIN`. (Unannounced,
  the others wait for the turn queue's fallback, half a second, which the idle rule
  allows.)
* **woken when subscribed again** ("those confirmations wake its first waiter, which
  may have missed a release meanwhile"): a manager in a plain lock's line whose pub/sub
  connection to a node dropped while it listened there for the name's releases, once
  the new connection's confirmation of that subscription reaches it, has its first
  waiter try again (a script on the name's key) within :data:`WOKEN_WITHIN`, unless
  it leaves the line, hears a grant, stops listening, or takes the name meanwhile (a
  task of its own took it, a handoff within the process too: its head is served, and
  whoever queues behind waits for that holder's release). (Not woken, the
  head sleeps on the PTTL its last attempt read, while the release it missed named
  its process: the others take the name after the fallback.)

* **withdrawn at the next attempt** ("an offer made before it learnt is withdrawn at its
  waiter's next attempt (a refresh of its entry without one, sent at once)"): a
  manager whose subscription to a name's releases was refused (an error reply on that
  pub/sub connection) after it wrote its entry with an offer sends its entry again
  without one before its head's next attempt with that offer's token. (Kept, the
  offer's grant is heard by nobody and takes the process out of line.)

All five are judged where nothing delays a command (``world.quiet`` runs: no fault, or
late subscriptions and dropped pub/sub connections only) and the nodes are not
clusters (whose processes take no turns), pub/sub refused or not (the first four then
find nothing to judge: no confirmation, no message); what breaks them goes to
``World.wire``. They read, never touch, the stores and the random streams: a run's
schedule is the same with them or without. A connection the simulation opened for a
process outside its context (a reconnection's) is labelled process -1: the rules match
connections by the manager's member, and processes by its entries' command connections.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import hiredis

from aiolock._core.keys import RELEASED_SUFFIX, grant_channel, release_channel, turn_keys
from aiolock._lua import ACQUIRE_SCRIPT, NOT_FREE, SHORTENED, TURN_JOIN_SCRIPT, TURN_LEAVE_SCRIPT

from .server import Store, ZSet

if TYPE_CHECKING:
    from .world import Link, World

#: How long a node may keep a tentative offer after its process heard every node
#: confirm its subscription to the grants (seconds): the entry is sent again at once,
#: and a command takes under a millisecond where these rules are judged.
FIRM_AFTER = 0.05
#: How soon a manager that leaves its line with its turn unused announces the lock
#: free (seconds): it publishes as it writes its ``TURN_LEAVE``.
ANNOUNCED_WITHIN = 0.01
#: How soon a head tries after its subscription is confirmed again (seconds): at once,
#: or after the turn queue's fallback (0.5 s and 10 % of jitter) where a release of its
#: process gave way since (Queue.missed_release).
WOKEN_WITHIN = 0.6
# The suffixes of a lock's keys and channels (aiolock._core.keys), to read the lock back.
_TURNS, _, _OFFERS = turn_keys(b"")
_RELEASED = RELEASED_SUFFIX
_GRANTS = grant_channel(b"", b"")


def _value(store: Store, key: bytes) -> bytes | None:
    """``key``'s live string value on ``store``, read without touching it."""
    expiry = store.expires.get(key)
    value = store.data.get(key)
    if (expiry is not None and store.now() > expiry) or not isinstance(value, bytes):
        return None
    return value


class Subscriptions:
    """What each manager's connections asked for, heard and wrote, as the library
    sees it, and the four rules above (World.subs, where they are judged)."""

    def __init__(self, world: World) -> None:
        self.world = world
        #: link -> channel -> when its client wrote the subscription (the first time
        #: on that connection since it last unsubscribed).
        self.written: dict[Link, dict[bytes, float]] = {}
        #: link -> channel -> when the node's confirmation reached the client.
        self.confirmed: dict[Link, dict[bytes, float]] = {}
        #: (link, channel) -> the client's (un)subscriptions there whose reply has not
        #: reached it: the node answers them in order, and only the last one's reply
        #: confirms (as for the library: aiolock._io.pubsub.Subscriber._answered).
        self.owed: dict[tuple[Link, bytes], int] = {}
        self._readers: dict[Link, hiredis.Reader] = {}
        #: member -> the process whose entries carry it.
        self.members: dict[bytes, int] = {}
        #: link -> the member of the manager whose connection it is (known once it
        #: carried a subscription to that manager's grants: a process may run two
        #: managers, each with its own connections and member).
        self.owners: dict[Link, bytes] = {}
        #: (node, offers key) where an offer may be: read after each command.
        self.offers: set[tuple[int, bytes]] = set()
        self._told: set[tuple[object, ...]] = set()
        #: (member, lock) -> when the manager heard a release name it, since which it
        #: heard neither a release naming nobody nor a grant (TurnEntry.named).
        self.named: dict[tuple[bytes, bytes], float] = {}
        #: (process, key) -> node -> when a command of the process last set the key's
        #: value there (an attempt that took it; a grant is set by the releaser's).
        self.set_by: dict[tuple[int, bytes], dict[int, float]] = {}
        #: (member, lock) -> when the manager last heard a grant (it may take the lock
        #: with it, after a release naming it: seed 1125899913848238).
        self.granted: dict[tuple[bytes, bytes], float] = {}
        #: (process, lock) -> the member and when it left its line with its turn unused,
        #: not announced yet.
        self.unannounced: dict[tuple[int, bytes], tuple[bytes, float]] = {}
        #: link -> when its client first wrote a subscription on it.
        self.opened: dict[Link, float] = {}
        #: (member, lock) -> when the confirmation of its release channel on a
        #: connection that replaced a dropped one reached it, its head not tried since.
        self.wake_due: dict[tuple[bytes, bytes], float] = {}
        #: (member, lock) for each plain lock whose line the manager is in (from its
        #: TURN_JOIN to its TURN_LEAVE): the rule above reads their heads' scripts.
        self.lines: set[tuple[bytes, bytes]] = set()
        #: (member, lock) -> the token of the offer its last entry carried (None: none)
        #: and when it wrote that entry.
        self.entries: dict[tuple[bytes, bytes], tuple[bytes | None, float]] = {}
        #: command connection -> the member whose entries it carried.
        self.writers: dict[Link, bytes] = {}
        #: pub/sub connection -> when its client read each refusal there (the first:
        #: "withdrawn at the next attempt"; each: given.py).
        self.refused: dict[Link, list[float]] = {}
        #: (member, lock) -> when the manager last heard a message that lets its head
        #: try at once: a release naming nobody or it, or a grant (given.py).
        self.wakes: dict[tuple[bytes, bytes], float] = {}
        #: (member, lock) -> when it last heard a release name another process: its head
        #: tries at the fallback after it, unless a later one is heard (TurnEntry.heard).
        self.others: dict[tuple[bytes, bytes], float] = {}
        #: (member, lock) -> when it heard a shortening or a confirmation of the lock's
        #: release channel: after a give-way, each wakes its head at the fallback
        #: (Queue._wake_unless_given_way, a timer nothing cancels).
        self.delayed: dict[tuple[bytes, bytes], list[float]] = {}

    # -- the client's side -----------------------------------------------------------

    def reads(self, data: bytes) -> bool:
        """Whether a command connection's write may hold what the rules read."""
        return (
            TURN_JOIN_SCRIPT.sha in data
            or TURN_LEAVE_SCRIPT.sha in data
            or b"PUBLISH" in data
            or (bool(self.wake_due) and b"EVALSHA" in data)
            or (bool(self.refused) and ACQUIRE_SCRIPT.sha in data)
        )

    def wrote(self, link: Link, data: bytes) -> None:
        """What a client wrote on ``link``: subscriptions, entries in and out of a line,
        "free" messages, and (while a head is due to try) scripts."""
        reader = hiredis.Reader()
        reader.feed(data)
        now = self.world.now
        while (command := reader.gets()) is not False:
            name = command[0].upper()
            if name == b"EVALSHA" and len(command) > 5 and command[1] == ACQUIRE_SCRIPT.sha:
                self._withdrawn(link, command[3], command[5])
            if name == b"EVALSHA" and self.wake_due and len(command) > 3:
                tried = [
                    due
                    for due in self.wake_due
                    if due[1] == command[3] and self.members.get(due[0]) == link.process
                ]
                for due in tried:  # (its head tried: a script on the lock's key)
                    del self.wake_due[due]
            if name in (b"SUBSCRIBE", b"UNSUBSCRIBE"):
                for channel in command[1:]:
                    self.owed[(link, channel)] = self.owed.get((link, channel), 0) + 1
            if name == b"SUBSCRIBE":
                self.opened.setdefault(link, now)
                written = self.written.setdefault(link, {})
                for channel in command[1:]:
                    written.setdefault(channel, now)
                    if _GRANTS in channel:
                        self.owners[link] = channel.rsplit(b":", 1)[1]
            elif name == b"UNSUBSCRIBE":  # (its confirmation no longer counts: as
                # for the library, a subscription written again waits for its own)
                for channel in command[1:]:
                    if channel.endswith(_RELEASED) and (member := self.owners.get(link)):
                        self.wake_due.pop((member, channel[: -len(_RELEASED)]), None)
                    self.written.get(link, {}).pop(channel, None)
                    self.confirmed.get(link, {}).pop(channel, None)
            elif (
                name == b"EVALSHA"
                and len(command) >= 9
                and command[1] == TURN_JOIN_SCRIPT.sha
                and command[3].endswith(_TURNS)
            ):
                member, lock = command[6], command[3][: -len(_TURNS)]
                self.members[member] = link.process
                self.lines.add((member, lock))
                self.writers[link] = member
                self.entries[(member, lock)] = (command[12] if len(command) > 12 else None, now)
                if len(command) > 12:  # (with an offer: a process polling makes none)
                    self._grants_with_releases(link.process, lock, member)
            elif (
                name == b"EVALSHA"
                and len(command) == 7
                and command[1] == TURN_LEAVE_SCRIPT.sha
                and command[2] == b"3"
                and command[3].endswith(_TURNS)
            ):
                self._left(link.process, command[3][: -len(_TURNS)], command[6])
            elif (  # the "free" message (Engine._announce)
                name == b"PUBLISH"
                and len(command) == 3
                and command[1].endswith(_RELEASED)
                and command[2] == b""
            ):
                self.unannounced.pop((link.process, command[1][: -len(_RELEASED)]), None)

    def heard(self, link: Link, data: bytes) -> None:
        """What reached the client of pub/sub connection ``link``: confirmations, each
        of a subscription the client still asks for, by the reply to its last request
        there (an unsubscription's reply changes nothing: the client stopped counting
        the channel as it wrote it; nor does the reply to a subscription written before
        it, seed 2251799813703477), messages, and refusals."""
        reader = self._readers.setdefault(link, hiredis.Reader())
        reader.feed(data)
        while (reply := reader.gets()) is not False:
            if isinstance(reply, hiredis.ReplyError):  # (a SUBSCRIBE refused)
                self.refused.setdefault(link, []).append(self.world.now)
                continue
            if not isinstance(reply, list) or len(reply) != 3:
                continue
            if reply[0] in (b"subscribe", b"unsubscribe"):
                owed = self.owed.pop((link, reply[1]), 0)
                if owed > 1:
                    self.owed[(link, reply[1])] = owed - 1
                    continue  # (a later request's reply is to come)
            if reply[1] not in self.written.get(link, {}):
                continue  # (the client no longer listens there)
            if reply[0] == b"subscribe":
                self.confirmed.setdefault(link, {}).setdefault(reply[1], self.world.now)
                if reply[1].endswith(_RELEASED):
                    self._subscribed_again(link, reply[1])
                    if (member := self.owners.get(link)) is not None:
                        lock = reply[1][: -len(_RELEASED)]
                        self.delayed.setdefault((member, lock), []).append(self.world.now)
            elif reply[0] == b"message" and (member := self.owners.get(link)) is not None:
                self._message(member, reply[1], reply[2])

    def _withdrawn(self, link: Link, lock: bytes, token: bytes) -> None:
        """The "withdrawn at the next attempt" rule, as ``link``'s client writes an
        attempt on ``lock`` with ``token``."""
        member = self.writers.get(link)
        entry = self.entries.get((member, lock)) if member is not None else None
        if entry is None or entry[0] != token or (member, lock) not in self.lines:
            return
        released = release_channel(lock)
        refused = [
            at
            for pubsub, (at, *_) in self.refused.items()
            if self.owners.get(pubsub) == member
            and released in self.written.get(pubsub, {})
            and at >= entry[1]
        ]
        if refused and (member, lock, entry[1]) not in self._told:
            self._told.add((member, lock, entry[1]))
            self.world.wire.append(
                f"withdrawn at the next attempt: p{link.process} tried {lock.decode()} at "
                f"{self.world.now:.6f} with the offer its entry carried since "
                f"{entry[1]:.6f}, its subscription refused at {min(refused):.6f}"
            )

    def _subscribed_again(self, link: Link, channel: bytes) -> None:
        """A confirmation of release channel ``channel`` reached ``link``'s client: is it
        of a connection that replaced one dropped while listening there?"""
        member = self.owners.get(link)
        if member is None or self.written[link][channel] != self.opened.get(link):
            return  # (not asked for as the connection opened: a new wait's)
        dropped = any(
            old is not link
            and old.dead
            and old.node is link.node
            and self.owners.get(old) == member
            and channel in written
            for old, written in self.written.items()
        )
        if dropped and (member, channel[: -len(_RELEASED)]) in self.lines:
            due = (member, channel[: -len(_RELEASED)])
            self.wake_due.setdefault(due, self.world.now)

    def check_woken(self, *, final: bool = False) -> None:
        """The "woken when subscribed again" rule (after each command, and at the end)."""
        now = self.world.now
        for (member, lock), since in list(self.wake_due.items()):
            if now - since > WOKEN_WITHIN:
                del self.wake_due[(member, lock)]
                self.world.wire.append(
                    f"woken when subscribed again: p{self.members.get(member)}'s subscription "
                    f"to the releases of {lock.decode()} was confirmed again at {since:.6f}, "
                    f"after its connection dropped, and its head had not tried by {now:.6f}"
                )
            elif final:
                del self.wake_due[(member, lock)]

    def _message(self, member: bytes, channel: bytes, message: bytes) -> None:
        """A message reached manager ``member``: TurnEntry.heard's view of its turn."""
        if channel.endswith(_RELEASED):
            lock = channel[: -len(_RELEASED)]
            if message in (b"", member):  # (its head may try now: given.py)
                self.wakes[(member, lock)] = self.world.now
            elif message == SHORTENED:  # (after a give-way: a wake-up at the fallback)
                self.delayed.setdefault((member, lock), []).append(self.world.now)
            elif message != NOT_FREE:  # (names another: its head tries at the fallback)
                self.others[(member, lock)] = self.world.now
            if message == b"":
                self.named.pop((member, lock), None)
            elif message == member:
                self.named.setdefault((member, lock), self.world.now)
        elif channel.endswith(_GRANTS + member):
            lock = channel[: -len(_GRANTS + member)]
            self.wakes[(member, lock)] = self.world.now
            self.named.pop((member, lock), None)
            self.granted[(member, lock)] = self.world.now
            self.wake_due.pop((member, lock), None)

    def took(self, process: int, lock: bytes) -> None:
        """A task of ``process`` took ``lock``: no head of its waits to be woken."""
        for due in [d for d in self.wake_due if d[1] == lock and self.members.get(d[0]) == process]:
            del self.wake_due[due]

    def _left(self, process: int, lock: bytes, member: bytes) -> None:
        """Manager ``member`` of ``process`` wrote its ``TURN_LEAVE`` for ``lock``."""
        self.wake_due.pop((member, lock), None)
        self.lines.discard((member, lock))
        since = self.named.pop((member, lock), None)
        if since is None:
            return
        world = self.world
        since -= ANNOUNCED_WITHIN * 5  # (an attempt may land just before the release
        # that names it is heard, and win: seed 1125899911843255)
        set_at = self.set_by.get((process, lock), {})
        entry = self.entries.get((member, lock))
        offer = entry[0] if entry is not None else None
        # Its waiter took the lock where it set the key, or where the key holds the
        # token its offer carried: granted there, the grant not heard yet (the head's
        # attempt finds the key its own, seed v2:167519440969196).
        took = sum(
            1
            for i, node in enumerate(world.nodes)
            if set_at.get(i, -math.inf) >= since
            or (offer is not None and _value(node.store, lock) == offer)
        )
        if took < len(world.nodes) // 2 + 1 and self.granted.get((member, lock), 0.0) < since:
            self.unannounced[(process, lock)] = (member, world.now)

    def check_announced(self, *, final: bool = False) -> None:
        """The "a turn unused is announced" rule (after each command, and at the end)."""
        now = self.world.now
        for (process, lock), (_member, left) in list(self.unannounced.items()):
            if final or now - left > ANNOUNCED_WITHIN:
                del self.unannounced[(process, lock)]
                self.world.wire.append(
                    f"a turn unused is announced: p{process} left the line of "
                    f"{lock.decode()} at {left:.6f} named and without the lock, and "
                    f"announced nothing"
                )

    def _grants_with_releases(self, process: int, lock: bytes, member: bytes) -> None:
        now = self.world.now
        released, grants = release_channel(lock), grant_channel(lock, member)
        for link, written in self.written.items():
            if link.process != process or link.dead or self.owners.get(link) != member:
                continue
            asked = written.get(released)
            if asked is None or asked >= now:
                continue
            granted = written.get(grants)
            if (granted is None or granted > asked) and (process, lock, asked) not in self._told:
                self._told.add((process, lock, asked))
                self.world.wire.append(
                    f"grants with the releases: p{process} joined the line of "
                    f"{lock.decode()} at {now:.6f}, subscribed on {link.name} to its "
                    f"release channel at {asked:.6f} and to its grants "
                    + ("never" if granted is None else f"at {granted:.6f}")
                )

    # -- the nodes' side -------------------------------------------------------------

    def set_value(self, node: int, key: bytes, process: int) -> None:
        """A command of ``process`` set ``key``'s value on ``node``."""
        self.set_by.setdefault((process, key), {})[node] = self.world.now

    def noted(self, node: int, offers: bytes) -> None:
        """A turn script ran on ``node`` for the line whose offers are ``offers``."""
        self.offers.add((node, offers))

    def _everywhere(self, process: int, channel: bytes) -> float | None:
        """When the last node's confirmation of ``channel`` reached ``process``, on its
        live connections; None while a node has not confirmed it on one."""
        last: float | None = None
        for node in self.world.nodes:
            heard = [
                confirmed[channel]
                for link, confirmed in self.confirmed.items()
                if link.process == process
                and link.node is node
                and not link.dead
                and channel in confirmed
            ]
            if not heard:
                return None
            first = min(heard)  # (a connection that confirmed it since)
            last = first if last is None else max(last, first)
        return last

    def check_firm(self) -> None:
        """The "firm once confirmed" rule, after a command ran on any node."""
        now = self.world.now
        for node, key in sorted(self.offers):
            store = self.world.nodes[node].store
            offers = store.data.get(key)
            expiry = store.expires.get(key)
            if not isinstance(offers, ZSet) or (expiry is not None and store.now() > expiry):
                self.offers.discard((node, key))
                continue
            for offer in offers.scores:
                member, seq = offer.split(b" ", 2)[:2]
                process = self.members.get(member)
                if not seq.endswith(b"*") or process is None:
                    continue
                lock = key[: -len(_OFFERS)]
                confirmed = self._everywhere(process, grant_channel(lock, member))
                told = (node, key, offer, confirmed)
                if confirmed is None or now - confirmed <= FIRM_AFTER or told in self._told:
                    continue
                self._told.add(told)
                self.world.wire.append(
                    f"firm once confirmed: n{node} kept p{process}'s tentative offer for "
                    f"{lock.decode()} at {now:.6f}, every node's confirmation of its "
                    f"subscription to the grants heard by {confirmed:.6f}"
                )
