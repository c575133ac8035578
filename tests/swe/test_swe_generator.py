"""The bug injector and the problem statements (no Docker); the Docker side of the generator is
covered by the shipped suite's checks in test_swe_grading.py and by `swerl tasks generate`."""

from __future__ import annotations

import ast
import random
import re

from swerl.envs.swe.generator import (
    LIBRARIES,
    Mutation,
    failure_messages,
    mutations_for,
    problem_statement,
)

SRC = '''\
def clamp(x, lo, hi):
    """Docstring with 3 numbers 4 5."""
    if x < lo:
        return lo
    total = x + 1
    total = total * 2
    if hi >= x and lo <= x:
        return max(lo, min(x, hi))
    return hi
'''


def _kinds(muts):
    return {m.kind for m in muts}


def test_every_mutation_changes_the_code_and_still_parses():
    muts = mutations_for("m.py", SRC)
    assert {"flip-compare", "flip-arithmetic", "flip-boolean", "change-constant", "negate-condition",
            "swap-arguments", "remove-assign", "remove-if"} <= _kinds(muts)
    for m in muts:
        new = m.apply(SRC)
        assert new != SRC
        assert ast.dump(ast.parse(new)) != ast.dump(ast.parse(SRC)), m
    # docstring numbers are not constants to mutate
    assert all("Docstring" not in m.apply(SRC) or m.start[0] != 2 for m in muts)


def test_specific_edits_are_exact():
    by = {}
    for m in mutations_for("m.py", SRC):
        by.setdefault(m.kind, []).append(m.apply(SRC))
    assert "    if x <= lo:\n" in by["flip-compare"][0]
    assert any("total = x - 1" in s for s in by["flip-arithmetic"])
    assert any("if hi >= x or lo <= x:" in s for s in by["flip-boolean"])
    assert any("return max(min(x, hi), lo)" in s for s in by["swap-arguments"])
    assert any("if not (x < lo):" in s for s in by["negate-condition"])
    # removing a statement deletes whole lines, leaving the rest byte-identical
    removed = [s for s in by["remove-assign"] if "total = total * 2" not in s]
    assert removed and SRC.replace("    total = total * 2\n", "") in removed


def test_mutation_apply_uses_byte_columns_on_non_ascii_lines():
    src = 'x = "é" if 1 < 2 else 3\n'
    flip = next(m for m in mutations_for("m.py", src) if m.kind == "flip-compare")
    assert flip.apply(src) == 'x = "é" if 1 <= 2 else 3\n'
    assert Mutation("m.py", "k", (1, 0), (1, 1), "y").apply(src).startswith("y =")


def test_problem_statement_describes_symptoms_not_the_fix():
    log = ("FAILED tests/test_x.py::test_clamp - AssertionError: assert 4 == 3\n"
           "FAILED tests/test_x.py::test_other - IndexError: no such group\n")
    msgs = failure_messages(log)
    assert msgs == {"tests/test_x.py::test_clamp": "AssertionError: assert 4 == 3",
                    "tests/test_x.py::test_other": "IndexError: no such group"}
    text = problem_statement(LIBRARIES["toolz"], "1.2.0", sorted(msgs), msgs, random.Random(0))
    assert "tests/test_x.py::test_clamp" in text and "assert 4 == 3" in text
    assert "toolz 1.2.0" in text
    for leak in ("flip", "mutation", "line "):
        assert leak not in text
    assert not re.search(r"\.py:\d", text)  # no file:line location of the change


def test_libraries_are_split_without_overlap():
    splits = {}
    for lib in LIBRARIES.values():
        splits.setdefault(lib.split, set()).add(lib.name)
    assert set(splits) == {"train", "heldout"}
    assert not splits["train"] & splits["heldout"]
