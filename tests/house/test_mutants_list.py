"""`make mutants` stays meaningful: every planted bug still finds the code it changes, once,
and names tests that exist (a refactoring that moves the code fails here, in `make test`,
not months later in a mutation run that silently plants nothing)."""

from __future__ import annotations

import ast

import pytest

from tests.support.mutants import MUTANTS, ROOT


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda mutant: mutant.name)
def test_each_mutant_changes_its_code_once_and_names_real_tests(mutant) -> None:
    source = (ROOT / mutant.file).read_text()
    assert source.count(mutant.old) == 1, f"{mutant.file} no longer holds {mutant.old!r} once"
    mutated = source.replace(mutant.old, mutant.new)
    assert mutated != source
    ast.parse(mutated)  # a mutant that does not even parse would be killed for nothing
    for selection in mutant.tests:
        path, _, name = selection.partition("::")
        assert (ROOT / path).is_file(), selection
        if name:
            tree = ast.parse((ROOT / path).read_text())
            assert name in {node.name for node in tree.body
                            if isinstance(node, ast.FunctionDef)}, selection


def test_mutant_names_are_unique() -> None:
    names = [mutant.name for mutant in MUTANTS]
    assert len(names) == len(set(names))
