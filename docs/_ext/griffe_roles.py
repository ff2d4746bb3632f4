"""A Griffe extension for the docs site: the docstrings' Sphinx roles, rendered.

The docstrings say ``:class:`~aiolock.Lock``` and ``:meth:`LockManager.attach```
(readable in an editor and in ``help()``); mkdocstrings renders Markdown. A role that
names a public object becomes a cross-reference (checked by ``mkdocs build --strict``);
one that names a private one (``aiolock._waiting.waiting.Taker``) becomes code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

import aiolock

ROLE = re.compile(r":(?:class|meth|func|attr|data|exc|obj|mod):`(~?)([^`]+)`")


def _render(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2).removesuffix("()")
    label = target.rsplit(".", 1)[-1] if short else target
    if not target.startswith("aiolock") and target.split(".")[0] in aiolock.__all__:
        target = f"aiolock.{target}"
    if target.startswith("aiolock") and not any(p.startswith("_") for p in target.split(".")):
        return f"[`{label}`][{target}]"
    return f"`{label}`"


class SphinxRoles(griffe.Extension):
    """Rewrite each docstring's roles once the object tree is complete."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:  # noqa: D102
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_render, obj.docstring.value)
