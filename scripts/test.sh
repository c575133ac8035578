#!/usr/bin/env bash
# The test suite: lint, then pytest against the real Docker engine (started here if it is down).
#   bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] || { echo "run scripts/setup.sh first (no .venv)" >&2; exit 1; }
bash scripts/ensure_docker.sh
.venv/bin/swerl sandbox build-base >/dev/null
.venv/bin/ruff check .
.venv/bin/pytest -q "$@"
