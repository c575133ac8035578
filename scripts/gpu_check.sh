#!/usr/bin/env bash
# The GPU figures of the learner (issue #7) in one device call: tokens/s, MFU and peak memory of one
# DeepSpeedLearner update on a Qwen2.5-1.5B-shaped model under ZeRO-2 and ZeRO-3 (bf16, gradient
# checkpointing, 4 x 4096 tokens), then the AEM + ActFocus overhead of swerl.algo on the same GPU, then
# ZeRO-2 without gradient checkpointing (what the recomputation costs). About 6 minutes on an H200;
# a device call: command "bash scripts/gpu_check.sh run", carry [".whl"], timeout_s 600.
#
#   bash scripts/gpu_check.sh prepare   # here, where PyPI is reachable: wheels the GPU image lacks -> .whl/
#   bash scripts/gpu_check.sh run       # there (a device run carrying .whl): figures -> $OUT (or bench_out/)
#   GPU_CHECK_DEVICE=cpu PYTHON=.venv/bin/python bash scripts/gpu_check.sh run   # the same steps, tiny, on CPU
#
# The GPU image has torch, transformers' dependencies, peft and accelerate, but not DeepSpeed (an sdist
# on PyPI: built here into a pure-Python wheel, its ops left to JIT) or pydantic; the transformers pin
# travels too (the image's is older). Python there is 3.12, so binary wheels are fetched for cp312.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=.whl
PY_HERE=.venv/bin/python
PURE=(transformers==5.24.0 hjson==3.1.0 pydantic==2.14.4 annotated-types==0.8.0 typing-inspection==0.4.5)
BINARY=(pydantic-core==2.50.5)

prepare() {
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    # DeepSpeed's setup.py imports torch: build without isolation, in the venv that has it
    DS_BUILD_OPS=0 "$PY_HERE" -m pip wheel --quiet --no-deps --no-build-isolation -w "$WHEELS" deepspeed==0.19.0
    "$PY_HERE" -m pip download --quiet --no-deps --only-binary=:all: -d "$WHEELS" "${PURE[@]}"
    "$PY_HERE" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" "${BINARY[@]}"
    ls -la "$WHEELS"
    du -sh "$WHEELS"
}

run() {
    local out=${OUT:-bench_out} py=${PYTHON:-python3} device=${GPU_CHECK_DEVICE:-cuda}
    local train=(--preset qwen2.5-1.5b) algo=() install=(--target /tmp/site)
    if [ "$device" = cpu ]; then  # the dry run: every step, tiny shapes; the wheels only checked for 3.12
        train=(--preset tiny --tokens 128 --warmup 1 --repeats 1)
        algo=(--H 64 --overhead-shape 2x64 --overhead-V 512 --overhead-repeats 1)
        install=(--dry-run --target /tmp/site-check --python-version 3.12 --only-binary=:all:)
    fi
    mkdir -p "$out"
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "${install[@]}" \
            "$WHEELS"/*.whl
        [ "$device" = cpu ] || export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
    "$py" -c "import torch, transformers, deepspeed; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'deepspeed', deepspeed.__version__, 'cuda', torch.cuda.is_available())"
    # the learner: ZeRO-2 and ZeRO-3, each in its own torchrun launch (the script's default)
    "$py" scripts/bench_train_gpu.py --device "$device" "${train[@]}" --timeout 240 \
        --out "$out/bench_train_gpu.json" 2>&1 | tee "$out/bench_train_gpu.log"
    # the AEM + ActFocus overhead (the loss step only; the token-statistics comparison was measured
    # on the H200 before and is skipped to save device time)
    "$py" scripts/bench_algo.py --device "$device" --skip-token-stats "${algo[@]}" \
        --out "$out/bench_algo_cuda.json" 2>&1 | tee "$out/bench_algo_cuda.log"
    # context for the MFU: ZeRO-2 without gradient checkpointing (no recomputed forward)
    "$py" scripts/bench_train_gpu.py --device "$device" "${train[@]}" --zero 2 --no-gradient-checkpointing \
        --timeout 240 --out "$out/bench_train_gpu_nockpt.json" 2>&1 | tee "$out/bench_train_gpu_nockpt.log"
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: bash scripts/gpu_check.sh prepare|run" >&2; exit 2 ;;
esac
