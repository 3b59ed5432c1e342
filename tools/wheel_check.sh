#!/usr/bin/env bash
# minidet as a pip user meets it: build a wheel, install it (not editable) into a fresh venv, and run the
# `minidet` command from a folder outside the checkout: --help, configs, weights list, a quick weight-free
# bench, and infer on a synthetic checkpoint (random but realistic torchvision weights saved as a state
# dict). Non-zero exit on any failure. $WHEEL_VENV (default .venv-wheel) is created anew each time; torch
# comes from where setup_env.sh takes it (TORCH_INDEX_URL; without an NVIDIA GPU the CPU build);
# WHEEL_DEPS_FROM=VENV borrows the dependencies of VENV (see below).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
start=$SECONDS
venv=$(realpath -m "${WHEEL_VENV:-.venv-wheel}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
echo "[wheel] building the wheel ($((SECONDS - start)) s)"
"$venv/bin/pip" wheel --quiet --no-deps --wheel-dir "$work/dist" "$repo"
if [[ -n "${WHEEL_DEPS_FROM:-}" ]]; then
    # CI: the dependencies (torch, ...) come from an existing venv through a .pth file, after the fresh venv's
    # own site-packages and without running that venv's .pth files (its editable minidet stays invisible);
    # this saves a second torch install. minidet itself is the wheel, installed into the fresh venv.
    purelib() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
    purelib "$WHEEL_DEPS_FROM" > "$(purelib "$venv")/_deps_from_$(basename "$WHEEL_DEPS_FROM").pth"
    "$venv/bin/pip" install --quiet --no-deps --force-reinstall "$work"/dist/minidet-*.whl 2>&1 \
        | { grep -v "outside environment" || true; }
else
    index=$(bash tools/setup_env.sh --torch-index)  # the CPU build on a machine without an NVIDIA GPU, as there
    "$venv/bin/pip" install --quiet ${index:+--index-url "$index"} torch==2.14.1 torchvision==0.29.1
    "$venv/bin/pip" install --quiet "$work"/dist/minidet-*.whl
fi
cd "$work"  # outside the checkout: only the installed package can be imported
export MINIDET_HOME="$work/home" PATH="$venv/bin:$PATH"

step() { echo "[wheel] $* ($((SECONDS - start)) s)"; }
step "installed from $(python -c 'import minidet; print(minidet.__file__)')"
python -c 'import minidet, sys; sys.exit("minidet" not in minidet.__file__ or "/src/" in minidet.__file__)'
step "minidet --help"; minidet --help >/dev/null
minidet infer --help > /dev/null && minidet weights --help > /dev/null
step "minidet configs"
minidet configs > configs.txt && grep -q '^torchvision/maskrcnn_resnet50_fpn ' configs.txt
step "minidet weights list"; minidet weights list > weights.txt && grep -q '^torchvision/maskrcnn_resnet50_fpn ' weights.txt
step "minidet bench (quick, weight-free)"
minidet bench --quick --size 160 --image 120x160 --iters 1 --warmup 0 --no-memory --peak-seconds 0 > bench.txt
grep -q 'Affine' bench.txt
tail -n 1 bench.txt | grep -q '^verdict: '  # the quick run ends with its verdict
if grep -q '^steps where' bench.txt; then echo "[wheel] the quick run printed the full benchmark's step table" >&2; exit 1; fi
step "minidet infer on a synthetic checkpoint"
python - <<'EOF'
import cv2, torch
from minidet.apps.synthetic import structured_image
from minidet.apps.bench.reference import tv_init_state, legacy_v1_state_dict
torch.save(legacy_v1_state_dict(tv_init_state(1, seed=0)), "synthetic_v1.pth")
cv2.imwrite("photo.jpg", structured_image(180, 240, seed=1))
EOF
minidet infer --config-file torchvision/maskrcnn_resnet50_fpn --input photo.jpg --output out \
    MODEL.WEIGHTS synthetic_v1.pth INPUT.MIN_SIZE_TEST 160 INPUT.MAX_SIZE_TEST 240 > infer.txt
test -s out/photo.json && test -s out/photo.jpg
python -c 'import json; d = json.load(open("out/photo.json")); assert d["width"] == 240, d'
step "minidet infer --slice and minidet convert"
minidet infer --config-file torchvision/maskrcnn_resnet50_fpn --input photo.jpg --output sliced --no-vis \
    --slice 128 --mask-format polygon --results sliced/all.jsonl MODEL.WEIGHTS synthetic_v1.pth \
    INPUT.MIN_SIZE_TEST 160 INPUT.MAX_SIZE_TEST 240 > sliced.txt
minidet convert sliced/all.jsonl --to coco-dataset --output sliced/coco.json > /dev/null
python -c 'import json; d = json.load(open("sliced/coco.json")); assert d["images"][0]["width"] == 240, d'
if python -c 'import starlette, uvicorn' 2> /dev/null; then  # the serve extra: its page ships in the wheel
    step "minidet serve: the record infer wrote, the page, SIGTERM"
    # the default thread count, as infer's above: the same float sums, the same record to the bit
    minidet serve --config-file torchvision/maskrcnn_resnet50_fpn --port 0 MODEL.WEIGHTS synthetic_v1.pth \
        INPUT.MIN_SIZE_TEST 160 INPUT.MAX_SIZE_TEST 240 > serve.txt 2> serve.err &
    server=$!
    trap 'kill -TERM "$server" 2> /dev/null || true; rm -rf "$work"' EXIT  # a failed check leaves no server behind
    python - <<'PY'
import json, re, time, urllib.request
for _ in range(1200):
    m = re.search(r"listening on (http://\S+) ", open("serve.txt").read())
    if m:
        try:
            if urllib.request.urlopen(m.group(1) + "/health/ready", timeout=5).status == 200:
                break
        except OSError:
            pass
    time.sleep(0.1)
else:
    raise SystemExit("[wheel] minidet serve was not ready after 120 s: " + open("serve.err").read())
url = m.group(1)
assert b"<canvas" in urllib.request.urlopen(url + "/", timeout=10).read()
req = urllib.request.Request(url + "/predict?file=photo.jpg", data=open("photo.jpg", "rb").read(),
                             headers={"Content-Type": "image/jpeg"})
assert json.load(urllib.request.urlopen(req, timeout=120)) == json.load(open("out/photo.json"))
PY
    kill -TERM "$server"
    wait "$server"
    trap 'rm -rf "$work"' EXIT
fi
step "OK"
