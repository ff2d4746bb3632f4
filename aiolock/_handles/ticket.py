"""Tickets: a held lock handed from one handle (or process) to another.

``lock.detach()`` returns a ticket; ``locks.attach(ticket)`` in any process takes the
lock over on a quorum (see handover.lua in _lua/: the key gets a new token, so a
ticket works once). A ticket carries the lock's token: it is a secret, like a password.
Its format: ``aiolock-ticket.1.`` and URL-safe base64 of a small JSON object.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Final, NamedTuple

__all__ = ["Ticket", "decode_ticket", "encode_ticket"]

_HEAD: Final = "aiolock-ticket.1."


class Ticket(NamedTuple):
    """What a ticket says (checked: see :func:`decode_ticket`)."""

    prefix: str
    name: str
    token: bytes
    fence: int
    ttl: float


def encode_ticket(ticket: Ticket) -> str:
    """The ticket as a string a caller may send anywhere (a secret: it holds the token)."""
    body = {
        "p": ticket.prefix,
        "n": ticket.name,
        "t": ticket.token.hex(),
        "f": ticket.fence,
        "l": ticket.ttl,
    }
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return _HEAD + base64.urlsafe_b64encode(data).decode()


def decode_ticket(text: object, *, prefix: str) -> Ticket:
    """Read a ticket made by :func:`encode_ticket`, of a manager with ``prefix``.

    Raises:
        TypeError: not a str.
        ValueError: not a ticket, or another prefix's (its name and ttl are checked
            by the caller).

    """
    if not isinstance(text, str):
        raise TypeError(f"a ticket must be a str, not {type(text).__name__}")
    if not text.startswith(_HEAD):
        raise ValueError("not an aiolock ticket (made by Lock.detach())")
    try:
        body = json.loads(base64.urlsafe_b64decode(text[len(_HEAD) :].encode()))
        ticket = Ticket(body["p"], body["n"], bytes.fromhex(body["t"]), body["f"], float(body["l"]))
    except (binascii.Error, UnicodeError, ValueError, KeyError, TypeError):
        raise ValueError("a damaged aiolock ticket") from None
    if (
        not isinstance(ticket.prefix, str)
        or not isinstance(ticket.name, str)
        or type(ticket.fence) is not int
        or not ticket.token
    ):
        raise ValueError("a damaged aiolock ticket")
    if ticket.prefix != prefix:
        raise ValueError(
            f"the ticket is of a manager with prefix {ticket.prefix!r}, not {prefix!r}"
        )
    return ticket
