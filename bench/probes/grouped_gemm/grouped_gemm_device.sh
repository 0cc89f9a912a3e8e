#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for the grouped_gemm family: build (grouped_gemm only; FLY_MATCH=REGEX adds every
# variant matching it, for tuning), GPU tests, compute-sanitizer memcheck / racecheck, flybench,
# bench/grouped_gemm_torch.py, flytune. Logs under $OUT.
#   bench/probes/grouped_gemm/grouped_gemm_device.sh [stages]   stages: test,memcheck,racecheck,bench,torch,tune
set -uo pipefail
stages=${1:-test,memcheck,racecheck,bench,torch}
out=${OUT:-/tmp/grouped_out}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
has() { [[ ",$stages," == *",$1,"* ]]; }
t0=$(date +%s)
tools/device_run.sh bd -DFLY_FAMILIES=grouped_gemm ${FLY_MATCH:+-DFLY_ALL_VARIANTS=ON "-DFLY_VARIANT_MATCH=$FLY_MATCH"} > "$out/cfg.log" 2>&1 || { tail -30 "$out/cfg.log"; exit 1; }
cmake --build bd -j16 --target flykernels fly_gpu_tests flybench flytune > "$out/build.log" 2>&1 || { grep -E "error" -A3 "$out/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s, $(grep -c . bd/gen/manifest.tsv) variants"
if has tune; then
  timeout ${TUNE_TIMEOUT:-150} bd/flytune grouped_gemm --quick ${TUNE_ARGS:-} --db "$out/tune.sqlite" --dump "$out/sm_90a.sql" --times "$out/tune_times.tsv" > "$out/tune.log" 2>&1
  echo "tune rc=$? ($(( $(date +%s) - t0 )) s)"; grep -v "^\[" "$out/tune.log" | tail -30
  export FLYKERNELS_TUNING_DB="$out/tune.sqlite"
fi
if has test; then
  timeout ${GPU_TEST_TIMEOUT:-120} bd/test/fly_gpu_tests "[grouped_gemm]" > "$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "FAILED|passed|failed|with expansion|-> |first mismatch|variant |offs=" "$out/gpu_tests.log" | head -40
fi
if has memcheck; then
  FLY_TEST_GROUPED_ONLY=${SAN_ONLY:-_bf16_bm128_bn256} timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool memcheck --error-exitcode 9 bd/test/fly_gpu_tests "[grouped_gemm]" > "$out/memcheck.log" 2>&1
  echo "memcheck rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "ERROR SUMMARY|passed|failed|Invalid" "$out/memcheck.log" | head -8
fi
if has racecheck; then
  FLY_TEST_GROUPED_ONLY=${SAN_ONLY:-_bf16_bm128_bn256} timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool racecheck --error-exitcode 9 bd/test/fly_gpu_tests "grouped gemm: ragged groups*,grouped gemm: every bundled variant forced" > "$out/racecheck.log" 2>&1
  echo "racecheck rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed|failed|hazard" "$out/racecheck.log" | head -8
fi
if has bench; then
  timeout ${BENCH_TIMEOUT:-90} bd/flybench grouped_gemm --layouts ${LAYOUTS:-nt} --json "$out/flybench.json" > "$out/bench.log" 2>&1
  echo "bench rc=$? ($(( $(date +%s) - t0 )) s)"; cut -c1-160 "$out/bench.log"
fi
if has torch; then
  PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-120} python3 bench/grouped_gemm_torch.py --lib bd/libflykernels.so --fly-json "$out/flybench.json" ${TORCH_ARGS:-} --json "$out/grouped_gemm_latest.json" --png "$out/grouped_gemm.png" > "$out/torch.log" 2>&1
  echo "torch rc=$? ($(( $(date +%s) - t0 )) s)"; cut -c1-170 "$out/torch.log"
fi
echo "total: $(( $(date +%s) - t0 )) s"
