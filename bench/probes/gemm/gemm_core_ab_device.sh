#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call (<= 300 s) proving the GEMM core refactor of issue 24 (docs/gemm.md, "The core's
# structure"): the old library (this tree with kernels/gemm as of the merge base 3f0a9cc: from git
# when the checkout has its history, else .ab/gemm_core_base_kernels.tar.gz, made here by
# `mkdir -p .ab && git archive 3f0a9cc kernels/gemm | gzip > .ab/gemm_core_base_kernels.tar.gz` and carried) and the new
# one, both the gemm default build plus six decode variants (the kernel whose code changed), then
#   1. the gemm GPU tests of the new build ("gemm: every bundled variant is right" forces every
#      bundled variant, the decode ones with each launch-axis cluster size),
#   2. compute-sanitizer memcheck and racecheck over the decode variants of that test,
#   3. an interleaved A/B of the two libraries over the 15-shape suite in the four layouts (each
#      build's database pick; target: b/a >= 0.99x geomean, minimum reported), and the same on NT
#      M <= 64 with a decode variant forced in both.
# Logs under $OUT (at most 8 files come back: the rest goes into logs.tar.gz).
#   OUT=/path bash bench/probes/gemm/gemm_core_ab_device.sh
set -uo pipefail
out=${OUT:-/tmp/gemm_core_ab}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
root=$(pwd); t0=$(date +%s)
el() { echo "$(( $(date +%s) - t0 )) s"; }
match='gemm_(bf16|fp16)_dec_w8_r16_m8_d4|gemm_(bf16|fp16)_dec_w4_r16_m2_d2|gemm_(bf16|fp16)_dec_w8_r32_m4_d2'
cfg=(-DFLY_FAMILIES=gemm -DFLY_ALL_VARIANTS=ON "-DFLY_VARIANT_MATCH=$match" -DFLY_BUILD_TOOLS=OFF)

# The old tree: a copy without build folders, kernels/gemm replaced by the merge base's.
rm -rf /tmp/gemm_ab_old && mkdir -p /tmp/gemm_ab_old
tar --exclude='./build*' --exclude='./bd*' --exclude=./.git -cf - . | tar -xf - -C /tmp/gemm_ab_old
rm -rf /tmp/gemm_ab_old/kernels/gemm
if git rev-parse --verify -q 3f0a9cc^{commit} > /dev/null 2>&1; then
  git archive 3f0a9cc kernels/gemm | tar -x -C /tmp/gemm_ab_old; echo "old kernels/gemm: git 3f0a9cc"
else
  tar -xzf .ab/gemm_core_base_kernels.tar.gz -C /tmp/gemm_ab_old; echo "old kernels/gemm: tarball"
fi
cp -r .devdeps /tmp/gemm_ab_old/ 2> /dev/null || true

# Both builds at once (8 jobs each).
( cd /tmp/gemm_ab_old && bash tools/device_run.sh bd_old "${cfg[@]}" -DFLY_BUILD_TESTS=OFF > "$out/old_build.log" 2>&1 &&
  cmake --build bd_old -j8 --target flykernels >> "$out/old_build.log" 2>&1 ) & old_pid=$!
( bash tools/device_run.sh bd_new "${cfg[@]}" > "$out/new_build.log" 2>&1 &&
  cmake --build bd_new -j8 --target flykernels fly_gpu_tests >> "$out/new_build.log" 2>&1 ) & new_pid=$!
wait $old_pid; old_rc=$?; wait $new_pid; new_rc=$?
echo "builds: old rc=$old_rc new rc=$new_rc ($(el)), $(grep -c . bd_new/gen/manifest.tsv) variants, $(grep -c _dec_ bd_new/gen/manifest.tsv) decode"
if [ $old_rc != 0 ] || [ $new_rc != 0 ]; then grep -E "error|FAILED" -A3 "$out"/*_build.log | head -40; exit 1; fi

# 1. GPU tests (every bundled gemm variant, decode included).
timeout 130 bd_new/test/fly_gpu_tests "[gemm]~[mx]" > "$out/gpu_tests.log" 2>&1
echo "gpu tests [gemm]~[mx] rc=$? ($(el))"; grep -E "FAILED|passed|failed|forced variant" "$out/gpu_tests.log" | head -20

# 2. Sanitizers over the decode variants (all cluster sizes of two of them).
FLY_TEST_GEMM_ONLY=_dec_w8_r16_m8_d4 timeout 50 compute-sanitizer --tool memcheck --error-exitcode 9 \
  bd_new/test/fly_gpu_tests "gemm: every bundled variant is right" > "$out/memcheck.log" 2>&1
echo "memcheck decode rc=$? ($(el))"; grep -E "ERROR SUMMARY|passed|failed|Invalid" "$out/memcheck.log" | head -6
FLY_TEST_GEMM_ONLY=bf16_dec_w4_r16_m2_d2 timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 \
  bd_new/test/fly_gpu_tests "gemm: every bundled variant is right" > "$out/racecheck.log" 2>&1
echo "racecheck decode rc=$? ($(el))"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed|failed|hazard" "$out/racecheck.log" | head -6

# 3. A/B, interleaved: the suite in four layouts (database picks), then a forced decode variant.
PYTHONUNBUFFERED=1 timeout 100 python3 bench/probes/gemm/ab_libs.py --a /tmp/gemm_ab_old/bd_old/libflykernels.so \
  --b bd_new/libflykernels.so --layouts nt,nn,tn,tt --rounds 5 > "$out/ab_suite.log" 2>&1
echo "A/B suite rc=$? ($(el))"; grep -E "geomean|WRONG" "$out/ab_suite.log"
PYTHONUNBUFFERED=1 timeout 25 python3 bench/probes/gemm/ab_libs.py --a /tmp/gemm_ab_old/bd_old/libflykernels.so \
  --b bd_new/libflykernels.so --layouts nt --max-m 64 --rounds 5 --force gemm_bf16_dec_w8_r16_m8_d4 > "$out/ab_decode.log" 2>&1
echo "A/B decode rc=$? ($(el))"; grep -E "^nt|geomean|WRONG" "$out/ab_decode.log"

tar -czf "$out/logs.tar.gz" -C "$out" old_build.log new_build.log 2> /dev/null && rm -f "$out/old_build.log" "$out/new_build.log"
echo "total: $(el)"
