#!/usr/bin/env bash
# Set up .venv (if needed) and run the test suite. Arguments are passed to pytest,
# e.g. `bash tools/test.sh -x tests/test_norm.py`; `-m "not slow"` leaves out the long tests (a first
# check of a few minutes; CI runs them all).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
if [[ $# -eq 0 ]]; then
    echo "tests: the whole suite, about 37 min on 2 cores; a first check of about 2.5 min: bash tools/test.sh -m \"not slow\""
fi
rc=0
"${VENV:-.venv}/bin/python" -m pytest -q --durations=30 "$@" || rc=$?
if [[ $rc -eq 5 ]]; then
    echo "error: pytest collected no tests" >&2
fi
exit $rc
