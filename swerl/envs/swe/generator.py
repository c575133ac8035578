"""Offline task generator: SWE-bench-schema bug-fix instances from small pure-Python libraries.

For a library (its sdist under tasks/swe/sources): build the library image (clean release + pytest),
run its tests on the clean tree, inject one bug at a time with `ast`-located edits (flip a
comparison / arithmetic / boolean operator, move an integer constant by one, delete a statement or an
`if` block, negate a condition, swap two call arguments), run the tests on the buggy tree, and keep
the bug when at least one test goes from passing to failing (FAIL_TO_PASS), at least one test in the
same test files keeps passing (PASS_TO_PASS), and a second run gives the same statuses. The kept
instance's repository at `base_commit` is the buggy tree; its gold `patch` (made by `git diff`)
restores the clean code. The problem statement describes the failing tests' symptoms only.
"""

from __future__ import annotations

import ast
import json
import random
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swebench.harness.constants import TestStatus
from swebench.harness.log_parsers import parse_log_pytest

from swerl.envs.swe.images import TASKS_ROOT, commit_command, extract_source, library_recipe
from swerl.envs.swe.types import SWEInstance
from swerl.sandbox import DockerSandbox, SandboxSpec
from swerl.sandbox.images import build_task_image

PYTEST = "python3 -m pytest -rA --tb=short -p no:cacheprovider -o addopts='' -W ignore::DeprecationWarning"
PASSING = {TestStatus.PASSED.value, TestStatus.XFAIL.value}


@dataclass(frozen=True)
class LibrarySpec:
    """A library the generator draws tasks from."""

    source: str
    """sdist file name under tasks/swe/sources (fetched once with `pip download --no-binary :all:`)."""
    code: tuple[str, ...]
    """Source files or folders (relative to the sdist root) where bugs are injected."""
    tests: tuple[str, ...]
    """Test files or folders passed to pytest."""
    split: str
    """`train` or `heldout`; a library is in exactly one."""
    pythonpath: str = ""
    """PYTHONPATH for the tests (e.g. `src` for src layouts)."""
    license: str = ""
    """The library's license (all permit redistribution of the source)."""
    exclude: tuple[str, ...] = ()
    """Path fragments of code files never mutated (version shims, compatibility modules)."""

    @property
    def name(self) -> str:
        from swerl.envs.swe.images import library_name

        return library_name(self.source).lower().replace("_", "-")

    def test_cmd(self, paths: tuple[str, ...] | list[str] | None = None) -> str:
        env = f"PYTHONPATH={self.pythonpath} " if self.pythonpath else ""
        return f"{env}{PYTEST} {' '.join(shlex.quote(p) for p in (paths or self.tests))}"


LIBRARIES: dict[str, LibrarySpec] = {s.name: s for s in (
    LibrarySpec("toolz-1.2.0.tar.gz", ("toolz",), ("toolz/tests",), "train", license="BSD-3-Clause",
                exclude=("tests/", "_version", "compatibility", "sandbox/", "curried/")),
    LibrarySpec("more_itertools-11.2.1.tar.gz", ("more_itertools",), ("tests",), "train", license="MIT"),
    LibrarySpec("cachetools-8.0.2.tar.gz", ("src/cachetools",), ("tests",), "train", pythonpath="src",
                license="MIT"),
    LibrarySpec("inflection-0.5.1.tar.gz", ("inflection",), ("test_inflection.py",), "heldout",
                license="MIT"),
    LibrarySpec("six-1.17.0.tar.gz", ("six.py",), ("test_six.py",), "heldout", license="MIT"),
)}


# ---- bug injection -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutation:
    """One injected bug: a byte-range replacement in one file."""

    path: str
    """File, relative to the repository root."""
    kind: str
    """What was done (for the record; never shown to the agent)."""
    start: tuple[int, int]
    """(line from 1, byte column) where the replaced text starts."""
    end: tuple[int, int]
    """(line, byte column) where it ends."""
    new: str
    """Replacement text."""

    def apply(self, source: str) -> str:
        lines = [ln.encode() for ln in source.splitlines(keepends=True)]
        (l0, c0), (l1, c1) = self.start, self.end
        head = b"".join(lines[: l0 - 1]) + lines[l0 - 1][:c0]
        tail = lines[l1 - 1][c1:] + b"".join(lines[l1:])
        return (head + self.new.encode() + tail).decode()


_CMP_SWAP = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">", ast.Eq: "!=", ast.NotEq: "==",
             ast.In: "not in", ast.NotIn: "in", ast.Is: "is not", ast.IsNot: "is"}
_CMP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
             ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
_BIN_SWAP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "//"), ast.FloorDiv: ("//", "*"),
             ast.Mod: ("%", "//")}


def _between(lines: list[bytes], a: ast.AST, b: ast.AST, old: str, new: str, path: str,
             kind: str) -> Mutation | None:
    """Replace operator `old` found between the end of `a` and the start of `b` (same line only)."""
    if a.end_lineno != b.lineno:  # type: ignore[attr-defined]
        return None
    line = lines[b.lineno - 1]  # type: ignore[attr-defined]
    gap = line[a.end_col_offset:b.col_offset]  # type: ignore[attr-defined]
    m = re.search(rb"(?<![=<>!*/%+-])" + re.escape(old.encode()) + rb"(?![=*/])", gap)
    if not m or gap.count(old.encode()) != 1:
        return None
    col = a.end_col_offset + m.start()  # type: ignore[attr-defined]
    return Mutation(path, kind, (b.lineno, col), (b.lineno, col + len(old)), new)  # type: ignore[attr-defined]


def _segment(node: ast.AST) -> tuple[tuple[int, int], tuple[int, int]]:
    return (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]


def mutations_for(path: str, source: str) -> list[Mutation]:
    """Every candidate bug in one file, in source order."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = [ln.encode() for ln in source.splitlines(keepends=True)]
    out: list[Mutation] = []
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                  and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}

    def seg_text(node: ast.AST) -> str:
        (l0, c0), (l1, c1) = _segment(node)
        if l0 != l1:
            return ""
        return lines[l0 - 1][c0:c1].decode()

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP_SWAP:
            op = type(node.ops[0])
            m = _between(lines, node.left, node.comparators[0], _CMP_TEXT[op], _CMP_SWAP[op], path,
                         "flip-compare")
            if m and " " not in _CMP_TEXT[op]:
                out.append(m)
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN_SWAP:
            old, new = _BIN_SWAP[type(node.op)]
            if (m := _between(lines, node.left, node.right, old, new, path, "flip-arithmetic")):
                out.append(m)
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            a, b = node.values
            if a.end_lineno == b.lineno:
                gap = lines[b.lineno - 1][a.end_col_offset:b.col_offset]
                m2 = re.search(rb"\b" + old.encode() + rb"\b", gap)
                if m2:
                    col = a.end_col_offset + m2.start()
                    out.append(Mutation(path, "flip-boolean", (b.lineno, col), (b.lineno, col + len(old)),
                                        new))
        elif (isinstance(node, ast.Constant) and type(node.value) is int and id(node) not in docstrings
              and node.lineno == node.end_lineno and seg_text(node) == str(node.value)):
            delta = 1 if node.value in (0, 1) or node.lineno % 2 else -1
            out.append(Mutation(path, "change-constant", *_segment(node), str(node.value + delta)))
        elif isinstance(node, ast.If) and node.lineno == node.test.end_lineno and seg_text(node.test):
            out.append(Mutation(path, "negate-condition", *_segment(node.test),
                                f"not ({seg_text(node.test)})"))
        elif (isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred)
              for a in node.args[:2]) and all(seg_text(a) for a in node.args[:2])
              and node.args[0].lineno == node.args[1].lineno):
            a, b = node.args[:2]
            if seg_text(a) != seg_text(b):
                text = lines[a.lineno - 1][a.col_offset:b.end_col_offset].decode()
                mid = text[len(seg_text(a)):len(text) - len(seg_text(b))]
                out.append(Mutation(path, "swap-arguments", (a.lineno, a.col_offset),
                                    (b.end_lineno, b.end_col_offset), seg_text(b) + mid + seg_text(a)))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.For | ast.While | ast.If | ast.With):
            body = node.body
            for stmt in body if len(body) > 1 else ():
                if isinstance(stmt, ast.Assign | ast.AugAssign | ast.If | ast.Expr | ast.For) and not (
                        isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                    if isinstance(stmt, ast.If) and stmt.orelse:
                        continue
                    # delete whole lines, so the indentation of what remains is untouched
                    first, last = stmt.lineno, stmt.end_lineno or stmt.lineno
                    if (lines[first - 1][:stmt.col_offset].strip()
                        or lines[last - 1][stmt.end_col_offset:].strip()):
                        continue
                    out.append(Mutation(path, f"remove-{type(stmt).__name__.lower()}", (first, 0),
                                        (last, len(lines[last - 1])), ""))
    out.sort(key=lambda m: (m.start, m.kind))
    return out


def candidate_mutations(lib: LibrarySpec, root: Path) -> list[Mutation]:
    files: list[Path] = []
    for p in lib.code:
        q = root / p
        files += sorted(q.rglob("*.py")) if q.is_dir() else [q]
    out: list[Mutation] = []
    for f in files:
        rel = f.relative_to(root).as_posix()
        if "test" in Path(rel).name or any(x in rel for x in lib.exclude):
            continue
        out += mutations_for(rel, f.read_text())
    return out


# ---- problem statements --------------------------------------------------------------------------


_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+?)(?: - (.*))?$", re.M)
_OPENERS = (
    "I'm seeing wrong results from {lib} {version}.",
    "Something in {lib} {version} seems to have regressed.",
    "After installing {lib} {version} from source, some of its behaviour is broken.",
    "There is a bug in {lib} {version}.",
)


def failure_messages(log: str) -> dict[str, str]:
    """test id → pytest's one-line failure reason (from the `-rA` short summary)."""
    return {m.group(1): (m.group(2) or "").strip() for m in _FAILED_LINE.finditer(log)}


def problem_statement(lib: LibrarySpec, version: str, f2p: list[str], messages: dict[str, str],
                      rng: random.Random) -> str:
    """An issue written from the symptoms: failing tests and their messages, nothing about the cause."""
    shown = f2p[:6]
    parts = [rng.choice(_OPENERS).format(lib=lib.name, version=version), ""]
    parts.append("Running the project's own test suite, these tests fail:" if len(f2p) > 1
                 else "Running the project's own test suite, this test fails:")
    parts.append("")
    for t in shown:
        msg = messages.get(t, "")
        msg = msg if len(msg) <= 300 else msg[:300] + " ..."
        parts.append(f"- `{t}`" + (f": `{msg}`" if msg else ""))
    if len(f2p) > len(shown):
        parts.append(f"- and {len(f2p) - len(shown)} more")
    parts += ["", "The other tests in the same files pass. The expected behaviour is the one the tests "
              "describe; please fix the library code (not the tests) so they pass again."]
    return "\n".join(parts) + "\n"


# ---- the generator -------------------------------------------------------------------------------


def _statuses(sb: DockerSandbox, cmd: str, timeout: float) -> tuple[dict[str, str], str]:
    # wide terminal: pytest cuts the short-summary reasons at the terminal width
    r = sb.run(f"cd /testbed && COLUMNS=400 {cmd} 2>&1", timeout=timeout)
    if r.timed_out:
        return {}, r.output
    return parse_log_pytest(r.output, None), r.output  # type: ignore[arg-type]


def root_commit_command(message: str, tree_dir: str = "/tmp/swerl-buggy") -> str:
    """Shell (run in /testbed) that commits the tracked files of the working tree as the root commit of
    a fresh repository in `tree_dir` and prints its sha: the base_commit the instance image builds
    (`images._instance_dockerfile`: the buggy tree, with no clean release in its history)."""
    return (f"rm -rf {tree_dir} && mkdir {tree_dir} && git ls-files -z | tar --null -T - -cf - | tar -xf - "
            f"-C {tree_dir} && (cd {tree_dir} && git init -q -b main && {commit_command(message)} && git "
            f"rev-parse HEAD) && rm -rf {tree_dir}")


def _sdist_version(source: str) -> str:
    m = re.match(r".+?-(\d[^-]*)\.tar\.gz$", source)
    return m.group(1) if m else ""


def generate_library(lib: LibrarySpec, *, max_instances: int = 20, max_candidates: int = 80, seed: int = 0,
                     max_fail_to_pass: int = 15, test_timeout: float = 120.0, tasks_root: Path = TASKS_ROOT,
                     client: Any = None, log: Callable[[str], None] | None = print,
                     start_index: int = 1) -> list[SWEInstance]:
    """Instances for one library (see the module docstring). Deterministic for a given seed."""
    say = log or (lambda _m: None)
    image = build_task_image(library_recipe(lib.source, tasks_root=tasks_root), client=client)
    root = extract_source(lib.source, tasks_root=tasks_root)
    version = _sdist_version(lib.source)
    rng = random.Random(f"{lib.name}-{seed}")
    cands = candidate_mutations(lib, root)
    rng.shuffle(cands)
    say(f"{lib.name}: {len(cands)} candidate bugs, trying up to {max_candidates}")
    out: list[SWEInstance] = []
    spec = SandboxSpec(image=image, network="none", memory="1g", output_limit=4_000_000,
                       default_timeout=test_timeout)
    with DockerSandbox(spec, client=client) as sb:
        clean_sha = sb.run("cd /testbed && git rev-parse HEAD").output.strip()
        clean, _ = _statuses(sb, lib.test_cmd(), test_timeout)
        clean2, _ = _statuses(sb, lib.test_cmd(), test_timeout)
        stable = {t for t, s in clean.items() if s in PASSING and clean2.get(t) == s
                  # ids with spaces reach the log parser cut at the space: unusable as exact names
                  and t.count("[") == t.count("]")}
        say(f"{lib.name}: {len(stable)} tests pass reliably on the clean tree")
        if not stable:
            raise RuntimeError(f"{lib.name}: no test passes on the clean tree; check LibrarySpec.tests")
        for n_try, mut in enumerate(cands[:max_candidates]):
            if len(out) >= max_instances:
                break
            original = (root / mut.path).read_text()
            sb.write_file(f"/testbed/{mut.path}", mut.apply(original))
            try:
                buggy, _ = _statuses(sb, lib.test_cmd(), test_timeout)
                f2p = sorted(t for t in stable if buggy.get(t) not in PASSING)
                if not buggy or not 1 <= len(f2p) <= max_fail_to_pass:
                    continue
                files = sorted({t.split("::", 1)[0] for t in f2p})
                p2p = sorted(t for t in stable if t.split("::", 1)[0] in files and buggy.get(t) in PASSING)
                if not p2p:
                    continue
                again, log_text = _statuses(sb, lib.test_cmd(files), test_timeout)
                if any((again.get(t) in PASSING) != (t in p2p) for t in (*f2p, *p2p)):
                    say(f"{lib.name}: candidate {n_try} is not reproducible; dropped")
                    continue
                iid = f"{lib.name}__{lib.name}-{start_index + len(out)}"
                # the gold patch: buggy → clean, as the diff of a throwaway commit of the bug on the clean one
                r = sb.run(f"cd /testbed && {root_commit_command(iid)} && {commit_command(iid)} && "
                           f"git diff --no-color HEAD {clean_sha} > /tmp/fix.diff; git reset -q --hard "
                           f"{clean_sha}")
                base_commit = r.output.strip().splitlines()[-1]
                gold = sb.read_text("/tmp/fix.diff")
                if not r.ok or len(base_commit) != 40 or not gold.strip():
                    raise RuntimeError(f"{lib.name}: committing the bug failed: {r.output[-500:]}")
                out.append(SWEInstance(
                    instance_id=iid, repo=f"swerl-synth/{lib.name}", base_commit=base_commit, patch=gold,
                    test_patch="", problem_statement=problem_statement(
                        lib, version, f2p, failure_messages(log_text), rng),
                    fail_to_pass=tuple(f2p), pass_to_pass=tuple(p2p), version=version,
                    created_at="2000-01-02T00:00:00Z", environment_setup_commit=clean_sha,
                    hints_text="", test_cmd=lib.test_cmd(files), source=lib.source, split=lib.split))
                say(f"{lib.name}: kept {iid} ({mut.kind} in {mut.path}:{mut.start[0]}; "
                    f"{len(f2p)} FAIL_TO_PASS, {len(p2p)} PASS_TO_PASS)")
            finally:
                sb.run(f"cd /testbed && git reset -q --hard {clean_sha} && git clean -fdq")
    return out


def iter_libraries(names: list[str] | None) -> Iterator[LibrarySpec]:
    for n in names or list(LIBRARIES):
        if n not in LIBRARIES:
            raise ValueError(f"unknown library {n!r}; known: {', '.join(LIBRARIES)}")
        yield LIBRARIES[n]


def write_suite(instances: list[SWEInstance], out_dir: Path) -> None:
    """instances.jsonl (all) + splits.json (library → split, ids per split) under `out_dir`."""
    from swerl.envs.swe.instances import write_instances

    out_dir.mkdir(parents=True, exist_ok=True)
    write_instances(instances, out_dir / "instances.jsonl")
    splits: dict[str, list[str]] = {}
    for i in instances:
        splits.setdefault(i.split, []).append(i.instance_id)
    libs = {spec.name: {"split": spec.split, "source": spec.source, "license": spec.license}
            for spec in LIBRARIES.values()}
    (out_dir / "splits.json").write_text(json.dumps({"libraries": libs, "splits": splits}, indent=1) + "\n")
