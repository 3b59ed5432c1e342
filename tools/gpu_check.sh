#!/usr/bin/env bash
# Issue 5 §4 in one prepared run for a machine with a CUDA GPU (a few minutes on an H200):
# minidet against torchvision on the same random weights, batch 1 and 16, float32 and bf16
# autocast, per-stage and per-step tables, detection checks. Writes the printed reports, the JSON
# and a chart into ${OUT:-gpu_out}; copy the numbers into docs/benchmarks.md (GPU section).
# Needs a Python with CUDA torch/torchvision and this repo's dependencies: ${PYTHON:-.venv/bin/python}.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
out=${OUT:-gpu_out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
"$py" -c 'import sys, torch, torchvision
if not torch.cuda.is_available():
    sys.exit("gpu_check: torch sees no CUDA device")
print("torch", torch.__version__, "torchvision", torchvision.__version__, "gpu", torch.cuda.get_device_name())' \
    | tee "$out/env.txt"
nvidia-smi >> "$out/env.txt" 2>&1 || true
common=(--device cuda --size 800 --batch 1,16 --iters 20 --warmup 3 --vs-torchvision)
"$py" tools/benchmark.py "${common[@]}" --norms FrozenBN,Affine+fold --json "$out/gpu_fp32.json" \
    --plot "$out/benchmark_gpu.png" MODEL.CHANNELS_LAST True 2>&1 | tee "$out/gpu_fp32.txt"
"$py" tools/benchmark.py "${common[@]}" --norms Affine+fold --amp bf16 --no-memory --json "$out/gpu_bf16.json" \
    MODEL.CHANNELS_LAST True 2>&1 | tee "$out/gpu_bf16.txt"
