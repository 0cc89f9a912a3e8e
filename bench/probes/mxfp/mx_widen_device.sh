#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call (<= 540 s) for the BF16-widening MX GEMM (kernels/mx/mxfp_widen.cu, variants
# mxfp_widen_n128, its split-K _s2 / _s4, the swapped decode _t1 variants and the _ov0 probe;
# docs/mxfp.md "BF16-widening design"):
#   1. build the MX families with the widening variants beside every variant the DB names;
#   2. smoke: fly_gpu_subset mx (every mx variant once); a hang (rc 124) stops the script;
#   3. GPU tests [mx][gemm] with the widening variants and the FP8 design's n128 split variant forced
#      (FLY_TEST_VARIANTS) and the default dispatch: the suite incl. extreme and NaN scales, E4M3 NaN
#      elements, tails, bias, split workspaces; [mx][quantize] (the quantizer bit for bit);
#   4. compute-sanitizer memcheck, racecheck and synccheck over each variant of $VARIANTS and the quantizer;
#   5. bench/mxfp_torch.py: flybench mxfp (default dispatch and the widening variant forced) beside
#      dequantize + cuBLAS, cuBLAS BF16 and cuBLAS FP8 rowwise, in the same run, on suites/mxfp.json.
# Logs under $OUT (default ./out-mxwiden): summary.txt, gpu.log, memcheck.log, racecheck.log,
# torch.log, torch.json, logs.tgz (the rest). BUDGET_S (default 540); VARIANTS (default
# the swapped decode variants) the variants sanitized and timed forced.
#   bash bench/probes/mxfp/mx_widen_device.sh   (from the repository root; carry .devdeps)
set -uo pipefail
out=${OUT:-./out-mxwiden}
mkdir -p "$out/more"
b=build-mxwiden
budget=${BUDGET_S:-540}
variants=${VARIANTS:-mxfp_widen_n32_t1_s1 mxfp_widen_n32_t1_s2 mxfp_widen_n32_t1_s4 mxfp_widen_n64_t1_s1 mxfp_widen_n64_t1_s2 mxfp_widen_n64_t1_s4}
t0=$(date +%s)
name=mx_widen_device.sh
phase_pat="ERROR SUMMARY|RACECHECK SUMMARY|test cases|All tests passed|geomean"; phase_lines=8
. bench/probes/mxfp/device_lib.sh

bash tools/device_run.sh "$b" -DFLY_FAMILIES="mx_quantize;mxfp" -DFLY_ALL_VARIANTS=ON \
  -DFLY_VARIANT_MATCH="^(mx_quantize_t256_hw1|mxfp_gemm_m64_n64|mxfp_wgmma_n(32|64|128)_f[01](_p[12])?(_s4)?|mxfp_widen_n.*)$" \
  >"$out/more/cfg.log" 2>&1
ninja -C "$b" -j16 flykernels fly_gpu_tests fly_gpu_subset flybench >"$out/more/build.log" 2>&1
rc=$?
sum "build rc=$rc ($(( $(date +%s) - t0 ))s); $(grep -c . "$b/gen/manifest.tsv" 2>/dev/null) variants"
[ $rc -eq 0 ] || { tail -30 "$out/more/build.log" | tee -a "$out/summary.txt"; finish 1; }
grep -q "^mxfp_widen_n128"$'\t' "$b/gen/manifest.tsv" || { sum "MISSING variant mxfp_widen_n128"; finish 1; }
command -v cuobjdump >/dev/null && cuobjdump -res-usage "$b/cubins/mxfp_widen_n128.cubin" 2>&1 | grep -E 'REG|STACK' | head -3 >>"$out/summary.txt"

phase "smoke subset" 60 "$out/more/smoke.log" "./$b/test/fly_gpu_subset" mx
grep -E "widen" "$out/more/smoke.log" | head -20 >>"$out/summary.txt"
[ "$last_rc" -eq 124 ] && { sum "smoke subset timed out: a kernel hangs; stopping"; finish 1; }
export FLY_TEST_VARIANTS='^mxfp_(widen|wgmma_n128_f0_p2_s4)'
phase "gpu tests [mx][gemm]" 150 "$out/gpu.log" "./$b/test/fly_gpu_tests" "[mx][gemm]"
unset FLY_TEST_VARIANTS
grep -E "variant mxfp_widen.*worst" "$out/gpu.log" | sed 's/^ *//' | head -8 >>"$out/summary.txt"
grep -E "with expansion|FAILED|REQUIRE|CHECK\(" "$out/gpu.log" | head -30 >>"$out/summary.txt"
phase "gpu tests [mx][quantize]" 60 "$out/more/quant.log" "./$b/test/fly_gpu_tests" "[mx][quantize]"
grep -E "with expansion|FAILED" "$out/more/quant.log" | head -10 >>"$out/summary.txt"
for v in $variants mx_quantize_t256_hw1; do
  phase "memcheck $v" 60 "$out/more/memcheck-$v.log" "$cs" --tool memcheck --error-exitcode 1 "./$b/test/fly_gpu_subset" --only $v
  phase "racecheck $v" 60 "$out/more/racecheck-$v.log" "$cs" --tool racecheck --error-exitcode 1 "./$b/test/fly_gpu_subset" --only $v
  phase "synccheck $v" 40 "$out/more/synccheck-$v.log" "$cs" --tool synccheck --error-exitcode 1 "./$b/test/fly_gpu_subset" --only $v
done
PYTHONUNBUFFERED=1 phase "mxfp_torch.py" 300 "$out/torch.log" python3 bench/mxfp_torch.py --flybench "./$b/flybench" \
  --reps "${REPS:-10}" --json "$out/torch.json" $(for v in $variants; do printf -- '--variant %s ' $v; done)
tail -12 "$out/torch.log" >>"$out/summary.txt"
finish 0
