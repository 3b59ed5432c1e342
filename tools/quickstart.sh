#!/usr/bin/env bash
# One command from a fresh checkout to a result: set up .venv (if needed), then run the
# weight-free benchmark (random realistic weights, synthetic images). Arguments are passed to
# tools/benchmark.py; without any, a quick run (minutes on 2 CPU cores, see README.md): short side
# 320, FrozenBN / Affine / Affine+fold (channels-last) against torchvision on the same weights,
# ending with one verdict line.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
if [[ $# -eq 0 ]]; then
    set -- --quick  # --size 320 --iters 3 --warmup 1 --norms FrozenBN,Affine,Affine+fold --vs-torchvision MODEL.CHANNELS_LAST True
fi
exec "${VENV:-.venv}/bin/python" tools/benchmark.py "$@"
