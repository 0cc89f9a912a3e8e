#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call that proves what was merged without a GPU: the default build, the packed-path GPU
# tests (attention forward / backward copies, GEMM odd strides) with memcheck on the new cases,
# ctest, then the Python package and its GPU tests. Each step has its own timeout so the call fits
# one 600 s command; the summary lines go to stdout, the logs to $OUT.
#   OUT=... bash bench/probes/common/verify_device.sh            (carry .devdeps and .whl)
set -uo pipefail
OUT=${OUT:-/tmp/out}
R=$PWD
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
if ! [ -f build/libflykernels.so ]; then
  bash tools/device_run.sh build >"$OUT/build.log" 2>&1 && cmake --build build -j16 >>"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
fi
el "build: $(ls build/cubins | wc -l) cubins"
run() {  # name timeout cmd...
  local name=$1 to=$2; shift 2
  timeout "$to" "$@" >"$OUT/$name.log" 2>&1
  el "$name rc=$?: $(grep -E 'test cases|All tests passed|ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$name.log" | tail -2 | tr '\n' ' ')"
}
run odd 90 build/test/fly_gpu_tests "[odd]"
run attn-packed 90 build/test/fly_gpu_tests "attention_fwd: strides TMA cannot take run on aligned copies"
run attn-bwd-packed 90 build/test/fly_gpu_tests "attention_bwd: strides TMA cannot take run on aligned copies"
run attn-packed-memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 9 build/test/fly_gpu_tests \
  "attention_fwd: strides TMA cannot take run on aligned copies"
run attn-bwd-packed-memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 9 build/test/fly_gpu_tests \
  "attention_bwd: strides TMA cannot take run on aligned copies"
if [ "${QUICK:-0}" = 1 ]; then exit 0; fi
(cd build && timeout 240 ctest --output-on-failure) >"$OUT/ctest.log" 2>&1
el "ctest rc=$?: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
if ls .whl/expecttest-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
FLYKERNELS_PREBUILT_DIR=build MAX_JOBS=16 timeout 200 python3 -m pip install -q --no-build-isolation --no-deps \
  --target /tmp/pyfk ./python >"$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; exit 1; }
el "python package installed"
(cd /tmp && PYTHONPATH=/tmp/pyfk:${PYTHONPATH:-} timeout "${PYTEST_S:-240}" python3 -m pytest -q -rs -x -p no:cacheprovider \
  "$R/python/tests" 2>&1) >"$OUT/pytest.log"
el "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" "$OUT/pytest.log" | tail -12
