"""The text-game image: one image every text game runs in, built FROM the base image with the games'
wheels installed offline (exact pins, no dependency resolution), the swerl sources the game server
imports and the game data. Its tag is a content hash of all of that, so an unchanged recipe costs one
lookup and any change (a source file, a pin, the Dockerfile) builds a new image.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from string import Template
from typing import Any

from swerl.envs.textgame.protocol import GAME_KINDS
from swerl.sandbox.errors import SandboxError

REPO_ROOT = Path(__file__).resolve().parents[3]

TEXTGAME_ROOT = "/opt/swerl"
"""Where the image holds the swerl sources and data (the server's working directory)."""
TEXTGAME_USER = "swerl"
"""The unprivileged user the game server runs as."""

TEXTGAME_IMAGE = "swerl-textgames"
"""Repository name of the text-game image; the tag is the content hash."""

TEXTGAME_REQUIREMENTS: list[str] = [
    # ALFWorld: its PDDL domain and grammar, TextWorld's PDDL engine and what TextWorld imports
    # (jericho's spacy is only imported for Z-machine games, so it stays out)
    "alfworld==0.4.2",
    "textworld==1.7.0",
    "numpy==2.4.6",
    "tatsu==5.8.3",
    "networkx==3.6.1",
    "more-itertools==11.2.1",
    "hashids==1.3.1",
    "mementos==1.3.1",
    "termcolor==3.3.0",
    "prompt-toolkit==3.0.53",
    "wcwidth==0.9.4",
    "tqdm==4.70.1",
    # WebShop: BM25 search (on numpy, above), fuzzy matching in the reward, the Porter stemmer
    "bm25s==0.3.16",
    "rapidfuzz==3.14.6",
    "snowballstemmer==3.1.1",
    # FrozenLake (swerl/envs/games): gymnasium's FrozenLake-v1 (on numpy, above) and what gymnasium imports
    "gymnasium==1.4.0",
    "cloudpickle==3.1.3",
    "farama-notifications==0.0.6",
    "typing-extensions==4.16.0",
]
"""Binary wheels (exact pins, no dependency resolution: the list is complete) installed in the image."""

TEXTGAME_LOCAL_WHEELS: list[str] = [
    # sdists only on PyPI: built once on the host (`build_local_wheel`) and cached
    "fast-downward-textworld==20.6.4",
    "jericho==3.3.1",
]
"""Requirements built from source on the host (cached in the wheels directory) and installed too."""

TEXTGAME_SOURCES: list[str] = [
    "swerl/__init__.py",
    "swerl/structs.py",
    "swerl/envs/__init__.py",
    "swerl/envs/textgame/__init__.py",
    "swerl/envs/textgame/protocol.py",
    "swerl/envs/textgame/server.py",
    "swerl/envs/alfworld",
    "swerl/envs/webshop",
    "swerl/envs/games",
]
"""swerl files (or directories) copied to the image: the server, what it imports and each game package
(whose `__init__` must import only game modules). The server runs with only these on its path, so a
new import in any of them must be listed here too (tests/envs/test_textgame.py imports them from a copy)."""

TEXTGAME_DATA_DIRS: list[str] = [
    "tasks/alfworld",
    "tasks/webshop",
]
"""Data directories copied to the image, at the same relative path under `TEXTGAME_ROOT`."""

TEXTGAME_WHEELS_DIR = REPO_ROOT / ".cache" / "wheels" / "textgames"
PIP_REQUIREMENT = "pip==26.3"
"""pip's own wheel, run from the wheel inside the image (the base image has no pip)."""


# pip does not widen a manylinux_2_x tag to the older ones, so every family up to bookworm's glibc is named
_PLATFORMS = ("manylinux_2_36_x86_64", "manylinux_2_34_x86_64", "manylinux_2_28_x86_64",
              "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _split_pin(req: str) -> tuple[str, str]:
    name, sep, version = req.partition("==")
    if not sep or not version:
        raise ValueError(f"text-game requirement {req!r} must be pinned as name==version")
    return name.strip(), version.strip()


def _find_wheel(dest: Path, req: str) -> Path | None:
    name, version = _split_pin(req)
    for p in sorted(dest.glob("*.whl")):
        parts = p.name.split("-")
        if len(parts) >= 2 and _norm(parts[0]) == _norm(name) and parts[1] == version:
            return p
    return None


def build_local_wheel(req: str, dest: Path, *, log: Callable[[str], None] | None = None) -> Path:
    """Build `req` (an sdist) into a wheel in `dest`, once. The venv's bin goes first on PATH because
    some build scripts call a bare `python` (fast-downward's does), which must be this interpreter,
    not whatever `python` the machine has (a pyenv shim breaks pip's isolated build env)."""
    found = _find_wheel(dest, req)
    if found:
        return found
    dest.mkdir(parents=True, exist_ok=True)
    if log:
        log(f"building {req} from source (a few minutes, once)")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dest),
                           req],
                          capture_output=True, text=True, env=env)
    found = _find_wheel(dest, req)
    if proc.returncode != 0 or found is None:
        raise SandboxError(f"building a wheel of {req} failed (needs make, cmake and a C++ compiler):\n"
                           f"{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return found


def ensure_textgame_wheels(dest: Path = TEXTGAME_WHEELS_DIR, *,
                           log: Callable[[str], None] | None = None) -> list[Path]:
    """Every wheel the image installs, downloading (or building) the missing ones into `dest`."""
    binary = [PIP_REQUIREMENT, *TEXTGAME_REQUIREMENTS]
    missing = [r for r in binary if _find_wheel(dest, r) is None]
    if missing:
        dest.mkdir(parents=True, exist_ok=True)
        if log:
            log(f"downloading {len(missing)} wheel(s) for the text-game image")
        # the image is Debian bookworm's CPython 3.11 (glibc 2.36)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3",
               "--abi", "none", *[a for tag in _PLATFORMS for a in ("--platform", tag)], "-d", str(dest),
               *missing]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SandboxError(f"pip download failed for {missing}: {proc.stderr[-3000:]}")
    out = []
    for r in binary:
        w = _find_wheel(dest, r)
        if w is None:
            raise SandboxError(f"no wheel of {r} in {dest} after downloading it")
        out.append(w)
    out += [build_local_wheel(r, dest, log=log) for r in TEXTGAME_LOCAL_WHEELS]
    return out


def _tree(root: Path, rel: str) -> list[tuple[str, Path]]:
    p = root / rel
    if p.is_file():
        return [(rel, p)]
    if not p.is_dir():
        raise SandboxError(f"{p} is missing: the text-game image needs it (run from the swerl checkout)")
    files = []
    for d, dirs, names in os.walk(p):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for n in sorted(names):
            if n.endswith((".pyc", ".pyo")):
                continue
            f = Path(d, n)
            files.append((str(f.relative_to(root)), f))
    return files


def textgame_context(wheels: Sequence[Path],
                     root: Path = REPO_ROOT) -> tuple[str, str, list[tuple[str, Path]]]:
    """(tag, rendered Dockerfile, [(path in the build context, host file)]) of the text-game image."""
    files = [(f"wheels/{w.name}", w) for w in sorted(wheels, key=lambda w: w.name)]
    for rel in TEXTGAME_SOURCES:
        files += [(f"src/{a}", p) for a, p in _tree(root, rel)]
    for rel in TEXTGAME_DATA_DIRS:
        files += [(f"src/{a}", p) for a, p in _tree(root, rel)]
    template = (root / "sandbox" / "textgames" / "Dockerfile").read_text()
    pip_wheel = next(w.name for w in wheels if _norm(w.name.split("-")[0]) == "pip")
    partial = dict(BASE=_base_tag(), PIP_WHEEL=pip_wheel, ROOT=TEXTGAME_ROOT, USER=TEXTGAME_USER,
                   KINDS=" ".join(sorted(GAME_KINDS)))
    h = hashlib.sha256(Template(template).safe_substitute(partial).encode())
    for arc, p in files:
        h.update(b"\0" + arc.encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    digest = h.hexdigest()
    return f"{TEXTGAME_IMAGE}:{digest[:16]}", Template(template).substitute(partial, HASH=digest), files


def _base_tag() -> str:
    from swerl.sandbox.images import BASE_TAG

    return BASE_TAG


def build_textgame_image(*, client: Any = None, log: Callable[[str], None] | None = None,
                         wheels_dir: Path = TEXTGAME_WHEELS_DIR) -> str:
    """Build (or find, by content hash: an unchanged recipe costs one lookup) the one image every text
    game runs in: the base image + the game wheels installed offline + the swerl sources the server
    needs + the game data. Returns its tag."""
    import docker.errors

    from swerl.sandbox import lifecycle
    from swerl.sandbox.images import LABEL_HASH, build_from_files

    client = client or lifecycle.docker_client(timeout=600)
    wheels = ensure_textgame_wheels(wheels_dir, log=log)
    tag, dockerfile, files = textgame_context(wheels)
    digest = tag.split(":")[1]
    try:
        labels = (client.images.get(tag).attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_HASH, "").startswith(digest):
            return tag
    except docker.errors.ImageNotFound:
        pass
    try:
        client.images.get(_base_tag())
    except docker.errors.ImageNotFound:
        raise SandboxError(f"base image {_base_tag()} is missing: run `swerl sandbox build-base` "
                           "first") from None
    if log:
        log(f"building {tag}")
    return build_from_files(client, tag, dockerfile, files, log=log)
