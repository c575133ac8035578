"""The published row forms besides SWE-bench's, made SWE-bench-form records that
`swerl.envs.swe.instances` validates, each with how its tests run; and SWE-Gym's own spec tables.

A row's form is told from its fields (`detect_form`); a row with the fields of two forms is an error,
never a guess:

- `swebench`: SWE-bench, Lite, Verified, SWE-Gym and sets in their schema (`test_patch`, `version`,
  ...). Rows as published are completed by `swerl.envs.swe.specs`: from SWE-bench's spec tables, or,
  for the repositories SWE-Gym added (`SWEGYM_REPOS`), from SWE-Gym's (`derive_swegym`).
- `swesmith`: SWE-smith's task instances (`image_name`; `patch` is the diff that *creates* the bug).
  The gold patch is that diff reversed; the tests run in the row's `image_name` as the repository's
  SWE-smith profile runs them (swesmith `SWESMITH_RELEASE`, in a process of its own), plus pytest's
  `-rA` summary, so that swebench's `parse_log_pytest` reads the outcomes the profile's own parser reads
  from the verbose lines. Python profiles with SWE-smith's default pytest parser are supported; any
  other profile is a clear error. The start state: SWE-smith's images hold its mirror of the repository
  (one commit, the clean code) and its harness fetches the instance's bug branch from GitHub; swerl
  instead commits the bug patch onto the image's HEAD in the scrubbed layer (base_commit `IMAGE_HEAD`,
  `setup_patch` the bug). A row's own `base_commit`, where an export has one, names a commit of that
  branch, which no image holds, so it is not used. Unlike SWE-smith's branches, the FAIL_TO_PASS test
  files are not removed from the agent's tree.
- `r2egym`: R2E-Gym's rows (`docker_image`, `parsed_commit_content`, `execution_result_content`,
  `expected_output_json`; no instance_id: it is made `<owner>__<repo>-<fixed commit>`). The start
  state is the commit's parent (the image checks it out); the gold patch is the commit's non-test
  Python diffs and test_patch its test-file ones, as R2E-Gym's `ParsedCommit.get_patch` writes them (its
  validation applies both); the tests are R2E-Gym's own, from the image's /r2e_tests, run with the
  command R2E-Gym wrote to run_tests.sh. R2E-Gym rewards a run whose parsed outcomes equal
  `expected_output_json` exactly; swerl converts that into FAIL_TO_PASS / PASS_TO_PASS: the tests
  R2E-Gym expects to pass, named as swebench's `parse_log_pytest` names them in the run recorded at the
  fixed commit, split by the run recorded at the buggy one (both in `execution_result_content`). The
  conversion is checked against `expected_output_json`: the tests it requires to pass are exactly those
  R2E-Gym expects to pass, or the row is refused. Not carried over: R2E-Gym also wants the tests
  expected to fail to keep failing (and the same number of tests); swerl asks that the expected passes
  pass.

Run as a script (`python forms.py swesmith|swegym`, JSON on stdin and stdout) this file is the process
that imports swesmith or SWE-Gym's fork of swebench, never swerl's pinned swebench: it imports only the
standard library at the top for that reason.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

FORMS = ("swebench", "swesmith", "r2egym")
FORM_NAMES = {"swebench": "SWE-bench", "swesmith": "SWE-smith", "r2egym": "R2E-Gym"}
MARKERS = {
    "swebench": ("test_patch",),
    "swesmith": ("image_name",),
    "r2egym": ("docker_image", "parsed_commit_content", "execution_result_content", "expected_output_json"),
}
"""The fields that tell a form: SWE-bench's `test_patch` (no SWE-smith or R2E-Gym row has one), SWE-smith's
`image_name` (swesmith 0.0.9 harness/gather.py writes it, next to instance_id, repo, patch, FAIL_TO_PASS
and PASS_TO_PASS), and R2E-Gym's own columns (R2E-Gym's agenthub/runtime/docker.py reads them)."""

SWESMITH_RELEASE = "0.0.9"
"""The swesmith release whose repository profiles (`swesmith.profiles`) say how each repository's tests
run. It imports `swebench.harness.constants.DOCKER_USER`, which swerl's pinned swebench 5 no longer
has, so it runs next to the spec release of `swerl.envs.swe.specs` (4.1.0), in its own process."""

SWEGYM_FORK = "https://github.com/SWE-Gym/SWE-Bench-Fork"
SWEGYM_FORK_COMMIT = "242429c188fcfd06aad13fce9a54d450470bf0ac"
"""SWE-Gym keeps its environment specs in a fork of swebench 2.0.13 (SWE-Gym's README: "The environment
constants are currently saved at SWE-Bench-Fork"), not on PyPI: this commit of it, fetched with git into
the cache on first use, or named by the environment variable `SWERL_SWEGYM_FORK` (a checkout)."""

SWEGYM_REPOS = frozenset(r.lower() for r in (
    "python/mypy", "getmoto/moto", "conan-io/conan", "dask/dask", "Project-MONAI/MONAI", "iterative/dvc",
    "bokeh/bokeh", "modin-project/modin", "spyder-ide/spyder", "HypothesisWorks/hypothesis",
    "pydantic/pydantic", "pandas-dev/pandas", "facebookresearch/hydra"))
"""The repositories SWE-Gym's fork adds to swebench's spec tables (its swebench/harness/constants.py,
lines 1700-2020, at `SWEGYM_FORK_COMMIT`); none has a spec in SWE-bench's own tables."""

SWEGYM_IMAGE_PREFIX = "xingyaoww/sweb.eval.x86_64."
"""SWE-Gym's prebuilt instance images (its README: "pre-built docker images for each instance under
xingyaoww/sweb.eval.x86_64"), named as OpenHands names them: `__` spelt `_s_`, lower case
(OpenHands evaluation/benchmarks/swe_bench/run_infer.py, `get_instance_docker_image`)."""

R2E_REVISION = "R2E-Gym/R2E-Gym@69bc953"
R2E_REPOS = {
    "aiohttp": "aio-libs/aiohttp", "coveragepy": "nedbat/coveragepy", "datalad": "datalad/datalad",
    "numpy": "numpy/numpy", "orange3": "biolab/orange3", "pandas": "pandas-dev/pandas",
    "pillow": "python-pillow/Pillow", "pyramid": "Pylons/pyramid", "scrapy": "scrapy/scrapy",
    "sympy": "sympy/sympy", "tornado": "tornadoweb/tornado",
}
"""R2E-Gym's `repo_name` → the GitHub repository its image clones (the `git clone` line of each
src/r2egym/repo_analysis/base_dockerfiles/Dockerfile.<repo_name>)."""

_R2E_PYTEST = ("PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' .venv/bin/python -W ignore -m "
               "pytest -rA r2e_tests")
R2E_TESTS_CMD = {name: _R2E_PYTEST for name in R2E_REPOS}
R2E_TESTS_CMD["orange3"] = ("QT_QPA_PLATFORM=minimal "
                            "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' xvfb-run "
                            "--auto-servernum .venv/bin/python -W ignore -m pytest -rA r2e_tests")
"""The command R2E-Gym writes to run_tests.sh (src/r2egym/repo_analysis/repo_analysis_args.py,
`tests_cmd`; repo_testextract.py writes it out), run in /testbed."""
R2E_RUNNERS = {
    "tornado": ("tornado_unittest_runner.py",
                ".venv/bin/python -W ignore r2e_tests/tornado_unittest_runner.py"),
    "pillow": ("unittest_custom_runner.py", ".venv/bin/python -W ignore r2e_tests/unittest_custom_runner.py"),
}
"""repo_testextract.py's exceptions: tornado's tests (and pillow's unittest-style ones, whose test files
then include the runner) run with R2E-Gym's pytest-like unittest runner, shipped among the test files."""

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m|\r")


class FormError(ValueError):
    """A row in a published form lacks what its form needs, or swerl cannot grade it as its set does."""


def _where(record: Any, index: int, origin: str) -> str:
    iid = record.get("instance_id") if isinstance(record, dict) else None
    return f"{origin} record {index}" + (f" ({iid})" if isinstance(iid, str) and iid else "")


def _plain(value: Any) -> Any:
    """parquet / datasets hand back numpy arrays for list columns."""
    return value.tolist() if hasattr(value, "tolist") else value


def detect_form(record: dict, *, where: str = "record") -> str:
    """The row's form (one of `FORMS`) from the fields it has; `swebench` when it has none of the
    telling fields (its own validation then names what is missing). Fields of two forms: FormError."""
    present = {form: [f for f in fields if record.get(f) is not None] for form, fields in MARKERS.items()}
    found = [form for form, fields in present.items() if fields]
    if len(found) > 1:
        parts = " and ".join(f"{FORM_NAMES[f]}'s {', '.join(present[f])}" for f in found)
        raise FormError(f"{where}: ambiguous row form: it has {parts}; a row must be in one published "
                        "schema (drop the other form's fields)")
    return found[0] if found else "swebench"


def convert_rows(records: list[Any], *, origin: str, indices: list[int] | None = None) -> list[Any]:
    """The records with every SWE-smith and R2E-Gym row made a SWE-bench-form record (SWE-bench rows and
    anything that is not a dict are left as they are, for `parse_instance` to judge). `indices`: the
    records' positions in their source, for the messages (default 0, 1, ...)."""
    indices = indices if indices is not None else list(range(len(records)))
    out = list(records)
    smith: list[int] = []
    for k, (i, rec) in enumerate(zip(indices, records, strict=True)):
        if not isinstance(rec, dict):
            continue
        form = detect_form(rec, where=_where(rec, i, origin))
        if form == "r2egym":
            out[k] = r2egym_record(rec, where=_where(rec, i, origin))
        elif form == "swesmith":
            _swesmith_fields(rec, _where(rec, i, origin))
            smith.append(k)
    if smith:
        answers = _run_oracle("swesmith", [_swesmith_request(records[k]) for k in smith])
        for k, answer in zip(smith, answers, strict=True):
            out[k] = swesmith_record(records[k], answer, where=_where(records[k], indices[k], origin))
    return out


# ----------------------------------------------------------------------------------------- SWE-smith

IMAGE_HEAD = "HEAD"
"""base_commit of a row whose image defines its start (SWE-smith's: the mirror's one commit, a hash
no row records): the image's HEAD, on top of which the scrubbed layer commits the `setup_patch`."""

def _swesmith_fields(rec: dict, where: str) -> None:
    """The SWE-smith row's own fields, before its profile is asked anything."""
    for field in ("instance_id", "repo", "patch", "image_name", "problem_statement"):
        if rec.get(field) is None:
            raise FormError(f"{where}: SWE-smith row: missing field {field!r}")
        if not isinstance(rec[field], str):
            raise FormError(f"{where}: SWE-smith row: field {field!r} must be a string, got "
                            f"{type(rec[field]).__name__}")
    for field in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        if rec.get(field) is None:
            raise FormError(f"{where}: SWE-smith row: missing field {field!r}")
        _test_ids(rec[field], field, f"{where}: SWE-smith row")


def _test_ids(value: Any, field: str, where: str) -> list[str]:
    value = _plain(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise FormError(f"{where}: field {field!r} is a string but not JSON ({e})") from None
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise FormError(f"{where}: field {field!r} must be a list of test-id strings, got "
                        f"{type(value).__name__}")
    return list(value)


def _swesmith_request(rec: dict) -> dict:
    """What the profile oracle needs of a row whose fields `_swesmith_fields` checked."""
    return {"instance_id": rec["instance_id"], "repo": rec["repo"],
            "FAIL_TO_PASS": _test_ids(rec["FAIL_TO_PASS"], "FAIL_TO_PASS", ""),
            "PASS_TO_PASS": _test_ids(rec["PASS_TO_PASS"], "PASS_TO_PASS", "")}


_PLAIN_PYTEST = re.compile(r"^(\S*/)?(uv run )?pytest(\s|$)")
_SHELL_OPS = re.compile(r"[|&<>`$()]")


def swesmith_record(rec: dict, answer: dict, *, where: str) -> dict:
    """The SWE-bench-form record of a SWE-smith row, given what its profile says (`_oracle_swesmith`)."""
    if "error" in answer:
        raise FormError(f"{where}: SWE-smith row: {answer['error']}")
    profile = f"{answer['profile']} ({answer['owner']}/{answer['name']}@{answer['commit'][:8]})"
    if answer["language"] != "python":
        raise FormError(f"{where}: SWE-smith row: its profile {profile} is a {answer['language']} profile; "
                        "swerl runs SWE-smith's Python profiles only (their pytest logs are what swerl's "
                        "grading reads)")
    if not answer["default_parser"]:
        raise FormError(f"{where}: SWE-smith row: its profile {profile} parses test logs with its own "
                        f"{answer['parser_class']}.log_parser, which no swebench log parser is known to "
                        "match")
    if "test_cmd" not in answer:
        raise FormError(f"{where}: SWE-smith row: instance_id does not start with its profile's name "
                        f"{answer['repo_name']!r}, as swesmith's get_test_cmd requires")
    cmd = answer["test_cmd"]
    last = cmd.split(";")[-1].strip()
    if not _PLAIN_PYTEST.match(last) or _SHELL_OPS.search(last):
        raise FormError(f"{where}: SWE-smith row: its profile {profile} runs {cmd!r}, not a plain pytest run "
                        "swerl can ask for pytest's -rA summary")
    out = {"instance_id": rec["instance_id"], "repo": rec["repo"], "base_commit": IMAGE_HEAD,
           "setup_patch": rec["patch"], "patch": reverse_patch(rec["patch"], where=where), "test_patch": "",
           "problem_statement": rec["problem_statement"],
           "FAIL_TO_PASS": _test_ids(rec["FAIL_TO_PASS"], "FAIL_TO_PASS", where),
           "PASS_TO_PASS": _test_ids(rec["PASS_TO_PASS"], "PASS_TO_PASS", where),
           "image": rec["image_name"], "test_cmd": f"{cmd} -rA", "log_parser": "parse_log_pytest",
           "eval_type": "pass_and_fail"}
    for field in ("created_at", "hints_text", "split"):
        if rec.get(field) is not None:
            out[field] = rec[field]
    return out


def _oracle_swesmith(rows: list[dict]) -> list[dict]:
    """(oracle process) Each row's profile: language, parser, and its test command as swesmith's own
    `get_test_cmd` makes it (no patch is passed, so it never clones anything)."""
    import swesmith
    from swesmith.profiles import registry
    from swesmith.profiles.python import PythonProfile

    out = []
    for row in rows:
        try:
            rp = registry.get_from_inst(row)
        except KeyError:
            out.append({"error": f"swesmith {getattr(swesmith, '__version__', SWESMITH_RELEASE)} has no "
                                 f"repository profile for {row['repo']!r}, so there is no way to know how "
                                 "its tests run"})
            continue
        cls = type(rp)
        parser_owner = next(k for k in cls.__mro__ if "log_parser" in vars(k))
        info = {"profile": cls.__name__, "language": cls.__module__.rsplit(".", 1)[-1], "owner": rp.owner,
                "name": rp.repo, "commit": rp.commit, "repo_name": rp.repo_name,
                "default_parser": parser_owner is PythonProfile, "parser_class": parser_owner.__name__}
        if row["instance_id"].rsplit(".", 1)[0] == rp.repo_name:
            info["test_cmd"] = rp.get_test_cmd(row)[0]
        out.append(info)
    return out


def swesmith_release_dir(root: Path | None = None) -> Path:
    """The unpacked swesmith `SWESMITH_RELEASE` wheel (fetched from PyPI the first time)."""
    from swerl.envs.swe.specs import unpacked_wheel

    return unpacked_wheel("swesmith", SWESMITH_RELEASE, root,
                          why="its repository profiles say how SWE-smith rows' "
                          "tests run")


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_GIT_HEADER = re.compile(r"^diff --git (a/.*) (b/.*)$")


def _swap_git_header(line: str, where: str) -> str:
    m = _GIT_HEADER.match(line)
    if not m:
        raise FormError(f"{where}: field 'patch': cannot read the diff header {line[:120]!r}")
    rest = line[len("diff --git "):]
    # a/X b/X: split where both halves name the same path; else at the last " b/"
    half = (len(rest) - 1) // 2
    if rest[half] == " " and rest[:half][2:] == rest[half + 1:][2:]:
        a, b = rest[:half], rest[half + 1:]
    else:
        a, b = m.group(1), m.group(2)
    return f"diff --git a/{b[2:]} b/{a[2:]}"


def reverse_patch(patch: str, *, where: str = "patch") -> str:
    """A git diff reversed (what `git apply -R` applies), as text: SWE-smith's `patch` creates the bug,
    so its reverse is the fix. Binary and copy diffs are refused."""
    if not patch.strip():
        raise FormError(f"{where}: field 'patch' is empty: a SWE-smith row's patch is the diff that creates "
                        "its bug")
    lines = patch.split("\n")
    trailing_newline = lines[-1] == ""
    if trailing_newline:
        lines.pop()
    out: list[str] = []
    i = 0
    if not lines or not lines[0].startswith("diff --git "):
        raise FormError(f"{where}: field 'patch' is not a git diff (it does not start with 'diff --git')")
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            out.append(_swap_git_header(line, where))
            i += 1
            header: list[str] = []
            while i < len(lines) and not lines[i].startswith(("@@", "diff --git ")):
                header.append(lines[i])
                i += 1
            out.extend(_reverse_header(header, where))
            continue
        m = _HUNK.match(line)
        if not m:
            raise FormError(f"{where}: field 'patch': unexpected line {line[:120]!r} where a hunk should "
                            "start")
        old_n = int(m.group(2)) if m.group(2) is not None else 1
        new_n = int(m.group(4)) if m.group(4) is not None else 1
        out.append(f"@@ -{m.group(3)}{'' if m.group(4) is None else ',' + m.group(4)} "
                   f"+{m.group(1)}{'' if m.group(2) is None else ',' + m.group(2)} @@{m.group(5)}")
        i += 1
        body: list[tuple[str, list[str]]] = []  # (kind, [line, its '\ No newline' marker])
        while old_n > 0 or new_n > 0:
            if i >= len(lines):
                raise FormError(f"{where}: field 'patch': a hunk ends before its line counts say")
            text = lines[i]
            kind = text[:1] if text else " "
            if kind not in " +-":
                raise FormError(f"{where}: field 'patch': unexpected hunk line {text[:120]!r}")
            old_n -= kind in " -"
            new_n -= kind in " +"
            entry = [text if text else " "]
            i += 1
            if i < len(lines) and lines[i].startswith("\\"):
                entry.append(lines[i])
                i += 1
            body.append((kind, entry))
        out.extend(_reverse_body(body))
        while i < len(lines) and lines[i].startswith("\\"):
            out.append(lines[i])
            i += 1
    return "\n".join(out) + ("\n" if trailing_newline else "")


def _reverse_body(body: list[tuple[str, list[str]]]) -> list[str]:
    """A hunk's lines reversed: what the bug added the fix removes and the other way round; in each run
    of changed lines the removals come first, as git writes them."""
    out: list[str] = []
    minus: list[list[str]] = []
    plus: list[list[str]] = []
    for kind, entry in [*body, (" ", [])]:
        if kind == " ":
            for e in minus + plus:
                out.extend(e)
            minus.clear()
            plus.clear()
            out.extend(entry)
        elif kind == "+":  # added by the bug: the fix removes it
            minus.append(["-" + entry[0][1:], *entry[1:]])
        else:
            plus.append(["+" + entry[0][1:], *entry[1:]])
    return out


def _reverse_header(header: list[str], where: str) -> list[str]:
    """A file's extended header lines, for the reversed diff: creation and deletion, old and new
    mode, rename source and target, the index's blob ids and the ---/+++ paths trade places."""
    out: list[str] = []
    modes: dict[str, str] = {}
    renames: dict[str, str] = {}
    minus = plus = None
    for line in header:
        if line.startswith(("GIT binary patch", "Binary files ")):
            raise FormError(f"{where}: field 'patch' has a binary diff, which swerl does not reverse")
        if line.startswith(("copy from ", "copy to ")):
            raise FormError(f"{where}: field 'patch' has a copy, which swerl does not reverse")
        if line.startswith("new file mode "):
            out.append("deleted file mode " + line[len("new file mode "):])
        elif line.startswith("deleted file mode "):
            out.append("new file mode " + line[len("deleted file mode "):])
        elif line.startswith(("old mode ", "new mode ")):
            modes[line[:3]] = line[len("old mode "):]
        elif line.startswith(("rename from ", "rename to ")):
            if not renames:
                out.append("\0renames")
            kind, _, path = line[len("rename "):].partition(" ")
            renames[kind] = path
        elif line.startswith("index "):
            m = re.match(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)(.*)$", line)
            if not m:
                raise FormError(f"{where}: field 'patch': cannot read {line[:120]!r}")
            out.append(f"index {m.group(2)}..{m.group(1)}{m.group(3)}")
        elif line.startswith("--- "):
            minus = line[4:]
        elif line.startswith("+++ "):
            plus = line[4:]
        else:
            out.append(line)
    if renames:
        k = out.index("\0renames")
        out[k:k + 1] = [f"rename from {renames.get('to', '')}", f"rename to {renames.get('from', '')}"]
    if modes:
        out[:0] = [f"old mode {modes.get('new', '')}", f"new mode {modes.get('old', '')}"]
    if minus is not None and plus is not None:
        def flip(path: str, prefix: str) -> str:
            return path if path == "/dev/null" else prefix + path[2:]
        out += [f"--- {flip(plus, 'a/')}", f"+++ {flip(minus, 'b/')}"]
    return out


# ------------------------------------------------------------------------------------------ R2E-Gym

def _json_field(rec: dict, field: str, where: str) -> Any:
    value = rec.get(field)
    if value is None:
        raise FormError(f"{where}: R2E-Gym row: missing field {field!r}")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise FormError(f"{where}: R2E-Gym row: field {field!r} is not valid JSON ({e})") from None
    return value


def _get(obj: Any, path: str, field: str, where: str, kind: type | tuple[type, ...] = str) -> Any:
    cur = obj
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            raise FormError(f"{where}: R2E-Gym row: field {field!r} has no {path!r}")
        cur = cur[key]
    if not isinstance(cur, kind):
        raise FormError(f"{where}: R2E-Gym row: {field}.{path} must be {getattr(kind, '__name__', kind)}, "
                        f"got {type(cur).__name__}")
    return cur


def _r2e_is_test_file(path: str) -> bool:
    """R2E-Gym's `FileDiff.is_test_file` (src/r2egym/commit_models/diff_classes.py)."""
    parts = path.split("/")
    return (path.endswith("_test.py") or path.startswith("test_") or parts[-1].startswith("test_")
            or any(p in parts for p in ("tests", "Tests", "test", "Test")))


def _r2e_range(r: dict, where: str) -> str:
    start = _get(r, "start", "parsed_commit_content", where, int)
    length = r.get("length")
    return f"{start}" if length is None else f"{start},{length}"


_R2E_LINE = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}


def _r2e_file_patch(fd: dict, where: str) -> str:
    """R2E-Gym's `FileDiff.get_patch`: the file's diff as git wrote it (R2E-Gym checks the round trip
    when it stores a commit: src/r2egym/repo_analysis/store_repo_commits.py)."""
    f = "parsed_commit_content"
    path = _get(fd, "header.file.path", f, where)
    patch = f"diff --git a/{path} b/{path}\n"
    misc = fd["header"].get("misc_line")
    if misc:
        patch += misc + "\n"
    index = fd.get("index_line")
    if index:
        mode = index.get("mode") or ""
        patch += (f"index {_get(index, 'old_commit_hash', f, where)}.."
                  f"{_get(index, 'new_commit_hash', f, where)}{' ' if mode else ''}{mode}\n")
    if fd.get("is_binary_file"):
        patch += _get(fd, "binary_line", f, where) + "\n"
    if fd.get("minus_file") and fd.get("plus_file"):
        patch += f"--- {_get(fd, 'minus_file.path', f, where)}\n+++ {_get(fd, 'plus_file.path', f, where)}\n"
    for hunk in fd.get("hunks") or []:
        d = _get(hunk, "descriptor", f, where, dict)
        section = d.get("section") or ""
        patch += (f"@@ -{_r2e_range(_get(d, 'old_range', f, where, dict), where)} "
                  f"+{_r2e_range(_get(d, 'new_range', f, where, dict), where)} "
                  f"@@{' ' + section if section else ''}\n")
        for line in _get(hunk, "line_group.all_lines", f, where, list):
            kind = line.get("type") if isinstance(line, dict) else None
            if kind not in _R2E_LINE or not isinstance(line.get("content"), str):
                raise FormError(f"{where}: R2E-Gym row: {f} has a hunk line that is not "
                                "{content, type: context|added|deleted|note}")
            patch += f"{_R2E_LINE[kind]}{line['content']}\n"
    return patch


def r2e_patches(parsed: dict, where: str) -> tuple[str, str]:
    """(fix, tests): the commit's non-test and test Python file diffs, as R2E-Gym's
    `ParsedCommit.get_patch(test_file=False)` / `get_patch(non_test_file=False)` make them (Python files
    only, its default)."""
    diffs = _get(parsed, "file_diffs", "parsed_commit_content", where, list)
    fix = tests = ""
    for fd in diffs:
        if not isinstance(fd, dict):
            raise FormError(f"{where}: R2E-Gym row: parsed_commit_content.file_diffs holds a "
                            f"{type(fd).__name__}")
        path = _get(fd, "header.file.path", "parsed_commit_content", where)
        if not path.endswith(".py"):
            continue
        if _r2e_is_test_file(path):
            tests += _r2e_file_patch(fd, where)
        else:
            fix += _r2e_file_patch(fd, where)
    return fix, tests


def _r2e_key(test_id: str) -> str:
    """How R2E-Gym's parse_log_pytest names a test (src/r2egym/repo_analysis/execution_log_parser.py):
    the node id without its file, `::` as `.`, the ' - message' cut (docker.py `_calculate_reward_r2e`)."""
    return ".".join(test_id.split("::")[1:]).split(" - ")[0]


def _r2e_statement(text: str) -> str:
    """What R2E-Gym shows the agent: the text between [ISSUE] and [/ISSUE] when there is one
    (agenthub/runtime/docker.py `get_task_instruction`)."""
    m = re.search(r"\[ISSUE\](.*)\[/ISSUE\]", text, re.DOTALL)
    return m.group(1) if m else text


def r2egym_record(rec: dict, *, where: str) -> dict:
    """The SWE-bench-form record of an R2E-Gym row (see the module docstring for the conversion)."""
    from swebench.harness.constants import TestStatus
    from swebench.harness.log_parsers import PARSER_REGISTRY

    for field in ("repo_name", "docker_image", "problem_statement"):
        if rec.get(field) is None:
            raise FormError(f"{where}: R2E-Gym row: missing field {field!r}")
        if not isinstance(rec[field], str):
            raise FormError(f"{where}: R2E-Gym row: field {field!r} must be a string, got "
                            f"{type(rec[field]).__name__}")
    name = rec["repo_name"]
    if name not in R2E_REPOS:
        raise FormError(f"{where}: R2E-Gym row: repo_name {name!r} has no base Dockerfile and test command "
                        f"in {R2E_REVISION} (it has them for {', '.join(sorted(R2E_REPOS))}), so there is no "
                        "way to know its repository or how its tests run")
    parsed = _json_field(rec, "parsed_commit_content", where)
    result = _json_field(rec, "execution_result_content", where)
    expected = _json_field(rec, "expected_output_json", where)
    if not isinstance(parsed, dict) or not isinstance(result, dict) or not isinstance(expected, dict):
        raise FormError(f"{where}: R2E-Gym row: parsed_commit_content, execution_result_content and "
                        "expected_output_json must each hold a JSON object")
    old, new = (_get(parsed, k, "parsed_commit_content", where)
                for k in ("old_commit_hash", "new_commit_hash"))
    for label, sha in (("old_commit_hash", old), ("new_commit_hash", new)):
        if not _HEX40.match(sha):
            raise FormError(f"{where}: R2E-Gym row: parsed_commit_content.{label} {sha!r} is not a 40-hex "
                            "commit")
    for field, value in (("commit_hash", rec.get("commit_hash")),
                         ("execution_result_content.new_commit_hash", result.get("new_commit_hash"))):
        if value is not None and value != new:
            raise FormError(f"{where}: R2E-Gym row: {field} {value!r} is not parsed_commit_content's "
                            f"new_commit_hash {new!r}")
    owner_repo = R2E_REPOS[name]
    iid = rec.get("instance_id")
    if iid is not None and not isinstance(iid, str):
        raise FormError(f"{where}: R2E-Gym row: field 'instance_id' must be a string")
    if not iid:
        iid = f"{owner_repo.replace('/', '__')}-{new}"
        where = f"{where} ({iid})"
    fix, tests = r2e_patches(parsed, where)
    if not fix:
        raise FormError(f"{where}: R2E-Gym row: parsed_commit_content changes no non-test Python file, so it "
                        "holds no fix")
    names = _get(result, "test_file_names", "execution_result_content", where, list)
    test_cmd = R2E_TESTS_CMD[name]
    runner = R2E_RUNNERS.get(name)
    if runner and runner[0] in names:
        test_cmd = runner[1]
    elif name == "tornado":
        raise FormError(f"{where}: R2E-Gym row: tornado's test files lack {R2E_RUNNERS['tornado'][0]}, the "
                        "runner R2E-Gym runs them with")
    parse = PARSER_REGISTRY["parse_log_pytest"]
    runs = {}
    for label in ("new_commit_res_stdout", "old_commit_res_stdout"):
        out = result.get(label)
        if not isinstance(out, str):
            raise FormError(f"{where}: R2E-Gym row: execution_result_content has no {label} (the recorded "
                            "test run FAIL_TO_PASS / PASS_TO_PASS are derived from)")
        runs[label] = parse(_ANSI.sub("", out), None)
    new_run, old_run = runs["new_commit_res_stdout"], runs["old_commit_res_stdout"]
    must_pass = [t for t, s in new_run.items() if s == TestStatus.PASSED.value]
    want = {_ANSI.sub("", k).split(" - ")[0] for k, v in expected.items() if v == "PASSED"}
    got = {_r2e_key(t) for t in must_pass}
    if got != want:
        extra, missing = sorted(got - want)[:3], sorted(want - got)[:3]
        raise FormError(f"{where}: R2E-Gym row: the run recorded at the fixed commit does not match "
                        f"expected_output_json (passing there but not expected: {extra or 'none'}; expected "
                        f"to pass but not named so by swebench's parse_log_pytest: {missing or 'none'})")
    f2p = [t for t in must_pass if old_run.get(t) != TestStatus.PASSED.value]
    p2p = [t for t in must_pass if old_run.get(t) == TestStatus.PASSED.value]
    if not f2p:
        raise FormError(f"{where}: R2E-Gym row: no test passes at the fixed commit that did not already pass "
                        "at the buggy one")
    # R2E-Gym runs the image's /r2e_tests (its hidden tests, copied in by its Dockerfiles) from /testbed
    fetch = ('test -d /r2e_tests || { echo "swerl: the image has no /r2e_tests (R2E-Gym\'s tests)"; exit 3; '
             '}; '
             "rm -rf r2e_tests && cp -r /r2e_tests r2e_tests && ")
    out = {"instance_id": iid, "repo": owner_repo, "base_commit": old, "patch": fix, "test_patch": tests,
           "problem_statement": _r2e_statement(rec["problem_statement"]), "FAIL_TO_PASS": f2p,
           "PASS_TO_PASS": p2p, "image": rec["docker_image"], "test_cmd": fetch + test_cmd,
           "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}
    date = parsed.get("commit_date")
    if isinstance(date, str):
        out["created_at"] = date
    if isinstance(rec.get("split"), str):
        out["split"] = rec["split"]
    return out


# ------------------------------------------------------------------------------------------- SWE-Gym

def is_swegym_repo(repo: Any) -> bool:
    return isinstance(repo, str) and repo.lower() in SWEGYM_REPOS


def swegym_image(instance_id: str) -> str:
    return f"{SWEGYM_IMAGE_PREFIX}{instance_id.replace('__', '_s_')}:latest".lower()


def swegym_fork_dir(root: Path | None = None) -> Path:
    """A checkout of SWE-Gym's fork of swebench: `SWERL_SWEGYM_FORK`, else the cache, fetched there
    with git at `SWEGYM_FORK_COMMIT` the first time."""
    from swerl.envs.swe.specs import SpecError

    def ok(p: Path) -> bool:
        return (p / "swebench" / "harness" / "constants.py").is_file()

    named = os.environ.get("SWERL_SWEGYM_FORK")
    if named:
        if not ok(Path(named)):
            raise SpecError(f"SWERL_SWEGYM_FORK={named} is not a checkout of {SWEGYM_FORK} "
                            "(it has no swebench/harness/constants.py)")
        return Path(named)
    if root is None:
        from swerl.envs.swe.images import CACHE_ROOT as root
    target = root / f"swebench-swegym-{SWEGYM_FORK_COMMIT[:12]}"
    if ok(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        repo = Path(tmp) / "fork"
        steps = (["git", "init", "-q", str(repo)],
                 ["git", "-C", str(repo), "fetch", "-q", "--depth", "1", SWEGYM_FORK, SWEGYM_FORK_COMMIT],
                 ["git", "-C", str(repo), "-c", "advice.detachedHead=false", "checkout", "-q", "FETCH_HEAD"])
        for step in steps:
            got = subprocess.run(step, capture_output=True, text=True)
            if got.returncode != 0:
                detail = (got.stderr or got.stdout).strip().splitlines()
                raise SpecError(
                    f"could not fetch SWE-Gym's specs ({SWEGYM_FORK} at {SWEGYM_FORK_COMMIT[:12]}): "
                    f"{detail[-1] if detail else got.returncode}; on a machine without GitHub, clone it "
                    f"elsewhere, check out that commit and copy it to {target} (or point SWERL_SWEGYM_FORK "
                    "at it)")
        if not ok(repo):
            raise SpecError(f"{SWEGYM_FORK} at {SWEGYM_FORK_COMMIT[:12]} has no "
                            "swebench/harness/constants.py")
        try:
            repo.rename(target)
        except OSError:  # another process got there first
            if not ok(target):
                raise
    return target


def derive_swegym(records: list[dict], *, root: Path | None = None) -> list[dict | str]:
    """For each SWE-bench-form row of a SWE-Gym repository: the fields SWE-Gym's fork derives (eval
    script, log parser, eval type, image names, ...) or a one-line reason it has none."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    fork = swegym_fork_dir(root)
    fields = ("instance_id", "repo", "version", "base_commit", "test_patch", "patch", "problem_statement",
              "hints_text", "created_at", "environment_setup_commit", "FAIL_TO_PASS", "PASS_TO_PASS")
    rows = [{k: _plain(r.get(k)) for k in fields if r.get(k) is not None} for r in records]
    answers = _run_oracle("swegym", rows, path=str(fork),
                          extra={"markers": [START_TEST_OUTPUT, END_TEST_OUTPUT]})
    out: list[dict | str] = []
    for row, a in zip(rows, answers, strict=True):
        out.append(a["error"] if "error" in a else {**a, "image": swegym_image(row["instance_id"])})
    return out


def _oracle_swegym(rows: list[dict], markers: list[str]) -> list[dict]:
    """(oracle process, the fork on sys.path) SWE-Gym's own eval script for each row — its
    make_eval_script_list, with swebench 4+'s output markers put around the test command (no-op `:`
    lines; swerl's grading reads the log between them) — and its parser, as its make_test_spec would."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    from swebench.harness.test_spec import (
        TestSpec,
        make_eval_script_list,
        make_repo_script_list,
        make_test_command,
    )

    start, end = markers
    out = []
    for row in rows:
        repo, version = row["repo"].lower(), row.get("version")
        if repo not in MAP_REPO_VERSION_TO_SPECS:
            out.append({"error": f"repository {row['repo']!r} has no SWE-Gym spec"})
            continue
        if version not in MAP_REPO_VERSION_TO_SPECS[repo]:
            known = ", ".join(sorted(MAP_REPO_VERSION_TO_SPECS[repo], key=str))
            out.append({"error": f"repository {row['repo']!r} has no SWE-Gym spec for version {version!r} "
                                 + (f"(specs exist for {known})" if known else "(its table has no version)")})
            continue
        if repo not in MAP_REPO_TO_PARSER:
            out.append({"error": f"repository {row['repo']!r} has no SWE-Gym log parser"})
            continue
        specs = MAP_REPO_VERSION_TO_SPECS[repo][version]
        env, testbed = "testbed", "/testbed"  # make_test_spec's names
        evals = make_eval_script_list(row, specs, env, testbed, row["base_commit"], row["test_patch"])
        cmd = make_test_command(row)
        if evals.count(cmd) != 1:
            out.append({"error": "SWE-Gym's eval script does not run its test command exactly once"})
            continue
        k = evals.index(cmd)
        evals[k:k + 1] = [f": '{start}'", cmd, f": '{end}'"]
        spec = TestSpec(instance_id=row["instance_id"].lower(), repo=repo, version=version,
                        repo_script_list=make_repo_script_list(specs, repo, testbed, row["base_commit"], env),
                        eval_script_list=evals, env_script_list=[], arch="x86_64", FAIL_TO_PASS=[],
                        PASS_TO_PASS=[])
        out.append({"eval_script": spec.eval_script, "log_parser": MAP_REPO_TO_PARSER[repo].__name__,
                    "eval_type": "pass_and_fail", "base_image": spec.base_image_key, "language": "py",
                    "install_repo_script": spec.install_repo_script, "base_dockerfile": spec.base_dockerfile,
                    "python": str(specs.get("python", ""))})
    return out


# -------------------------------------------------------------------------------------- the oracles

def _run_oracle(mode: str, rows: list[dict], *, path: str | None = None,
                extra: dict | None = None) -> list[dict]:
    """Run this file as a script in a process whose `swebench` (and `swesmith`) is the one `mode` needs."""
    from swerl.envs.swe.specs import SpecError, spec_release_dir

    if not rows:
        return []
    if mode == "swesmith":
        path = os.pathsep.join([str(swesmith_release_dir()), str(spec_release_dir())])
        what = f"swesmith {SWESMITH_RELEASE}'s profiles"
    else:
        what = f"SWE-Gym's specs ({SWEGYM_FORK} at {SWEGYM_FORK_COMMIT[:12]})"
    env = {**os.environ, "PYTHONPATH": str(path), "PYTHONNOUSERSITE": "1"}
    got = subprocess.run([sys.executable, __file__, mode], input=json.dumps({**(extra or {}), "rows": rows}),
                         capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if got.returncode != 0:
        tail = got.stderr.strip().splitlines()
        raise SpecError(f"{what} failed to load: {tail[-1] if tail else got.returncode}")
    return json.loads(got.stdout)["rows"]


def _oracle_main() -> None:
    mode = sys.argv[1]
    request = json.load(sys.stdin)
    rows = request["rows"]
    fn = {"swesmith": _oracle_swesmith, "swegym": lambda r: _oracle_swegym(r, request["markers"])}[mode]
    answers: list[dict] = []
    for row in rows:  # one bad row names itself; the others still derive
        try:
            answers.extend(fn([row]))
        except Exception as e:
            answers.append({"error": f"{mode} could not derive it: {type(e).__name__}: {e}"})
    json.dump({"rows": answers}, sys.stdout)


if __name__ == "__main__":
    _oracle_main()
