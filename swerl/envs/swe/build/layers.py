"""Building the three Docker layers (base, env, instance) offline, each cached by its content hash and
labelled with its lock."""

from __future__ import annotations

import hashlib
import io
import re
import shutil
import ssl
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import docker.errors

from swerl.envs.swe.build.apt import _fetch_debs
from swerl.envs.swe.build.checkout import _ancestor_tags, _apply_edits, _bundle, _checkout
from swerl.envs.swe.build.locks import _compare, _image_digest, _lock_text
from swerl.envs.swe.build.plan import (
    BASE_IMAGE_LABEL,
    BUILD_TOOLS,
    IN_IMAGE_DEBS,
    IN_IMAGE_WHEELS,
    LAYER_LABEL,
    LOCK_LABEL,
    BuildPlan,
    _split_tag,
)
from swerl.envs.swe.build.templates import (
    _BASE_DOCKERFILE,
    _ENV_DOCKERFILE,
    _INSTANCE_DOCKERFILE,
    _env_setup,
    _instance_install,
)
from swerl.envs.swe.image_build import ImageUnavailable
from swerl.envs.swe.resolve import (
    BuildError,
    Resolver,
    build_requires,
    host_pip_cert,
    lock_digest,
    lock_of,
    pins,
)
from swerl.sandbox.errors import SandboxError
from swerl.sandbox.images import (
    DEBIAN_SUITE,
    LABEL_HASH,
    SUITE_PYTHONS,
    base_tag,
    build_base_image,
    distribution,
)
from swerl.sandbox.session import asset


def _docker_build(client: Any, tag: str, dockerfile: str, files: dict[str, Path | str], *, where: str,
                  log: Callable[[str], None] | None, labels: dict[str, str] | None = None) -> list[str]:
    """`docker build --network none` of a context: the Dockerfile plus `files` (context path → host file or
    folder, or text). Returns the SWERL_BUILD_NOTE lines; a failed build raises ImageUnavailable (the
    step's own SWERL_BUILD_ERROR message when it gave one: BuildError)."""
    with tempfile.TemporaryFile() as ctx:
        with tarfile.open(fileobj=ctx, mode="w") as tar:
            for name, src in {"Dockerfile": dockerfile, **files}.items():
                if isinstance(src, Path):
                    tar.add(src, arcname=name)
                else:
                    data = src.encode("utf-8", "surrogateescape")
                    info = tarfile.TarInfo(name)
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
        ctx.seek(0)
        out: list[str] = []
        try:
            for chunk in client.api.build(fileobj=ctx, custom_context=True, tag=tag, rm=True, forcerm=True,
                                          decode=True, network_mode="none", labels=labels):
                if "stream" in chunk:
                    out.append(chunk["stream"])
                if "error" in chunk:
                    text = "".join(out)
                    why = re.findall(r"SWERL_BUILD_ERROR: (.*)", text)
                    if why:
                        raise BuildError(f"{where}: {why[-1].strip()}")
                    raise ImageUnavailable(f"{where}: building {tag} failed: {chunk['error'].strip()}\n"
                                           f"{text[-3000:]}")
        except docker.errors.APIError as e:
            raise ImageUnavailable(f"{where}: building {tag} failed: {e}") from e
    text = "".join(out)
    if log:
        log(f"built {tag}")
    return [n.strip() for n in re.findall(r"SWERL_BUILD_NOTE: (.*)", text)]


def _verify() -> ssl.SSLContext:
    """TLS as this machine's pip has it (its CA bundle: a proxy's, say), for the as-of index's upstream."""
    cert = host_pip_cert()
    return ssl.create_default_context(cafile=cert) if cert else ssl.create_default_context()


def _swerl_base(client: Any, suite: str, log: Callable[[str], None] | None) -> Any:
    """swerl's base image of `suite`, built (debootstrap, as `swerl sandbox build-base --suite`) when
    missing."""
    tag = base_tag(suite)
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        pass
    if log:
        log(f"{tag} ({distribution(suite)} {suite}, Python {SUITE_PYTHONS[suite]}) is missing: building it "
            "(a minute or two)")
    try:
        build_base_image(suite=suite, client=client, log=None)
    except SandboxError as e:
        flag = "" if suite == DEBIAN_SUITE else f" --suite {suite}"
        raise ImageUnavailable(f"the base image {tag} is missing and could not be built "
                               f"({str(e).splitlines()[0]}) — run `sudo swerl sandbox "
                               f"build-base{flag}`") from e
    return client.images.get(tag)


def _build_base(client: Any, plans: Sequence[BuildPlan], force: bool,
                log: Callable[[str], None] | None, *, check: bool = False) -> tuple[str, str, bool]:
    """SWE-bench's base layer on the swerl base of the plans' (one) suite, under every base name they
    have (a spec with docker_specs names its own: the same layer here). Returns (name, id, built).
    `check`: the layer as it is (none: ImageUnavailable)."""
    suite = plans[0].suite
    if check:
        try:
            return plans[0].base_image, client.images.get(plans[0].base_image).id, False
        except docker.errors.ImageNotFound as e:
            raise ImageUnavailable(f"{plans[0].base_image} is not on this machine: nothing to check "
                                   "(build the images first)") from e
    swerl_base = _swerl_base(client, suite, log)
    shim = asset("conda_activate.sh")
    name = plans[0].base_image
    digest = hashlib.sha256("\0".join([swerl_base.id, shim, _BASE_DOCKERFILE,
                                       base_tag(suite)]).encode()).hexdigest()
    built = False
    if force or _image_digest(client, name) != digest:
        dockerfile = _BASE_DOCKERFILE.format(base=swerl_base.id, layer=LAYER_LABEL,
                                             base_label=BASE_IMAGE_LABEL, swerl_base=base_tag(suite),
                                             hash=LABEL_HASH, digest=digest)
        _docker_build(client, name, dockerfile, {"activate": shim}, where=name, log=log)
        built = True
    image = client.images.get(name)
    for other in sorted({plan.base_image for plan in plans} - {name}):
        repo, tag = _split_tag(other)
        image.tag(repo, tag=tag)
    return name, image.id, built


def _build_env(client: Any, plan: BuildPlan, base_id: str, pip: Resolver, work: Path, force: bool,
               log: Callable[[str], None] | None, *, differs: list[str] | None = None) -> tuple[Path, bool]:
    """The environment layer (its wheel set stays in `work` for the instance layers). Returns (wheel
    folder, built). With `differs` nothing is built: how the image's lock and hash differ from this
    resolution goes there."""
    where = plan.where
    key = hashlib.sha256(plan.env_image.encode()).hexdigest()[:16]
    folder = work / f"env-{key}"
    wheels = folder / "wheels"
    wheels.mkdir(parents=True)
    ctx = folder / "swerl-env"
    ctx.mkdir()
    if log:
        log(f"{where}: resolving the packages of {plan.env_image} as of {pip.index.as_of}")
    pip.collect(list(BUILD_TOOLS), wheels, what=f"{where}: pip and the build tools", binary_only=True)
    tools = pins(wheels, BUILD_TOOLS)
    if plan.conda_packages:
        (ctx / "conda.txt").write_text("\n".join(plan.conda_packages) + "\n")
        pip.collect(["-r", str(ctx / "conda.txt")], wheels, what=f"{where}: the spec's conda packages")
    if plan.requirements.strip():
        (ctx / "requirements.txt").write_text(plan.requirements + "\n")
        pip.collect(["-r", str(ctx / "requirements.txt")], wheels, what=f"{where}: requirements.txt")
    if plan.pip_packages:
        pip.collect(list(plan.pip_packages), wheels, what=f"{where}: the spec's pip_packages")
    pip.sdist_build_requires(wheels, what=where)
    setup = _env_setup(plan, tools)
    (ctx / "setup.sh").write_text(setup)
    lock = _lock_text(pip, lock_of(wheels))
    dockerfile = _ENV_DOCKERFILE.format(base=base_id, wheels=IN_IMAGE_WHEELS, layer=LAYER_LABEL,
                                        hash=LABEL_HASH, digest="")
    digest = hashlib.sha256("\0".join([base_id, dockerfile, setup,
                                       *(p.read_text() for p in sorted(ctx.iterdir())),
                                       lock_digest(lock)]).encode()).hexdigest()
    if differs is not None:
        differs += _compare(client, plan.env_image, digest, lock)
        return wheels, False
    if not force and _image_digest(client, plan.env_image) == digest:
        return wheels, False
    dockerfile = _ENV_DOCKERFILE.format(base=base_id, wheels=IN_IMAGE_WHEELS, layer=LAYER_LABEL,
                                        hash=LABEL_HASH, digest=digest)
    if log:
        log(f"{where}: building {plan.env_image} ({len(lock) - 1} packages)")
    _docker_build(client, plan.env_image, dockerfile, {"wheels": wheels, "swerl-env": ctx}, where=where,
                  log=log, labels={LOCK_LABEL: "\n".join(lock)})
    return wheels, True


def _build_instance(client: Any, plan: BuildPlan, env_wheels: Path, pip: Resolver, work: Path, force: bool,
                    log: Callable[[str], None] | None, *,
                    differs: list[str] | None = None) -> tuple[list[str], bool]:
    """The instance layer. Returns (notes, built); `differs` as for `_build_env`."""
    where = plan.instance_id
    folder = work / f"instance-{hashlib.sha256(where.encode()).hexdigest()[:16]}"
    wheels = folder / "wheels"
    wheels.mkdir(parents=True)
    for p in env_wheels.iterdir():
        shutil.copy2(p, wheels / p.name)
    try:
        env_id = client.images.get(plan.env_image).id
    except docker.errors.ImageNotFound as e:
        raise ImageUnavailable(f"{where}: {plan.env_image} is not on this machine") from e
    tags = _ancestor_tags(plan)  # in the repository too: a version from `git describe`
    src = _checkout(plan, folder, tags)
    _apply_edits(client, env_id, plan, src)  # what the install step reads: sphinx's pins in setup.py
    pyproject = src / "pyproject.toml"
    pip.collect(build_requires(pyproject.read_text() if pyproject.is_file() else None), wheels,
                what=f"{where}: the repository's build requirements")
    pip.collect([f"{src}{plan.project[1:]}"], wheels, what=f"{where}: the repository's dependencies")
    pip.sdist_build_requires(wheels, what=where)
    shutil.rmtree(src)
    # the cached download goes into the build context as it is (written once, never changed, so its
    # file list stands for its contents)
    if plan.apt_packages:
        debs = _fetch_debs(client, env_id, plan, offline=pip.offline, log=log)
        debs_digest = (debs / "packages.json").read_text()
    else:
        debs = folder / "debs"
        debs.mkdir()
        debs_digest = ""
    install = _instance_install(plan)
    lock = _lock_text(pip, lock_of(wheels))
    template = _INSTANCE_DOCKERFILE.format(env=env_id, wheels=IN_IMAGE_WHEELS, debs=IN_IMAGE_DEBS,
                                           base_commit=plan.base_commit, layer=LAYER_LABEL,
                                           task=plan.instance_id.lower(), hash=LABEL_HASH, digest="")
    digest = hashlib.sha256("\0".join([env_id, template, install, plan.base_commit,
                                       *(f"{ref} {obj}" for ref, obj in sorted(tags.items())),
                                       lock_digest(lock), debs_digest]).encode()).hexdigest()
    if differs is not None:
        differs += _compare(client, plan.instance_image, digest, lock)
        return [], False
    if not force and _image_digest(client, plan.instance_image) == digest:
        return [], False
    bundle = _bundle(plan, folder, tags)
    dockerfile = _INSTANCE_DOCKERFILE.format(env=env_id, wheels=IN_IMAGE_WHEELS, debs=IN_IMAGE_DEBS,
                                             base_commit=plan.base_commit, layer=LAYER_LABEL,
                                             task=plan.instance_id.lower(), hash=LABEL_HASH, digest=digest)
    if log:
        log(f"{where}: building {plan.instance_image}")
    notes = _docker_build(client, plan.instance_image, dockerfile,
                          {"repo.bundle": bundle, "wheels": wheels, "debs": debs, "install.sh": install},
                          where=where, log=log, labels={LOCK_LABEL: "\n".join(lock)})
    return notes, True
