"""Run as a script, never imported: derives what published SWE-bench rows leave out, with the
per-repo / per-version spec tables of the swebench release on this process's `sys.path`.

swebench 5 (the release swerl pins for grading) no longer has those tables: its rows must carry an
eval script. The last release that derives them is run here, in a process of its own, so its
`swebench` package never meets the pinned one. stdin: a JSON list of rows; stdout: a JSON list,
per row either {"error": "..."} or the derived fields.
"""

from __future__ import annotations

import json
import sys


def derive(row: dict) -> dict:
    """The row's eval script, parser, eval type and image names, as `make_test_spec` would make
    them, without the environment script (which fetches requirement files from GitHub: no network
    is needed to grade)."""
    from swebench.harness.constants import FAIL_ONLY_REPOS, MAP_REPO_TO_EXT, MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    from swebench.harness.test_spec.create_scripts import make_eval_script_list, make_repo_script_list
    from swebench.harness.test_spec.test_spec import TestSpec

    repo, version = row.get("repo"), row.get("version")
    if repo not in MAP_REPO_VERSION_TO_SPECS:
        return {"error": f"repository {repo!r} has no SWE-bench spec"}
    if version not in MAP_REPO_VERSION_TO_SPECS[repo]:
        known = ", ".join(sorted(MAP_REPO_VERSION_TO_SPECS[repo], key=str))
        return {"error": f"repository {repo!r} has no SWE-bench spec for version {version!r} (specs exist for {known})"}
    if repo not in MAP_REPO_TO_PARSER:
        return {"error": f"repository {repo!r} has no SWE-bench log parser"}
    specs = MAP_REPO_VERSION_TO_SPECS[repo][version]
    env, testbed = "testbed", "/testbed"  # make_test_spec's names
    spec = TestSpec(
        instance_id=row["instance_id"], repo=repo, version=version,
        repo_script_list=make_repo_script_list(specs, repo, testbed, row["base_commit"], env),
        eval_script_list=make_eval_script_list(row, specs, env, testbed, row["base_commit"], row["test_patch"]),
        env_script_list=[], arch="x86_64", FAIL_TO_PASS=[], PASS_TO_PASS=[], language=MAP_REPO_TO_EXT[repo],
        docker_specs=specs.get("docker_specs", {}), namespace=None,
    )
    return {
        "eval_script": spec.eval_script,
        "log_parser": MAP_REPO_TO_PARSER[repo].__name__,
        "eval_type": "fail_only" if repo in FAIL_ONLY_REPOS else "pass_and_fail",
        "image": spec.instance_image_key,
        "base_image": spec.base_image_key,
        "language": spec.language,
        "install_repo_script": spec.install_repo_script,
        "base_dockerfile": spec.base_dockerfile,
        "python": str(specs.get("python", "")),
    }


def main() -> None:
    import swebench

    rows = json.load(sys.stdin)
    out = []
    for row in rows:
        try:
            out.append(derive(row))
        except Exception as e:  # one bad row names itself; the others still derive
            out.append({"error": f"swebench {swebench.__version__} could not derive its spec: {type(e).__name__}: {e}"})
    json.dump({"release": swebench.__version__, "rows": out}, sys.stdout)


if __name__ == "__main__":
    main()
