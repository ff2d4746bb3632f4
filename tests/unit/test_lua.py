"""The Lua scripts as the nodes get them (aiolock/_lua/): exact text, pinned SHA1s.

A script's SHA1 is how every client of every version names it (EVALSHA): a change to a
script's text is a change of protocol, made on purpose and pinned here anew.
"""

from __future__ import annotations

import re
from importlib.resources import files

import pytest

from aiolock import _lua
from aiolock._lua import Script, every_script, source_of

#: What each script hashes to (EVALSHA), as the nodes run it.
SHA1 = {
    "acquire": "9711a7bc5e72e5f511cd198a1e900c9dda6aba73",
    "extend": "a681a2d6f6e2c1091b6afc4d8f1d53f1e7d64333",
    "extend_many": "834e34fa53c6132ad842c4aa56ad35713286c2e8",
    "force_release": "4247839769584ec24b086a62d462021a74253d10",
    "handover": "a100039cab7bb4b797a0ec354342c48aecfc16a9",
    "inspect": "e0225f42fb37d6ac51e265942b93c8150f071682",
    "pass_on": "2ee2ea72bac3f3d6ec65a9af9cd8a83a11da5f32",
    "raise_fence": "dc8857b88a8974c6538c51445daa116761f70a0d",
    "release": "d83fe8b6e1a036fbd3519d00075cd257bd3ab4ff",
    "release_either": "fec9c700f503709529ff117add89252128e5f1f3",
    "release_turn": "e2107f35cfff5fae04ef36a1c9d69342aaf4840d",
    "repair": "2005106578b83c59040849955529c2aed3a0d5d9",
    "rw_read": "0a3edb0607cf3d8cceefcdc2edb993e985998a9c",
    "rw_release": "9137cf6163cd4ff392c3601319894e3215938ed5",
    "rw_write": "21deefe42dfecc44593b2cd00fa928d9dd571e96",
    "sem_acquire": "e5d419559fcf6ccda32f498bd554a9cb6fc7521d",
    "sem_release": "53adb0617963fc24ac694ff14201e4ab857f8e4f",
    "turn_join": "f1db541b2197410e769e6c41fd35436f45745174",
    "turn_leave": "681bf1f9b7f12579e05d3958aae21422f056ccb1",
}
#: The same for the scripts that announce, as a cluster with sharded pub/sub runs them.
SHARDED_SHA1 = {
    "extend": "9df511980901d19b61372e61e6e9cd9bfc278a28",
    "force_release": "a41128c0d50e58009651a930dc45f584d78d6637",
    "handover": "6a37d47d40a878faff08a4f1216e4e11cdf0f292",
    "pass_on": "cd30af963430738ea6d594d85e15e1b2f8657ad1",
    "release": "6a36040d15a652e99143abba2216cc578ad6c71b",
    "release_either": "738b6eec190bb4c7a2359a9b1bb87c8e28e72d8f",
    "release_turn": "edb47da7a483d7cf23940460883ef4e37ee7d660",
    "rw_release": "570f46ba1236ba5fb9ab954286e70e8ff56f2154",
    "sem_release": "be22894873b8bec849739d25d8fc6bb47ce60b84",
    "turn_leave": "7cd05f9d4ec9ec9acd55f46b0017cfd5759f7a81",
}
LUA = files("aiolock._lua")


def test_every_file_is_a_script_or_a_part_and_every_script_is_pinned() -> None:
    names = {p.name.removesuffix(".lua") for p in LUA.iterdir() if p.name.endswith(".lua")}
    parts = {n for n in names if n.startswith("_")}
    assert parts == {"_fence", "_holder", "_now_ms"}
    assert names - parts == set(every_script()) == set(SHA1)


@pytest.mark.parametrize("name", sorted(SHA1))
def test_each_script_hashes_to_its_pinned_sha1(name: str) -> None:
    script = every_script()[name]
    assert script.sha.decode() == SHA1[name]
    sharded = script.sharded()
    if name in SHARDED_SHA1:
        assert sharded.sha.decode() == SHARDED_SHA1[name]
        assert b"redis.call('publish'" not in sharded.source
    else:
        assert sharded.source == script.source


@pytest.mark.parametrize("name", sorted(SHA1))
def test_each_file_is_headed_by_what_it_does_then_its_keys_arguments_and_reply(
    name: str,
) -> None:
    text = LUA.joinpath(f"{name}.lua").read_text()
    header, blank, _body = text.partition("\n\n")
    assert blank
    assert header.startswith(f"-- {name.upper()}: ")
    assert all(line.startswith("--") for line in header.splitlines())
    assert "KEYS[" in header or name == "inspect"
    assert "returns" in header


def test_a_part_is_written_in_place_of_its_line_with_the_renames_it_asks_for() -> None:
    fence = source_of("_fence.lua").decode()
    assert fence.startswith("local fence = tonumber(ARGV[4])\n")
    # Every script that hands out a lock takes the same fencing lines ...
    for name in ("acquire", "pass_on", "rw_read", "rw_write", "sem_acquire"):
        assert fence in every_script()[name].source.decode(), name
    # ... and the turn queue's grant with its own counter's retention and floor.
    granted = fence.replace("ARGV[3]", "retention").replace("ARGV[4]", "ARGV[2]")
    assert granted in _lua.RELEASE_TURN_SCRIPT.source.decode()
    # No part line is left in what the nodes run.
    for script in every_script().values():
        assert b"--+" not in script.source


def test_the_semaphore_constants_are_the_ones_its_script_writes() -> None:
    source = _lua.SEM_ACQUIRE_SCRIPT.source.decode()
    assert f"if #free == {_lua.SEM_FREE_REPORTED} then break end" in source
    assert re.search(rf"'LIMIT', 0, {_lua.SEM_CHECKS}\)\n", source)


def test_a_script_made_from_text_is_named_by_its_sha1() -> None:
    script = Script(b"return 1")
    assert script.sha == b"e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
    assert "e0e1f9fabfc9" in repr(script)
    assert repr(_lua.ACQUIRE_SCRIPT) == "<Script acquire>"
