"""The API reference on the built site shows every public name, signature and member.

``nox -s docs`` builds the site, then runs this file with ``AIOLOCK_SITE`` set to it;
elsewhere (no site built) it is skipped. It reads the HTML a reader gets: each public
class of ``aiolock`` and each of its public members (inherited ones too) has its entry,
``LockManager``'s constructor shows every parameter, and no docstring role is left raw.
"""

from __future__ import annotations

import html
import inspect
import os
import re
from pathlib import Path

import pytest

import aiolock
import aiolock.telemetry

SITE = os.environ.get("AIOLOCK_SITE")
pytestmark = pytest.mark.skipif(not SITE, reason="the built site: nox -s docs runs this")

#: The classes whose members a user calls.
HANDLES = ["Lock", "Semaphore", "LockMany", "ReadLock", "WriteLock"]


def _page() -> str:
    return (Path(SITE or ".") / "reference" / "api" / "index.html").read_text()


def _text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def _public_members(cls: type) -> list[str]:
    return [name for name in dir(cls) if not name.startswith("_")]


def test_every_public_class_and_member_has_an_entry() -> None:
    page = _page()
    missing = []
    for name in aiolock.__all__:
        obj = getattr(aiolock, name)
        if not inspect.isclass(obj):
            continue
        if f'id="aiolock.{name}"' not in page:
            missing.append(name)
            continue
        if issubclass(obj, BaseException) or name in ("EventKind",):
            continue
        missing += [
            f"{name}.{member}"
            for member in _public_members(obj)
            if f'id="aiolock.{name}.{member}"' not in page
        ]
    assert not missing, missing


@pytest.mark.parametrize("handle", HANDLES)
def test_the_handle_api_is_there_inherited_members_included(handle: str) -> None:
    page = _page()
    for member in ("acquire", "release", "extend", "wait_lost", "remaining", "name", "ttl",
                   "owned", "fencing_token", "lost", "timeout"):  # fmt: skip
        assert f'id="aiolock.{handle}.{member}"' in page, f"{handle}.{member}"


def test_lock_manager_shows_its_constructor_with_every_parameter() -> None:
    text = _text(_page())
    start = text.index("LockManager(")
    signature = text[start : text.index(")", start)]
    for parameter in inspect.signature(aiolock.LockManager).parameters:
        assert f"{parameter}:" in signature, parameter


def test_no_sphinx_role_is_left_raw_and_no_private_base_is_named() -> None:
    text = _text(_page())
    assert not re.findall(r":(?:class|meth|func|attr|data|exc|obj):`", text)
    assert "Bases:" not in text
    assert "BaseHandle" not in text


def test_the_telemetry_and_testing_helpers_are_documented() -> None:
    page = _page()
    for name in ("OpenTelemetry", "Prometheus"):
        assert f'id="aiolock.telemetry.{name}"' in page
    for name in ("redis_servers", "redis_cluster", "nemesis", "Servers", "Server"):
        assert f'id="aiolock.testing.{name}"' in page, name
    assert aiolock.telemetry.OpenTelemetry.__module__.startswith("aiolock")
