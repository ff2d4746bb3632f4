"""Every Lua script (aiolock/_lua/) on a real server: loaded under its own SHA1, and run.

The simulation runs the same scripts on Lua 5.1 (lupa); here the server's own Lua and
commands answer, for each script as a single node and as a cluster with sharded pub/sub
runs it.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as redis

from aiolock._lua import Script, every_script

K = "{lua}:k"
TURNS = [f"{K}:turns", f"{K}:turns:live", f"{K}:turns:offers"]
RW = [f"{K}:w", f"{K}:i", f"{K}:r"]
#: Each script's keys, arguments, and its reply on an empty node (a script that takes a
#: lock replies the bare fencing token: here the floor sent, 7).
CALLS: dict[str, tuple[list[str], list[Any], Any]] = {
    "acquire": ([K, f"{K}:fence"], ["t", 10000, 60000, 7], 7),
    "raise_fence": ([f"{K}:fence"], [9, 60000], 1),
    "extend": ([K], ["t", 5000], 0),
    "extend_many": ([K, f"{K}:2"], ["t", 5000, "u", 5000], [0, 0]),
    "repair": ([K, f"{K}:fence"], ["t", 5000, 5, 60000], 1),
    "inspect": ([K, f"{K}:fence"], [], [-2, None, None]),
    "handover": ([K], ["t", "u", 5000], 0),
    "pass_on": ([K, f"{K}:fence"], ["u", 5000, 60000, 7, "t", 0], [0, -2]),
    "release": ([K], ["t"], 0),
    "release_either": ([K], ["t", "u"], 0),
    "force_release": ([K], [], 0),
    "release_turn": ([K, f"{K}:fence", *TURNS], ["t", 7], 0),
    "turn_join": (TURNS, ["m", 1, 5000], 1),
    "turn_leave": (TURNS, ["m"], 0),
    "rw_read": ([f"{K}:r:1", f"{K}:fence", *RW], ["t", 5000, 60000, 7, "1"], 7),
    "rw_write": ([f"{K}:w", f"{K}:fence", *RW[1:]], ["t", 5000, 60000, 7, f"{K}:r:", "0"], 7),
    "rw_release": ([f"{K}:w", f"{K}:r"], ["t", "", f"{K}:released"], 0),
    "sem_acquire": ([f"{K}:0", f"{K}:fence", f"{K}:slots"], ["t", 5000, 60000, 7, 0, 2], 7),
    "sem_release": ([f"{K}:0", f"{K}:slots"], ["t", 0], 0),
}  # fmt: skip


def test_every_script_has_a_call_here() -> None:
    assert set(CALLS) == set(every_script())


@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "sharded"])
@pytest.mark.parametrize("name", sorted(CALLS))
async def test_each_script_loads_under_its_sha1_and_runs_on_a_real_server(
    clients: list[redis.Redis], name: str, sharded: bool
) -> None:
    client = clients[0]
    script: Script = every_script()[name]
    if sharded:
        script = script.sharded()
    keys, args, first_reply = CALLS[name]
    await client.delete(*{K, f"{K}:fence", f"{K}:2", *TURNS, f"{K}:w", f"{K}:0", f"{K}:slots"})
    assert (await client.script_load(script.source.decode())).encode() == script.sha
    reply = await client.evalsha(script.sha.decode(), len(keys), *keys, *args)
    assert reply == first_reply
