"""Images for SWE instances.

Order of preference:
1. an offline instance (`source` set): built here, without the network, from the library's source
   distribution under tasks/swe/sources + the pytest wheels under tasks/swe/wheels. Two layers: a
   library image (the clean release at /testbed, shared by all its instances) and a thin instance
   layer that reverses the gold patch and commits the result as the root commit of a new repository,
   which must be `base_commit` (the clean release is in no commit the agent can reach);
2. the image the instance names (`image`, newer SWE-bench datasets), local or pulled;
3. SWE-bench's prebuilt image `swebench/sweb.eval.x86_64.<id>` (`__` written `_1776_`), local or pulled.
Nothing fits → `ImageUnavailable` naming the instance and what was tried, never a crash elsewhere.

Whichever it is, episodes and grading run on its scrubbed layer (`swerl.envs.swe.scrub`): no git object,
ref, installed copy or archive in it holds the fixed files.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from pathlib import Path
from typing import Any

import docker.errors

from swerl.envs.swe.image_build import ImageUnavailable, build_cached_image, lock
from swerl.envs.swe.scrub import scrub_image
from swerl.envs.swe.types import SWEInstance
from swerl.sandbox import lifecycle
from swerl.sandbox.images import LABEL_HASH, TaskImageRecipe, build_task_image

TASKS_ROOT = Path(__file__).resolve().parents[3] / "tasks" / "swe"
CACHE_ROOT = Path(__file__).resolve().parents[3] / ".cache" / "swe"
# Fixed identity and dates: the buggy commit's sha depends only on the trees, so a fresh machine
# rebuilds exactly the base_commit recorded in the instance.
COMMIT_ENV = ("GIT_AUTHOR_NAME=swerl GIT_AUTHOR_EMAIL=swerl@localhost GIT_COMMITTER_NAME=swerl "
              "GIT_COMMITTER_EMAIL=swerl@localhost GIT_AUTHOR_DATE=2000-01-02T00:00:00Z "
              "GIT_COMMITTER_DATE=2000-01-02T00:00:00Z")


def swebench_image_name(instance_id: str, arch: str = "x86_64") -> str:
    """SWE-bench's prebuilt instance image (Docker names cannot hold `__`, hence `_1776_`)."""
    return f"swebench/sweb.eval.{arch}.{instance_id.replace('__', '_1776_')}:latest".lower()


def commit_command(message: str) -> str:
    """Shell that commits the work tree of /testbed with swerl's fixed identity and dates."""
    return f"git add -A && {COMMIT_ENV} git commit -q --no-verify -m '{message}'"


def library_name(source: str) -> str:
    """`more_itertools-11.2.1.tar.gz` → `more_itertools`."""
    m = re.match(r"(.+?)-\d[^-]*\.(tar\.gz|zip)$", source)
    if not m:
        raise ValueError(f"source {source!r} is not an sdist name like NAME-VERSION.tar.gz")
    return m.group(1)


def extract_source(source: str, *, tasks_root: Path = TASKS_ROOT, cache_root: Path = CACHE_ROOT) -> Path:
    """The sdist unpacked (its single top-level folder stripped) in the cache; reused when present."""
    sdist = tasks_root / "sources" / source
    if not sdist.is_file():
        raise ImageUnavailable(f"source {source!r} is not in {tasks_root / 'sources'}")
    dest = cache_root / "src" / source.removesuffix(".tar.gz")
    with lock(str(dest)):
        if dest.is_dir():
            return dest
        tmp = dest.with_name(dest.name + ".tmp")
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        with tarfile.open(sdist) as tar:
            for m in tar.getmembers():
                parts = m.name.split("/", 1)
                if len(parts) < 2 or not parts[1] or not (m.isfile() or m.isdir()):
                    continue
                m.name = parts[1]
                tar.extract(m, tmp, filter="data")
        tmp.rename(dest)
    return dest


def library_recipe(source: str, *, tasks_root: Path = TASKS_ROOT) -> TaskImageRecipe:
    """The library image: the clean release at /testbed (committed by the task Dockerfile) + pytest."""
    name = "swe-" + library_name(source).lower().replace("_", "-")
    return TaskImageRecipe(name=name, repo_dir=extract_source(source, tasks_root=tasks_root),
                           wheels_dir=tasks_root / "wheels", requirements=("pytest",))


def _instance_dockerfile(base: str, instance: SWEInstance, digest: str) -> str:
    return (
        f"FROM {base}\n"
        "COPY --chown=swerl:swerl fix.diff /tmp/swerl-fix.diff\n"
        "USER swerl\n"
        # The gold patch goes from buggy to clean, so reversing it on the clean tree gives the buggy one;
        # committed as the root of a new repository, so no commit holds the clean tree.
        f"RUN set -e; cd /testbed; git apply -R /tmp/swerl-fix.diff; rm /tmp/swerl-fix.diff; "
        f"rm -rf .git; git init -q -b main; {commit_command(instance.instance_id)}; "
        f"head=$(git rev-parse HEAD); if [ \"$head\" != '{instance.base_commit}' ]; then "
        f"echo \"base_commit mismatch: built $head, instance says {instance.base_commit}\"; exit 1; fi\n"
        "USER root\n"
        f"LABEL swerl.user=swerl swerl.task={instance.instance_id.lower()} {LABEL_HASH}={digest}\n"
        "STOPSIGNAL SIGKILL\n"
    )


def build_offline_image(instance: SWEInstance, *, client: Any = None, tasks_root: Path = TASKS_ROOT,
                        log: Any = None) -> str:
    """Build (or find cached) the image of an offline instance; returns its tag."""
    client = client or lifecycle.docker_client(timeout=600)
    with lock(f"library:{instance.source}"):  # concurrent graders share one library image build
        base = build_task_image(library_recipe(instance.source, tasks_root=tasks_root), client=client,
                                log=log)
    digest = hashlib.sha256("\0".join([base, instance.instance_id, instance.base_commit, instance.patch,
                                        _instance_dockerfile(base, instance, "")]).encode()).hexdigest()
    safe = re.sub(r"[^a-z0-9_.-]", "-", instance.instance_id.lower())
    tag = f"swerl-swe-{safe}:{digest[:16]}"
    build_cached_image(client, tag, digest, {"Dockerfile": _instance_dockerfile(base, instance, digest),
                                             "fix.diff": instance.patch},
                       failed=lambda error, out: ImageUnavailable(
                           f"{instance.instance_id}: building {tag} failed: {error}\n{out[-1500:]}"))
    return tag


def _local_or_pull(client: Any, name: str, pull: bool) -> bool:
    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        pass
    if not pull:
        return False
    try:
        client.images.pull(name)
        return True
    except docker.errors.DockerException:
        return False


def resolve_image(instance: SWEInstance, *, client: Any = None, tasks_root: Path = TASKS_ROOT,
                  pull: bool = True, log: Any = None, scrub: bool = True) -> str:
    """The image to grade (or run an agent on) `instance`: its scrubbed layer (`scrub=False`: the image
    itself, for tools that must see it as built); see the module docstring for the order."""
    client = client or lifecycle.docker_client(timeout=600)
    raw = _raw_image(instance, client=client, tasks_root=tasks_root, pull=pull, log=log)
    return scrub_image(instance, raw, client=client, log=log) if scrub else raw


def _raw_image(instance: SWEInstance, *, client: Any, tasks_root: Path, pull: bool, log: Any) -> str:
    if instance.source:
        return build_offline_image(instance, client=client, tasks_root=tasks_root, log=log)
    tried = []
    for name in (instance.image, swebench_image_name(instance.instance_id)):
        if name and name not in tried:
            tried.append(name)
            if _local_or_pull(client, name, pull):
                return name
    raise ImageUnavailable(
        f"{instance.instance_id}: no image: {', '.join(tried)} "
        f"{'is' if len(tried) == 1 else 'are'} not on this machine and cannot be pulled, and the instance "
        "has no `source` to build one from — load the image (`docker load`) or build it with SWE-bench's "
        "image builder on a machine with network access.")
