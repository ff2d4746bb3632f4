"""The seams with redis-py (aiolock/_io/redis.py) and with strict servers (aiolock/_lua/).

Pure logic; the same table is exercised against real servers by the cluster,
failure and ACL tests, on every redis-py line of `nox -s compat`.
"""

from __future__ import annotations

import importlib.metadata
import re

import pytest
import redis.asyncio as redis
from redis.exceptions import (
    AskError,
    AuthenticationError,
    BusyLoadingError,
    ClusterCrossSlotError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)

from aiolock._core.keys import RELEASED_SUFFIX, grant_channel, release_channel, semaphore_index
from aiolock._io.node import Node
from aiolock._io.redis import ERROR_CLASSES, connection_settings, error_from_reply
from aiolock._lua import every_script


@pytest.mark.parametrize(
    ("reply", "cls"),
    [
        ("NOSCRIPT No matching script. Please use EVAL.", NoScriptError),
        ("READONLY You can't write against a read only replica.", ReadOnlyError),
        ("OOM command not allowed when used memory > 'maxmemory'.", OutOfMemoryError),
        ("NOPERM User aiolock has no permissions to run the 'set' command", NoPermissionError),
        ("NOAUTH Authentication required.", AuthenticationError),
        ("WRONGPASS invalid username-password pair or user is disabled.", AuthenticationError),
        ("LOADING Redis is loading the dataset in memory", BusyLoadingError),
        ("TRYAGAIN Multiple keys request during rehashing of slot", TryAgainError),
        ("CLUSTERDOWN The cluster is down", ClusterDownError),
        ("CROSSSLOT Keys in request don't hash to the same slot", ClusterCrossSlotError),
        ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
         MasterDownError),
    ],
)  # fmt: skip
def test_error_replies_get_their_class_and_keep_the_servers_words(
    reply: str, cls: type[Exception]
) -> None:
    error = error_from_reply("redis://h:1", reply)
    assert type(error) is cls
    assert error.args == (f"redis://h:1: {reply}",)


def test_redirects_are_parsed() -> None:
    moved = error_from_reply("n", "MOVED 3999 127.0.0.1:6381")
    assert type(moved) is MovedError
    assert (moved.slot_id, moved.host, moved.port) == (3999, "127.0.0.1", 6381)
    ask = error_from_reply("n", "ASK 12 ::1:7000")
    assert type(ask) is AskError
    assert (ask.slot_id, ask.host, ask.port) == (12, "::1", 7000)
    assert str(moved) == "n: MOVED 3999 127.0.0.1:6381"


@pytest.mark.parametrize(
    "reply", ["ERR unknown command 'FOO'", "WRONGTYPE Operation against a key", "MOVED garbage"]
)
def test_other_replies_are_plain_response_errors(reply: str) -> None:
    error = error_from_reply("n", reply)
    assert type(error) is ResponseError
    assert error.args == (f"n: {reply}",)


def test_every_class_of_the_table_is_a_redis_error() -> None:
    assert all(issubclass(cls, RedisError) for cls in ERROR_CLASSES.values())


def test_every_script_declares_every_key_it_touches() -> None:
    """Strict cluster proxies and DragonflyDB refuse a key a script did not declare.

    Every key a script's commands name must be a ``KEYS[...]`` entry; only PUBLISH
    takes a channel (not a key) built from them.
    """
    call = re.compile(r"redis\.p?call\('(\w+)',\s*([^,)]+(?:\]\])?)")
    checked = 0
    for name, script in every_script().items():
        for command, first in call.findall(script.source.decode()):
            checked += 1
            if command in ("publish", "spublish"):
                continue
            assert re.fullmatch(r"KEYS\[.+\]", first.strip()), (name, command, first)
    assert checked > 30


def test_a_server_older_than_6_2_is_refused_with_a_clear_error() -> None:
    """Redis 6.0 has no SET ... GET: every script would fail with a Lua error."""
    node = Node("redis://127.0.0.1:1", request_timeout=0.1)
    node._on_info(b"# Server\r\nredis_version:6.0.20\r\nrun_id:ab12\r\nuptime_in_seconds:99\r\n")
    replies: list[object] = []
    node.call((b"PING",), replies.append)
    assert len(replies) == 1
    assert isinstance(replies[0], RedisError)
    assert "Redis 6.0.20 is older than 6.2" in str(replies[0])
    assert node.server_version == (6, 0, 20)
    newer = Node("redis://127.0.0.1:1", request_timeout=0.1)
    newer._on_info(b"# Server\r\nredis_version:6.2.14\r\nrun_id:cd34\r\n")
    assert newer.refusal is None
    assert newer.server_version == (6, 2, 14)


def test_the_scripts_announce_on_the_channel_the_waiters_listen_to() -> None:
    """Scripts build the release channel from KEYS[1] themselves: as _core/keys.py does."""
    suffix = RELEASED_SUFFIX.decode()
    scripts = every_script()
    assert release_channel(b"k") == b"k" + RELEASED_SUFFIX
    for script in (scripts["release"], scripts["force_release"]):
        assert f"KEYS[1] .. '{suffix}'" in script.source.decode()
    # A semaphore's slots announce on its index's channel (KEYS[2] of SEM_RELEASE).
    assert f"KEYS[2] .. '{suffix}'" in scripts["sem_release"].source.decode()
    assert release_channel(semaphore_index(b"k")) == b"k:slots" + RELEASED_SUFFIX
    # A release names the next process on the release channel, and grants it the lock
    # on that process's own channel.
    turn = scripts["release_turn"].source.decode()
    assert f"KEYS[1] .. '{suffix}'" in turn
    assert "KEYS[1] .. ':turn:' .. turn" in turn
    assert grant_channel(b"k", b"m") == b"k:turn:m"


def test_a_connection_says_it_is_aiolocks_unless_its_client_named_itself() -> None:
    ours = f"redis-py(aiolock_v{importlib.metadata.version('aiolock-redis')})"
    try:  # (redis-py 7.1 and later; before, lib_name)
        from redis.driver_info import DriverInfo

        mine = redis.Redis(host="127.0.0.1", port=1, driver_info=DriverInfo(name="mine"))
    except ImportError:
        mine = redis.Redis(host="127.0.0.1", port=1, lib_name="mine")
    settings = [
        connection_settings("redis://127.0.0.1:1")[1],
        connection_settings(redis.Redis(host="127.0.0.1", port=1))[1],
        connection_settings(mine)[1],
    ]
    names = [
        kwargs["driver_info"].formatted_name if "driver_info" in kwargs else kwargs["lib_name"]
        for kwargs in settings
    ]
    assert names == [ours, ours, "mine"]
