#!/usr/bin/env bash
# One command from a fresh checkout to a result: set up .venv (if needed), then run the
# weight-free benchmark (random realistic weights, synthetic images). Arguments are passed to
# tools/benchmark.py, e.g. `bash tools/quickstart.sh --size 320 --iters 2`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
exec "${VENV:-.venv}/bin/python" tools/benchmark.py "$@"
