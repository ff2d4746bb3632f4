"""aiolock/_io/protocol.py: pack_evalsha, the request a fan-out writes to every node."""

from __future__ import annotations

import random

import hiredis
import pytest

from aiolock._io.protocol import pack_evalsha

SHA = bytes(random.Random(1).choices(b"0123456789abcdef", k=40))


@pytest.mark.parametrize(
    "args",
    [
        (),
        (b"",),
        (b"2", b"aiolock:{orders:42}", b"aiolock:{orders:42}:fence", bytes(range(16)), b"30000"),
        (b"1", b"k\r\n$3\r\n", b"\x00\xff"),  # (bytes that look like RESP are only data)
        (b"1", b"x" * 1023, b"y" * 1024, b"z" * 70_000),  # around and past the length table
        tuple(b"%d" % i for i in range(2000)),  # more arguments than the table counts
    ],
)
def test_pack_evalsha_makes_the_bytes_hiredis_makes(args: tuple[bytes, ...]) -> None:
    assert pack_evalsha(SHA, args) == hiredis.pack_command((b"EVALSHA", SHA, *args))


def test_pack_evalsha_on_random_arguments() -> None:
    rng = random.Random(7)
    for _ in range(500):
        args = tuple(
            rng.randbytes(rng.choice((0, 1, 9, 40, 300, 1500))) for _ in range(rng.randrange(12))
        )
        assert pack_evalsha(SHA, args) == hiredis.pack_command((b"EVALSHA", SHA, *args))
