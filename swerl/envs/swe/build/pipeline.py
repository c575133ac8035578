"""The whole run of `swerl tasks build-images`: plans, then each base, env and instance layer once.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swerl.envs.swe.build.layers import _build_base, _build_env, _build_instance, _verify
from swerl.envs.swe.build.locks import _image_digest
from swerl.envs.swe.build.plan import (
    PAGES_CACHE,
    WHEELS_CACHE,
    BuildPlan,
    BuildResult,
    _split_tag,
    plan_builds,
)
from swerl.envs.swe.image_build import ImageUnavailable
from swerl.envs.swe.images import CACHE_ROOT
from swerl.envs.swe.pypi import AsOfIndex
from swerl.envs.swe.resolve import (
    BuildError,
    Resolver,
    glibc_version,
    host_python,
    manylinux_platforms,
    marker_environment,
)
from swerl.envs.swe.types import SWEInstance
from swerl.sandbox import lifecycle


@dataclass
class _EnvBuild:
    wheels: Path | None = None
    error: BaseException | None = None
    built: bool = False
    instances: list[str] = field(default_factory=list)


def build_images(instances: Sequence[SWEInstance], *, repos: Path, wheels: Path = WHEELS_CACHE,
                 offline: bool = False, force: bool = False, check: bool = False, client: Any = None,
                 log: Callable[[str], None] | None = print, root: Path = CACHE_ROOT) -> list[BuildResult]:
    """Build SWE-bench's base, environment and instance images of `instances` (see the module
    docstring); one `BuildResult` per instance, in order. Never raises for one instance's problem: its
    result says what it was. `check`: build nothing; resolve every env and instance layer again from the
    row, with the index's pages asked afresh, and compare its lock and content hash with the image's
    (`BuildResult.differs`)."""
    client = client or lifecycle.docker_client(timeout=1800)
    plans = plan_builds(instances, Path(repos), root=root)
    results: dict[str, BuildResult] = {}
    ready: list[BuildPlan] = []
    for inst, plan in zip(instances, plans, strict=True):
        if isinstance(plan, BuildError):
            results[inst.instance_id] = BuildResult(inst.instance_id, error=str(plan), bad_input=True)
            continue
        if not force and _image_digest(client, plan.instance_image) == "":  # there, and not built here
            if log:
                log(f"{plan.instance_image} is on this machine and was not built by swerl: kept (force to "
                    "rebuild)")
            results[inst.instance_id] = BuildResult(inst.instance_id, instance_image=plan.instance_image)
            continue
        ready.append(plan)
    if not ready:
        return [results[i.instance_id] for i in instances]

    # suite → (its base layer's name, id, built by this call), or why it could not be had: one suite's
    # missing base image (no root for debootstrap) fails only the rows that need it
    bases: dict[str, tuple[str, str, bool] | ImageUnavailable] = {}
    for suite in dict.fromkeys(plan.suite for plan in ready):
        group = [plan for plan in ready if plan.suite == suite]
        try:
            bases[suite] = _build_base(client, group, force and not check, log, check=check)
        except ImageUnavailable as e:
            bases[suite] = e

    resolvers: dict[str, Resolver] = {}
    envs: dict[str, _EnvBuild] = {}
    with tempfile.TemporaryDirectory(prefix="swerl-build-") as tmp, \
            AsOfIndex(Path(wheels), PAGES_CACHE, offline=offline, refresh=check,
                      verify=_verify()) as index:
        work = Path(tmp)
        for plan in ready:
            iid = plan.instance_id
            base = bases[plan.suite]
            if isinstance(base, ImageUnavailable):
                results[iid] = BuildResult(iid, base_image=plan.base_image, python=plan.python,
                                           swerl_base=plan.swerl_base, error=str(base))
                continue
            base_tag, base_id, built_base = base
            built: list[str] = [base_tag] if built_base else []
            # reported once, with the first instance built on it
            bases[plan.suite] = (base_tag, base_id, False)
            differs: list[str] = []
            try:
                pip = resolvers.get(plan.python)
                if pip is None:
                    exe = host_python(plan.python)
                    markers = None if exe else marker_environment(client, base_id)
                    platforms = () if exe else manylinux_platforms(glibc_version(client, base_id))
                    pip = resolvers[plan.python] = Resolver(
                        index, python=plan.python, exe=exe, markers=markers, platforms=platforms,
                        image=None if exe else base_id, client=client, work=work, log=log)
                env = envs.get(plan.env_image)
                if env is None:
                    env = envs[plan.env_image] = _EnvBuild()
                    try:
                        env.wheels, env.built = _build_env(client, plan, base_id, pip, work, force, log,
                                                           differs=differs if check else None)
                    except (BuildError, ImageUnavailable) as e:
                        env.error = e
                if env.error is not None:
                    raise env.error
                if env.built and not env.instances:
                    built.append(plan.env_image)
                env.instances.append(iid)
                assert env.wheels is not None
                notes, inst_built = _build_instance(client, plan, env.wheels, pip, work, force, log,
                                                    differs=differs if check else None)
                if inst_built:
                    built.append(plan.instance_image)
                if not check:
                    for extra in plan.also_tag:
                        name, tag = _split_tag(extra)
                        client.images.get(plan.instance_image).tag(name, tag=tag)
                results[iid] = BuildResult(iid, base_image=plan.base_image, env_image=plan.env_image,
                                           instance_image=plan.instance_image, python=plan.python,
                                           swerl_base=plan.swerl_base, built=tuple(built), notes=tuple(notes),
                                           differs=tuple(differs))
            except BuildError as e:
                results[iid] = BuildResult(iid, base_image=plan.base_image, python=plan.python,
                                           swerl_base=plan.swerl_base, error=str(e), bad_input=True)
            except ImageUnavailable as e:
                results[iid] = BuildResult(iid, base_image=plan.base_image, python=plan.python,
                                           swerl_base=plan.swerl_base, error=str(e))
    return [results[i.instance_id] for i in instances]
