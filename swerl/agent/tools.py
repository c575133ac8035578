"""Sandbox tools for SWE agents: `bash`, `str_replace_editor`, `submit`.

Behaviour follows the conventions SWE-agent and OpenHands established (a persistent shell; an
editor that views with `cat -n` numbering and replaces only unique strings; an explicit submit), so
prompts and models trained for them carry over. Every failure is a `ToolResult` with `error=True`
and a message for the model; exceptions are left to the harness itself failing (sandbox died).
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from swerl.sandbox import Sandbox
from swerl.structs import ToolCall, ToolResult, ToolSpec


@dataclass(frozen=True)
class ToolConfig:
    """Limits and roots of the sandbox tools."""

    allowed_root: str = "/testbed"
    """Editor paths must lie inside this directory."""
    default_timeout_s: float = 60.0
    """Seconds a bash call may run when the model gives no timeout."""
    max_timeout_s: float = 300.0
    """Cap on the timeout the model may ask for."""
    max_observation_chars: int = 16_000
    """Observations longer than this keep their head and tail with a note of what was cut."""
    max_command_chars: int = 100_000
    """Longest `bash` command a call may send (longer ones get an error observation: write a file)."""
    max_text_chars: int = 2_000_000
    """Longest `file_text` / `old_str` / `new_str` of an editor call."""

    def __post_init__(self) -> None:
        if not self.allowed_root.startswith("/"):
            raise ValueError(f"ToolConfig.allowed_root must be absolute, got {self.allowed_root!r}")
        if not 0 < self.default_timeout_s <= self.max_timeout_s:
            raise ValueError("ToolConfig needs 0 < default_timeout_s <= max_timeout_s, got "
                             f"{self.default_timeout_s} and {self.max_timeout_s}")
        if self.max_observation_chars < 200:
            raise ValueError("ToolConfig.max_observation_chars must be >= 200, got "
                             f"{self.max_observation_chars}")


SNIPPET_CONTEXT = 4
"""Lines shown around an edit so the model can check it without another `view`."""


def _spec(name: str, description: str, properties: dict, required: Sequence[str]) -> ToolSpec:
    schema = {"type": "object", "properties": properties, "required": list(required)}
    return ToolSpec(name=name, description=description, parameters_json=json.dumps(schema))


def tool_specs(config: ToolConfig | None = None) -> tuple[ToolSpec, ...]:
    """The JSON-schema specs of the three tools, for the chat template."""
    config = config or ToolConfig()
    root = config.allowed_root
    bash = _spec(
        "bash",
        "Run a bash command line in a persistent shell session (the working directory and environment "
        f"persist between calls). The repository is at {root}. Output over "
        f"{config.max_observation_chars} characters is cut in the middle. Long-running commands are "
        f"interrupted after `timeout` seconds (default {config.default_timeout_s:g}, at most "
        f"{config.max_timeout_s:g}). No network access; no interactive programs.",
        {"command": {"type": "string", "description": "The command line to run."},
         "timeout": {"type": "integer", "description": "Seconds before the command is interrupted."}},
        ["command"],
    )
    editor = _spec(
        "str_replace_editor",
        "View, create and edit files. `view` shows a file with line numbers (like `cat -n`), or lists a "
        "directory two levels deep (hidden entries excluded). `create` writes a new file (fails if it "
        "exists). `str_replace` replaces `old_str`, which must occur exactly once in the file, with "
        "`new_str`. `insert` inserts `new_str` after line `insert_line` (0 = at the top). `undo_edit` "
        f"reverts the last edit of the file. Paths must be absolute and inside {root}.",
        {"command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"],
                     "description": "The operation."},
         "path": {"type": "string", "description": f"Absolute path of a file or directory in {root}."},
         "file_text": {"type": "string", "description": "`create`: the content of the new file."},
         "old_str": {"type": "string", "description": "`str_replace`: the exact text to replace."},
         "new_str": {"type": "string", "description": "`str_replace` / `insert`: the new text."},
         "insert_line": {"type": "integer", "description": "`insert`: insert after this line (0 = top)."},
         "view_range": {"type": "array", "items": {"type": "integer"},
                        "description": "`view` of a file: [start, end] lines, 1-based, end -1 = to the "
                                       "end."}},
        ["command", "path"],
    )
    submit = _spec(
        "submit",
        f"Submit your changes to the repository in {root} and end the episode. Call it once the fix is done.",
        {}, [],
    )
    return (bash, editor, submit)


def truncate_middle(text: str, limit: int) -> str:
    """Keep the head and tail of an over-long observation, with a note of what was cut."""
    if len(text) <= limit:
        return text
    keep = (limit - 120) // 2
    cut = len(text) - 2 * keep
    return (f"{text[:keep]}\n\n[... {cut} characters cut: showing the first {keep} and last {keep} "
            f"of {len(text)} ...]\n\n{text[-keep:]}")


def numbered(text: str, start: int = 1) -> str:
    """`cat -n` formatting: right-aligned line numbers, a tab, the line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]  # a final newline does not start another line
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(lines, start))


_MAX_LINE = 10_000_000
_MAX_TIMEOUT_GIVEN = 1e9


def check_arguments(tool: str, args: dict, config: ToolConfig) -> str:
    """Why the call's argument values cannot be run (naming the argument and the limit), or ""."""
    limits = {"command": config.max_command_chars if tool == "bash" else 64, "path": 4096,
              "file_text": config.max_text_chars, "old_str": config.max_text_chars,
              "new_str": config.max_text_chars}
    for key, value in args.items():
        if isinstance(value, str):
            if "\x00" in value:
                return (f"`{key}` contains a NUL character (\\x00), which no command line, file path or text "
                        "file here can hold; remove it.")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                return (f"`{key}` is not valid Unicode text (a lone surrogate at index {e.start}); send "
                        "valid text.")
            limit = limits.get(key, 4096)
            if len(value) > limit:
                return (f"`{key}` is {len(value)} characters, over the limit of {limit}"
                        + ("; write long content to a file in steps instead." if key != "path" else "."))
    if "path" in args and isinstance(args["path"], str):
        long = [c for c in args["path"].split("/") if len(c.encode()) > 255]
        if long:
            return f"`path` has a name of {len(long[0].encode())} bytes, over the limit of 255."
    t = args.get("timeout")
    if t is not None and (isinstance(t, bool) or not isinstance(t, int | float) or t != t
                          or not -_MAX_TIMEOUT_GIVEN <= t <= _MAX_TIMEOUT_GIVEN):
        return f"`timeout` must be a number of seconds between 1 and {config.max_timeout_s:g}."
    line = args.get("insert_line")
    if (line is not None
        and (isinstance(line, bool) or not isinstance(line, int) or not 0 <= line <= _MAX_LINE)):
        return f"`insert_line` must be a line number between 0 and {_MAX_LINE}."
    rng = args.get("view_range")
    if rng is not None and (not isinstance(rng, list) or len(rng) != 2
                            or any(isinstance(x, bool) or not isinstance(x, int) or abs(x) > _MAX_LINE
                                   for x in rng)):
        return f"`view_range` must be two line numbers [start, end] with |n| <= {_MAX_LINE}."
    return ""


class SandboxTools:
    """The tools of one episode over one sandbox; holds the per-file edit history for `undo_edit`."""

    def __init__(self, sandbox: Sandbox, config: ToolConfig | None = None) -> None:
        self.sandbox = sandbox
        self.config = config or ToolConfig()
        self.specs = tool_specs(self.config)
        # path -> previous contents, newest last; None = the file did not exist before the edit
        self._history: dict[str, list[bytes | None]] = {}

    def execute(self, call: ToolCall) -> ToolResult:
        """Run one call. Argument types are checked by the parser against `specs`; the values are
        checked here (`check_arguments`), and whatever the model sent, the answer is an observation:
        only the harness itself failing (a `SandboxError`) leaves as an exception."""
        args = call.arguments
        bad = check_arguments(call.name, args, self.config)
        if bad:
            return ToolResult(f"{call.name}: {bad}", error=True)
        try:
            if call.name == "bash":
                return self._cap(self.bash(args.get("command", ""), args.get("timeout")))
            if call.name == "str_replace_editor":
                return self._cap(self.editor(**args))
            if call.name == "submit":
                return self.submit()
        # the call's fault, not the harness's (OSError: a path the sandbox user may not read or write)
        except (ValueError, TypeError, OverflowError, UnicodeError, OSError) as e:
            return ToolResult(f"{call.name}: {e}", error=True)
        return ToolResult(f"Unknown tool {call.name!r}. Available tools: "
                          f"{', '.join(s.name for s in self.specs)}.",
                          error=True)

    def _cap(self, r: ToolResult) -> ToolResult:
        text = truncate_middle(r.observation, self.config.max_observation_chars)
        return r if text is r.observation else ToolResult(text, error=r.error, terminated=r.terminated,
                                                          result=r.result)

    # ---- bash ------------------------------------------------------------------------------------
    def bash(self, command: str, timeout: int | float | None = None) -> ToolResult:
        if not isinstance(command, str) or not command.strip():
            return ToolResult("bash: `command` is empty; give the command line to run.", error=True)
        cap = self.config.max_timeout_s
        if timeout is None:
            t = self.config.default_timeout_s
        elif timeout <= 0:
            return ToolResult(f"bash: `timeout` must be a positive number of seconds (at most {cap:g}).",
                              error=True)
        else:
            t = min(float(timeout), cap)
        r = self.sandbox.run(command, timeout=t)
        parts = [r.output.rstrip("\n")] if r.output else []
        if r.note:
            parts.append(r.note)
        if r.timed_out:
            capped = " (the maximum)" if timeout is not None and timeout > cap else ""
            parts.append(f"[command interrupted after {t:g} seconds{capped}; run long jobs in the "
                         "background or with a larger timeout]")
        elif r.oom:
            parts.append("[a process was killed: out of memory]")
        if r.exit_code != 0 and not r.timed_out:
            parts.append(f"[exit code {r.exit_code}]")
        return ToolResult("\n".join(parts) if parts else "[no output]", error=not r.ok)

    # ---- str_replace_editor ------------------------------------------------------------------------
    def _check_path(self, path: object) -> tuple[str, str]:
        """(normalised path, error)."""
        root = self.config.allowed_root
        if not isinstance(path, str) or not path:
            return "", "`path` is empty; give an absolute path."
        if not path.startswith("/"):
            return "", (f"The path {path!r} is not absolute. Use an absolute path such as "
                        f"{posixpath.join(root, path)}.")
        norm = posixpath.normpath(path)
        if norm.startswith("//"):
            norm = "/" + norm.lstrip("/")
        if norm != root and not norm.startswith(root.rstrip("/") + "/"):
            return "", f"The path {path} is outside {root}; only files inside {root} can be viewed or edited."
        return norm, ""

    def _read(self, path: str) -> tuple[str | None, str]:
        """(text, error); text None with error '' means the file does not exist."""
        try:
            data = self.sandbox.read_file(path)
        except FileNotFoundError:
            return None, ""
        except IsADirectoryError:
            return None, f"{path} is a directory, not a file."
        except PermissionError:
            return None, f"{path} cannot be read: permission denied."
        except ValueError as e:
            return None, f"{path} cannot be edited here: {e}."
        try:
            return data.decode("utf-8"), ""
        except UnicodeDecodeError:
            return None, f"{path} is not a UTF-8 text file; inspect it with bash instead."

    def editor(self, command: str = "", path: str = "", **kw: object) -> ToolResult:
        norm, err = self._check_path(path)
        if err:
            return ToolResult(f"str_replace_editor: {err}", error=True)
        allowed = {"view": {"view_range"}, "create": {"file_text"}, "str_replace": {"old_str", "new_str"},
                   "insert": {"insert_line", "new_str"}, "undo_edit": set()}
        if command not in allowed:
            return ToolResult(f"str_replace_editor: unknown command {command!r}; use one of "
                              f"{sorted(allowed)}.",
                              error=True)
        extra = sorted(k for k, v in kw.items() if v is not None and k not in allowed[command])
        if extra:
            return ToolResult(f"str_replace_editor: `{command}` does not take {extra}.", error=True)
        r = getattr(self, f"_{command}")(norm, **{k: v for k, v in kw.items() if k in allowed[command]})
        return r

    def _view(self, path: str, view_range: list[int] | None = None) -> ToolResult:
        text, err = self._read(path)
        if err.endswith("is a directory, not a file."):
            if view_range is not None:
                return ToolResult("str_replace_editor: `view_range` is only allowed when viewing a file, "
                                  f"and {path} is a directory.", error=True)
            q = shlex.quote(path)
            r = self.sandbox.run(f"find {q} -maxdepth 2 -not -path '*/.*' | sort", timeout=30)
            if not r.ok:
                return ToolResult(f"str_replace_editor: listing {path} failed: {r.output}", error=True)
            return ToolResult(f"Files and directories up to 2 levels deep in {path}, hidden entries "
                              f"excluded:\n{r.output.rstrip()}")
        if err:
            return ToolResult(f"str_replace_editor: {err}", error=True)
        if text is None:
            return ToolResult(f"str_replace_editor: {path} does not exist.", error=True)
        if view_range is None:
            return ToolResult(f"Here's the result of running `cat -n` on {path}:\n{numbered(text)}")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines = lines[:-1]
        n = len(lines)
        if len(view_range) != 2:
            return ToolResult("str_replace_editor: `view_range` must be two integers [start, end].",
                              error=True)
        start, end = view_range
        if not 1 <= start <= max(n, 1):
            return ToolResult(f"str_replace_editor: invalid view_range {view_range}: start {start} must be "
                              f"between 1 and {n}, the number of lines in {path}.", error=True)
        if end == -1:
            end = n
        elif end < start or end > n:
            return ToolResult(f"str_replace_editor: invalid view_range {view_range}: end {end} must be -1 "
                              f"or between {start} and {n}, the number of lines in {path}.", error=True)
        body = "\n".join(f"{i:6}\t{line}" for i, line in enumerate(lines[start - 1:end], start))
        return ToolResult(f"Here's the result of running `cat -n` on {path} (lines {start}-{end}):\n{body}")

    def _create(self, path: str, file_text: str | None = None) -> ToolResult:
        if file_text is None:
            return ToolResult("str_replace_editor: `create` needs `file_text`, the content of the file.",
                              error=True)
        text, err = self._read(path)
        if text is not None or err:
            what = "a directory" if "directory" in err else "a file"
            return ToolResult(f"str_replace_editor: {path} already exists as {what}; `create` only makes new "
                              "files. Use `str_replace` or `insert` to edit it.", error=True)
        self.sandbox.write_file(path, file_text)
        self._history.setdefault(path, []).append(None)
        return ToolResult(f"File created: {path}")

    def _load_for_edit(self, path: str) -> tuple[str | None, ToolResult | None]:
        text, err = self._read(path)
        if err:
            return None, ToolResult(f"str_replace_editor: {err}", error=True)
        if text is None:
            return None, ToolResult(f"str_replace_editor: {path} does not exist; create it with `create`.",
                                    error=True)
        return text, None

    def _save(self, path: str, old: str, new: str) -> None:
        self.sandbox.write_file(path, new)
        self._history.setdefault(path, []).append(old.encode("utf-8"))

    def _snippet(self, path: str, text: str, first_line: int, last_line: int) -> str:
        lines = text.split("\n")
        a = max(1, first_line - SNIPPET_CONTEXT)
        b = min(len(lines), last_line + SNIPPET_CONTEXT)
        body = "\n".join(f"{i:6}\t{line}" for i, line in enumerate(lines[a - 1:b], a))
        return (f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of "
                f"{path}:\n{body}\nReview the changes and make sure they are as expected.")

    def _str_replace(self, path: str, old_str: str | None = None, new_str: str | None = None) -> ToolResult:
        if old_str is None:
            return ToolResult("str_replace_editor: `str_replace` needs `old_str`.", error=True)
        if old_str == "":
            return ToolResult("str_replace_editor: `old_str` is empty; give the exact text to replace.",
                              error=True)
        new_str = "" if new_str is None else new_str
        text, fail = self._load_for_edit(path)
        if fail:
            return fail
        assert text is not None
        starts, pos = [], 0
        while (i := text.find(old_str, pos)) != -1:
            starts.append(i)
            pos = i + 1
        if not starts:
            return ToolResult(f"str_replace_editor: no replacement was performed: old_str did not appear "
                              f"verbatim in {path}. Check whitespace and indentation (view the file first).",
                              error=True)
        if len(starts) > 1:
            lines = sorted({text.count("\n", 0, i) + 1 for i in starts})
            return ToolResult("str_replace_editor: no replacement was performed: old_str occurs "
                              f"{len(starts)} times in {path}, in lines {lines}. Include more surrounding "
                              "lines to make it unique.", error=True)
        i = starts[0]
        new_text = text[:i] + new_str + text[i + len(old_str):]
        self._save(path, text, new_text)
        first = text.count("\n", 0, i) + 1
        return ToolResult(self._snippet(path, new_text, first, first + new_str.count("\n")))

    def _insert(self, path: str, insert_line: int | None = None, new_str: str | None = None) -> ToolResult:
        if insert_line is None or new_str is None:
            return ToolResult("str_replace_editor: `insert` needs `insert_line` and `new_str`.", error=True)
        text, fail = self._load_for_edit(path)
        if fail:
            return fail
        assert text is not None
        lines = text.splitlines(keepends=True)
        if not 0 <= insert_line <= len(lines):
            return ToolResult(f"str_replace_editor: invalid insert_line {insert_line}: it must be between 0 "
                              f"and {len(lines)}, the number of lines in {path}.", error=True)
        if insert_line > 0 and not lines[insert_line - 1].endswith("\n"):
            lines[insert_line - 1] += "\n"  # the last line had no newline: the insertion starts a new one
        block = new_str if new_str.endswith("\n") else new_str + "\n"
        new_text = "".join(lines[:insert_line]) + block + "".join(lines[insert_line:])
        self._save(path, text, new_text)
        return ToolResult(self._snippet(path, new_text, insert_line + 1, insert_line + block.count("\n")))

    def _undo_edit(self, path: str) -> ToolResult:
        history = self._history.get(path)
        if not history:
            return ToolResult(f"str_replace_editor: no edit of {path} to undo in this episode.", error=True)
        previous = history.pop()
        if previous is None:
            r = self.sandbox.run(f"rm -f -- {shlex.quote(path)}", timeout=30)
            if not r.ok:
                return ToolResult(f"str_replace_editor: could not remove {path}: {r.output}", error=True)
            return ToolResult(f"Last edit of {path} undone: the file it created was removed.")
        self.sandbox.write_file(path, previous)
        text = previous.decode("utf-8")
        return ToolResult(f"Last edit of {path} undone. Here's the result of running `cat -n` on {path}:\n"
                          f"{numbered(text)}")

    # ---- submit ------------------------------------------------------------------------------------
    def submit(self) -> ToolResult:
        patch = self.sandbox.diff()
        shown = patch if patch else "(no changes)"
        return ToolResult(f"Submitted. The patch of the repository:\n{shown}", terminated=True, result=patch)
