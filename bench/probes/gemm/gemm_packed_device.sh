#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for GEMM on strides TMA cannot take (issue 25): the packed path (aligned copies in
# the workspace, then the TMA kernel) beside the cp.async kernel, and GEMM off the tuned keys.
#   OUT=... bash bench/probes/gemm/gemm_packed_device.sh [stages]      (carry .devdeps)
# stages (comma-separated, default build,test,memcheck,granules,random1,odd):
#   build     the default build (skipped when build/ already has the library and tests)
#   test      fly_gpu_tests "[odd]" (both paths on every odd-stride case) and "[gemm]~[mx]"
#   memcheck  compute-sanitizer memcheck on "[odd]"; memcheck + racecheck on the sanitize subset's
#             cp.async variants (which also run the packed path)
#   granules  bench/probes/gemm/gemm_odd_granules.py: 4096^3, four layouts, 8/4/2-byte lines
#   random1   bench/gemm_random.py --seed 1 --count 60 (aligned shapes: TN/TT with M % 8 != 0 pack)
#   random23  the same with seeds 2 and 3
#   odd       bench/gemm_random.py --odd, seeds 1 and 2, 8 shapes each (the earlier runs' limits)
# Logs under $OUT.
set -uo pipefail
stages=${1:-build,test,memcheck,granules,random1,odd}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
has() { [[ ",$stages," == *",$1,"* ]]; }
LIB=build/libflykernels.so
if has build && ! { [ -f $LIB ] && [ -x build/test/fly_gpu_tests ]; }; then
  bash tools/device_run.sh build >"$OUT/build.log" 2>&1 && cmake --build build -j16 >>"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
  el "build done: $(ls build/cubins | wc -l) cubins"
fi
if has test; then
  timeout 120 build/test/fly_gpu_tests "[odd]" >"$OUT/odd-tests.log" 2>&1
  el "[odd] rc=$?: $(tail -3 "$OUT/odd-tests.log" | tr '\n' ' ')"
  timeout 200 build/test/fly_gpu_tests "[gemm]~[mx]" >"$OUT/gemm-tests.log" 2>&1
  el "[gemm]~[mx] rc=$?: $(tail -3 "$OUT/gemm-tests.log" | tr '\n' ' ')"
fi
if has memcheck; then
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 build/test/fly_gpu_tests "[odd]" >"$OUT/odd-memcheck.log" 2>&1
  el "memcheck [odd] rc=$?: $(grep -E "ERROR SUMMARY|test cases" "$OUT/odd-memcheck.log" | tr '\n' ' ')"
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 build/test/fly_gpu_subset --only gemm_odd_bf16_bn128_st6 \
      --only gemm_odd_fp16_bn128_st6 >"$OUT/odd-subset-$tool.log" 2>&1
    el "$tool subset rc=$?: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|variants" "$OUT/odd-subset-$tool.log" | tr '\n' ' ')"
  done
fi
if has granules; then
  timeout 240 python3 bench/probes/gemm/gemm_odd_granules.py --lib $LIB >"$OUT/granules.log" 2>&1
  el "granules rc=$?"; cat "$OUT/granules.log"
fi
for seed in 1 2 3; do
  if { [ $seed = 1 ] && has random1; } || { [ $seed != 1 ] && has random23; }; then
    timeout 280 python3 bench/gemm_random.py --lib $LIB --seed $seed --count ${COUNT:-60} \
      --json "$OUT/gemm_random_seed$seed.json" >"$OUT/random-seed$seed.log" 2>&1
    el "random seed $seed rc=$?"; grep -E "geomean|refused|wrong" "$OUT/random-seed$seed.log"
  fi
done
if has odd; then
  for seed in 1 2; do
    timeout 120 python3 bench/gemm_random.py --lib $LIB --seed $seed --count 8 --odd --max-tflop 0.5 --max-gib 2 \
      >"$OUT/random-odd-seed$seed.log" 2>&1
    el "odd random seed $seed rc=$?"; grep -E "geomean|wrong" "$OUT/random-odd-seed$seed.log"
  done
fi
el "done"
