"""`swerl tasks build-images`: SWE-bench's base, environment and instance images, built here from
SWE-bench's own specs, a local git mirror and packages downloaded on the host, found by grading like
pulled images (real Docker).

The row is made up in SWE-bench's published form (no eval script, parser or image). Its repo label,
pallets/flask 3.0, only picks SWE-bench's spec (Python 3.11, `pytest -rA`, requirements/dev.txt from the
repository plus pinned pip_packages — MarkupSafe 2.1.1 has no 3.11 wheel, so one sdist is built in the
image); the code is the shipped inflection library, committed into a mirror with history before
base_commit and the fix after it. The packages come from tasks/swe/wheels and the wheels cache
(.cache/swe/wheels; the first run downloads the spec's pins from the package index, about 1.5 MB).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import docker
import pytest
from conftest_swe import ROOT, pick, swe_suite  # noqa: F401

from swerl.cli import main
from swerl.envs.swe.build import (
    LAYER_LABEL,
    WHEELS_CACHE,
    BuildError,
    BuildPlan,
    _split_pre_install,
    build_images,
    conda_to_pip,
    plan_builds,
)
from swerl.envs.swe.images import extract_source
from swerl.envs.swe.instances import load_instances

IID = "pallets__flask-90101"
SPEC = ("pallets/flask", "3.0")
GIT_ENV = {"GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@example.com", "GIT_COMMITTER_NAME": "dev",
           "GIT_COMMITTER_EMAIL": "dev@example.com", "GIT_AUTHOR_DATE": "2001-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2001-01-01T00:00:00Z"}


def git(cwd, *args: str, input: str | None = None) -> str:
    got = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, capture_output=True, text=True,
                         input=input, env={**os.environ, **GIT_ENV}, check=True)
    return got.stdout.strip()


@pytest.fixture(scope="module")
def mirror(tmp_path_factory, swe_suite):  # noqa: F811
    """A bare mirror `repos/pallets__flask.git` of the shipped inflection library: a release commit (the
    environment_setup_commit, with requirements/dev.txt), base_commit on top, and the fix after it."""
    inst = pick(swe_suite, "inflection")
    tmp = tmp_path_factory.mktemp("build")
    work = tmp / "work"
    shutil.copytree(extract_source("inflection-0.5.1.tar.gz"), work,
                    ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    git(work, "init", "-q", "-b", "main")
    git(work, "apply", "-R", "-", input=inst.patch)  # the bug is in from the start
    (work / "requirements").mkdir()
    (work / "requirements" / "dev.txt").write_text("pytest\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "release 0.5.1")
    env_commit = git(work, "rev-parse", "HEAD")
    (work / "README.rst").write_text((work / "README.rst").read_text() + "\nMore docs.\n")
    git(work, "commit", "-qam", "docs")
    base = git(work, "rev-parse", "HEAD")
    with open(work / "test_inflection.py", "a") as f:
        f.write("# the test patch\n")
    test_patch = git(work, "diff") + "\n"
    git(work, "checkout", "-q", "--", ".")
    git(work, "apply", "-", input=inst.patch)
    git(work, "commit", "-qam", "fix the bug")
    fix = git(work, "rev-parse", "HEAD")
    repos = tmp / "repos"
    repos.mkdir()
    git(tmp, "clone", "-q", "--mirror", str(work), str(repos / "pallets__flask.git"))
    row = {"instance_id": IID, "repo": SPEC[0], "version": SPEC[1], "base_commit": base,
           "environment_setup_commit": env_commit, "patch": inst.patch, "test_patch": test_patch,
           "problem_statement": inst.problem_statement, "hints_text": "", "created_at": "2001-01-01T00:00:00Z",
           "FAIL_TO_PASS": json.dumps(list(inst.fail_to_pass)), "PASS_TO_PASS": json.dumps(list(inst.pass_to_pass))}
    tasks = tmp / "rows.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    return {"repos": repos, "tasks": tasks, "row": row, "base": base, "fix": fix, "tmp": tmp}


def run_cli(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_build_images_makes_swebenchs_three_images_and_grading_uses_them(mirror, capsys):
    rc, out, err = run_cli(["tasks", "build-images", "--tasks", str(mirror["tasks"]), "--repos", str(mirror["repos"]),
                            "--wheels", str(WHEELS_CACHE)], capsys)
    assert rc == 0, out[-3000:] + err
    (inst,) = load_instances(mirror["tasks"])
    (plan,) = plan_builds([inst], mirror["repos"])
    assert isinstance(plan, BuildPlan)
    # SWE-bench's names: the row's derived `image` is the instance image
    assert inst.image == plan.instance_image == f"sweb.eval.x86_64.{IID}:latest"
    assert plan.base_image == "sweb.base.py.x86_64:latest" and plan.env_image.startswith("sweb.env.py.x86_64.")
    assert plan.requirements.strip() == "pytest"  # read from the mirror at environment_setup_commit
    assert f"ok   {IID}: {plan.instance_image} (env {plan.env_image})" in out
    client = docker.from_env()
    for name, layer in ((plan.base_image, "base"), (plan.env_image, "env"), (plan.instance_image, "instance")):
        assert client.images.get(name).labels[LAYER_LABEL] == layer

    from swerl.sandbox import DockerSandbox, SandboxSpec

    with DockerSandbox(SandboxSpec(image=plan.instance_image, user="root"), client=client) as sb:
        def sh(cmd: str) -> str:
            r = sb.run(cmd, timeout=60)
            assert r.exit_code == 0, (cmd, r.output)
            return r.output.strip()

        # /testbed at base_commit, with the history before it and nothing after
        assert sh("cd /testbed && git rev-parse HEAD && git branch --show-current") == f"{mirror['base']}\nmain"
        assert sh("cd /testbed && git rev-list --count HEAD") == "2"
        assert sb.run(f"cd /testbed && git cat-file -e {mirror['fix']}").exit_code != 0
        assert sh("cd /testbed && git remote; git status --porcelain; stat -c %U .") == "swerl"
        # the testbed env: a venv of Python 3.11 at the conda env's path, activated as SWE-bench's scripts do
        py = sh("source /opt/miniconda3/bin/activate && conda activate testbed && "
                "python -c 'import sys, inflection, pytest, werkzeug, markupsafe; "
                "print(sys.prefix, sys.version_info[:2], inflection.__file__, werkzeug.__version__, "
                "markupsafe.__version__)'")
        assert py == "/opt/miniconda3/envs/testbed (3, 11) /testbed/inflection/__init__.py 2.3.7 2.1.1"
        assert sh("ls /tmp/swerl-wheels /tmp/swerl-env 2>&1 | grep -c 'No such' || true") == "2"

    from swerl.envs.swe.grading import grade_patch

    gold, empty = grade_patch(inst, inst.patch), grade_patch(inst, "")
    assert gold.resolved and not gold.failed, gold.error
    assert not empty.resolved and not empty.failed, empty.error

    # a second run finds every layer up to date
    (again,) = build_images([inst], repos=mirror["repos"], log=None)
    assert again.ok and again.built == (), again


def test_a_spec_needing_another_python_is_a_clear_error_naming_it(mirror, capsys):
    row = {**mirror["row"], "instance_id": "pallets__flask-90102", "version": "2.0"}  # flask 2.0: Python 3.9
    tasks = mirror["tmp"] / "py39.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    rc, out, err = run_cli(["tasks", "build-images", "--tasks", str(tasks), "--repos", str(mirror["repos"])], capsys)
    assert rc == 2
    assert "FAIL pallets__flask-90102 (pallets/flask 2.0): SWE-bench's spec needs Python 3.9" in out
    assert "only Python 3.11" in out and err.startswith("swerl: error: 1 instance(s) could not be built")
    with pytest.raises(docker.errors.ImageNotFound):
        docker.from_env().images.get("sweb.eval.x86_64.pallets__flask-90102:latest")


def test_a_missing_mirror_or_commit_is_named(mirror, tmp_path):
    (inst,) = load_instances(mirror["tasks"])
    (no_mirror,) = plan_builds([inst], tmp_path)
    assert isinstance(no_mirror, BuildError) and f"no mirror of pallets/flask under {tmp_path}" in str(no_mirror)
    import dataclasses

    (no_commit,) = plan_builds([dataclasses.replace(inst, base_commit="1" * 40)], mirror["repos"])
    assert isinstance(no_commit, BuildError) and f"does not have its base_commit {'1' * 40}" in str(no_commit)


def test_conda_packages_become_pip_requirements_and_non_python_ones_are_refused():
    assert conda_to_pip("numpy=1.19", where="x") == "numpy==1.19.*"
    assert conda_to_pip("conda-forge::scipy==1.5.2", where="x") == "scipy==1.5.2"
    assert conda_to_pip("pandas<2.0.0", where="x") == "pandas<2.0.0"
    assert conda_to_pip("python=3.11", where="x") is None
    with pytest.raises(BuildError, match="'cxx-compiler' is not a Python package"):
        conda_to_pip("cxx-compiler", where="x")


def test_pre_install_apt_steps_are_checked_and_network_steps_refused():
    apt, other = _split_pre_install(["apt-get update && apt-get install -y locales",
                                     "DEBIAN_FRONTEND=noninteractive apt-get install -y git && && echo ok",
                                     "sed -i 's/a/b/' setup.py"], "x")
    assert apt == ["locales", "git"] and other == ["echo ok", "sed -i 's/a/b/' setup.py"]
    with pytest.raises(BuildError, match="fetches from the network"):
        _split_pre_install(['wget -O "$QHULL_TAR" "$QHULL_URL"'], "x")
