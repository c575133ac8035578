"""Sandbox images without a registry.

- `build_base_image`: a Debian or Ubuntu root filesystem by debootstrap + `docker import` (no registry
  needed), or an official image when a registry is reachable; then `sandbox/base.Dockerfile` on top.
  One per suite (`SUITE_PYTHONS`): Debian bookworm's is `swerl-base:latest`, every sandbox's default;
  the others (`swerl-base-SUITE:latest`) exist for what needs that suite's Python (SWE-bench
  environments, `swerl.envs.swe.build`). Ubuntu's suites are debootstrapped from archive.ubuntu.com
  (release pocket) and checked with Ubuntu's archive keyring (`ubuntu-keyring`).
- `build_task_image`: base + a repository at /testbed + Python wheels downloaded on the host and
  installed with no network inside.

Both are cached by a hash of everything that goes into them: an unchanged image costs one lookup.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

import docker.errors

from swerl.sandbox import lifecycle
from swerl.sandbox.errors import SandboxError
from swerl.sandbox.session import ASSETS, asset

BASE_TAG = "swerl-base:latest"
BASE_PACKAGES = ("python3", "git", "patch", "bash", "procps", "ca-certificates")
DEBIAN_SUITE = "bookworm"
"""The suite of `BASE_TAG`."""
SUITE_PYTHONS: dict[str, str] = {"xenial": "3.5", "bionic": "3.6", "focal": "3.8", "bullseye": "3.9",
                                 "jammy": "3.10", "bookworm": "3.11", "trixie": "3.13"}
"""The suites whose archive is reachable (deb.debian.org, archive.ubuntu.com), and the one CPython each
ships as python3. Debian's buster (3.7) and older are only on archive.debian.org; Ubuntu's noble (3.12)
is newer than the debootstrap of Debian bookworm knows."""
UBUNTU_SUITES = frozenset({"xenial", "bionic", "focal", "jammy"})
"""The suites in SUITE_PYTHONS that are Ubuntu's (the others are Debian's)."""
UBUNTU_MIRROR = "http://archive.ubuntu.com/ubuntu"
"""Where Ubuntu suites are debootstrapped from (`SWERL_UBUNTU_MIRROR` overrides it, as
`SWERL_DEBIAN_MIRROR` does Debian's deb.debian.org)."""
UBUNTU_KEYRING = Path("/usr/share/keyrings/ubuntu-archive-keyring.gpg")
"""Ubuntu's archive keys (Debian's `ubuntu-keyring`): debootstrap checks an Ubuntu suite's Release file
with it. Passed explicitly, so a missing one fails instead of debootstrap's unchecked download."""
SUITE_PACKAGES: dict[str, tuple[str, ...]] = {
    "bullseye": ("python3-distutils",), "focal": ("python3-distutils",), "jammy": ("python3-distutils",),
    "bionic": ("python3-distutils", "setpriv")}
"""What a suite needs beyond BASE_PACKAGES: pip and setuptools < 60 import distutils on Python < 3.12,
which Debian and Ubuntu ship apart from python3 from 3.6 on (xenial's 3.5 has it in its stdlib); the
session harness drops to the sandbox user with setpriv, which bionic ships apart from util-linux (in
universe) and xenial not at all (`SUITE_FILES`)."""
SUITE_COMPONENTS: dict[str, tuple[str, ...]] = {"bionic": ("main", "universe")}
"""Archive components debootstrap reads beyond main (bionic's setpriv is in universe)."""
_SETPRIV_SHIM = """#!/usr/bin/python3 -IS
# swerl: xenial's util-linux has no setpriv. The session harness runs only `setpriv --reuid=U --regid=G
# --groups=G1,G2 -- CMD...` (numeric ids), which this does the same way: groups, gid, uid, then exec, with
# the environment and descriptors untouched (chroot --userspec would need CAP_SYS_CHROOT, which sandboxes
# drop). -I -S: nothing from the environment or site-packages runs as root.
import os
import sys

args, opts = sys.argv[1:], {}
while args and args[0] != "--":
    key, _, value = args.pop(0).partition("=")
    opts[key] = value
if len(args) < 2 or set(opts) - {"--reuid", "--regid", "--groups"} or not {"--reuid", "--regid"} <= set(opts):
    sys.exit("setpriv (swerl's shim): only --reuid=U --regid=G [--groups=G,...] -- CMD... is supported")
os.setgroups([int(g) for g in opts.get("--groups", "").split(",") if g])
os.setgid(int(opts["--regid"]))
os.setuid(int(opts["--reuid"]))
os.execvp(args[1], args[1:])
"""
SUITE_FILES: dict[str, dict[str, str]] = {"xenial": {"usr/local/bin/setpriv": _SETPRIV_SHIM}}
"""Files written into a suite's root filesystem after debootstrap (path → text, mode 755)."""
LABEL_HASH = "swerl.content-hash"
_REGISTRY_PROBE_IMAGE = "python:3.11-slim"


def _sha256(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _existing_hash(client: Any, tag: str) -> str | None:
    try:
        img = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return ((img.attrs.get("Config") or {}).get("Labels") or {}).get(LABEL_HASH)


def _build(client: Any, tag: str, log: Any, *, network: bool = False, **context: Any) -> None:
    """`docker build` (of `path=` or `fileobj=`), streaming the log; no network unless asked."""
    try:
        for chunk in client.api.build(tag=tag, rm=True, forcerm=True, decode=True,
                                      network_mode=None if network else "none", **context):
            if "stream" in chunk and log:
                log(chunk["stream"].rstrip())
            if "error" in chunk:
                raise SandboxError(f"building {tag} failed: {chunk['error'].strip()}")
    except docker.errors.APIError as e:
        raise SandboxError(f"building {tag} failed: {e}") from e


def save_image(client: Any, tag: str) -> bytes:
    """Image `tag` as `docker save` writes it, its name included, for `docker load` into another daemon
    (how images reach a cluster's sandbox hosts without a registry)."""
    return b"".join(client.images.get(tag).save(named=True))


def registry_reachable(client: Any) -> bool:
    try:
        client.images.get(_REGISTRY_PROBE_IMAGE)
        return True
    except docker.errors.ImageNotFound:
        pass
    try:
        client.images.pull(_REGISTRY_PROBE_IMAGE)
        return True
    except docker.errors.DockerException:
        return False


def base_tag(suite: str = DEBIAN_SUITE) -> str:
    """The swerl base image of a suite: `swerl-base:latest` for bookworm, `swerl-base-SUITE:latest`."""
    return BASE_TAG if suite == DEBIAN_SUITE else f"swerl-base-{suite}:latest"


def distribution(suite: str) -> str:
    """`Debian` or `Ubuntu`: whose suite it is."""
    return "Ubuntu" if suite in UBUNTU_SUITES else "Debian"


def _check_suite(suite: str) -> None:
    if suite not in SUITE_PYTHONS:
        known = ", ".join(f"{s} (Python {v})" for s, v in SUITE_PYTHONS.items())
        raise ValueError(f"no swerl base image for the suite {suite!r}: the suites are {known}")


def _packages(suite: str) -> tuple[str, ...]:
    return BASE_PACKAGES + SUITE_PACKAGES.get(suite, ())


def _debootstrap_recipe(suite: str) -> str:
    """What the debootstrap route's root filesystem is made of, for its content hash."""
    recipe = f"{suite} {' '.join(_packages(suite))}"
    if suite not in UBUNTU_SUITES:  # a Debian suite's text is what it always was: its image stays up to date
        return recipe
    files = "".join(f"\0{path}\0{text}" for path, text in sorted(SUITE_FILES.get(suite, {}).items()))
    return f"ubuntu {recipe} components={','.join(SUITE_COMPONENTS.get(suite, ('main',)))}{files}"


def _debootstrap_rootfs(client: Any, tag: str, log: Any, suite: str = DEBIAN_SUITE) -> None:
    hint = "" if suite == DEBIAN_SUITE else f" --suite {suite}"
    if os.geteuid() != 0:
        raise SandboxError(f"debootstrap needs root: run `sudo swerl sandbox build-base{hint}` "
                           "(or scripts/setup.sh)")
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap is not installed: `sudo apt-get install debootstrap`, then retry")
    ubuntu = suite in UBUNTU_SUITES
    if ubuntu and not UBUNTU_KEYRING.is_file():
        raise SandboxError(f"Ubuntu's archive keyring {UBUNTU_KEYRING} is not installed (debootstrap checks "
                           f"{suite}'s packages with it): `sudo apt-get install ubuntu-keyring` (on Debian "
                           "bookworm it is in bookworm-backports; scripts/setup.sh installs it), then retry")
    with tempfile.TemporaryDirectory(prefix="swerl-rootfs-") as d:
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(_packages(suite))}"]
        if suite in SUITE_COMPONENTS:
            cmd.append(f"--components={','.join(SUITE_COMPONENTS[suite])}")
        if ubuntu:
            cmd += [f"--keyring={UBUNTU_KEYRING}", suite, d,
                    os.environ.get("SWERL_UBUNTU_MIRROR") or UBUNTU_MIRROR]
        else:
            cmd += [suite, d]
            if os.environ.get("SWERL_DEBIAN_MIRROR"):
                cmd.append(os.environ["SWERL_DEBIAN_MIRROR"])
        if log:
            log(f"$ {' '.join(cmd)}   (a minute or two)")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SandboxError(f"debootstrap failed (exit {proc.returncode}):\n"
                               f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        # apt caches and lists are dead weight in every sandbox
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(Path(d, junk), ignore_errors=True)
        for path, text in SUITE_FILES.get(suite, {}).items():
            Path(d, path).parent.mkdir(parents=True, exist_ok=True)
            Path(d, path).write_text(text)
            Path(d, path).chmod(0o755)
        tar = subprocess.Popen(["tar", "-C", d, "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        try:
            client.api.import_image_from_stream(tar.stdout, repository=tag.split(":")[0],
                                                tag=tag.split(":")[1])
        finally:
            tar.stdout.close()
            tar.wait()


def _registry_recipe(suite: str) -> str:
    """The registry route's root filesystem: bookworm's as shipped; another Debian suite's from the
    official python image of that suite and its Python (same steps); an Ubuntu suite's from the official
    ubuntu image and its python3, with the debootstrap route's packages and files."""
    recipe = asset("registry-root.Dockerfile")
    if suite == DEBIAN_SUITE:
        return recipe
    if suite in UBUNTU_SUITES:
        # the official ubuntu images list universe already (SUITE_COMPONENTS)
        files = "".join(f"COPY {Path(path).name} /{path}\nRUN chmod 755 /{path}\n"
                        for path in SUITE_FILES.get(suite, {}))
        return (f"FROM ubuntu:{suite}\nRUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install "
                f"-y --no-install-recommends {' '.join(_packages(suite))} && rm -rf /var/lib/apt/lists/*\n"
                f"{files}")
    lines = recipe.splitlines(keepends=True)
    first = next(i for i, ln in enumerate(lines) if ln.startswith("FROM "))
    lines[first] = f"FROM python:{SUITE_PYTHONS[suite]}-slim-{suite}\n"
    return "".join(lines)


def build_base_image(tag: str | None = None, *, suite: str = DEBIAN_SUITE, method: str = "auto",
                     force: bool = False, client: Any = None, log: Any = print) -> str:
    """Build the sandbox base image of a Debian or Ubuntu suite (tag: `base_tag(suite)` unless given);
    returns its tag. `method`: auto | debootstrap | registry."""
    if method not in ("auto", "debootstrap", "registry"):
        raise ValueError(f"method must be auto, debootstrap or registry, got {method!r}")
    _check_suite(suite)
    tag = tag or base_tag(suite)
    client = client or lifecycle.docker_client(timeout=600)
    if method == "auto":
        method = "registry" if registry_reachable(client) else "debootstrap"
    stage2 = asset("base.Dockerfile")
    # bookworm's recipe text is what it always was, so its existing image stays up to date
    recipe = _registry_recipe(suite) if method == "registry" else _debootstrap_recipe(suite)
    digest = _sha256(method, recipe, stage2)
    if not force and _existing_hash(client, tag) == digest:
        if log:
            log(f"{tag} is up to date ({digest[:12]})")
        return tag
    root_tag = f"swerl-rootfs:{digest[:16]}"
    try:
        client.images.get(root_tag)
    except docker.errors.ImageNotFound:
        if method == "debootstrap":
            _debootstrap_rootfs(client, root_tag, log, suite)
        else:
            with tempfile.TemporaryDirectory() as d:
                Path(d, "Dockerfile").write_text(recipe)
                for path, text in SUITE_FILES.get(suite, {}).items():
                    Path(d, Path(path).name).write_text(text)
                _build(client, root_tag, log, network=True, path=d)
    with tempfile.TemporaryDirectory() as d:
        text = Template(stage2).substitute(FROM=root_tag) + f"LABEL {LABEL_HASH}={digest}\n"
        Path(d, "Dockerfile").write_text(text)
        _build(client, tag, log, path=d)
    if log:
        log(f"built {tag} ({suite}, {method}, {digest[:12]})")
    return tag


@dataclass(frozen=True)
class TaskImageRecipe:
    """What goes into a task image. Everything here is hashed into the image tag."""

    name: str
    """Short name of the task or repository (lowercase letters, digits, '-', '_', '.')."""
    repo_dir: Path
    """Host directory copied to /testbed (committed as the base commit if it is not a git repo)."""
    wheels_dir: Path | None = None
    """Host directory of .whl files (must include pip's own wheel) installed with --no-index."""
    requirements: tuple[str, ...] = ()
    """Requirement names installed from `wheels_dir` (e.g. ("pytest",))."""
    setup: tuple[str, ...] = ()
    """Extra shell commands run in /testbed as the sandbox user at build time, with no network."""
    base: str = BASE_TAG
    """Image the task image builds FROM."""

    def __post_init__(self) -> None:
        if (not self.name or not all(c.isalnum() or c in "-_." for c in self.name)
                or self.name != self.name.lower()):
            raise ValueError(f"TaskImageRecipe.name must be lowercase [a-z0-9-_.], got {self.name!r}")
        if not Path(self.repo_dir).is_dir():
            raise ValueError(f"TaskImageRecipe.repo_dir {self.repo_dir} is not a directory")
        if self.requirements and self.wheels_dir is None:
            raise ValueError("TaskImageRecipe.requirements need wheels_dir (download them with "
                             "download_wheels)")


def download_wheels(requirements: list[str], dest: Path, *, python_version: str = "3.11") -> Path:
    """Download wheels (and pip's own) on the host for installing in a sandbox with no network."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dest), "--only-binary=:all:",
           "--python-version", python_version, "--platform", "manylinux2014_x86_64", "--platform", "any",
           "pip", *requirements]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SandboxError(f"pip download failed for {requirements}: {proc.stderr[-2000:]}")
    return dest


def _context_tar_entries(recipe: TaskImageRecipe) -> list[tuple[str, Path]]:
    files = []
    for root, dirs, names in os.walk(recipe.repo_dir):
        dirs.sort()
        for n in sorted(names):
            p = Path(root, n)
            files.append((f"repo/{p.relative_to(recipe.repo_dir)}", p))
    if recipe.wheels_dir:
        files += [(f"wheels/{p.name}", p) for p in sorted(Path(recipe.wheels_dir).glob("*.whl"))]
    return files


def task_image_tag(recipe: TaskImageRecipe) -> tuple[str, str, str]:
    """(tag, content hash, rendered Dockerfile) for a recipe, without building anything."""
    h = hashlib.sha256()
    for arc, p in _context_tar_entries(recipe):
        st = p.lstat()
        h.update(arc.encode() + b"\0" + oct(st.st_mode).encode() + b"\0")
        h.update(os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
    setup = "\n".join(f"RUN cd /testbed && {cmd}" for cmd in recipe.setup)
    template = asset("task.Dockerfile")
    partial = dict(BASE=recipe.base, REQUIREMENTS=" ".join(recipe.requirements), SETUP=setup,
                   NAME=recipe.name)
    digest = _sha256(h.hexdigest(), Template(template).safe_substitute(partial))
    text = Template(template).substitute(partial, HASH=digest)
    return f"swerl-task-{recipe.name}:{digest[:16]}", digest, text


def build_task_image(recipe: TaskImageRecipe, *, client: Any = None, log: Any = None) -> str:
    """Build (or find cached) the task image for `recipe`; returns its tag."""
    client = client or lifecycle.docker_client(timeout=600)
    tag, digest, dockerfile = task_image_tag(recipe)
    if _existing_hash(client, tag) == digest:
        return tag
    try:
        client.images.get(recipe.base)
    except docker.errors.ImageNotFound:
        raise SandboxError(f"base image {recipe.base} is missing: run `swerl sandbox build-base` "
                           "first") from None
    return build_from_files(client, tag, dockerfile, _context_tar_entries(recipe), dirs=("repo", "wheels"),
                            log=log)


def build_from_files(client: Any, tag: str, dockerfile: str, files: list[tuple[str, Path]], *,
                     dirs: tuple[str, ...] = (), log: Any = None) -> str:
    """`docker build` (no network) of a context made of `dockerfile`, the empty directories `dirs` and
    `files` ((path in the context, file on the host) pairs); returns `tag`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        df = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(df)
        tar.addfile(info, io.BytesIO(df))
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for arc, p in files:
            tar.add(p, arcname=arc, recursive=False)
    buf.seek(0)
    _build(client, tag, log, fileobj=buf, custom_context=True)
    return tag


def _created(img: Any) -> tuple[str, float]:
    """Sort key of an image's creation time: Docker's RFC 3339 string has a variable-length fraction."""
    stamp = str(img.attrs.get("Created", ""))
    whole, _, frac = stamp.rstrip("Z").partition(".")
    return whole, float(f"0.{frac.split('+')[0] or 0}")


@dataclass(frozen=True)
class PrunedImage:
    """An image `prune_images` removed (or, in a dry run, would remove)."""

    name: str
    """repository:tag, or the image id for an untagged one."""
    size: int
    """Bytes of the image (layers it shares with kept images are not freed)."""


def prune_images(client: Any = None, *, prefix: str = "swerl-", dry_run: bool = False) -> list[PrunedImage]:
    """Remove superseded swerl images. Every image is cached under a content-hash tag, so a changed
    recipe leaves the old tag behind. Among content-hashed images, per repository whose name starts
    with `prefix` the newest is kept and older tags go; untagged leftovers (a tag rebuilt elsewhere) go
    too. An image a container uses (running or not) is kept, and Docker itself refuses to delete one a
    kept image is built on (it is skipped)."""
    client = client or lifecycle.docker_client()
    # the low-level list is one call (the high-level one inspects every container)
    in_use = {c.get("ImageID") for c in client.api.containers(all=True)}
    labelled = client.images.list(filters={"label": LABEL_HASH})
    newest: dict[str, tuple[tuple[str, float], str]] = {}
    for img in labelled:
        for tag in img.tags:
            repo = tag.rsplit(":", 1)[0]
            if repo.startswith(prefix) and (repo not in newest or _created(img) > newest[repo][0]):
                newest[repo] = (_created(img), tag)
    keep = {tag for _, tag in newest.values()}
    pruned: list[PrunedImage] = []
    # newest first: an image built on an older one goes before it, so that one can go too
    for img in sorted(labelled, key=_created, reverse=True):
        if img.id in in_use:
            continue
        names = [t for t in img.tags if t.rsplit(":", 1)[0].startswith(prefix) and t not in keep]
        names = names if img.tags else [img.id]
        for name in names:
            if not dry_run:
                try:
                    client.images.remove(name)
                except docker.errors.APIError:  # a kept image is built on it, or it just got used
                    continue
            pruned.append(PrunedImage(name, int(img.attrs.get("Size", 0))))
    return pruned


__all__ = ["ASSETS", "BASE_TAG", "DEBIAN_SUITE", "SUITE_PYTHONS", "UBUNTU_SUITES", "PrunedImage",
           "TaskImageRecipe", "base_tag", "build_base_image", "build_from_files", "build_task_image",
           "distribution", "download_wheels", "prune_images", "task_image_tag"]
