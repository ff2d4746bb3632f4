"""A renewal of one lock as the server's own compare-and-set: which servers have it
(aiolock/_io/protocol.py ``has_set_ifeq``), and the command and its reply as
``EXTEND_MANY``'s (aiolock/_core/batch.py). Pure logic: tests/test_renewal.py runs it
on a real server."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from aiolock._core.batch import as_extended, extend_one
from aiolock._io.protocol import has_set_ifeq


@pytest.mark.parametrize(
    ("info", "has"),
    [
        ({"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "9.1.2"}, True),
        ({"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "8.1.0"}, True),
        ({"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "8.0.3"}, False),
        ({"redis_version": "8.4.0"}, True),
        ({"redis_version": "8.2.1"}, False),
        # Valkey says it matches Redis 7.2: its own version decides, not that one.
        ({"redis_version": "7.2.4", "server_name": "valkey"}, False),
        ({"redis_version": "7.0.15"}, False),
        ({"redis_version": "9.0.0", "server_name": "keydb"}, False),  # (unknown: scripts)
        ({}, False),  # INFO denied: scripts
    ],
)
def test_which_servers_have_set_ifeq(info: dict[str, str], has: bool) -> None:
    assert has_set_ifeq(info) is has


def test_one_renewal_is_set_ifeq_with_the_token_and_the_ttl_in_milliseconds() -> None:
    assert extend_one((b"k", b"tok", 2.5)) == (
        b"SET",
        b"k",
        b"tok",
        b"IFEQ",
        b"tok",
        b"PX",
        b"2500",
    )
    assert extend_one((b"k", b"tok", 0.0001))[-1] == b"1"  # (at least 1 ms, as the script)


def test_set_ifeq_s_reply_reads_as_the_script_s() -> None:
    assert as_extended(b"OK") == [1]
    assert as_extended(None) == [0]  # no key, or another token
    # A key of another type: the script's pcall says 0 for it, not a failed node.
    assert as_extended(ResponseError("WRONGTYPE Operation against a key holding ...")) == [0]
    lost = RedisConnectionError("reset")
    assert as_extended(lost) is lost
    refused = ResponseError("ERR syntax error")
    assert as_extended(refused) is refused
    assert isinstance(as_extended(b"QUEUED"), TypeError)
