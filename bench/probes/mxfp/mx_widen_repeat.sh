#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The widening variants' GPU tests repeated (mxfp_widen_n128 and the probe _ov0 that retires each stage; the
# intermittent mismatch of 2026-12-06 showed up in some runs only),
# then compute-sanitizer and a timing of 4096^3 beside the FP8 design. One device call, carry .devdeps.
#   OUT=... bash bench/probes/mxfp/mx_widen_repeat.sh [repeats]
set -uo pipefail
out=${OUT:-./out-mxrep}; mkdir -p "$out"; n=${1:-8}; b=build-mxwiden
t0=$(date +%s)
bash tools/device_run.sh "$b" -DFLY_FAMILIES="mx_quantize;mxfp" -DFLY_ALL_VARIANTS=ON \
  -DFLY_VARIANT_MATCH="^(mx_quantize_t256_hw1|mxfp_gemm_m64_n64|mxfp_wgmma_n128_f0_p2|mxfp_widen_n128.*)$" >/dev/null 2>&1
ninja -C "$b" -j16 flykernels fly_gpu_tests fly_gpu_subset flybench >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 ))s" | tee "$out/summary.txt"
for v in '^mxfp_widen_n128$' '^mxfp_widen_n128_ov0$'; do
  pass=0; fail=0
  for i in $(seq 1 "$n"); do
    if FLY_TEST_VARIANTS="$v" timeout 60 "./$b/test/fly_gpu_tests" "[mx][gemm]" >"$out/run.log" 2>&1; then pass=$((pass+1))
    else fail=$((fail+1)); cp "$out/run.log" "$out/fail-$fail.log"; fi
  done
  echo "[mx][gemm] $v forced x$n: $pass passed, $fail failed" | tee -a "$out/summary.txt"
done
rm -f "$out/run.log"
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in mxfp_widen_n128 mxfp_widen_n128_ov0; do for tool in memcheck racecheck synccheck; do
  timeout 60 "$cs" --tool $tool --error-exitcode 1 "./$b/test/fly_gpu_subset" --only $v >"$out/$tool.log" 2>&1
  echo "$v $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | head -1)" | tee -a "$out/summary.txt"; rm -f "$out/$tool.log"
done; done
echo '{"cases": [{"M": 4096, "N": 4096, "K": 4096}, {"M": 2048, "N": 14336, "K": 4096}]}' >/tmp/two.json
for v in mxfp_widen_n128 mxfp_widen_n128_ov0 mxfp_wgmma_n128_f0_p2; do
  timeout 60 "./$b/flybench" mxfp --suite /tmp/two.json --variant $v 2>&1 | grep -E '^mxfp' | tee -a "$out/summary.txt"
done
echo "done $(( $(date +%s) - t0 ))s" | tee -a "$out/summary.txt"
