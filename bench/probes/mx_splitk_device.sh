#!/usr/bin/env bash
# One device call (<= 300 s) for the MX split-K variants mxfp_wgmma_n{32,64,128}_f0_p2_s{2,4,8}
# (docs/mxfp.md "Split-K", written without a GPU): build the MX families with those variants and
# the DB's, the MX GPU tests (every bundled variant forced; the split variants run unsplit there:
# NULL workspace), memcheck + racecheck over fly_gpu_subset mx, then flybench mxfp with each split
# variant forced beside the default. Logs under $OUT (summary.txt, gpu.log, memcheck.log,
# racecheck.log, bench.log, logs.tgz).
#   bash bench/probes/mx_splitk_device.sh   (from the repository root)
# NOTE: flybench / flytune / the GPU tests pass no workspace yet, so the forced split variants are
# timed on their unsplit path until they pass fly_scaled_gemm_workspace_size's buffer (not done).
set -uo pipefail
out=${OUT:-./out-mxsplit}
mkdir -p "$out/more"
t0=$(date +%s)
sum() { echo "$*" | tee -a "$out/summary.txt"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -e .devdeps ] || { [ -e ../../.devdeps ] && ln -sfn ../../.devdeps .devdeps; }
b=build-mxsplit
bash tools/device_run.sh "$b" -DFLY_FAMILIES="mx_quantize;mxfp" -DFLY_ALL_VARIANTS=ON \
  -DFLY_VARIANT_MATCH="mx_quantize_t256_hw1|mxfp_gemm_m64_n64|mxfp_wgmma_n(32|64|128)_f0_p2_s[248]|mxfp_wgmma_n128_f0_p2|mxfp_wgmma_n64_f0|mxfp_wgmma_n32_f0" \
  >"$out/more/cfg.log" 2>&1
cmake --build "$b" -j16 >"$out/more/build.log" 2>&1; sum "build rc=$? ($(( $(date +%s) - t0 ))s)"
timeout 60 "./$b/test/fly_gpu_subset" mx >"$out/more/smoke.log" 2>&1; sum "smoke rc=$?"
timeout 90 "./$b/test/fly_gpu_tests" "[mx][gemm]" >"$out/gpu.log" 2>&1; sum "gpu tests rc=$? $(grep -E 'test cases|passed' "$out/gpu.log" | tail -1)"
timeout 40 "$cs" --tool memcheck --error-exitcode 1 "./$b/test/fly_gpu_subset" mx >"$out/memcheck.log" 2>&1; sum "memcheck rc=$?"
timeout 50 "$cs" --tool racecheck --error-exitcode 1 "./$b/test/fly_gpu_subset" mx >"$out/racecheck.log" 2>&1; sum "racecheck rc=$?"
for v in "" mxfp_wgmma_n128_f0_p2_s4 mxfp_wgmma_n128_f0_p2_s8 mxfp_wgmma_n64_f0_p2_s2; do
  timeout 40 "./$b/flybench" mxfp ${v:+--variant $v} >>"$out/bench.log" 2>&1; sum "flybench ${v:-default} rc=$?"
done
sum "done ($(( $(date +%s) - t0 ))s)"
tar czf "$out/logs.tgz" -C "$out" more; rm -rf "$out/more"
