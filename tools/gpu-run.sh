#!/usr/bin/env bash
# Runs ON the GPU machine from the repo root, after ../shared/tools/gpu-prep filled .gpu/ here:
#   bash tools/gpu-run.sh TREE CMD...        (the device tool: carry [".gpu"])
# TREE: the tree to test, e.g. a clean export of HEAD made here beforehand with
#   rm -rf .gpu/tree && mkdir -p .gpu/tree && git archive HEAD | tar -x -C .gpu/tree
# (so uncommitted edits don't travel), or "." for the working tree.
# Installs the carried wheels, builds the C extension for the GPU image's Python (3.12 limited
# API: the abi3 build made here is for 3.11 and lacks CallBase's vectorcall), then runs each CMD
# inside TREE with its src/ on the path: "tests" = every test marked gpu; "tests/N/K" = those
# of the K-th of N slices of the test files (every N-th file from the K-th, by path: the whole
# suite passed 10 minutes, a device call's limit, in session 42, so run "tests/2/1" and
# "tests/2/2" in two calls); anything else is handed to python3 ("benchmarks/launch.py --reps
# 15"). Logs and RESULTS.md come back in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --find-links .gpu/wheels .gpu/wheels/*.whl 2>&1 | grep -v -i warning
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"
[ $# -ge 2 ] || { echo "usage: bash tools/gpu-run.sh TREE CMD..." >&2; exit 2; }
cd "$1"; shift
inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
( cd src/kernelpack/runtime && gcc -O2 -shared -fPIC -DPy_LIMITED_API=0x030C0000 -I"$inc" \
    _launch.c _fastcall.c _fastcall_spec.c _callbase.c _drvcall.c ../_verify.c ../_fbread.c ../_zstd.c ../_zstd_inflate.c ../_fdowner.c -ldl -o _launch.abi3.so ) || echo "EXTENSION BUILD FAILED"
export PYTHONPATH="$PWD/src"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m compileall -q src/kernelpack >/dev/null
rc=0
for cmd in "$@"; do
  echo "=== $cmd ($(date -u +%H:%M:%S))"
  if [ "$cmd" = tests ]; then
    python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests 2>&1 | tee -a "$OUT/gpu-tests.log"; r=${PIPESTATUS[0]}
  elif [[ "$cmd" =~ ^tests/([0-9]+)/([0-9]+)$ ]]; then
    n=${BASH_REMATCH[1]}; k=${BASH_REMATCH[2]}
    files=$(find tests -name 'test_*.py' | LC_ALL=C sort | awk -v n="$n" -v k="$k" '(NR - k) % n == 0')
    echo "slice $k of $n: $(echo "$files" | wc -l) files"
    # shellcheck disable=SC2086 # one word per file
    python3 -m pytest -m gpu -q -rs -p no:cacheprovider $files 2>&1 | tee -a "$OUT/gpu-tests.log"; r=${PIPESTATUS[0]}
    [ "$r" -eq 5 ] && r=0  # no test of the slice is marked gpu
  else
    bash -c "python3 $cmd" 2>&1 | tee -a "$OUT/bench.log"; r=${PIPESTATUS[0]}
  fi
  echo "=== rc=$r ($(date -u +%H:%M:%S))"; [ $r -ne 0 ] && rc=$r
done
cp benchmarks/RESULTS.md "$OUT/RESULTS.md" 2>/dev/null
exit $rc
