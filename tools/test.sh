#!/usr/bin/env bash
# Set up .venv (if needed) and run the test suite. Arguments are passed to pytest,
# e.g. `bash tools/test.sh -x tests/test_norm.py`; `-m "not slow"` leaves out the long tests (a first
# check of a few minutes; CI runs them all).
#
# Two parts: the tests not marked `serial` in MINIDET_TEST_WORKERS processes (pytest-xdist; default: the cores, at
# most 2, each process with one torch thread), then those marked `serial` (timed by the wall clock: servers'
# timeouts, signals, torchrun's ranks) in one process with the machine to themselves. MINIDET_TEST_WORKERS=1, or
# pytest-xdist missing, or your own -n / -p: one pytest process runs everything, as a plain `pytest` does.
# TEST_RUNNER: what runs pytest's arguments under the venv's python (default `-m pytest`; CI's first check without
# the optional extras passes tools/without_extras.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
py="${VENV:-.venv}/bin/python"
read -r -a runner <<< "${TEST_RUNNER:--m pytest}"
if [[ $# -eq 0 ]]; then
    echo "tests: the whole suite, about 33 min on 2 cores; a first check of about 4 min: bash tools/test.sh -m \"not slow\""
fi
cores=$(nproc 2> /dev/null || echo 1)
workers=${MINIDET_TEST_WORKERS:-$((cores < 2 ? cores : 2))}
parts=1
if [[ $workers -gt 1 ]] && "$py" -c "import xdist" 2> /dev/null && [[ " $* " != *" -n "* && " $* " != *" -p "* ]]; then
    parts=2
fi

rc=0
if [[ $parts -eq 1 ]]; then
    "$py" "${runner[@]}" -q --durations=30 "$@" || rc=$?
else
    echo "tests: part 1 of 2, the tests not marked serial, in $workers processes (pytest-xdist)"
    rc1=0
    "$py" "${runner[@]}" -q --durations=30 -n "$workers" --dist loadgroup --part parallel "$@" || rc1=$?
    echo "tests: part 2 of 2, the tests marked serial, in one process"
    rc2=0
    "$py" "${runner[@]}" -q --durations=30 --part serial "$@" || rc2=$?
    # a part with nothing selected (5) is fine when the other ran tests
    if [[ $rc1 -eq 5 && $rc2 -eq 5 ]]; then rc=5
    elif [[ $rc1 -ne 0 && $rc1 -ne 5 ]]; then rc=$rc1
    elif [[ $rc2 -ne 0 && $rc2 -ne 5 ]]; then rc=$rc2
    fi
fi
if [[ $rc -eq 5 ]]; then
    echo "error: pytest collected no tests" >&2
fi
exit "$rc"
