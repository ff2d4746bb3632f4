"""A renewal batch's votes, lock by lock (see :meth:`Quorum.extend_many`). No I/O."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

from .votes import NodeLike, milliseconds, quorum_size

__all__ = ["BATCH_BYTES", "BATCH_LIMIT", "BatchVotes", "batch_chunks", "chunk_args"]

#: Most locks renewed by one script call (bounds the time a node spends in it).
BATCH_LIMIT: Final = 1000
#: Most bytes of keys and tokens in one renewal call: a node runs one script at a time,
#: and 1,000 names of 4 KB took one 14 ms (every other client waited); 64 KB take
#: about 1 ms. Short names fit BATCH_LIMIT locks in one call.
BATCH_BYTES: Final = 64 * 1024


class BatchVotes:
    """Per-lock vote counts of one batched extend (see :meth:`Quorum.extend_many`)."""

    __slots__ = (
        "_answered",
        "_n",
        "_outstanding",
        "_quorum",
        "errors",
        "failed",
        "missing",
        "no",
        "waiter",
        "yes",
    )

    def __init__(
        self,
        m: int,
        *,
        n: int,
        chunks: int,
        waiter: asyncio.Future[None],
    ) -> None:
        self._n = n
        self._quorum = quorum_size(n)
        self.yes = [0] * m
        self.no = [0] * m
        self.failed = [0] * m
        self.errors: dict[object, BaseException] = {}
        #: For each lock that some node said it does not hold: those nodes' indices.
        self.missing: dict[int, list[int]] = {}
        self._answered: set[tuple[int, int]] = set()
        self._outstanding = n * chunks
        self.waiter = waiter

    def won(self, j: int) -> bool:
        """A quorum extended lock ``j``."""
        return self.yes[j] >= self._quorum

    def rejected(self, j: int) -> bool:
        """Nodes saying "not yours" alone made a quorum for lock ``j`` impossible."""
        return self.no[j] > self._n - self._quorum

    def record(self, node: NodeLike, ni: int, lo: int, hi: int, reply: Any) -> None:
        """Count node ``ni``'s reply for the locks ``lo`` to ``hi`` (exclusive)."""
        if (ni, lo) in self._answered:
            return
        self._answered.add((ni, lo))
        if isinstance(reply, BaseException) or not isinstance(reply, list):
            error = reply if isinstance(reply, BaseException) else TypeError(repr(reply))
            self.errors[node.spec] = error
            for j in range(lo, hi):
                self.failed[j] += 1
        else:
            for j, one in zip(range(lo, hi), reply, strict=False):
                if one == 1:
                    self.yes[j] += 1
                elif isinstance(one, BaseException):  # one part of a split call failed
                    self.errors[node.spec] = one
                    self.failed[j] += 1
                else:
                    self.no[j] += 1
                    self.missing.setdefault(j, []).append(ni)
        self._outstanding -= 1
        if self._outstanding == 0 and not self.waiter.done():
            self.waiter.set_result(None)

    def decided(self) -> bool:
        """Every (node, chunk) answered or timed out."""
        return self._outstanding == 0

    def expire(
        self, nodes: Sequence[NodeLike], chunks: Sequence[tuple[int, int]], timeout: float
    ) -> None:
        """Count every (node, chunk) still unanswered as failed by timeout."""
        for ni, node in enumerate(nodes):
            for lo, hi in chunks:
                if (ni, lo) not in self._answered:
                    error = TimeoutError(f"{node.name}: no reply within {timeout:g}s")
                    self.record(node, ni, lo, hi, error)


def batch_chunks(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Split a renewal batch of items of these sizes into ``(lo, hi)`` script calls.

    Each call takes at most :data:`BATCH_LIMIT` items and, unless one item alone is
    larger, at most :data:`BATCH_BYTES` bytes.
    """
    chunks: list[tuple[int, int]] = []
    lo = size = 0
    for i, item in enumerate(sizes):
        if i > lo and (i - lo >= BATCH_LIMIT or size + item > BATCH_BYTES):
            chunks.append((lo, i))
            lo, size = i, 0
        size += item
    if lo < len(sizes):
        chunks.append((lo, len(sizes)))
    return chunks


def chunk_args(items: Sequence[tuple[bytes, bytes, float]], lo: int, hi: int) -> tuple[bytes, ...]:
    """``EXTEND_MANY``'s arguments for ``items[lo:hi]``, each ``(key, token, ttl)``."""
    part = items[lo:hi]
    args: list[bytes] = [b"%d" % len(part)]
    args.extend(key for key, _token, _ttl in part)
    for _key, token, ttl in part:
        args.append(token)
        args.append(b"%d" % milliseconds(ttl))
    return tuple(args)


def extend_one(item: tuple[bytes, bytes, float]) -> tuple[bytes, ...]:
    """One lock's renewal, ``(key, token, ttl)``, as ``SET key token IFEQ token PX ms``.

    Where the server has it (Valkey 8.1, Redis 8.4), this does what ``EXTEND_MANY``
    does for one lock, without a script: the expiry is reset only while the key holds
    the token, and a missing key is not created.
    """
    key, token, ttl = item
    return (b"SET", key, token, b"IFEQ", token, b"PX", b"%d" % milliseconds(ttl))


def as_extended(reply: Any) -> Any:
    """:func:`extend_one`'s reply as ``EXTEND_MANY``'s: ``[1]`` reset, ``[0]`` not.

    ``[0]`` too for a key of another type (the script's ``pcall`` says 0 there); any
    other error or failure is returned as it is: the node failed.
    """
    if reply is None or (isinstance(reply, Exception) and str(reply).startswith("WRONGTYPE")):
        return [0]
    if reply == b"OK":
        return [1]
    return reply if isinstance(reply, BaseException) else TypeError(repr(reply))
