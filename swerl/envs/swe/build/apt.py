"""The .debs a spec's `apt-get install` steps need, downloaded by the env image's own apt in a throwaway
container on the bridge network (never from a build), cached in .cache/swe/debs."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swerl.envs.swe.build.plan import DEBS_CACHE, BuildPlan
from swerl.envs.swe.image_build import ImageUnavailable
from swerl.envs.swe.resolve import BuildError, run_throwaway

_APT_DOWNLOAD = """set -e
export DEBIAN_FRONTEND=noninteractive
if grep -q '^ID=ubuntu' /etc/os-release; then
    # SWE-bench's base, Ubuntu's official image, lists every component (sphinx's graphviz is in universe);
    # swerl's debootstrapped one lists main (this container only)
    sed -i -E 's/^(deb [^ ]+ [^ ]+) .*/\\1 main restricted universe multiverse/' /etc/apt/sources.list
fi
mkdir -p /out/partial
# apt-get update exits 0 when the archive is out of reach (it warns): that is told apart, exit 90
if ! out=$(apt-get update 2>&1) || printf '%s\\n' "$out" | grep -qE '^(Err|E):|^W: Failed to fetch'; then
    printf '%s\\n' "$out" | grep -E '^(Err|E|W):' | tail -3
    exit 90
fi
apt-get install -y -qq --download-only -o Dir::Cache::archives=/out -o Debug::NoLocking=1 "$@"
rm -rf /out/partial /out/lock
"""


def _fetch_debs(client: Any, image: str, plan: BuildPlan, *, offline: bool,
                log: Callable[[str], None] | None) -> Path:
    """The folder of the .deb files the spec's `apt-get install -y PACKAGES` would install on `image`
    (the env layer: the swerl base's packages are there), recommended packages included as that command
    installs them. They are downloaded by that image's own apt, in a throwaway container on the bridge
    network — the suite's archive is reached from this machine, never from a build — and kept in
    DEBS_CACHE per swerl base and package list."""
    where = plan.where
    key = hashlib.sha256("\0".join([plan.swerl_base, *plan.apt_packages]).encode()).hexdigest()[:16]
    folder = DEBS_CACHE / f"{plan.suite}-{key}"
    done = folder / "packages.json"
    if done.is_file():
        return folder
    if offline:
        raise BuildError(f"{where}: the spec's pre_install apt packages ({' '.join(plan.apt_packages)}) are "
                         f"not downloaded yet ({folder}); run once without --offline")
    if log:
        log(f"{where}: downloading {' '.join(plan.apt_packages)} from {plan.suite}'s archive")
    DEBS_CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=DEBS_CACHE))
    try:
        cmd = ["bash", "-c", _APT_DOWNLOAD, "apt-download", *plan.apt_packages]
        code, output = run_throwaway(client, image, cmd, network_mode="bridge",
                                      volumes={str(tmp): {"bind": "/out", "mode": "rw"}})
        output = output.strip()
        if code != 0:
            lines = output.splitlines()
            # apt's error, else its first warning (the fetch that failed, with why)
            errors, warnings = ([ln for ln in lines if ln.startswith(p)] for p in ("E:", "W:"))
            tail = errors or warnings[:1] or lines
            why = (f"{where}: {plan.suite}'s apt could not download the spec's pre_install packages "
                   f"({' '.join(plan.apt_packages)}): {tail[-1] if tail else f'exit {code}'}")
            # a package the suite does not have is the spec's problem; the archive out of reach (90) or
            # anything else, this machine's
            if code != 90 and re.search(r"Unable to locate package|has no installation candidate", output):
                raise BuildError(why)
            raise ImageUnavailable(why)
        files = sorted(p.name for p in tmp.iterdir() if p.suffix == ".deb")
        (tmp / "packages.json").write_text(json.dumps({"packages": list(plan.apt_packages), "files": files},
                                                      indent=1) + "\n")
        try:
            tmp.rename(folder)
        except OSError:  # another build got there first
            if not done.is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
