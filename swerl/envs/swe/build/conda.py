"""conda → pip: a spec's conda packages and environment.yml dependencies as PyPI requirements
(`conda_to_pip`); a conda dependency that is not a Python package is an error naming it."""

from __future__ import annotations

import re

from swerl.envs.swe.resolve import BuildError

NON_PYTHON_CONDA = frozenset({
    "c-compiler", "cxx-compiler", "fortran-compiler", "compilers", "gcc", "gxx", "gfortran", "clang", "make",
    "cmake", "pkg-config", "nodejs", "yarn", "graphviz", "pandoc", "ffmpeg", "ghostscript", "imagemagick",
    "texlive-core", "tectonic", "git", "mkl", "openblas", "blas", "cudatoolkit", "cudnn", "freetype", "qhull",
    "hdf5", "zlib", "sqlite", "openssl", "icu", "gdal", "proj", "geos", "tk", "xz", "bzip2", "r-base", "go",
    "rust", "curl", "wget", "enchant", "hunspell", "poppler", "cairo", "pango", "boost", "eigen", "libffi",
    "libxml2", "libxslt", "libgdal", "libspatialindex", "libblas", "liblapack", "libgfortran"})
"""Conda packages that are not Python packages (a PyPI project of that name is something else or
nothing): an environment asking for one cannot be made from PyPI."""


def conda_to_pip(spec: str, *, where: str) -> str | None:
    """A conda package spec as a pip requirement (`numpy=1.19` → `numpy==1.19.*`, `x::pkg` → `pkg`);
    None for `python` and `pip` (the venv has them). A non-Python conda package is a BuildError."""
    text = spec.strip().split("::", 1)[-1]
    m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", text)
    if not m:
        raise BuildError(f"{where}: conda package {spec!r} is not a name with an optional version")
    name, rest = m.group(1), m.group(2).replace(" ", "")
    if name.lower() in ("python", "pip"):
        return None
    if name.lower() in NON_PYTHON_CONDA or name.startswith("_"):
        raise BuildError(f"{where}: the conda package {name!r} is not a Python package (no conda channel is "
                         "reachable here and PyPI does not have it as such), so this environment cannot be "
                         "built")
    if rest.startswith("=") and not rest.startswith("=="):
        version = rest[1:].split("=", 1)[0]  # conda's name=version=build
        rest = f"=={version}" if "*" in version else f"=={version}.*"
    return name + rest


def _environment_yml(text: str, where: str) -> tuple[list[str], list[str]]:
    """(conda dependencies, pip dependencies) of an environment.yml."""
    import yaml

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise BuildError(f"{where}: the environment.yml is not valid YAML "
                         f"({str(e).splitlines()[0]})") from None
    conda: list[str] = []
    pip: list[str] = []
    for dep in data.get("dependencies") or []:
        if isinstance(dep, dict):
            pip += [str(p) for p in dep.get("pip") or []]
        else:
            conda.append(str(dep))
    return conda, pip
