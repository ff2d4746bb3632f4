"""A script whose reply asks for more keys (a read-write lock's writer) runs again with them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from .._core.calls import Callback
from .._core.votes import NodeLike
from .._lua import Script

__all__ = ["MAX_KEY_ROUNDS", "call_with_keys_asked"]


#: How often one node may be asked again with the keys its reply named.
MAX_KEY_ROUNDS: Final = 3


def call_with_keys_asked(
    node: NodeLike,
    script: Script,
    args: tuple[bytes, ...],
    keys_asked: Callable[[Any], tuple[bytes, ...] | None],
    callback: Callback,
) -> None:
    """Run ``script`` on ``node``; while its reply asks for keys, run it again with them.

    ``args`` is ``(numkeys, *keys, *argv)``; the keys asked for are appended to the keys.
    After :data:`MAX_KEY_ROUNDS` rounds the node counts as "held", holder's ttl unknown.
    """
    numkeys = int(args[0])
    keys, argv = args[1 : 1 + numkeys], args[1 + numkeys :]
    node.call_script(script, args, _Asking(node, script, keys, argv, keys_asked, callback))


@dataclass(slots=True)
class _Asking:
    """One node's replies to ``script``, until one asks for no more keys.

    An object, not a closure that passes itself on: that would refer to itself, and
    take the fan-out's votes with it into a cycle only the garbage collector frees.
    """

    node: NodeLike
    script: Script
    keys: tuple[bytes, ...]
    argv: tuple[bytes, ...]
    keys_asked: Callable[[Any], tuple[bytes, ...] | None]
    callback: Callback
    rounds: int = 0

    def __call__(self, reply: Any) -> None:
        rounds = self.rounds
        more = None if isinstance(reply, BaseException) else self.keys_asked(reply)
        if more is None:
            self.callback(reply)
        elif rounds >= MAX_KEY_ROUNDS:
            self.callback([0, -2])  # the keys kept changing: held, ttl unknown
        else:
            self.rounds = rounds + 1
            args = (b"%d" % (len(self.keys) + len(more)), *self.keys, *more, *self.argv)
            self.node.call_script(self.script, args, self)
