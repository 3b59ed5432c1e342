#!/usr/bin/env bash
# Create the virtual environment (default .venv, or $VENV) and install minidet into it, once.
#
# Installs the tested torch/torchvision releases, then minidet in editable mode with its test and export
# extras. A stamp in the venv records what was installed; the install is redone only when
# pyproject.toml or this script change. Set TORCH_INDEX_URL to pick a wheel index for torch
# (e.g. https://download.pytorch.org/whl/cpu for CPU-only wheels); $PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_PINS=(torch==2.14.1 torchvision==0.29.1)

stamp=$(cat pyproject.toml tools/setup_env.sh | sha256sum | cut -d' ' -f1)
if [[ -f "$VENV/.minidet-stamp" && "$(cat "$VENV/.minidet-stamp")" == "$stamp" ]]; then
    exit 0
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || { echo "error: minidet needs Python >= 3.10 ($PYTHON is $("$PYTHON" -V 2>&1))" >&2; exit 1; }
    echo "setup: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
echo "setup: installing ${TORCH_PINS[*]} into $VENV"
"$VENV/bin/pip" install --quiet ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "${TORCH_PINS[@]}"
echo "setup: installing minidet (editable, with the test and export extras)"
"$VENV/bin/pip" install --quiet -e '.[test,export]'
echo "$stamp" > "$VENV/.minidet-stamp"
