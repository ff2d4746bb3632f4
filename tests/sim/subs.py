"""Promises of the waiting docs about a process's subscriptions and turns, read on the
wire (docs/explanation/waiting.md, "A process subscribes to its grants before
its first attempt, with the release channels, and an offer it sends before every node
confirmed that subscription is *tentative* (...; it is sent again, firm, as soon as
the last node confirms)"):

* **grants with the releases**: when a process writes its entry in a name's line
  (``TURN_JOIN``), every live pub/sub connection of its manager on which it subscribed
  to the name's release channel at an earlier instant carries its subscription to its
  grants for that name, written no later than the release channel's. (A connection
  counts as the manager's once it carried a subscription to its grants, for any name.)
  (A subscription to the grants only as the process joins makes its offer tentative
  at every join: a grant in the round trip that follows is undone.)
* **firm once confirmed**: no node keeps a process's tentative offer longer than
  :data:`FIRM_AFTER` after the last node's confirmation of its subscription to the
  grants reached the process (each on a live connection). (An offer left tentative
  until the entry's next refresh, half a second later, costs the grants that come
  meanwhile.)

* **a turn unused is announced**: a manager that leaves a name's line
  (``TURN_LEAVE``, its last waiter gone) after it heard a release name it, and
  neither heard a grant since nor set the name's key on a quorum of nodes (its waiter
  did not take the lock), publishes the release channel's "free" message at once
  (waiting.md: "If none of its waiters takes the lock after all, the last one to
  leave announces it free"): within :data:`ANNOUNCED_WITHIN`. (Unannounced, the
  others wait for the turn queue's fallback, half a second, which the idle rule
  allows.)

All three are judged where nothing delays a command (``world.quiet`` runs: no fault, or late
subscriptions and dropped pub/sub connections only), pub/sub is not refused and the
nodes are not clusters (whose processes take no turns); what breaks them goes to
``World.wire``. They read, never touch, the stores and the random streams: a run's
schedule is the same with them or without.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import hiredis

from aiolock._turn_scripts import TURN_JOIN_SCRIPT, TURN_LEAVE_SCRIPT

from .server import ZSet

if TYPE_CHECKING:
    from .world import Link, World

#: How long a node may keep a tentative offer after its process heard every node
#: confirm its subscription to the grants (seconds): the entry is sent again at once,
#: and a command takes under a millisecond where these rules are judged.
FIRM_AFTER = 0.05
#: How soon a manager that leaves its line with its turn unused announces the lock
#: free (seconds): it publishes as it writes its ``TURN_LEAVE``.
ANNOUNCED_WITHIN = 0.01
_TURNS = b":turns"
_RELEASED = b":released"
_GRANTS = b":turn:"
_OFFERS = b":turns:offers"


class Subscriptions:
    """What each pub/sub connection's client asked for and heard confirmed, and the
    two rules above."""

    def __init__(self, world: World) -> None:
        self.world = world
        #: link -> channel -> when its client wrote the subscription (the first time
        #: on that connection since it last unsubscribed).
        self.written: dict[Link, dict[bytes, float]] = {}
        #: link -> channel -> when the node's confirmation reached the client.
        self.confirmed: dict[Link, dict[bytes, float]] = {}
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
        #: heard neither a release naming nobody nor a grant (Entry.named).
        self.named: dict[tuple[bytes, bytes], float] = {}
        #: (process, key) -> node -> when a command of the process last set the key's
        #: value there (an attempt that took it; a grant is set by the releaser's).
        self.set_by: dict[tuple[int, bytes], dict[int, float]] = {}
        #: (process, lock) -> the member and when it left its line with its turn unused,
        #: not announced yet.
        self.unannounced: dict[tuple[int, bytes], tuple[bytes, float]] = {}

    # -- the client's side -----------------------------------------------------------

    @staticmethod
    def reads(data: bytes) -> bool:
        """Whether a command connection's write may hold what the rules read."""
        return TURN_JOIN_SCRIPT.sha in data or TURN_LEAVE_SCRIPT.sha in data or b"PUBLISH" in data

    def wrote(self, link: Link, data: bytes) -> None:
        """What a client wrote on ``link``: subscriptions, and entries in a line."""
        reader = hiredis.Reader()
        reader.feed(data)
        now = self.world.now
        while (command := reader.gets()) is not False:
            name = command[0].upper()
            if name == b"SUBSCRIBE":
                written = self.written.setdefault(link, {})
                for channel in command[1:]:
                    written.setdefault(channel, now)
                    if b":turn:" in channel:
                        self.owners[link] = channel.rsplit(b":", 1)[1]
            elif name == b"UNSUBSCRIBE":  # (its confirmation no longer counts: as
                # for the library, a subscription written again waits for its own)
                for channel in command[1:]:
                    self.written.get(link, {}).pop(channel, None)
                    self.confirmed.get(link, {}).pop(channel, None)
            elif (
                name == b"EVALSHA"
                and len(command) >= 9
                and command[1] == TURN_JOIN_SCRIPT.sha
                and command[3].endswith(_TURNS)
            ):
                self.members[command[6]] = link.process
                self._grants_with_releases(link.process, command[3][: -len(_TURNS)], command[6])
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
        of a subscription the client still asks for (an unsubscription's reply changes
        nothing: the client stopped counting the channel as it wrote it)."""
        reader = self._readers.setdefault(link, hiredis.Reader())
        reader.feed(data)
        while (reply := reader.gets()) is not False:
            if not isinstance(reply, list) or len(reply) != 3:
                continue
            if reply[1] not in self.written.get(link, {}):
                continue  # (the client no longer listens there)
            if reply[0] == b"subscribe":
                self.confirmed.setdefault(link, {}).setdefault(reply[1], self.world.now)
            elif reply[0] == b"message" and (member := self.owners.get(link)) is not None:
                self._message(member, reply[1], reply[2])

    def _message(self, member: bytes, channel: bytes, message: bytes) -> None:
        """A message reached manager ``member``: Entry.heard's view of its turn."""
        if channel.endswith(_RELEASED):
            lock = channel[: -len(_RELEASED)]
            if message == b"":
                self.named.pop((member, lock), None)
            elif message == member:
                self.named.setdefault((member, lock), self.world.now)
        elif channel.endswith(_GRANTS + member):
            self.named.pop((member, channel[: -len(_GRANTS + member)]), None)

    def _left(self, process: int, lock: bytes, member: bytes) -> None:
        """Manager ``member`` of ``process`` wrote its ``TURN_LEAVE`` for ``lock``."""
        since = self.named.pop((member, lock), None)
        if since is None:
            return
        world = self.world
        since -= ANNOUNCED_WITHIN * 5  # (an attempt may land just before the release
        # that names it is heard, and win: seed 1125899911843255)
        took = sum(1 for at in self.set_by.get((process, lock), {}).values() if at >= since)
        if took < len(world.nodes) // 2 + 1:
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
        released, grants = lock + b":released", lock + b":turn:" + member
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
                confirmed = self._everywhere(process, lock + b":turn:" + member)
                told = (node, key, offer, confirmed)
                if confirmed is None or now - confirmed <= FIRM_AFTER or told in self._told:
                    continue
                self._told.add(told)
                self.world.wire.append(
                    f"firm once confirmed: n{node} kept p{process}'s tentative offer for "
                    f"{lock.decode()} at {now:.6f}, every node's confirmation of its "
                    f"subscription to the grants heard by {confirmed:.6f}"
                )
