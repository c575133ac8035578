"""Check swerl's SWE-Gym row completion against SWE-Gym's own fork of swebench (a local check, not a test:
the fork lives on GitHub only, which CI cannot reach; the test suite covers the same code paths through a
stand-in fork with the fork's API, tests/swe/test_swe_forms.py).

    .venv/bin/python scripts/check_swegym_fork.py            # the fork from the cache, or fetched once
    SWERL_SWEGYM_FORK=/path/to/checkout .venv/bin/python scripts/check_swegym_fork.py

For the first and the last version in the fork's spec table of each repository SWE-Gym adds, a row in
SWE-Gym's published form (no eval script, parser, eval type or image) is loaded through
`swerl.envs.swe.instances.load_instances`, exactly as a user's rows are, and checked: the eval script runs the
fork's test command once, between swebench's output markers, after the spec's install step and with the test
files reset to base_commit; the log parser is the one the fork maps the repository to (and swebench's
registry has it, swerl's pydantic parser included); the image is SWE-Gym's prebuilt one. A repository whose
table has no version must be refused with a one-line reason. Last, swerl's pydantic parser and the fork's own
`parse_log_pytest_pydantic` read one log (verbose and summary lines, colour codes) to the same map.
Prints a table; exit 1 on any mismatch, 2 when the fork cannot be had.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from swerl.envs.swe.forms import SWEGYM_FORK_COMMIT, SWEGYM_REPOS, swegym_fork_dir, swegym_image
from swerl.envs.swe.instances import InstanceError, load_instances
from swerl.envs.swe.specs import SpecError

BASE = "0" * 39 + "1"
TEST_FILE = "tests/test_swerl_check.py"
# mypy's tests are cases in its test-data files; the fork runs them by name (`-k "testA or testB"`)
MYPY_FILE = "test-data/unit/check-swerl.test"
MYPY_CASE = "testSwerlCheck"


def test_patch(path: str, added: str) -> str:
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1,2 @@\n x = 1\n+{added}\n"


# verbose lines name the test before the status, summary lines after it; colour codes as pytest prints them
PYDANTIC_LOG = "\n".join([
    "tests/test_main.py::test_ok PASSED                                   [ 20%]",
    "tests/test_main.py::test_bad \x1b[31mFAILED\x1b[0m                     [ 40%]",
    "tests/test_types.py::test_p[str-x] SKIPPED (needs y)                  [ 60%]",
    "\x1b[32mPASSED\x1b[0m tests/test_main.py::test_ok",
    "FAILED tests/test_main.py::test_bad - AssertionError: 1 != 2",
    "ERROR tests/test_broken.py - ImportError: no module",
    "XFAIL tests/test_types.py::test_x - reason",
    "= 1 failed, 1 passed, 1 skipped, 1 xfailed, 1 error in 0.12s =",
])

# (in a process with the fork first on sys.path) the fork's spec table and parser map for SWE-Gym's repos
LIST_SPECS = """
import json, sys
from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
repos = json.loads(sys.argv[1])
out = {}
for repo, table in MAP_REPO_VERSION_TO_SPECS.items():
    if repo.lower() in repos:
        out[repo] = {"versions": [str(v) for v in table],
                     "parser": getattr(MAP_REPO_TO_PARSER.get(repo), "__name__", None),
                     "test_cmds": {str(v): s.get("test_cmd") for v, s in table.items()},
                     "installs": {str(v): s.get("install") for v, s in table.items()}}
print(json.dumps(out))
"""

FORK_PARSER = """
import json, sys
from swebench.harness.log_parsers import parse_log_pytest_pydantic as parse
print(json.dumps(parse(sys.stdin.read())))
"""


def in_fork(fork: Path, code: str, *args: str, stdin: str = "") -> str:
    env = {**os.environ, "PYTHONPATH": str(fork), "PYTHONNOUSERSITE": "1"}
    got = subprocess.run([sys.executable, "-c", code, *args], input=stdin, capture_output=True, text=True,
                         env=env, cwd=tempfile.gettempdir())
    if got.returncode != 0:
        tail = got.stderr.strip().splitlines()
        print(f"check_swegym_fork: the fork at {fork} failed to load: {tail[-1] if tail else got.returncode}",
              file=sys.stderr)
        raise SystemExit(2)
    return got.stdout.splitlines()[-1]


def row(repo: str, version: str) -> dict:
    tests = (test_patch(MYPY_FILE, f"[case {MYPY_CASE}]") if repo == "python/mypy"
             else test_patch(TEST_FILE, "y = 2"))
    return {"instance_id": f"{repo.replace('/', '__')}-90001", "repo": repo, "version": version,
            "base_commit": BASE, "patch": "", "test_patch": tests, "problem_statement": "it breaks",
            "hints_text": "", "created_at": "2024-01-01T00:00:00Z", "FAIL_TO_PASS": [f"{TEST_FILE}::test_a"],
            "PASS_TO_PASS": [f"{TEST_FILE}::test_b"]}


def check_row(repo: str, version: str, spec: dict, tmp: Path) -> list[str]:
    """What is wrong with the row swerl completes for (repo, version); [] when nothing is."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT
    from swebench.harness.log_parsers import PARSER_REGISTRY

    import swerl.envs.swe.parsers  # noqa: F401  (adds swerl's parsers, pydantic's, to swebench's registry)

    path = tmp / "rows.jsonl"
    path.write_text(json.dumps(row(repo, version)) + "\n")
    (inst,) = load_instances(path)
    lines = inst.eval_script.splitlines()
    wrong = []
    try:
        start, end = lines.index(f": '{START_TEST_OUTPUT}'"), lines.index(f": '{END_TEST_OUTPUT}'")
    except ValueError:
        return ["no output markers in the eval script"]
    between = lines[start + 1:end]
    test_cmd = spec["test_cmds"][version]
    test_cmd = " ".join(test_cmd) if isinstance(test_cmd, list) else test_cmd
    mypy = repo == "python/mypy"
    want = f'{test_cmd} "{MYPY_CASE}"' if mypy else f"{test_cmd} {TEST_FILE}"
    if between != [want]:
        wrong.append(f"between the markers {between!r}, not the fork's {want!r}")
    if f"git checkout {BASE} {MYPY_FILE if mypy else TEST_FILE}" not in lines[:start]:
        wrong.append("the test files are not reset to base_commit before the run")
    install = spec["installs"][version]
    if install and install not in "\n".join(lines[:start]):
        wrong.append(f"the spec's install step {install!r} is not in the script")
    if inst.log_parser != spec["parser"] or inst.log_parser not in PARSER_REGISTRY:
        wrong.append(f"log parser {inst.log_parser!r}, the fork's is {spec['parser']!r}")
    if inst.image != swegym_image(inst.instance_id):
        wrong.append(f"image {inst.image!r}")
    return wrong


def main() -> int:
    from swerl.envs.swe.parsers import parse_log_pytest_pydantic

    try:
        fork = swegym_fork_dir()
    except SpecError as e:
        print(f"check_swegym_fork: {e}", file=sys.stderr)
        return 2
    specs = json.loads(in_fork(fork, LIST_SPECS, json.dumps(sorted(SWEGYM_REPOS))))
    print(f"SWE-Gym's fork at {SWEGYM_FORK_COMMIT[:12]}: {fork}")
    print(f"{'repository':<30} {'version':<9} {'parser':<28} result")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for repo in sorted(SWEGYM_REPOS):
            name = next((r for r in specs if r.lower() == repo), None)
            if name is None:
                print(f"{repo:<30} {'-':<9} {'-':<28} MISSING: the fork has no table for it")
                bad += 1
                continue
            versions = specs[name]["versions"]
            if not versions:  # must be refused, naming why
                try:
                    path = Path(tmp) / "rows.jsonl"
                    path.write_text(json.dumps(row(name, "1.0")) + "\n")
                    load_instances(path)
                    print(f"{name:<30} {'1.0':<9} {'-':<28} WRONG: accepted, the table has no version")
                    bad += 1
                except InstanceError as e:
                    ok = "(its table has no version)" in str(e)
                    print(f"{name:<30} {'(none)':<9} {'-':<28} {'refused, as it must' if ok else str(e)}")
                    bad += not ok
                continue
            for version in dict.fromkeys([versions[0], versions[-1]]):
                wrong = check_row(name, version, specs[name], Path(tmp))
                print(f"{name:<30} {version:<9} {specs[name]['parser'] or '-':<28} "
                      + ("ok" if not wrong else "WRONG: " + "; ".join(wrong)))
                bad += bool(wrong)
    theirs = json.loads(in_fork(fork, FORK_PARSER, stdin=PYDANTIC_LOG))
    ours = parse_log_pytest_pydantic(PYDANTIC_LOG)
    same = ours == theirs
    print(f"pydantic's parser on one log: swerl {len(ours)} tests, the fork {len(theirs)}: "
          + ("the same map" if same else f"DIFFERENT\n  swerl: {ours}\n  fork:  {theirs}"))
    bad += not same
    print(f"{bad} mismatch(es)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
