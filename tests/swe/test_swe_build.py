"""`swerl tasks build-images`: SWE-bench's base, environment and instance images, built here from
SWE-bench's own specs, a local git mirror and packages downloaded on the host, found by grading like
pulled images (real Docker).

The rows are made up in SWE-bench's published form (no eval script, parser or image). Their repo label
only picks SWE-bench's spec: pallets/flask 3.0 (Python 3.11 on bookworm's base, `pytest -rA`,
requirements/dev.txt from the repository plus pinned pip_packages — MarkupSafe 2.1.1 has no 3.11 wheel, so
one sdist is built in the image), pallets/flask 2.0 (Python 3.9 on bullseye's base, resolved on the
host for 3.9 by pip's --python-version with the image's environment markers: wheels only, pytest's
`python_version < "3.11"` dependencies included) and pydicom/pydicom 1.3 (Python 3.6 on Ubuntu bionic's
base, as django's 3.x versions: the conda package numpy and pytest, resolved for cp36m and bionic's glibc
2.27); the code is the shipped inflection library, committed into a mirror (one per repo label) with
history before base_commit and the fix after it. The packages come from tasks/swe/wheels and the wheels
cache (.cache/swe/wheels; the first run downloads the specs' packages from the package index, about 25 MB
with numpy). The bullseye and bionic base images are made by debootstrap the first time (a minute or two
each; root, deb.debian.org, archive.ubuntu.com and Ubuntu's keyring needed), then cached by their content
hash like bookworm's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import docker
import pytest
from swe_fixtures import ROOT, pick, swe_suite  # noqa: F401

from swerl.cli import main
from swerl.envs.swe.build import (
    BASE_IMAGE_LABEL,
    LAYER_LABEL,
    WHEELS_CACHE,
    BuildError,
    BuildPlan,
    build_images,
    buildable_pythons,
    conda_to_pip,
    image_lock,
    plan_builds,
)
from swerl.envs.swe.build.plan import _split_pre_install
from swerl.envs.swe.images import ImageUnavailable, extract_source
from swerl.envs.swe.instances import load_instances
from swerl.sandbox.images import SUITE_PYTHONS, base_tag

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
    """Bare mirrors `repos/pallets__flask.git` (and the same as `pydicom__pydicom.git`) of the
    shipped inflection library: a release commit (the environment_setup_commit, with requirements/dev.txt),
    base_commit on top, and the fix after it."""
    inst = pick(swe_suite, "inflection")
    tmp = tmp_path_factory.mktemp("build")
    work = tmp / "work"
    shutil.copytree(extract_source("inflection-0.5.1.tar.gz"), work,
                    ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    git(work, "init", "-q", "-b", "main")
    git(work, "apply", "-R", "-", input=inst.patch)  # the bug is in from the start
    (work / "requirements").mkdir()
    (work / "requirements" / "dev.txt").write_text("pytest\n")
    # sphinx's specs run the tests through tox and edit its config at install time
    (work / "tox.ini").write_text("[tox]\nenvlist = py39\n\n[testenv]\ncommands = pytest {posargs}\n")
    with open(work / "setup.cfg", "a") as f:  # sphinx's specs install `.[test]`, which brings pytest
        f.write("\n[options.extras_require]\ntest = pytest\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "release 0.5.1")
    git(work, "tag", "-a", "v0.5.1", "-m", "0.5.1")  # where setuptools-scm would read the version
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
    git(work, "tag", "v0.5.2")  # the fix's release: must not come along
    fix = git(work, "rev-parse", "HEAD")
    repos = tmp / "repos"
    repos.mkdir()
    for name in ("pallets__flask", "pydicom__pydicom", "sphinx-doc__sphinx"):
        git(tmp, "clone", "-q", "--mirror", str(work), str(repos / f"{name}.git"))
    row = {"instance_id": IID, "repo": SPEC[0], "version": SPEC[1], "base_commit": base,
           "environment_setup_commit": env_commit, "patch": inst.patch, "test_patch": test_patch,
           "problem_statement": inst.problem_statement, "hints_text": "",
           "created_at": "2001-01-01T00:00:00Z", "FAIL_TO_PASS": json.dumps(list(inst.fail_to_pass)),
           "PASS_TO_PASS": json.dumps(list(inst.pass_to_pass))}
    tasks = tmp / "rows.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    return {"repos": repos, "tasks": tasks, "row": row, "base": base, "fix": fix, "tmp": tmp}


def run_cli(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize(("iid", "repo", "version", "python", "suite"), [
    (IID, "pallets/flask", "3.0", "3.11", "bookworm"),
    ("pallets__flask-90103", "pallets/flask", "2.0", "3.9", "bullseye"),
    ("pydicom__pydicom-90104", "pydicom/pydicom", "1.3", "3.6", "bionic"),
], ids=["py3.11-bookworm", "py3.9-bullseye", "py3.6-bionic"])
def test_build_images_makes_swebenchs_three_images_and_grading_uses_them(mirror, capsys, iid, repo, version,
                                                                         python, suite):
    tasks = mirror["tmp"] / f"{iid}.jsonl"
    tasks.write_text(json.dumps({**mirror["row"], "instance_id": iid, "repo": repo, "version": version})
                     + "\n")
    rc, out, err = run_cli(["tasks", "build-images", "--tasks", str(tasks), "--repos", str(mirror["repos"]),
                            "--wheels", str(WHEELS_CACHE)], capsys)
    assert rc == 0, out[-3000:] + err
    (inst,) = load_instances(tasks)
    (plan,) = plan_builds([inst], mirror["repos"])
    assert isinstance(plan, BuildPlan)
    assert (plan.python, plan.suite, plan.swerl_base) == (python, suite, base_tag(suite))
    # SWE-bench's names: the row's derived `image` is the instance image; the base layer of a suite other
    # than bookworm has the suite after SWE-bench's name
    assert inst.image == plan.instance_image == f"sweb.eval.x86_64.{iid}:latest"
    assert plan.base_image == ("sweb.base.py.x86_64:latest" if suite == "bookworm"
                               else f"sweb.base.py.x86_64.{suite}:latest")
    assert plan.env_image.startswith("sweb.env.py.x86_64.")
    # flask's spec reads requirements from the mirror at environment_setup_commit; pydicom's has conda
    # packages
    assert plan.requirements.strip() == ("pytest" if repo == "pallets/flask" else "")
    assert plan.conda_packages == (() if repo == "pallets/flask" else ("numpy",))
    assert (f"ok   {iid}: {plan.instance_image} (env {plan.env_image}); Python {python} on "
            f"{plan.swerl_base}") in out
    client = docker.from_env()
    for name, layer in ((plan.base_image, "base"), (plan.env_image, "env"),
                        (plan.instance_image, "instance")):
        labels = client.images.get(name).labels
        assert (labels[LAYER_LABEL], labels[BASE_IMAGE_LABEL]) == (layer, plan.swerl_base)
    # SWE-bench's pins for the version, and what it names unpinned
    pins = {p.split("==")[0].lower(): p.split("==")[1] for p in plan.pip_packages if "==" in p}
    unpinned = {p.lower() for p in (*plan.pip_packages, *plan.conda_packages) if "==" not in p}

    from swerl.sandbox import DockerSandbox, SandboxSpec

    with DockerSandbox(SandboxSpec(image=plan.instance_image, user="root"), client=client) as sb:
        def sh(cmd: str) -> str:
            r = sb.run(cmd, timeout=60)
            assert r.exit_code == 0, (cmd, r.output)
            return r.output.strip()

        # /testbed at base_commit, with the history before it and nothing after
        assert sh(". /etc/os-release && echo $VERSION_CODENAME") == suite
        assert (sh("cd /testbed && git rev-parse HEAD && git symbolic-ref --short HEAD")
                == f"{mirror['base']}\nmain")
        assert sh("cd /testbed && git rev-list --count HEAD") == "2"
        # the tags on that history came along, as SWE-bench's full clone has them (a version from `git
        # describe`: pytest's own setuptools-scm version is below its minversion without them); later ones
        # did not
        described = sh("cd /testbed && git tag && git describe --tags --abbrev=40")
        assert described == f"v0.5.1\nv0.5.1-1-g{mirror['base']}"
        assert sb.run(f"cd /testbed && git cat-file -e {mirror['fix']}").exit_code != 0
        assert sh("cd /testbed && git remote; git status --porcelain; stat -c %U .") == "swerl"
        # the testbed env: a venv of the suite's Python at the conda env's path, activated as SWE-bench's
        # scripts do, with the spec's pins
        activate = "source /opt/miniconda3/bin/activate && conda activate testbed && "
        py = sh(activate + "python -c 'import sys, inflection, pytest; "
                "print(sys.prefix, \"%d.%d\" % sys.version_info[:2], inflection.__file__)'")
        assert py == f"/opt/miniconda3/envs/testbed {python} /testbed/inflection/__init__.py"
        installed = dict(ln.lower().split("==")
                         for ln in sh(activate + "python -m pip freeze --all").splitlines() if "==" in ln)
        assert {name: installed.get(name) for name in pins} == pins
        assert unpinned <= set(installed), unpinned - set(installed)
        # pip, setuptools and wheel, as conda create gives SWE-bench's env: the newest for the Python on
        # 2025-09-11 (PyPI's history; see tests/swe/test_swe_pypi.py), pkg_resources with them; the spec's
        # own pins win (flask 3.0's setuptools==70.0.0)
        newest = {"3.6": ("21.3.1", "59.6.0", "0.37.1")}.get(python, ("25.2", "80.9.0", "0.45.1"))
        tools = tuple(pins.get(n, v) for n, v in zip(("pip", "setuptools", "wheel"), newest, strict=True))
        assert tuple(installed.get(n) for n in ("pip", "setuptools", "wheel")) == tools
        sh(activate + "python -c 'import pkg_resources'")
        # a python started through a link to the env's (tox-current-env links `.tox/py39/bin/python` to it
        # for SWE-bench's sphinx test command) is the env's python, as with conda's env; the system's stays
        linked = sh("mkdir -p /tmp/lk/bin && ln -sf /opt/miniconda3/envs/testbed/bin/python "
                    "/tmp/lk/bin/python && /tmp/lk/bin/python -c 'import sys, pytest, inflection; "
                    "print(sys.prefix)'")
        assert linked == "/opt/miniconda3/envs/testbed"
        assert sh("/usr/bin/python3 -c 'import sys; print(sys.prefix)'") == "/usr"
        assert sb.run("/usr/bin/python3 -c 'import pytest'").exit_code != 0
        assert sh("ls /tmp/swerl-wheels /tmp/swerl-env 2>&1 | grep -c 'No such' || true") == "2"

    from swerl.envs.swe.grading import grade_patch

    gold, empty = grade_patch(inst, inst.patch), grade_patch(inst, "")
    assert gold.resolved and not gold.failed, gold.error
    assert not empty.resolved and not empty.failed, empty.error
    # the empty patch names each FAIL_TO_PASS test it left failing, with pytest's own line for it
    assert gold.failed_tests == ()
    assert len(empty.failed_tests) == len(inst.fail_to_pass)
    pairs = list(zip(empty.failed_tests, inst.fail_to_pass, strict=True))
    assert all(ln.startswith(f"FAIL_TO_PASS {t}: ") for ln, t in pairs)
    assert all(f": FAILED | FAILED {t}" in ln for ln, t in pairs)

    # a second run finds every layer up to date
    (again,) = build_images([inst], repos=mirror["repos"], log=None)
    assert again.ok and again.built == (), again
    # each layer's lock is on it: every file it installed from, with its sha256
    for name in (plan.env_image, plan.instance_image):
        lock = image_lock(client, name)
        assert lock[0].startswith(f"# as-of 2025-09-11T02:57:58Z python {python} ")
        assert any(line.startswith(f"setuptools-{tools[1]}-") for line in lock), lock
        assert all(re.fullmatch(r"\S+ [0-9a-f]{64}", line) for line in lock[1:])
    # --check resolves again from the row, with fresh pages: the same
    rc, out, err = run_cli(["tasks", "build-images", "--check", "--tasks", str(tasks), "--repos",
                            str(mirror["repos"])], capsys)
    same = f"same {iid}: {plan.env_image}, {plan.instance_image}"
    assert (rc, same) == (0, out.splitlines()[-2]), out + err


def test_one_instance_or_several_in_any_order_give_the_same_images_and_check_names_a_difference(mirror,
                                                                                                capsys):
    """The environment is a function of the row: built one at a time, then together in the other order
    with more (newer) packages in the wheels folder, nothing is rebuilt and every image keeps its content
    hash. An env image whose lock is not what the row resolves to is named by `--check`, file by file."""
    from swerl.sandbox.images import LABEL_HASH

    client = docker.from_env()
    rows = [{**mirror["row"], "instance_id": iid, "repo": "pallets/flask", "version": version}
            for iid, version in (("pallets__flask-90106", "3.0"), ("pallets__flask-90107", "2.0"))]
    tasks = mirror["tmp"] / "pair.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    insts = load_instances(tasks)
    for inst in insts:
        (one,) = build_images([inst], repos=mirror["repos"], log=None)
        assert one.ok, one.error
    names = [n for r in build_images(insts, repos=mirror["repos"], log=None)
             for n in (r.env_image, r.instance_image)]
    hashes = {n: client.images.get(n).labels[LABEL_HASH] for n in names}
    newer = WHEELS_CACHE / "pytest-9.2.0-py3-none-any.whl"  # after the cutoff: never offered
    shutil.copy(ROOT / "tasks" / "swe" / "wheels" / newer.name, newer)
    again = build_images(insts[::-1], repos=mirror["repos"], log=None)
    assert [r.built for r in again] == [(), ()], again
    assert {n: client.images.get(n).labels[LABEL_HASH] for n in names} == hashes

    # an env image under the row's name whose lock says another pytest: --check names it, exit 1
    env = again[1].env_image
    lock = image_lock(client, env)
    (line,) = [ln for ln in lock if ln.startswith("pytest-")]
    forged = "\n".join(ln if ln != line else "pytest-9.2.0-py3-none-any.whl " + "0" * 64 for ln in lock)
    original = client.images.get(env)
    import io
    client.images.build(fileobj=io.BytesIO(f"FROM {original.id}\n".encode()), tag=env,
                        labels={"swerl.lock": forged}, rm=True)
    try:
        (inst,) = [i for i in insts if i.version == "3.0"]
        one = mirror["tmp"] / "one.jsonl"
        one.write_text(json.dumps(rows[0]) + "\n")
        rc, out, err = run_cli(["tasks", "build-images", "--check", "--tasks", str(one), "--repos",
                                str(mirror["repos"])], capsys)
        assert rc == 1, out + err
        assert f"DIFF pallets__flask-90106: {env}" in out
        assert f"     {env}: - pytest-9.2.0-py3-none-any.whl" in out
        assert f"     {env}: + {line.split()[0]}" in out
        assert "0/1 instance(s) resolve to the images' locks" in out
    finally:
        original.tag(*env.rsplit(":", 1))


def test_a_specs_apt_packages_come_from_its_archive_and_its_edits_stay_as_swebench_keeps_them(mirror, capsys):
    """sphinx 7.2's spec (Python 3.9): pre_install apt-installs graphviz and edits tox.ini so pytest prints
    -rA results; its tests run through tox in the current env (pip_packages tox, tox-current-env)."""
    from swerl.envs.swe.build import DEBS_CACHE
    from swerl.envs.swe.images import resolve_image
    from swerl.sandbox import DockerSandbox, SandboxSpec

    iid = "sphinx-doc__sphinx-90105"
    tasks = mirror["tmp"] / f"{iid}.jsonl"
    tasks.write_text(json.dumps({**mirror["row"], "instance_id": iid, "repo": "sphinx-doc/sphinx",
                                 "version": "7.2"}) + "\n")
    (inst,) = load_instances(tasks)
    (plan,) = plan_builds([inst], mirror["repos"])
    assert isinstance(plan, BuildPlan) and (plan.suite, plan.apt_packages) == ("bullseye", ("graphviz",))
    assert "sed -i 's/pytest/pytest -rA/' tox.ini" in plan.steps
    rc, out, err = run_cli(["tasks", "build-images", "--tasks", str(tasks), "--repos", str(mirror["repos"]),
                            "--wheels", str(WHEELS_CACHE)], capsys)
    assert rc == 0, out[-3000:] + err
    (cached,) = [d for d in DEBS_CACHE.glob("bullseye-*")
                 if json.loads((d / "packages.json").read_text())["packages"] == ["graphviz"]]
    debs = json.loads((cached / "packages.json").read_text())["files"]
    assert any(f.startswith("graphviz_") for f in debs) and len(debs) > 1  # with its dependencies
    client = docker.from_env()
    with DockerSandbox(SandboxSpec(image=plan.instance_image), client=client) as sb:  # the agent's user
        assert sb.run("dot -V").output.startswith("dot - graphviz version")
        log = sb.run("cd /testbed && git log -2 --format='%an <%ae> %s'").output.strip().splitlines()
        assert log == ["SWE-bench <setup@swebench.config> SWE-bench", "dev <dev@example.com> docs"]
        assert sb.run("cd /testbed && git rev-parse HEAD~1").output.strip() == mirror["base"]
        assert sb.run("cd /testbed && git status --porcelain && grep -c 'pytest -rA' tox.ini").output == "1\n"
    # the scrub keeps SWE-bench's setup commit as the start; graded through tox with the -rA results
    image = resolve_image(inst, client=client)
    with DockerSandbox(SandboxSpec(image=image), client=client) as sb:
        assert sb.base_commit != mirror["base"] and sb.run("dot -V").ok
    from swerl.envs.swe.grading import grade_patch

    gold, empty = grade_patch(inst, inst.patch), grade_patch(inst, "")
    assert gold.resolved and not gold.failed, gold.error
    assert not empty.resolved and not empty.failed, empty.error
    # offline, the downloaded packages are enough, and nothing is rebuilt
    (again,) = build_images([inst], repos=mirror["repos"], offline=True, log=None)
    assert again.ok and again.built == (), again


def test_apt_packages_the_archive_lacks_or_not_downloaded_offline_are_named_and_no_container_stays(mirror):
    import dataclasses

    from swerl.envs.swe.build.apt import _fetch_debs
    from swerl.sandbox.lifecycle import LABEL_PID

    (inst,) = load_instances(mirror["tasks"])
    (plan,) = plan_builds([inst], mirror["repos"])
    bad = dataclasses.replace(plan, apt_packages=("swerl-no-such-package",))
    client = docker.from_env()
    with pytest.raises(BuildError, match=r"bookworm's apt could not download the spec's pre_install packages "
                                         r"\(swerl-no-such-package\): E: Unable to locate package "
                                         "swerl-no-such-package"):
        _fetch_debs(client, base_tag("bookworm"), bad, offline=False, log=None)
    with pytest.raises(BuildError, match=r"\(swerl-no-such-package\) are not downloaded yet .*; run once "
                                         "without --offline"):
        _fetch_debs(client, base_tag("bookworm"), bad, offline=True, log=None)
    # the archive out of reach is this machine's problem, not the spec's
    import swerl.envs.swe.build.apt as apt

    unreachable = ("sed -i -E 's|http://[^ ]+|http://127.0.0.1:9/debian|' /etc/apt/sources.list\n"
                   + apt._APT_DOWNLOAD)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(apt, "_APT_DOWNLOAD", unreachable)
        with pytest.raises(ImageUnavailable,
                           match=r"bookworm's apt could not download .*: W: Failed to fetch http://127.0.0.1:9/"):
            _fetch_debs(client, base_tag("bookworm"), dataclasses.replace(plan, apt_packages=("less",)),
                        offline=False, log=None)
    assert client.containers.list(all=True, filters={"label": f"{LABEL_PID}={os.getpid()}"}) == []


def test_a_pin_with_only_an_sdist_is_resolved_by_the_images_own_python_then_offline(tmp_path):
    """For a Python this machine has no interpreter of (bullseye's 3.9), the host's pip can resolve wheels
    only. A spec pin that exists only as an sdist (atomicwrites 1.4.1: SWE-bench's pytest 4.x-5.x specs pin
    it; real pytest-dev__pytest-5227 needs it) is resolved by the image's own python3 in a throwaway
    container, against the as-of index; offline, from the index's cached pages and files, to the same
    file — so is a requirements file that needs it, and a project whose setup.py 3.11 cannot run; offline
    with nothing cached it is a one-line error naming what the index lacked. No container stays."""
    from swerl.envs.swe.build import glibc_version, manylinux_platforms, marker_environment
    from swerl.envs.swe.pypi import AsOfIndex
    from swerl.envs.swe.resolve import Resolver
    from swerl.sandbox.images import build_base_image
    from swerl.sandbox.lifecycle import LABEL_PID

    client = docker.from_env()
    base = build_base_image(suite="bullseye", client=client, log=None)
    host = dict(python="3.9", exe=None, markers=marker_environment(client, base), log=None,
                platforms=manylinux_platforms(glibc_version(client, base)), image=base, client=client)
    cache, pages = tmp_path / "wheels", tmp_path / "pages"
    for offline in (False, True):  # the package index once, then its cached pages and files alone
        dest = tmp_path / f"dest-{offline}"
        dest.mkdir()
        with AsOfIndex(cache, pages, offline=offline) as index:
            Resolver(index, work=tmp_path / f"work-{offline}", **host).collect(["atomicwrites==1.4.1"], dest,
                                                                               what="pins")
        assert sorted(p.name for p in dest.iterdir()) == ["atomicwrites-1.4.1.tar.gz"]
    # the same from a requirements file (mounted; real flask 2.0's pins blinker 1.4, pylint 2.x's coveralls
    # needs docopt: sdists only) and from a project whose setup.py runs only on the spec's Python (real
    # requests 2.4's imports what 3.10 dropped), its egg-info left for the host's user to remove
    reqs = tmp_path / "reqs"
    reqs.mkdir()
    (reqs / "requirements.txt").write_text("-r more.txt\n")
    (reqs / "more.txt").write_text("atomicwrites==1.4.1\n")
    project = tmp_path / "project"
    project.mkdir()
    (project / "setup.py").write_text(
        "import collections\nfrom setuptools import setup\ncollections.Mapping  # gone in 3.10\n"
        "setup(name='old', version='1.0', py_modules=[], extras_require={'test': ['atomicwrites==1.4.1']})\n")
    for k, args in enumerate((["-r", str(reqs / "requirements.txt")], [f"{project}[test]"])):
        dest = tmp_path / f"dest-args-{k}"
        dest.mkdir()
        with AsOfIndex(cache, pages, offline=True) as index:
            Resolver(index, work=tmp_path / f"work-args-{k}", **host).collect(args, dest, what="files")
        assert sorted(p.name for p in dest.iterdir()) == ["atomicwrites-1.4.1.tar.gz"]
    shutil.rmtree(project)  # what pip wrote in it is this user's
    # offline with nothing cached: one line naming the pin and what the index did not have
    none = tmp_path / "dest-none"
    none.mkdir()
    with AsOfIndex(tmp_path / "empty", tmp_path / "no-pages", offline=True) as index, \
            pytest.raises(BuildError, match=r"^pins: pip could not resolve it against the package index as "
                                            r"of 2025-09-11T02:57:58Z: .*atomicwrites.*; the index did not "
                                            r"have page (pip|atomicwrites) \(offline.*\(run once without "
                                            r"--offline\)$"):
        Resolver(index, work=tmp_path / "work-none", **host).collect(["atomicwrites==1.4.1"], none,
                                                                     what="pins")
    assert client.containers.list(all=True, filters={"label": f"{LABEL_PID}={os.getpid()}"}) == []


def test_a_spec_needing_a_python_no_suite_ships_is_a_clear_error_naming_it(mirror, capsys):
    # matplotlib 3.0: Python 3.7, which only Debian buster ships (gone from deb.debian.org); its spec reads
    # requirements/testing/travis_all.txt at environment_setup_commit, so the mirror has one
    work = mirror["tmp"] / "matplotlib"
    git(mirror["tmp"], "clone", "-q", str(mirror["repos"] / "pallets__flask.git"), str(work))
    (work / "requirements" / "testing").mkdir()
    (work / "requirements" / "testing" / "travis_all.txt").write_text("pytest\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "matplotlib's requirements")
    git(mirror["tmp"], "clone", "-q", "--mirror", str(work),
        str(mirror["repos"] / "matplotlib__matplotlib.git"))
    row = {**mirror["row"], "instance_id": "matplotlib__matplotlib-90102", "repo": "matplotlib/matplotlib",
           "version": "3.0", "environment_setup_commit": git(work, "rev-parse", "HEAD")}
    tasks = mirror["tmp"] / "py37.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    rc, out, err = run_cli(["tasks", "build-images", "--tasks", str(tasks), "--repos", str(mirror["repos"])],
                           capsys)
    assert rc == 2
    (line,) = [ln for ln in out.splitlines() if ln.startswith("FAIL ")]
    assert line.startswith("FAIL matplotlib__matplotlib-90102 (matplotlib/matplotlib 3.0): SWE-bench's spec "
                           "needs Python 3.7, which no Debian or Ubuntu suite reachable here ships")
    assert f"the versions that build are {buildable_pythons()}" in line
    assert all(f"{py} ({suite})" in line for suite, py in SUITE_PYTHONS.items())
    assert err.startswith("swerl: error: 1 instance(s) could not be built")
    with pytest.raises(docker.errors.ImageNotFound):
        docker.from_env().images.get("sweb.eval.x86_64.matplotlib__matplotlib-90102:latest")


def test_a_missing_mirror_or_commit_is_named(mirror, tmp_path):
    (inst,) = load_instances(mirror["tasks"])
    (no_mirror,) = plan_builds([inst], tmp_path)
    assert (isinstance(no_mirror, BuildError)
            and f"no mirror of pallets/flask under {tmp_path}" in str(no_mirror))
    import dataclasses

    (no_commit,) = plan_builds([dataclasses.replace(inst, base_commit="1" * 40)], mirror["repos"])
    assert isinstance(no_commit, BuildError) and f"does not have its base_commit {'1' * 40}" in str(no_commit)


def test_a_swegym_repository_is_refused_naming_its_prebuilt_image(mirror, tmp_path):
    import dataclasses

    (inst,) = load_instances(mirror["tasks"])
    gym = dataclasses.replace(inst, instance_id="getmoto__moto-90001", repo="getmoto/moto")
    (err,) = plan_builds([gym], mirror["repos"])
    assert isinstance(err, BuildError) and str(err).startswith("getmoto__moto-90001: getmoto/moto is one of "
                                                               "SWE-Gym's repositories")
    assert "load SWE-Gym's prebuilt image xingyaoww/sweb.eval.x86_64.getmoto_s_moto-90001:latest" in str(err)


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


def test_pre_install_edits_are_applied_to_the_checkout_its_dependencies_are_resolved_from(mirror, tmp_path):
    """sphinx 3.5's spec edits setup.py before `pip install -e .[test]` (Jinja2<3.0, markupsafe<=2.0.1;
    real sphinx-doc__sphinx-8721): the packages downloaded for the install are resolved from the edited
    file. The edits run in a throwaway container with no network, as this machine's user; a step that
    fails there (one writing /etc as root) is let be, and no container stays."""
    import dataclasses

    from swerl.envs.swe.build.checkout import _apply_edits
    from swerl.sandbox.images import build_base_image
    from swerl.sandbox.lifecycle import LABEL_PID

    (inst,) = load_instances(mirror["tasks"])
    (plan,) = plan_builds([dataclasses.replace(inst, repo="sphinx-doc/sphinx", version="3.5")],
                          mirror["repos"])
    assert isinstance(plan, BuildPlan)
    assert "sed -i 's/Jinja2>=2.3/Jinja2<3.0/' setup.py" in plan.edits
    assert set(plan.edits) <= set(plan.steps) and not any("pip install" in e for e in plan.edits)
    src = tmp_path / "src"
    src.mkdir()
    (src / "setup.py").write_text("install_requires = [\n    'Jinja2>=2.3',\n    'packaging',\n]\n")
    (src / "tox.ini").write_text("[testenv]\ncommands = pytest\n")
    client = docker.from_env()
    image = build_base_image(suite=plan.suite, client=client, log=None)
    edits = ("echo 'en_US UTF-8' > /etc/locale.gen", *plan.edits)
    _apply_edits(client, image, dataclasses.replace(plan, edits=edits), src)
    assert (src / "setup.py").read_text() == ("install_requires = [\n    'Jinja2<3.0',\n    'packaging', "
                                              "'markupsafe<=2.0.1',\n]\n")
    assert (src / "tox.ini").read_text() == "[testenv]\ncommands = pytest -rA\n"
    assert {p.stat().st_uid for p in src.iterdir()} == {os.getuid()}
    assert client.containers.list(all=True, filters={"label": f"{LABEL_PID}={os.getpid()}"}) == []


def test_specs_sharing_an_env_image_give_it_the_same_setup_script(mirror):
    """sphinx 3.3 and 3.5 (real sphinx-doc__sphinx-8273 and -8721) have one env image by SWE-bench's name:
    its script must not depend on which of them is built first."""
    import dataclasses

    from swerl.envs.swe.build.templates import _env_setup

    (inst,) = load_instances(mirror["tasks"])
    rows = [dataclasses.replace(inst, repo="sphinx-doc/sphinx", version=v) for v in ("3.3", "3.5")]
    plans = plan_builds(rows, mirror["repos"])
    assert all(isinstance(p, BuildPlan) for p in plans)
    assert plans[0].env_image == plans[1].env_image
    tools = ["pip==25.2", "setuptools==80.9.0", "wheel==0.45.1"]
    assert _env_setup(plans[0], tools) == _env_setup(plans[1], tools)
