#!/usr/bin/env bash
# Create the virtual environment (default .venv, or $VENV) and install minidet into it, once.
#
# Installs the tested torch/torchvision releases, then minidet in editable mode with the extras
# $MINIDET_EXTRAS (default "test"; CI adds "ray", "export", "openvino", "serve", "geo", "supervision" and the
# test-only "reference", whose tests are skipped without them).
# A stamp in the venv records what was installed; the install is redone only when pyproject.toml,
# this script or the extras change. Where torch comes from: $TORCH_INDEX_URL if set; else, on
# Linux without an NVIDIA GPU (no nvidia-smi, no /proc/driver/nvidia), the CPU build from the CPU
# wheel index ($TORCH_CPU_INDEX_URL, default https://download.pytorch.org/whl/cpu: no CUDA libraries
# to download) if it answers within a few seconds, else (one line says so) the default index.
# $PYTHON picks the interpreter.
#
# `bash tools/setup_env.sh --torch-index` only prints that index (an empty line: the default index).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_PINS=(torch==2.14.1 torchvision==0.29.1)
CPU_INDEX=${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}
EXTRAS=${MINIDET_EXTRAS:-test}

has_nvidia_gpu() {
    command -v nvidia-smi > /dev/null 2>&1 || [[ -e /proc/driver/nvidia ]]
}

answers() {  # URL: an answer (any HTTP success) within 5 s; no name, no route, an error status: no
    local limit=()
    command -v timeout > /dev/null && limit=(timeout 10)  # a name lookup that hangs too
    ${limit[@]+"${limit[@]}"} "$PYTHON" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=5).close()' "$1" > /dev/null 2>&1
}

torch_index() {  # the index torch is installed from; empty: pip's default
    if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
        echo "$TORCH_INDEX_URL"
    elif [[ "$(uname -s)" == Linux ]] && ! has_nvidia_gpu; then
        if answers "${CPU_INDEX%/}/torch/"; then
            echo "$CPU_INDEX"
        else
            echo "setup: no NVIDIA GPU here, but the CPU wheel index $CPU_INDEX does not answer: torch comes" \
                "from the default index, with its CUDA libraries (set TORCH_INDEX_URL to choose)" >&2
            echo
        fi
    else
        echo
    fi
}

if [[ "${1:-}" == "--torch-index" ]]; then
    torch_index
    exit 0
fi

stamp=$( (cat pyproject.toml tools/setup_env.sh; echo "$EXTRAS") | sha256sum | cut -d' ' -f1)
if [[ -f "$VENV/.minidet-stamp" && "$(cat "$VENV/.minidet-stamp")" == "$stamp" ]]; then
    exit 0
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || { echo "error: minidet needs Python >= 3.10 ($PYTHON is $("$PYTHON" -V 2>&1))" >&2; exit 1; }
    echo "setup: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
index=$(torch_index)
from=${index:+ from $index}
[[ -n "$index" && -z "${TORCH_INDEX_URL:-}" ]] && from=" (the CPU build: no NVIDIA GPU here) from $index"
# pip compiles each installed module to bytecode one file at a time (a third of the set-up's time); here it installs
# without, and Python's compileall does it on every core: torch's modules while pip installs the rest, then the rest
compile_modules() {
    "$VENV/bin/python" -m compileall -qq -j 0 "$@" > /dev/null 2>&1 || true  # a file that does not compile: as pip
}
echo "setup: installing ${TORCH_PINS[*]}$from into $VENV"
"$VENV/bin/pip" install --quiet --no-compile ${index:+--index-url "$index"} "${TORCH_PINS[@]}"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
compile_modules "$site/torch" "$site/torchvision" &
compiling=$!
echo "setup: installing minidet (editable, with the extras $EXTRAS)"
# the test-only extra "reference": OpenMMLab's packages (mmdet, mmengine, mmcv-lite) without their dependencies, for
# mmcv-lite's would add opencv-python (the GUI build, which needs libGL) over opencv-python-headless's cv2; the extra
# lists the pure-python dependencies they need, which install as usual; the LVIS API (lvis) likewise, as it asks for
# opencv-python too
extras=$(tr "," "\n" <<< "$EXTRAS" | { grep -vx reference || true; } | paste -sd, -)
"$VENV/bin/pip" install --quiet --no-compile -e ".[$extras]"
if tr ',' '\n' <<< "$EXTRAS" | grep -qx reference; then
    mapfile -t reference < <("$VENV/bin/python" -c 'import re, tomllib
for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["reference"]:
    print(("N " if re.match(r"mm(det|engine|cv)|lvis", r) else "D ") + r)')
    "$VENV/bin/pip" install --quiet --no-compile $(printf '%s\n' "${reference[@]}" | sed -n 's/^D //p')
    "$VENV/bin/pip" install --quiet --no-compile --no-deps $(printf '%s\n' "${reference[@]}" | sed -n 's/^N //p')
fi
wait "$compiling"
compile_modules "$site"
echo "$stamp" > "$VENV/.minidet-stamp"
