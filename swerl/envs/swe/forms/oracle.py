"""The upstream code that says how SWE-smith's and SWE-Gym's rows run, which must not share a process
with swerl's pinned swebench: the pins (`SWESMITH_RELEASE`, `SWEGYM_FORK` at `SWEGYM_FORK_COMMIT`), the
swesmith wheel (`swesmith_release_dir`), the functions that run in the oracle process (swesmith's
profiles, SWE-Gym's eval scripts and parsers) and `_run_oracle`, which starts that process.

Run as a script (`python oracle.py swesmith|swegym`, JSON on stdin and stdout) this file is the process
that imports swesmith or SWE-Gym's fork of swebench, never swerl's pinned swebench: it imports only the
standard library at the top for that reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SWESMITH_RELEASE = "0.0.9"
"""The swesmith release whose repository profiles (`swesmith.profiles`) say how each repository's tests
run. It imports `swebench.harness.constants.DOCKER_USER`, which swerl's pinned swebench 5 no longer
has, so it runs next to the spec release of `swerl.envs.swe.specs` (4.1.0), in its own process."""

SWEGYM_FORK = "https://github.com/SWE-Gym/SWE-Bench-Fork"
SWEGYM_FORK_COMMIT = "242429c188fcfd06aad13fce9a54d450470bf0ac"
"""SWE-Gym keeps its environment specs in a fork of swebench 2.0.13 (SWE-Gym's README: "The environment
constants are currently saved at SWE-Bench-Fork"), not on PyPI: this commit of it, fetched with git into
the cache on first use, or named by the environment variable `SWERL_SWEGYM_FORK` (a checkout)."""


def swesmith_release_dir(root: Path | None = None) -> Path:
    """The unpacked swesmith `SWESMITH_RELEASE` wheel (fetched from PyPI the first time)."""
    from swerl.envs.swe.spec_release import unpacked_wheel

    return unpacked_wheel("swesmith", SWESMITH_RELEASE, root,
                          why="its repository profiles say how SWE-smith rows' "
                          "tests run")


# ----------------------------------------------------------------------- in the oracle process

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



# ---------------------------------------------------------------------------- starting the oracle

def _run_oracle(mode: str, rows: list[dict], *, path: str | None = None,
                extra: dict | None = None) -> list[dict]:
    """Run this file as a script in a process whose `swebench` (and `swesmith`) is the one `mode` needs."""
    from swerl.envs.swe.spec_release import SpecError, spec_release_dir

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
