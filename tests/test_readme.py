"""The README and docs/ as a new user reads them: every block a user would paste works.

Nothing here hard-codes the README's code: the Markdown is parsed (markdown-it, which `rich` depends
on) and every fenced block is checked by its language.

- ```python blocks run, each in a fresh interpreter from the repository root, as a user would paste
  them (on the real Docker engine and the real base image when they use the sandbox).
- ```bash blocks: every command line (continuations joined, comments and env-var prefixes dropped)
  is checked: a `swerl ...` command (also `torchrun -m swerl.cli`, `deepspeed --module swerl.cli`,
  `python -m swerl`) must parse with the real CLI parser; a `--config FILE` must load with the line's
  overrides; every repository path it names (`configs/`, `scripts/`, `tasks/`, ...) must exist. The
  commands that are cheap on a CPU (`CHEAP`) really run and must exit 0. Commands written inline in
  the prose (`swerl train --config ...`) get the same parse and path checks.
- Every relative link (`[text](path#anchor)`) in README.md and docs/*.md resolves to a file of the
  repository (one a clone has: not git-ignored) and, for Markdown targets, to a heading; no document
  points outside the repository (a clone has no `DESIGN.md` or `shared/`).
- Every `swerl.module.name` the documents cite exists, and every repository path they cite in
  inline code exists.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]

LANGUAGES = {"python", "bash", "text"}
"""Fence languages a document may use: python and bash blocks are tested; text is for diagrams and
output, never for something to paste."""

SHOWS = {
    "The sandbox harness": ("new file mode", "GIT binary patch", "calculator/calc/__init__.py"),
    "The agent loop": ("+    return sum(values) / len(values)",),
}
"""What a python block under a heading must print: a block that runs but no longer does what the text
around it says (the diff with the new and the binary file; the submitted fix) fails too."""

CHEAP = [("tasks", "list"), ("train", "--help-config")]
"""`swerl` argument prefixes whose commands are cheap on a CPU with no network: these really run (and so
does any `swerl ... --help`)."""

REPO_DIRS = ("configs", "scripts", "tasks", "sandbox", "swerl", "tests", "docs")
"""Top-level folders whose paths, when a document names them, must exist in the repository."""


# ---- parsing the documents -------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    heading: str

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def _tokens(doc: Path) -> list:
    return MarkdownIt("commonmark").enable("table").parse(doc.read_text(encoding="utf-8"))


def _inline_children(doc: Path):
    """(line, child token) of every inline element of the document; the line is the first one of the
    paragraph that holds the element's text (markdown-it maps only blocks to lines)."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    for tok in _tokens(doc):
        if tok.type == "inline" and tok.children:
            start, end = tok.map
            for child in tok.children:
                needle = child.attrs.get("href") or child.content
                line = next((n for n in range(start, end) if needle and str(needle) in lines[n]), start)
                yield line + 1, child


def blocks(doc: Path) -> list[Block]:
    out, heading, toks = [], "", _tokens(doc)
    for i, tok in enumerate(toks):
        if tok.type == "heading_open":
            heading = toks[i + 1].content
        elif tok.type in ("fence", "code_block"):
            out.append(Block(doc, tok.map[0] + 1,
                             tok.info.strip().split(" ")[0] if tok.type == "fence" else "", tok.content,
                             heading))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    toks = _tokens(doc)
    for i, tok in enumerate(toks):
        if tok.type == "heading_open":
            base = slug("".join(c.content for c in toks[i + 1].children or []))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


ALL_BLOCKS = [b for doc in DOCUMENTS for b in blocks(doc)]
PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "python"]
BASH_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "bash"]


# ---- shell command lines -----------------------------------------------------------------------------

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_OPERATORS = {"&&", "||", ";", "|", "&"}


def logical_lines(code: str) -> list[str]:
    """Lines of a shell block with backslash continuations joined."""
    out, cur = [], ""
    for line in code.splitlines():
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        out.append(cur + line)
        cur = ""
    if cur:
        out.append(cur)
    return [line for line in out if line.strip() and not line.lstrip().startswith("#")]


def simple_commands(line: str) -> list[list[str]]:
    """The simple commands of one command line (split at && || ; |), without env-var prefixes."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    lex.commenters = "#"
    words = list(lex)
    cmds = [list(g) for is_op, g in itertools.groupby(words, lambda w: w in _OPERATORS) if not is_op]
    return [cmd for cmd in (list(itertools.dropwhile(_ASSIGNMENT.match, c)) for c in cmds) if cmd]


def swerl_argv(cmd: list[str]) -> list[str] | None:
    """The `swerl` arguments of a command that runs the swerl CLI, else None."""
    if Path(cmd[0]).name == "swerl":
        return cmd[1:]
    for i, word in enumerate(cmd[:-1]):
        if word in ("-m", "--module") and cmd[i + 1] in ("swerl", "swerl.cli"):
            return cmd[i + 2:]
    return None


@dataclass(frozen=True)
class Command:
    where: str
    argv: tuple[str, ...]
    inline: bool

    @property
    def id(self) -> str:
        return f"{self.where} {shlex.join(self.argv)}"[:120]


def _inline_command_words(text: str) -> list[str] | None:
    """An inline code span that is a whole command of this repository: `swerl ...` (however launched),
    `bash scripts/x.sh`, `A=1 .venv/bin/python scripts/x.py ...`."""
    text = text.replace("…", "").replace("[", "").replace("]", "")  # `cmd [--opt]`: the option is optional
    for cmd in simple_commands(text):
        if len(cmd) >= 2 and (swerl_argv(cmd) is not None or (
                Path(cmd[0]).name in ("bash", "python", "python3") and cmd[1].endswith((".sh", ".py")))):
            return cmd
    return None


def commands() -> list[Command]:
    out = []
    for b in BASH_BLOCKS:
        for line in logical_lines(b.code):
            out += [Command(b.id, tuple(cmd), False) for cmd in simple_commands(line)]
    for doc in DOCUMENTS:
        for line, child in _inline_children(doc):
            if child.type == "code_inline" and (cmd := _inline_command_words(child.content)):
                out.append(Command(f"{doc.relative_to(ROOT)}:{line}", tuple(cmd), True))
    return out


COMMANDS = commands()


def _repo_paths(words) -> list[str]:
    """Words (or --opt=word values) that name a path under one of REPO_DIRS."""
    out = []
    for word in words:
        value = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
        if value.split("/", 1)[0] in REPO_DIRS and "/" in value:
            out.append(value)
    return out


def _expand_braces(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [q for alt in m.group(1).split(",")
            for q in _expand_braces(path[:m.start()] + alt + path[m.end():])]


def _exists(path: str) -> bool:
    return any(any(ROOT.glob(p)) if any(c in p for c in "*?") else (ROOT / p).exists()
               for p in _expand_braces(path))


# ---- the checks ------------------------------------------------------------------------------------


def test_the_documents_have_blocks_to_test():
    assert PYTHON_BLOCKS and BASH_BLOCKS, "the Markdown parser found no python / bash blocks in README.md"
    assert any(swerl_argv(list(c.argv)) for c in COMMANDS)


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.id)
def test_every_block_is_fenced_with_a_known_language(block):
    assert block.lang in LANGUAGES, (
        f"{block.id}: a code block must be fenced with one of {sorted(LANGUAGES)} (got {block.lang!r}; "
        "an indented block has none) so that this test knows how to check it")


def _needs_docker(b: Block) -> bool:
    return re.search(r"\bswerl\.sandbox\b|DockerSandbox|SandboxPool", b.code) is not None


def _python_param(b: Block):
    return pytest.param(b, id=b.id, marks=[pytest.mark.docker] if _needs_docker(b) else [])


@pytest.mark.parametrize("block", [_python_param(b) for b in PYTHON_BLOCKS])
def test_python_block_runs(block, request):
    if _needs_docker(block):
        request.getfixturevalue("base_image")  # the real base image exists (built once if not)
    # the environment carries conftest's SWERL_RUN_ID: the suite's last check sees any container left
    r = subprocess.run([sys.executable, "-c", block.code], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert r.returncode == 0, (
        f"the python block at {block.id} (under {block.heading!r}) fails as a user would paste it:\n"
        f"{r.stdout[-3000:]}\n{r.stderr[-6000:]}")
    missing = [text for text in SHOWS.get(block.heading, ()) if text not in r.stdout]
    assert not missing, (f"the python block at {block.id} ran but its output lacks {missing}:\n"
                         f"{r.stdout[-3000:]}")


_INCOMPLETE = ("the following arguments are required", "expected one argument",
               "expected at least one argument")
"""argparse's complaints about a command that is only cut short: prose may name `swerl plot` or
`swerl eval --game` without their arguments, but never a subcommand or an option that does not exist."""


def _parse_swerl(argv: list[str], *, partial: bool = False) -> argparse.Namespace | None:
    from swerl.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(argv)
    except SystemExit as e:
        if partial and any(m in err.getvalue() for m in _INCOMPLETE):
            return None
        raise AssertionError(f"`swerl {shlex.join(argv)}` does not parse (exit {e.code}): "
                             f"{err.getvalue()}") from None


def _cheap(argv: list[str]) -> bool:
    return "-h" in argv or "--help" in argv or any(tuple(argv[:len(p)]) == p for p in CHEAP)


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c.id)
def test_command_line(cmd):
    argv = list(cmd.argv)
    missing = [p for p in _repo_paths(argv) if not _exists(p)]
    assert not missing, (f"{cmd.where}: `{shlex.join(argv)}` names paths the repository does not have: "
                         f"{missing}")
    args = swerl_argv(argv)
    if argv[0] == "pip":  # installing an extra: it must be one pyproject.toml defines
        import tomllib

        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        m = re.fullmatch(r"\.\[([\w,]+)\]", argv[-1])
        assert argv[1:3] == ["install", "-e"] and m, f"{cmd.where}: {shlex.join(argv)}: not pip install -e"
        assert set(m.group(1).split(",")) <= set(extras), f"{cmd.where}: no such extra in {sorted(extras)}"
        return
    if argv[0] == "ray":  # a cluster node: `ray start`, a sandbox host offered by its resource name
        from swerl.cluster.config import HOST_RESOURCE_PREFIX

        assert argv[1] == "start" and ("--head" in argv or any(a.startswith("--address=") for a in argv)), cmd
        for a in argv:
            if a.startswith("--resources="):
                res = json.loads(a.split("=", 1)[1])
                assert all(k.startswith(HOST_RESOURCE_PREFIX) for k in res), f"{cmd.where}: {res}"
        return
    if args is None:
        # not the swerl CLI: a script run by a known program; the script itself must exist
        assert Path(argv[0]).name in ("bash", "python", "python3", "torchrun", "deepspeed") or \
            argv[0].endswith(
                "/python"), f"{cmd.where}: this test does not know how to check `{shlex.join(argv)}`"
        scripts = [w for w in argv[1:] if w.endswith((".sh", ".py"))]
        assert scripts, f"{cmd.where}: `{shlex.join(argv)}` runs no script of the repository"
        return
    if not any(a in ("-h", "--help") for a in args):
        ns = _parse_swerl(args, partial=cmd.inline)
        if ns is not None and getattr(ns, "config", None):
            from swerl.config import load
            from swerl.sft import SFTConfig
            from swerl.train import TrainConfig

            config = ROOT / ns.config
            assert config.is_file(), f"{cmd.where}: --config {ns.config} does not exist"
            schema = SFTConfig if args[0] == "sft" else TrainConfig
            load(schema, config, list(ns.overrides))  # raises on unknown keys or bad values
    if not cmd.inline and _cheap(args):
        exe = Path(sys.executable).with_name("swerl")
        assert exe.is_file(), f"the `swerl` console script is not installed next to {sys.executable}"
        r = subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (f"{cmd.where}: `{shlex.join(argv)}` exits {r.returncode}:\n"
                                   f"{r.stderr[-3000:]}")
        assert r.stdout.strip(), f"{cmd.where}: `{shlex.join(argv)}` printed nothing"


def test_the_cheap_commands_are_in_the_readme():
    """The CPU-cheap commands that run above are the README's own (a renamed one must not go unseen)."""
    used = [swerl_argv(list(c.argv)) for c in COMMANDS if not c.inline]
    for prefix in CHEAP:
        assert any(a is not None and tuple(a[:len(prefix)]) == prefix for a in used), prefix


def _links(doc: Path):
    for line, child in _inline_children(doc):
        if child.type == "link_open":
            yield line, child.attrs.get("href", "")
        elif child.type == "image":
            yield line, child.attrs.get("src", "")


LINKS = [(doc, line, href) for doc in DOCUMENTS for line, href in _links(doc)]


def _ignored(path: Path) -> bool:
    r = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT, capture_output=True)
    return r.returncode == 0


@pytest.mark.parametrize(("doc", "line", "href"), LINKS,
                         ids=[f"{d.relative_to(ROOT)}:{n}:{h}"[:100] for d, n, h in LINKS])
def test_relative_link_resolves(doc, line, href):
    if re.match(r"^[a-z][a-z0-9+.-]*:", href):  # https:, mailto: ...
        return
    path, _, anchor = href.partition("#")
    target = (doc.parent / path).resolve() if path else doc
    where = f"{doc.relative_to(ROOT)}:{line}: link {href!r}"
    assert target.is_relative_to(ROOT), f"{where} points outside the repository"
    assert target.exists(), f"{where}: {target.relative_to(ROOT)} does not exist"
    assert not _ignored(target), (f"{where}: {target.relative_to(ROOT)} is git-ignored, a clone does not "
                                  "have it")
    if anchor:
        assert target.suffix == ".md", f"{where}: an anchor into a non-Markdown file"
        assert anchor in anchors(target), f"{where}: {target.name} has no heading #{anchor}"


_OUTSIDE = re.compile(r"DESIGN\.md|\bshared/|\bpapers/")


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_no_document_points_outside_the_repository(doc):
    bad = [f"{n}: {line.strip()}" for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
           if _OUTSIDE.search(line)]
    assert not bad, f"{doc.relative_to(ROOT)} cites files a clone does not have: {bad}"


def _inline_codes():
    for doc in DOCUMENTS:
        for line, child in _inline_children(doc):
            if child.type == "code_inline":
                yield f"{doc.relative_to(ROOT)}:{line}", child.content


_DOTTED = re.compile(r"^swerl(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _resolve(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            if importlib.util.find_spec(name) is None:
                continue
        except ModuleNotFoundError:  # a parent is a module, not a package
            continue
        obj = importlib.import_module(name)
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_cited_swerl_names_exist():
    cited = sorted({(where, text) for where, text in _inline_codes() if _DOTTED.match(text)})
    assert cited
    missing = [f"{where}: {text}" for where, text in cited if not _resolve(text)]
    assert not missing, f"the documents cite names swerl does not have: {missing}"


def test_cited_repository_paths_exist():
    cited = [(where, text) for where, text in _inline_codes()
             if " " not in text and text.split("/", 1)[0] in REPO_DIRS and "/" in text]
    assert cited
    missing = [f"{where}: {text}" for where, text in cited if not _exists(text.rstrip("/"))]
    assert not missing, f"the documents cite paths the repository does not have: {missing}"


def test_architecture_lists_every_module_of_the_package():
    """docs/architecture.md describes the package as it is: every module and subpackage is named there."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    layout = doc[doc.index("## The package today"):doc.index("## Which way imports point")]
    package = ROOT / "swerl"
    names = {p.stem for p in package.rglob("*.py")
             if p.name != "__init__.py" and "__pycache__" not in p.parts}
    names |= {p.parent.name for p in package.rglob("__init__.py") if p.parent != package}
    missing = sorted(n for n in names if not re.search(rf"(?<![\w/]){re.escape(n)}(?!\w)", layout))
    assert not missing, f"docs/architecture.md's 'The package today' does not mention {missing}: update it"
