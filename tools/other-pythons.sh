#!/usr/bin/env bash
# Runs the CPU test suite under other Python interpreters than CI's, each in a clean export of
# HEAD with a venv of its own:
#   bash tools/other-pythons.sh PYTHON...        e.g. ~/.pyenv/versions/3.10.13/bin/python
# Why: the README promises Python 3.10 or newer and CI runs one interpreter (the machine's
# python3). Python 3.10 builds no C extension (kernelpack then runs its pure-Python paths) and
# installs NumPy 2.2 at most; 3.12 and later change when the garbage collector may run. Each run
# works in /tmp/kernelpack-py<version> (git archive HEAD, so uncommitted edits do not travel):
# never `pip install -e .` this checkout with another interpreter, which rebuilds
# src/kernelpack/runtime/_launch.abi3.so for it and breaks the main .venv's import.
# Logs: /tmp/kernelpack-py<version>.log; exit status: the number of interpreters that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,11p "$0" >&2; exit 2; }
failed=0
for py in "$@"; do
    version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || { failed=$((failed + 1)); continue; }
    tree=/tmp/kernelpack-py$version
    log=/tmp/kernelpack-py$version.log
    rm -rf "$tree" && mkdir -p "$tree" && git archive HEAD | tar -x -C "$tree"
    echo "== Python $version ($py): $tree, log $log"
    (
        cd "$tree" && "$py" -m venv .venv && .venv/bin/python -m pip install -q -e '.[dev]' &&
            .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 tests
    ) >"$log" 2>&1
    rc=$?
    tail -n 1 "$log"
    [ $rc -eq 0 ] || { failed=$((failed + 1)); grep -E "^(FAILED|ERROR)" "$log" | head -20; }
done
exit $failed
