"""Two promises of the waiting docs about a process's subscription to its grants, read
on the wire (docs/explanation/waiting.md, "A process subscribes to its grants before
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

Both are judged where nothing delays a command (``world.quiet`` runs: no fault, or late
subscriptions and dropped pub/sub connections only), pub/sub is not refused and the
nodes are not clusters (whose processes take no turns); what breaks them goes to
``World.wire``. They read, never touch, the stores and the random streams: a run's
schedule is the same with them or without.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import hiredis

from aiolock._turn_scripts import TURN_JOIN_SCRIPT

from .server import ZSet

if TYPE_CHECKING:
    from .world import Link, World

#: How long a node may keep a tentative offer after its process heard every node
#: confirm its subscription to the grants (seconds): the entry is sent again at once,
#: and a command takes under a millisecond where these rules are judged.
FIRM_AFTER = 0.05
_TURNS = b":turns"
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

    # -- the client's side -----------------------------------------------------------

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

    def heard(self, link: Link, data: bytes) -> None:
        """What reached the client of pub/sub connection ``link``: confirmations, each
        of a subscription the client still asks for (an unsubscription's reply changes
        nothing: the client stopped counting the channel as it wrote it)."""
        reader = self._readers.setdefault(link, hiredis.Reader())
        reader.feed(data)
        while (reply := reader.gets()) is not False:
            if not isinstance(reply, list) or len(reply) != 3:
                continue
            if reply[0] == b"subscribe" and reply[1] in self.written.get(link, {}):
                self.confirmed.setdefault(link, {}).setdefault(reply[1], self.world.now)

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
