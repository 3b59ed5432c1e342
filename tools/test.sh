#!/usr/bin/env bash
# Set up .venv (if needed) and run the test suite. Arguments are passed to pytest,
# e.g. `bash tools/test.sh -x tests/test_norm.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
rc=0
"${VENV:-.venv}/bin/python" -m pytest -q "$@" || rc=$?
if [[ $rc -eq 5 ]]; then
    echo "error: pytest collected no tests" >&2
fi
exit $rc
