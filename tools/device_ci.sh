#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One call on the GPU machine: optional tuning build + flytune, then the default build, the whole
# test suite (CPU + GPU), and every family's benchmark beside its PyTorch baseline.
#   tools/device_ci.sh "<families to tune, e.g. topk;gemm>" "<families to bench>"
# Env: TUNE_MATCH (FLY_VARIANT_MATCH of the tuning build), GEMM_TUNE_ARGS (e.g. "--max-minutes 8"),
# GEMM_BENCH_ARGS (default "--triton-layouts nt"; "--no-triton" skips Triton), TAIL.
# Results land in $OUT (logs, tuned dump, charts, JSON).
set -uo pipefail
tune=${1:-}
benches=${2:-rmsnorm topk gemm}
OUT=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1
if [ -n "$tune" ]; then
  # TUNE_MATCH: a FLY_VARIANT_MATCH regex for the tuning build (e.g. "gemm_bf16_").
  tools/device_run.sh build-tune -DFLY_ALL_VARIANTS=ON -DFLY_FAMILIES="$tune" -DFLY_VARIANT_MATCH="${TUNE_MATCH:-}" \
    -DFLY_BUILD_TESTS=OFF > $OUT/tune-configure.log 2>&1
  cmake --build build-tune -j16 > $OUT/tune-build.log 2>&1 || { tail -30 $OUT/tune-build.log; exit 1; }
  for fam in ${tune//;/ }; do
    echo "== flytune $fam"
    targs=""; [ "$fam" = gemm ] && targs="${GEMM_TUNE_ARGS:-}"
    (time ./build-tune/flytune "$fam" --db $OUT/tuned.sqlite --dump db/sm_90a.sql $targs) 2>&1 | tr '\r' '\n' | grep -v "\] [0-9]*/[0-9]* " | tail -6
  done
  cp db/sm_90a.sql $OUT/sm_90a.sql
fi
tools/device_run.sh build > $OUT/configure.log 2>&1
(time cmake --build build -j16) > $OUT/build.log 2>&1 || { grep -E "error" -A5 $OUT/build.log | head -40; exit 1; }
./build/flyinfo | head -6
ctest --test-dir build --output-on-failure 2>&1 | tee $OUT/ctest.log | grep -E "Test +#|tests passed|FAILED|failed" | head
./build/test/fly_gpu_tests 2>&1 | tail -3 > $OUT/gpu-summary.log; cat $OUT/gpu-summary.log
for fam in $benches; do
  echo "== bench $fam"
  extra=""; [ "$fam" = gemm ] && extra="${GEMM_BENCH_ARGS:---triton-layouts nt}"
  timeout 300 python3 bench/${fam}_torch.py --flybench build/flybench --png $OUT/$fam.png --json $OUT/${fam}_latest.json $extra > $OUT/bench-$fam.log 2>&1
  tail -${TAIL:-14} $OUT/bench-$fam.log
done
