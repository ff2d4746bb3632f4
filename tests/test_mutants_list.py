"""The named mutants (tests/mutants.py) still apply: each anchor is found exactly once.

A refactoring that moves an anchor would otherwise be noticed only by the long
`nox -s mutants` run (as when REPAIR copied ACQUIRE's first line).
"""

from __future__ import annotations

import pytest

from .mutants import MUTANTS, ROOT, Mutant, locate


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_the_anchor_of_each_named_mutant_is_found_once(mutant: Mutant) -> None:
    source = locate(mutant).read_text()
    assert source.count(mutant.old) == 1
    assert mutant.old != mutant.new
    for test in mutant.tests:
        assert (ROOT / test.split("::")[0]).exists(), test
