"""The as-of index (`swerl.envs.swe.pypi`): what every SWE-bench build resolves against — PyPI as it
stood when swebench 4.1.0 was released — with the real PyPI behind it (the first run downloads the few
packages below, about 6 MB) and the host's real pip in front.

The expected versions are PyPI's history, read off its release dates, not this code's output: on
2025-09-11 the newest pip was 25.2 (2025-07-30), setuptools 80.9.0 (2025-05-27), wheel 0.45.1
(2024-11-23), pytest 8.4.2 (2025-09-04); the last releases whose Requires-Python admits 3.5 are pip
20.3.4, setuptools 50.3.2 and wheel 0.37.1, and 3.6's pip 21.3.1 and setuptools 59.6.0.
"""

from __future__ import annotations

import shutil

import pytest
from swe_fixtures import ROOT

from swerl.envs.swe.build import BUILD_TOOLS, BuildError
from swerl.envs.swe.pypi import RESOLVED_AS_OF, AsOfIndex
from swerl.envs.swe.resolve import Resolver, lock_of, pins

MARKERS = {"implementation_name": "cpython", "os_name": "posix", "platform_machine": "x86_64",
           "platform_system": "Linux", "platform_python_implementation": "CPython", "sys_platform": "linux",
           "platform_release": "", "platform_version": ""}


def resolver(index: AsOfIndex, python: str, work) -> Resolver:
    """pip resolving for `python` by --python-version (no interpreter of it needed), wheels only."""
    full = {"3.5": "3.5.2", "3.6": "3.6.9", "3.9": "3.9.2", "3.11": "3.11.2"}[python]
    markers = {**MARKERS, "python_version": python, "python_full_version": full,
               "implementation_version": full}
    return Resolver(index, python=python, exe=None, markers=markers, platforms=["manylinux2014_x86_64"],
                    work=work)


@pytest.mark.parametrize(("python", "expected"), [
    ("3.5", ["pip==20.3.4", "setuptools==50.3.2", "wheel==0.37.1"]),
    ("3.6", ["pip==21.3.1", "setuptools==59.6.0", "wheel==0.37.1"]),
    ("3.9", ["pip==25.2", "setuptools==80.9.0", "wheel==0.45.1"]),
    ("3.11", ["pip==25.2", "setuptools==80.9.0", "wheel==0.45.1"]),
])
def test_every_environment_gets_the_build_tools_of_its_python_as_of_swebench_4_1(tmp_path, python, expected):
    dest = tmp_path / "dest"
    dest.mkdir()
    with AsOfIndex(tmp_path / "wheels", tmp_path / "pages") as index:
        resolver(index, python, tmp_path).collect(list(BUILD_TOOLS), dest, what="tools", binary_only=True)
    assert pins(dest, BUILD_TOOLS) == expected
    assert RESOLVED_AS_OF == "2025-09-11T02:57:58Z"


def test_the_wheels_folder_is_a_cache_never_a_source_of_versions(tmp_path, monkeypatch):
    """pytest 9.2.0 (shipped in tasks/swe/wheels, released after the cutoff) sits in the folder, and the
    user's pip configuration offers it too (PIP_FIND_LINKS): pytest still resolves to 8.4.2. A cached file
    whose content is not the index's is downloaded again; offline, from the cached pages and files, the
    resolution (and so the lock) is the same."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for p in (ROOT / "tasks" / "swe" / "wheels").glob("*.whl"):
        shutil.copy(p, wheels / p.name)
    monkeypatch.setenv("PIP_FIND_LINKS", str(ROOT / "tasks" / "swe" / "wheels"))
    locks = []
    for k, offline in enumerate((False, True, True)):
        dest = tmp_path / f"dest-{k}"
        dest.mkdir()
        with AsOfIndex(wheels, tmp_path / "pages", offline=offline) as index:
            resolver(index, "3.11", tmp_path).collect(["pytest"], dest, what="pytest")
        assert pins(dest, ["pytest", "pluggy"]) == ["pytest==8.4.2", "pluggy==1.6.0"]
        locks.append(lock_of(dest))
        if k == 1:  # a cached file that is not what the index says: replaced, not served
            (cached,) = wheels.glob("pluggy-1.6.0-*.whl")
            cached.write_bytes(b"not a wheel")
            with pytest.raises(BuildError, match=r"; the index did not have file pluggy-1\.6\.0-.*offline"), \
                    AsOfIndex(wheels, tmp_path / "pages", offline=True) as index:
                resolver(index, "3.11", tmp_path).collect(["pytest"], tmp_path / "dest-x", what="pytest")
            with AsOfIndex(wheels, tmp_path / "pages") as index:  # online: downloaded again
                resolver(index, "3.11", tmp_path).collect(["pytest"], tmp_path / "dest-y", what="pytest")
    assert locks[0] == locks[1] == locks[2]
    assert (wheels / "pytest-9.2.0-py3-none-any.whl").is_file()  # kept, never offered


def test_a_project_with_nothing_before_the_cutoff_is_no_matching_distribution(tmp_path):
    """A release after the cutoff is as absent as a project that does not exist: pip says so, one line."""
    dest = tmp_path / "dest"
    dest.mkdir()
    with AsOfIndex(tmp_path / "wheels", tmp_path / "pages") as index, \
            pytest.raises(BuildError, match=r"^late: pip could not resolve it against the package index as "
                                            r"of 2025-09-11T02:57:58Z: ERROR: No matching distribution found "
                                            r"for setuptools==82\.0\.0 \(for Python 3\.11 only wheels"):
        resolver(index, "3.11", tmp_path).collect(["setuptools==82.0.0"], dest, what="late")
