"""Run as a script, never imported: derives what published SWE-bench rows leave out, with the
per-repo / per-version spec tables of the swebench release on this process's `sys.path`.

swebench 5 (the release swerl pins for grading) no longer has those tables: its rows must carry an
eval script. The last release that derives them is run here, in a process of its own, so its
`swebench` package never meets the pinned one. stdin: a JSON list of rows; stdout: a JSON list,
per row either {"error": "..."} or the derived fields.

With the argument `build` (`swerl.envs.swe.build`), each row also carries `mirror` (the git directory of
a local mirror of its repository) and gets what building its images needs: the environment script and
image name exactly as `make_test_spec` makes them, with the requirements.txt / environment.yml that
swebench would fetch from raw.githubusercontent.com read from the mirror at the row's
environment_setup_commit instead (its fetching function's `requests` is replaced, in this process only,
so its own path lists, `-r` includes and clean-ups apply unchanged).
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
        return {"error": f"repository {repo!r} has no SWE-bench spec for version {version!r} (specs exist "
                         f"for {known})"}
    if repo not in MAP_REPO_TO_PARSER:
        return {"error": f"repository {repo!r} has no SWE-bench log parser"}
    specs = MAP_REPO_VERSION_TO_SPECS[repo][version]
    env, testbed = "testbed", "/testbed"  # make_test_spec's names
    spec = TestSpec(
        instance_id=row["instance_id"], repo=repo, version=version,
        repo_script_list=make_repo_script_list(specs, repo, testbed, row["base_commit"], env),
        eval_script_list=make_eval_script_list(row, specs, env, testbed, row["base_commit"],
                                               row["test_patch"]),
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


class _MirrorResponse:
    def __init__(self, status_code: int, text: str) -> None:
        self.status_code, self.text = status_code, text


class _MirrorRequests:
    """Stands in for `requests` in swebench's spec code: raw.githubusercontent.com/<repo>/<commit>/<path>
    is `git show <commit>:<path>` of the local mirror; any other URL is refused (there is no network)."""

    def __init__(self, git_dir: str, repo: str) -> None:
        self.git_dir, self.repo = git_dir, repo
        self.read: list[str] = []

    def get(self, url: str, headers: object = None, **_: object) -> _MirrorResponse:
        import posixpath
        import subprocess

        from swebench.harness.constants import SWE_BENCH_URL_RAW

        prefix = SWE_BENCH_URL_RAW.rstrip("/") + f"/{self.repo}/"
        if not url.startswith(prefix):
            raise RuntimeError(f"swebench asked for {url}, which is not a file of {self.repo}: a build reads "
                               "only the local mirror")
        commit, _, path = url[len(prefix):].partition("/")
        path = posixpath.normpath(path)
        got = subprocess.run(["git", "-c", "safe.directory=*", f"--git-dir={self.git_dir}", "show",
                              f"{commit}:{path}"], capture_output=True)
        if got.returncode != 0:
            return _MirrorResponse(404, "")
        self.read.append(path)
        return _MirrorResponse(200, got.stdout.decode("utf-8", "replace"))


def build(row: dict) -> dict:
    """`derive`'s fields plus what building the row's three images needs: SWE-bench's environment
    script and env image name (requirement files read from the mirror), the spec itself, and the
    requirements.txt / environment.yml text that script installs."""
    out = derive(row)
    if "error" in out:
        return out
    import swebench.harness.test_spec.python as pyspec
    from swebench.harness.constants import (
        MAP_REPO_TO_ENV_YML_PATHS,
        MAP_REPO_TO_INSTALL,
        MAP_REPO_TO_REQS_PATHS,
        MAP_REPO_VERSION_TO_SPECS,
    )
    from swebench.harness.test_spec.test_spec import make_test_spec
    from swebench.harness.utils import load_cached_environment_yml

    repo = row["repo"]
    specs = MAP_REPO_VERSION_TO_SPECS[repo][row["version"]]
    mirror = _MirrorRequests(row["mirror"], repo)
    pyspec.requests = mirror  # type: ignore[assignment]  # this process only
    pyspec.get_requirements_by_commit.cache_clear()
    pyspec.get_environment_yml_by_commit.cache_clear()
    commit = row.get("environment_setup_commit") or row["base_commit"]
    record = {k: v for k, v in row.items() if k != "mirror"}
    packages = specs.get("packages", "")
    try:
        spec = make_test_spec(record)
    except ValueError as e:
        if "Could not find" not in str(e):
            raise
        paths = (MAP_REPO_TO_REQS_PATHS.get(repo)
                 if packages == "requirements.txt" else MAP_REPO_TO_ENV_YML_PATHS.get(repo))
        return {"error": f"SWE-bench's spec for {repo} {row['version']} installs the packages of "
                         f"{' or '.join(paths or [packages])}, which the mirror does not have at "
                         f"environment_setup_commit {commit}"}
    requirements = environment_yml = ""
    if load_cached_environment_yml(row["instance_id"]):
        environment_yml = load_cached_environment_yml(row["instance_id"])
    elif packages == "requirements.txt":
        requirements = pyspec.get_requirements(record)
    elif packages == "environment.yml":
        environment_yml = pyspec.get_environment_yml(record, "testbed")
    plain = json.loads(json.dumps(specs, default=str))
    return {**out, "env_image": spec.env_image_key, "env_script": spec.setup_env_script, "specs": plain,
            "requirements": requirements, "environment_yml": environment_yml,
            "repo_install": MAP_REPO_TO_INSTALL.get(repo, ""), "read_from_mirror": sorted(set(mirror.read))}


def main() -> None:
    import swebench

    mode = sys.argv[1] if len(sys.argv) > 1 else "derive"
    fn = {"derive": derive, "build": build}[mode]
    rows = json.load(sys.stdin)
    out = []
    for row in rows:
        try:
            out.append(fn(row))
        except Exception as e:  # one bad row names itself; the others still derive
            out.append({"error": f"swebench {swebench.__version__} could not derive its spec: "
                                 f"{type(e).__name__}: {e}"})
    json.dump({"release": swebench.__version__, "rows": out}, sys.stdout)


if __name__ == "__main__":
    main()
