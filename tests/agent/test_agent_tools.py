"""The sandbox tools against a real DockerSandbox on the demo calculator repository."""

from __future__ import annotations

import pytest

from swerl.agent import SandboxTools
from swerl.agent.tools import ToolConfig
from swerl.sandbox import DockerSandbox, SandboxSpec
from swerl.structs import ToolCall

pytestmark = pytest.mark.docker

CALC = "/testbed/calc/__init__.py"


@pytest.fixture
def tools(task_image):
    with DockerSandbox(SandboxSpec(image=task_image, memory="512m")) as sb:
        yield SandboxTools(sb, ToolConfig(max_observation_chars=2000, default_timeout_s=20, max_timeout_s=30))


def edit(tools: SandboxTools, **args):
    return tools.editor(**args)


def test_view_file_like_cat_n_and_ranges(tools):
    src = tools.sandbox.read_text(CALC)
    lines = src.splitlines()
    r = edit(tools, command="view", path=CALC)
    assert not r.error
    assert r.observation.splitlines()[1:] == [f"{i:6}\t{line}" for i, line in enumerate(lines, 1)]
    assert r.observation.splitlines()[1:] == tools.sandbox.run(f"cat -n {CALC}").output.splitlines()
    r = edit(tools, command="view", path=CALC, view_range=[8, 9])
    assert r.observation.splitlines()[1:] == ["     8\tdef mean(values: list[float]) -> float:",
                                              "     9\t    if not values:"]
    r = edit(tools, command="view", path=CALC, view_range=[10, -1])
    assert [ln.split("\t")[0].strip() for ln in r.observation.splitlines()[1:]] == ["10", "11"]
    for bad, says in (([0, 3], "start 0 must be between 1 and 11"),
                      ([5, 99], "end 99 must be -1 or between 5 and 11"),
                      ([5, 3], "end 3 must be -1 or between 5 and 11"), ([1], "two integers")):
        r = edit(tools, command="view", path=CALC, view_range=bad)
        assert r.error and says in r.observation, r.observation


def test_view_directory_lists_two_levels_without_hidden(tools):
    tools.sandbox.run("mkdir -p /testbed/calc/deep/deeper && touch /testbed/calc/deep/deeper/x.py "
                      "/testbed/.hidden")
    r = edit(tools, command="view", path="/testbed")
    listed = r.observation.splitlines()[1:]
    assert "/testbed/calc/__init__.py" in listed and "/testbed/tests/test_calc.py" in listed
    assert "/testbed/calc/deep" in listed and not any("deeper" in p for p in listed)
    assert not any("/." in p for p in listed)  # no .git, no .hidden
    r = edit(tools, command="view", path="/testbed", view_range=[1, 2])
    assert r.error and "only allowed when viewing a file" in r.observation


def test_str_replace_edits_once_and_shows_a_snippet(tools):
    r = edit(tools, command="str_replace", path=CALC, old_str="/ (len(values) + 1)", new_str="/ len(values)")
    assert not r.error
    assert "    11\t    return sum(values) / len(values)" in r.observation
    assert tools.sandbox.read_text(CALC).count("return sum(values) / len(values)\n") == 1


def test_str_replace_with_no_match_or_several_matches_changes_nothing(tools):
    before = tools.sandbox.read_text(CALC)
    r = edit(tools, command="str_replace", path=CALC, old_str="return  a + b", new_str="x")
    assert r.error and "did not appear verbatim in /testbed/calc/__init__.py" in r.observation
    r = edit(tools, command="str_replace", path=CALC, old_str="float", new_str="int")
    assert r.error and "occurs 5 times" in r.observation and "in lines [4, 8]" in r.observation
    r = edit(tools, command="str_replace", path=CALC, old_str="return", new_str="yield")
    assert r.error and "occurs 2 times" in r.observation and "in lines [5, 11]" in r.observation
    assert tools.sandbox.read_text(CALC) == before


def test_insert_after_a_line_and_at_the_top(tools):
    edit(tools, command="insert", path=CALC, insert_line=0, new_str="import math")
    r = edit(tools, command="insert", path=CALC, insert_line=6, new_str="    # added\n")
    assert not r.error and "     7\t    # added" in r.observation
    lines = tools.sandbox.read_text(CALC).splitlines()
    assert lines[0] == "import math" and lines[6] == "    # added" and lines[5] == "    return a + b"
    r = edit(tools, command="insert", path=CALC, insert_line=99, new_str="x")
    assert r.error and "invalid insert_line 99: it must be between 0 and 13" in r.observation


def test_insert_after_a_last_line_without_newline(tools):
    tools.sandbox.write_file("/testbed/n.txt", "a\nb")
    edit(tools, command="insert", path="/testbed/n.txt", insert_line=2, new_str="c")
    assert tools.sandbox.read_text("/testbed/n.txt") == "a\nb\nc\n"


def test_undo_edit_walks_back_the_history_of_each_file(tools):
    original = tools.sandbox.read_text(CALC)
    edit(tools, command="str_replace", path=CALC, old_str="a + b", new_str="b + a")
    edit(tools, command="insert", path=CALC, insert_line=0, new_str="# top")
    edit(tools, command="create", path="/testbed/new.py", file_text="x = 1\n")
    r = edit(tools, command="undo_edit", path=CALC)
    assert (not r.error and "b + a" in tools.sandbox.read_text(CALC)
            and "# top" not in tools.sandbox.read_text(CALC))
    edit(tools, command="undo_edit", path=CALC)
    assert tools.sandbox.read_text(CALC) == original
    r = edit(tools, command="undo_edit", path=CALC)
    assert r.error and "no edit of /testbed/calc/__init__.py to undo" in r.observation
    r = edit(tools, command="undo_edit", path="/testbed/new.py")
    assert "removed" in r.observation
    assert tools.sandbox.run("test -e /testbed/new.py").exit_code == 1


def test_create_refuses_existing_files_and_directories(tools):
    r = edit(tools, command="create", path=CALC, file_text="oops")
    assert r.error and "already exists as a file" in r.observation
    r = edit(tools, command="create", path="/testbed/calc", file_text="oops")
    assert r.error and "already exists as a directory" in r.observation
    r = edit(tools, command="create", path="/testbed/pkg/mod.py", file_text="y = 2\n")
    assert not r.error and tools.sandbox.read_text("/testbed/pkg/mod.py") == "y = 2\n"


@pytest.mark.parametrize(("path", "says"), [
    ("calc/__init__.py", "is not absolute. Use an absolute path such as /testbed/calc/__init__.py"),
    ("/etc/passwd", "is outside /testbed"),
    ("/testbed/../etc/passwd", "is outside /testbed"),
    ("/testbed2/x", "is outside /testbed"),
    ("", "`path` is empty"),
])
def test_paths_must_be_absolute_and_inside_the_root(tools, path, says):
    r = edit(tools, command="view", path=path)
    assert r.error and says in r.observation, r.observation


def test_editor_rejects_missing_files_and_wrong_arguments(tools):
    r = edit(tools, command="view", path="/testbed/nope.py")
    assert r.error and "/testbed/nope.py does not exist" in r.observation
    r = edit(tools, command="view", path=CALC, old_str="x")
    assert r.error and "`view` does not take ['old_str']" in r.observation
    r = edit(tools, command="str_replace", path=CALC, new_str="x")
    assert r.error and "needs `old_str`" in r.observation


def test_bash_is_persistent_with_capped_timeouts_and_truncated_output(tools):
    assert tools.bash("cd /testbed/calc && export X=1").observation == "[no output]"
    assert tools.bash("pwd; echo $X").observation == "/testbed/calc\n1"
    r = tools.bash("echo no; exit 3")
    assert r.error and r.observation.startswith("no") and "[exit code 3]" in r.observation
    r = tools.bash("sleep 5", timeout=1)
    assert r.error and "[command interrupted after 1 seconds" in r.observation
    r = tools.execute(ToolCall("bash", '{"command": "seq 1 5000"}'))
    assert "characters cut" in r.observation and len(r.observation) <= 2000
    assert r.observation.startswith("1\n2\n") and r.observation.endswith("4999\n5000")
    assert tools.bash("true", timeout=0).error


def test_bash_timeout_is_capped_by_the_configured_maximum(task_image):
    with DockerSandbox(SandboxSpec(image=task_image, memory="512m")) as sb:
        tools = SandboxTools(sb, ToolConfig(default_timeout_s=1, max_timeout_s=1))
        r = tools.bash("sleep 4; echo done", timeout=1000)
        assert r.error and "interrupted after 1 seconds (the maximum)" in r.observation


def test_submit_returns_the_diff(tools):
    tools.editor(command="str_replace", path=CALC, old_str="(len(values) + 1)", new_str="len(values)")
    r = tools.execute(ToolCall("submit"))
    assert r.terminated and not r.error
    assert r.result == tools.sandbox.diff()
    assert "-    return sum(values) / (len(values) + 1)\n+    return sum(values) / len(values)\n" in r.result
