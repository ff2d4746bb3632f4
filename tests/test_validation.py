"""Bad arguments are rejected at once, before any I/O (no server is running here)."""

from __future__ import annotations

import math
import warnings

import pytest
import redis.asyncio as redis

from aiolock import LockManager

# Nothing listens here: a test that reached the network would fail differently.
NOWHERE = "redis://127.0.0.1:1"
NODES = [NOWHERE, "redis://127.0.0.1:2", "redis://127.0.0.1:3"]


@pytest.mark.parametrize(
    ("nodes", "error"),
    [
        ([], ValueError),
        ("redis://127.0.0.1:1", TypeError),
        (None, TypeError),
        ([1], TypeError),
        ([b"redis://127.0.0.1:1"], TypeError),
        (["http://127.0.0.1:1"], ValueError),
        ([NOWHERE, NOWHERE], ValueError),
        ([NOWHERE, "redis://127.0.0.1:1/0"], ValueError),
        (["redis://localhost:1", "redis://127.0.0.1:1"], ValueError),
    ],
)
def test_bad_nodes_are_rejected(nodes: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        LockManager(nodes)  # type: ignore[arg-type]


def test_duplicate_client_nodes_are_rejected() -> None:
    a = redis.Redis(host="127.0.0.1", port=1)
    b = redis.Redis(host="127.0.0.1", port=1)
    with pytest.raises(ValueError, match="duplicate"):
        LockManager([a, b])


def test_databases_of_one_server_are_one_node() -> None:
    # One server would hold a majority of three "nodes".
    with pytest.raises(ValueError, match="same server"):
        LockManager(["redis://127.0.0.1:1/0", "redis://127.0.0.1:1/1", "redis://127.0.0.1:1/2"])
    with pytest.raises(ValueError, match="same server"):
        LockManager(["unix:///tmp/r.sock?db=0", "unix:///tmp/r.sock?db=1", NOWHERE])


@pytest.mark.parametrize("n", [2, 4, 6])
def test_even_number_of_nodes_is_logged_not_raised(
    n: int, caplog: pytest.LogCaptureFixture
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would be an error here
        LockManager([f"redis://127.0.0.1:{port}" for port in range(1, n + 1)])
    assert "use an odd number" in caplog.text


@pytest.mark.parametrize("n", [1, 3, 5])
def test_odd_number_of_nodes_is_not_logged(n: int, caplog: pytest.LogCaptureFixture) -> None:
    LockManager([f"redis://127.0.0.1:{port}" for port in range(1, n + 1)])
    assert "odd number" not in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"node_timeout": 0}, ValueError),
        ({"node_timeout": -1}, ValueError),
        ({"node_timeout": math.nan}, ValueError),
        ({"node_timeout": math.inf}, ValueError),
        ({"node_timeout": "1"}, TypeError),
        ({"drift_factor": -0.1}, ValueError),
        ({"drift_factor": 1.0}, ValueError),
        ({"drift_factor": math.nan}, ValueError),
        ({"prefix": 3}, TypeError),
        ({"restart_grace": -1}, ValueError),
        ({"restart_grace": math.nan}, ValueError),
        ({"restart_grace": math.inf}, ValueError),
        ({"restart_grace": "30"}, TypeError),
    ],
)
def test_bad_manager_options_are_rejected(
    kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        LockManager(NODES, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        (("",), {}, ValueError),
        ((None,), {}, TypeError),
        ((b"name",), {}, TypeError),
        ((3,), {}, TypeError),
        (("n",), {"ttl": 0}, ValueError),
        (("n",), {"ttl": -1}, ValueError),
        (("n",), {"ttl": math.inf}, ValueError),
        (("n",), {"ttl": math.nan}, ValueError),
        (("n",), {"ttl": "10"}, TypeError),
        (("n",), {"ttl": True}, TypeError),
        (("n",), {"ttl": 0.05}, ValueError),  # == node_timeout
        (("n",), {"ttl": 0.01}, ValueError),  # < node_timeout
        (("n",), {"timeout": -1}, ValueError),
        (("n",), {"timeout": math.nan}, ValueError),
        (("n",), {"timeout": "1"}, TypeError),
        (("n",), {"max_hold": 0}, ValueError),
    ],
)
def test_bad_lock_arguments_are_rejected(
    args: tuple[object, ...], kwargs: dict[str, object], error: type[Exception]
) -> None:
    locks = LockManager(NODES)
    with pytest.raises(error):
        locks.lock(*args, **kwargs)  # type: ignore[arg-type]


def test_an_oversized_name_is_refused_without_being_encoded() -> None:
    """Refused in O(1), whatever its size: a name is measured by its characters (and an
    ASCII one by its length) before anything encodes it (a 10 MB name took 11 ms)."""

    class Unencoded(str):
        __slots__ = ()

        def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
            raise AssertionError("the name was encoded")

    locks = LockManager(NODES)
    for huge in (Unencoded("n" * 10_000_000), Unencoded("é" * 5_000_000)):
        with pytest.raises(ValueError, match="at most 4096 bytes in UTF-8") as info:
            locks.lock(huge)
        assert len(str(info.value)) < 200
        with pytest.raises(ValueError, match="at most 4096 bytes in UTF-8"):
            locks.lock_many(["a", huge])
        with pytest.raises(ValueError, match="at most 4096 bytes in UTF-8"):
            locks.semaphore(huge, 2)
    with pytest.raises(ValueError, match=r"got 5000000 characters"):
        locks.lock("é" * 5_000_000)


def test_bounds_on_names_ttls_and_limits_are_said_before_any_io() -> None:
    """A 10 MB name once reached every node and failed the other tasks' requests queued
    behind it; ttl=1e16 failed on the nodes ("value is not an integer or out of range")."""
    locks = LockManager(NODES)
    locks.lock("n" * 4096)  # the longest name: fine
    locks.lock("é" * 2048)  # 4096 bytes in UTF-8
    with pytest.raises(ValueError, match=r"at most 4096 bytes in UTF-8, got 4097") as info:
        locks.lock("n" * 4097)
    assert len(str(info.value)) < 200  # the message does not carry the whole name
    with pytest.raises(ValueError, match=r"at most 4096 bytes in UTF-8, got 10000000"):
        locks.lock_many(["a", "n" * 10_000_000])
    with pytest.raises(ValueError, match="UTF-8"):
        locks.lock("lone \ud800 surrogate")
    for bad_ttl in (1e16, 365 * 24 * 3600 + 1):
        with pytest.raises(ValueError, match=r"at most 3.1536e\+07s \(a year\)"):
            locks.lock("n", ttl=bad_ttl)
    locks.lock("n", ttl=365 * 24 * 3600)
    with pytest.raises(ValueError, match="at most"):
        locks.lock("n", max_hold=1e16)
    with pytest.raises(ValueError, match=r"limit must be from 1 to 1000, got 1001"):
        locks.semaphore("n", 1001)
    locks.semaphore("n", 1000)
    # Names that are odd but valid keep working (a `}` must not break the hash tag).
    for odd in ("a}b", "{x}", "nul\x00byte", "new\nline"):
        locks.lock(odd)


async def test_extend_beyond_the_longest_ttl_is_refused_before_io() -> None:
    locks = LockManager(NODES)
    with pytest.raises(ValueError, match="a year"):
        await locks.lock("n").extend(1e16)
    await locks.aclose()


def test_node_timeout_must_be_below_ttl() -> None:
    locks = LockManager(NODES, node_timeout=1.0)
    with pytest.raises(ValueError, match="node_timeout"):
        locks.lock("n", ttl=1.0)
    locks.lock("n", ttl=1.5)


async def test_bad_acquire_and_extend_arguments_are_rejected_before_io() -> None:
    locks = LockManager(NODES)
    lock = locks.lock("n")
    with pytest.raises(ValueError, match="timeout"):
        await lock.acquire(timeout=-1)
    with pytest.raises(TypeError):
        await lock.acquire(timeout="soon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl"):
        await lock.extend(0)
    with pytest.raises(ValueError, match="ttl"):
        await lock.extend(math.inf)
    await locks.aclose()


def test_lock_handle_is_cheap_and_unacquired() -> None:
    locks = LockManager(NODES)
    lock = locks.lock("orders:42", ttl=10.0, timeout=5.0)
    assert lock.name == "orders:42"
    assert lock.ttl == 10.0
    assert lock.timeout == 5.0
    assert not lock.owned
    assert lock.remaining() == 0.0
    assert lock.fencing_token is None
    assert locks.lock("n", timeout=math.inf).timeout is None


def test_node_urls_hide_passwords_in_messages() -> None:
    locks = LockManager(["redis://user:s3cret@127.0.0.1:1"])
    assert "s3cret" not in repr(locks)


def test_a_sync_client_is_refused_with_a_clear_message() -> None:
    import redis

    with pytest.raises(TypeError, match=r"redis\.asyncio\.Redis client.*not Redis"):
        LockManager([redis.Redis(host="127.0.0.1", port=1)])


def test_a_redis_cluster_client_is_one_node_named_after_its_servers() -> None:
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    client = RedisCluster(
        startup_nodes=[ClusterNode("127.0.0.1", 1), ClusterNode("127.0.0.1", 2)],
        password="s3cret",  # noqa: S106 - a test password, checked to stay hidden
    )
    locks = LockManager([client, "redis://127.0.0.1:3", "redis://127.0.0.1:4"])
    assert locks.quorum == 2
    assert "redis-cluster://127.0.0.1:1,127.0.0.1:2" in repr(locks)
    assert "s3cret" not in repr(locks)


def test_restart_grace_defaults_to_the_longest_ttl_used_and_at_least_30_s() -> None:
    locks = LockManager(NODES, restart_grace=None)
    assert locks.restart_grace == 30.0
    locks.lock("short", ttl=5)
    assert locks.restart_grace == 30.0
    locks.semaphore("long", 2, ttl=90)
    assert locks.restart_grace == 90.0
    locks.lock_many(["a", "b"], ttl=120)
    assert locks.restart_grace == 120.0
    assert LockManager(NODES, restart_grace=0).restart_grace == 0.0
    assert LockManager(NODES, restart_grace=2.5).restart_grace == 2.5
