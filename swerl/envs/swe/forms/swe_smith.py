"""SWE-smith's rows (`image_name`; `patch` creates the bug) made SWE-bench-form records
(`swesmith_record`, from what the repository's SWE-smith profile says), and the git diff reversal that
makes the fix of the bug patch (`reverse_patch`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from swerl.envs.swe.forms.common import FormError, _plain

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
