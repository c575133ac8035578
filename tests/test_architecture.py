"""The house rules the package keeps as it grows: no import circles in `swerl/`, no module over 600 lines.

The import graph is read with `ast`, so the check needs no import of swerl (and no torch): every
`import` and `from ... import` counts, the lazy ones inside functions too (a lazy import that closes a
circle is a circle that only waits for a call order to bite), except those under `if TYPE_CHECKING:`,
which never run.
"""

from __future__ import annotations

import ast
import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "swerl"
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """CPython 3.11 keeps `ast.parse`'s recursion depth in module state: a garbage collection inside a parse
    whose finalizer parses too (a never-retrieved asyncio exception, logged with 3.11's caret traceback,
    which calls `ast.parse`) leaves the outer one a `SystemError: AST constructor recursion depth mismatch`
    (cpython gh-106905). Earlier tests' garbage must not fail this one."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The swerl modules `name` imports (a `from pkg import sub` of a submodule is an edge to `pkg.sub`)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_nodes(tree)
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in known:
                    out.add(sub)
                elif base in known:
                    out.add(base)
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    with _no_collection():
        return {m: imports_of(m, p, known) for m, p in mods.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_circle_finder_sees_a_circle_and_a_lazy_one(tmp_path: Path) -> None:
    # the finder itself, on a hand-made graph: a → b → c → a is one circle, d → a is not part of it
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    # and the reader: a lazy import inside a function is an edge, a TYPE_CHECKING one is not
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import swerl.x\n"
                 "def g():\n    from swerl.y import z\n")
    assert imports_of("swerl.m", f, {"swerl.x", "swerl.y", "swerl.y.z"}) == {"swerl.y.z"}


def test_no_import_circles_in_swerl() -> None:
    found = circles(import_graph())
    assert not found, ("import circles in swerl/ (move the shared piece into a module both import): "
                       + "; ".join(" ↔ ".join(c) for c in found))


def test_no_module_over_600_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in sorted(PKG.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split each by job): {long}"


def test_a_type_that_moved_is_refused_with_its_new_home() -> None:
    import importlib

    structs = importlib.import_module("swerl.structs")
    moved = r"swerl\.structs\.GradeResult moved: import it from swerl\.envs\.swe\.types"
    with pytest.raises(ImportError, match=moved):
        exec("from swerl.structs import GradeResult", {})
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        structs.NoSuchThing  # noqa: B018
    # and each moved name is importable from its new home
    for name, home in structs._MOVED.items():
        assert getattr(importlib.import_module(home), name).__name__ == name


def test_no_module_of_the_package_is_git_ignored() -> None:
    # an ignore pattern such as `build/` once swallowed the package's swerl/envs/swe/build/: the modules
    # were on disk, imported fine here, and absent from every clone
    import subprocess

    paths = [str(p.relative_to(ROOT)) for p in PKG.rglob("*.py") if "__pycache__" not in p.parts]
    got = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT, input="\n".join(paths),
                         capture_output=True, text=True)
    assert got.returncode in (0, 1), got.stderr
    assert not got.stdout.split(), f"git ignores modules of the package: {got.stdout.split()}"
