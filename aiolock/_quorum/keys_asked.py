"""A script whose reply asks for more keys (a read-write lock's writer) runs again with them."""

from __future__ import annotations

from collections.abc import Callable
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
    rounds = 0

    def on_reply(reply: Any) -> None:
        nonlocal rounds
        more = None if isinstance(reply, BaseException) else keys_asked(reply)
        if more is None:
            callback(reply)
        elif rounds >= MAX_KEY_ROUNDS:
            callback([0, -2])  # the keys kept changing: held, ttl unknown
        else:
            rounds += 1
            node.call_script(script, (b"%d" % (numkeys + len(more)), *keys, *more, *argv), on_reply)

    node.call_script(script, args, on_reply)
