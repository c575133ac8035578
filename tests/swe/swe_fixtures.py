"""Fixtures for the SWE task tests (imported by tests/test_swe_*.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tasks" / "swe" / "instances.jsonl"

@pytest.fixture(scope="session")
def swe_suite():
    from swerl.envs.swe.instances import load_instances

    return load_instances(SUITE)

def pick(suite, library: str, *, p2p_contains: str = "", f2p_lacks: str = ""):
    """The first shipped instance of `library` whose PASS_TO_PASS has a test matching `p2p_contains`
    and whose FAIL_TO_PASS has none matching `f2p_lacks`."""
    for inst in suite:
        if not inst.instance_id.startswith(f"{library}__"):
            continue
        if p2p_contains and not any(p2p_contains in t for t in inst.pass_to_pass):
            continue
        if f2p_lacks and any(f2p_lacks in t for t in inst.fail_to_pass):
            continue
        return inst
    raise AssertionError(f"no shipped {library} instance fits (p2p {p2p_contains!r}, f2p without "
                         f"{f2p_lacks!r})")

@pytest.fixture(scope="session")
def swe_log_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("swe-logs")



SWEBENCH_EVAL = """#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/envs/testbed/bin/activate
cd /testbed
git checkout {base} -- {files}
: '>>>>> Start Test Output'
{test_cmd}
: '>>>>> End Test Output'
git checkout {base} -- {files}
"""


def swebench_layout_instance(docker_client, inst, *, variant: str = "future-fix"):
    """`inst` (a shipped offline instance) as it would look in SWE-bench's prebuilt image layout: a
    repository with its own history whose *later* commits hold the fix (branch, tag, remote-tracking ref,
    reflog, stash, a note, a dangling commit; refs packed), HEAD reset to base_commit, and a testbed
    environment at the conda path (a venv over the system's pytest), everything root's and no non-root
    user, as in SWE-bench's images; the row carries an `image` and
    an `eval_script` in SWE-bench's form and no `source`. Variants: `future-fix` (the fix only in later
    commits: history is kept), `parent-fix` (the clean release is HEAD's parent: history must be cut),
    `installed-copy` (the fixed package also installed in site-packages), `no-git` (git removed),
    `grader-files` (R2E-Gym's untracked runner files in /testbed and hidden tests in /r2e_tests),
    `setup-commit` (HEAD is SWE-bench's setup commit on top of base_commit, as its 4.x harness makes
    it) and `other-commit` (HEAD is someone else's commit on top of base_commit)."""
    import dataclasses
    import hashlib
    import io
    import tarfile

    from swerl.envs.swe.grading import graded_test_files
    from swerl.envs.swe.images import library_recipe
    from swerl.sandbox import DockerSandbox, SandboxSpec
    from swerl.sandbox.images import build_task_image

    lib = build_task_image(library_recipe(inst.source), client=docker_client)
    g = "git -c user.name=dev -c user.email=dev@example.com"
    pkg = inst.patch.split("diff --git a/", 1)[1].split("/", 1)[0]
    # like swerl's offline images before scrubbing: the clean release is the parent
    if variant == "parent-fix":
        start = ["git branch -m main", "git apply -R /tmp/fix.diff"]
    else:  # a history of its own in which the bug is old
        start = ["rm -rf .git && git init -q -b main", "git apply -R /tmp/fix.diff", "git add -A",
                 f"{g} commit -qm 'release (the bug is already here)'"]
    steps = [
        "cd /testbed", *start,
        "echo 'changes' > HISTORY.txt && git add -A",
        f"{g} commit -qm 'old work'",
        "echo 'more' >> HISTORY.txt",
        f"{g} commit -qam 'base: unrelated docs change'",
        "base=$(git rev-parse HEAD) && echo $base > /tmp/swerl-test-base",
        "git apply /tmp/fix.diff",
        f"{g} commit -qam 'fix the bug'",
        "git tag v-fixed && git update-ref refs/remotes/origin/main HEAD",
        f"{g} notes add -m 'see the fix' HEAD",
        f"echo dangling | {g} commit-tree HEAD^{{tree}} -p $base >/dev/null",
        "git pack-refs --all",
        "git reset -q --hard $base",
        f"git apply /tmp/fix.diff && {g} stash -q",
    ]
    if variant == "setup-commit":  # what SWE-bench 4.x's harness commits after its setup steps
        steps.append("echo 'setup' >> HISTORY.txt && git -c user.name=SWE-bench "
                     "-c user.email=setup@swebench.config commit -q --allow-empty -am SWE-bench")
    if variant == "other-commit":  # a commit of someone else's between base_commit and HEAD
        steps.append(f"echo 'local' >> HISTORY.txt && {g} commit -qam 'local change'")
    # the testbed environment: a venv at the conda env's path, and swerl's `conda activate` equivalent
    root = ["python3 -m venv --without-pip --system-site-packages /opt/miniconda3/envs/testbed",
            "mkdir -p /opt/miniconda3/bin && cp /tmp/conda_activate.sh /opt/miniconda3/bin/activate"]
    # as SWE-bench's images are: root's tree, no non-root user, no `swerl.user` (the library image's is
    # blanked)
    root += ["chown -R root:root /testbed", "userdel -r swerl"]
    if variant == "grader-files":  # as R2E-Gym's images: untracked runner files and the hidden tests
        root += ["printf 'pytest -rA\\n' > /testbed/run_tests.sh", "mkdir -p /testbed/.venv/bin /r2e_tests",
                 "echo 'def test_hidden(): pass' > /r2e_tests/test_hidden.py"]
    if variant == "installed-copy":
        root.append(f"cp -r /tmp/fixed/{pkg} /usr/local/lib/python3.11/dist-packages/{pkg}")
    if variant == "no-git":
        root.append("rm -f /usr/bin/git")
    dockerfile = "\n".join([
        f"FROM {lib}", "USER root", "COPY fix.diff conda_activate.sh /tmp/", "RUN chmod 644 /tmp/fix.diff",
        "RUN mkdir -p /tmp/fixed && cp -r /testbed/. /tmp/fixed/",  # the clean release = the fixed tree
        "USER swerl", "RUN set -e; " + "; ".join(steps), "USER root", "RUN set -e; " + "; ".join(root),
        "RUN rm -rf /tmp/fixed /tmp/fix.diff /tmp/conda_activate.sh", 'LABEL swerl.user=""', ""])
    shim = (ROOT / "sandbox" / "conda_activate.sh").read_text()
    digest = hashlib.sha256((dockerfile + inst.patch + shim).encode()).hexdigest()[:12]
    tag = f"swerl-test-swebench-layout-{variant}:{digest}"
    try:
        docker_client.images.get(tag)
    except Exception:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, text in (("Dockerfile", dockerfile), ("fix.diff", inst.patch),
                               ("conda_activate.sh", shim)):
                data = text.encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        buf.seek(0)
        for chunk in docker_client.api.build(fileobj=buf, custom_context=True, tag=tag, rm=True, decode=True,
                                             network_mode="none"):
            assert "error" not in chunk, chunk
    with DockerSandbox(SandboxSpec(image=tag, user="root"), client=docker_client) as sb:
        base = sb.run("cat /tmp/swerl-test-base").output.strip()
    files = " ".join(graded_test_files(inst))
    script = SWEBENCH_EVAL.format(base=base, files=files,
                                  test_cmd=inst.test_cmd.replace("python3 -m pytest", "pytest"))
    return dataclasses.replace(inst, instance_id=f"swerl-synth__{inst.instance_id}-{variant}",
                               base_commit=base, image=tag, eval_script=script, source="", test_cmd="")


def swesmith_layout_instance(docker_client, inst):
    """`inst` (a shipped offline instance) as SWE-smith publishes its tasks: an image whose /testbed is
    the clean code as a one-commit mirror (root's, no `swerl.user`), and a row whose bug is a patch
    (`setup_patch`) on top of that HEAD, which no row names (`base_commit` is `HEAD`)."""
    import dataclasses

    from swerl.envs.swe.forms import IMAGE_HEAD, reverse_patch
    from swerl.envs.swe.images import build_cached_image, library_recipe
    from swerl.sandbox.images import build_task_image

    lib = build_task_image(library_recipe(inst.source), client=docker_client)
    dockerfile = "\n".join([
        f"FROM {lib}", "USER root",
        "RUN set -e; cd /testbed; rm -rf .git; git init -q -b main; git add --force .; "
        "git -c user.name=swesmith -c user.email=swesmith@anon.com commit -qm 'Initial commit'; "
        "chown -R root:root /testbed; userdel -r swerl",
        'LABEL swerl.user=""', ""])
    tag = f"swerl-test-swesmith-layout:{hashlib.sha256(dockerfile.encode()).hexdigest()[:12]}"
    build_cached_image(docker_client, tag, tag, {"Dockerfile": dockerfile},
                       failed=lambda error, out: AssertionError(f"{error}\n{out[-2000:]}"))
    return dataclasses.replace(inst, instance_id=f"swerl-synth__{inst.instance_id}-swesmith",
                               base_commit=IMAGE_HEAD, setup_patch=reverse_patch(inst.patch), image=tag,
                               source="", eval_script="")


def slow_gold_command(patch: str, package: str) -> str:
    """Shell lines that apply `patch` and make importing `package` pause 10 s, so a test run is caught
    mid-way by `GradingKiller` (on a loaded Docker daemon too: it polls `docker top`)."""
    return (f"git apply - <<'SWERL_EOF'\n{patch}SWERL_EOF\n"
            f"sed -i '1i import time; time.sleep(10)' {package}/__init__.py")


class GradingKiller:
    """Kills every grading container of this process (labels `swerl.swe.instance` and `swerl.pid`) once
    its tests run, from a thread: the daemon hiccup / OOM kill / host trouble that takes a grading run
    away mid-test."""

    def __init__(self, docker_client, *, after_s: float = 0.5) -> None:
        import threading

        self.client, self.after_s = docker_client, after_s
        self.killed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import os
        import time

        seen: dict[str, float] = {}
        while not self._stop.is_set():
            mine = {"label": ["swerl.swe.instance", f"swerl.pid={os.getpid()}"]}
            for c in self.client.containers.list(filters=mine):
                seen.setdefault(c.id, time.monotonic())
                if time.monotonic() - seen[c.id] >= self.after_s and c.id not in self.killed:
                    try:
                        top = " ".join(" ".join(p) for p in c.top().get("Processes", []))
                    except Exception:
                        continue
                    if "pytest" in top:  # mid-test
                        c.kill()
                        self.killed.append(c.id)
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
