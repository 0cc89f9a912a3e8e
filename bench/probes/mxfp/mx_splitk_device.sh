#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call (<= 300 s) for the MX split-K variants mxfp_wgmma_n{32,64,128}_f0_p2_s{2,4,8}
# (docs/mxfp.md "Split-K"): proves their split path on the H200.
#   1. build the MX families with the nine split variants, their unsplit p2 parents and the DB's;
#   2. smoke: fly_gpu_subset mx (every mx variant; the split ones with the queried workspace left
#      uninitialized, then with none); a hang (rc 124) stops the script;
#   3. GPU tests [mx][gemm]: the split variants (and two unsplit references; FLY_TEST_VARIANTS)
#      forced with the queried workspace (they split: NaN-poisoned partials, two runs bit-identical,
#      >= 10 split cases counted) and their NULL / half-workspace fallback; the default dispatch
#      with and without a workspace;
#   4. compute-sanitizer memcheck and racecheck over fly_gpu_subset's split variants;
#   5. flybench mxfp on the decode shapes (M 1 / 32 / 128, a small suite written below) with the
#      default dispatch, then each split variant forced (column "splits": the split count the
#      launch used; "vs_default": max |forced - default| / max |default|);
#   6. initcheck over the split variants (the uninitialized workspace is written before it is read).
# Logs under $OUT (default ./out-mxsplit): summary.txt, gpu.log, memcheck.log, racecheck.log,
# initcheck.log, bench.log, logs.tgz (the rest): 7 files. BUDGET_S (default 290): phases are
# skipped, saying so, once it is spent.
#   bash bench/probes/mxfp/mx_splitk_device.sh   (from the repository root)
set -uo pipefail
out=${OUT:-./out-mxsplit}
mkdir -p "$out/more"
b=build-mxsplit
budget=${BUDGET_S:-290}
t0=$(date +%s)
name=mx_splitk_device.sh
. bench/probes/mxfp/device_lib.sh

splits="mxfp_wgmma_n32_f0_p2_s2 mxfp_wgmma_n32_f0_p2_s4 mxfp_wgmma_n32_f0_p2_s8 mxfp_wgmma_n64_f0_p2_s2 mxfp_wgmma_n64_f0_p2_s4 mxfp_wgmma_n64_f0_p2_s8 mxfp_wgmma_n128_f0_p2_s2 mxfp_wgmma_n128_f0_p2_s4 mxfp_wgmma_n128_f0_p2_s8"
bash tools/device_run.sh "$b" -DFLY_FAMILIES="mx_quantize;mxfp" -DFLY_ALL_VARIANTS=ON \
  -DFLY_VARIANT_MATCH="^(mx_quantize_t256_hw1|mxfp_gemm_m64_n64|mxfp_wgmma_n(32|64|128)_f0_p2(_s[248])?)$" \
  >"$out/more/cfg.log" 2>&1
ninja -C "$b" -j16 flykernels fly_gpu_tests fly_gpu_subset flybench >"$out/more/build.log" 2>&1
rc=$?
sum "build rc=$rc ($(( $(date +%s) - t0 ))s); $(grep -c . "$b/gen/manifest.tsv" 2>/dev/null) variants"
[ $rc -eq 0 ] || { tail -30 "$out/more/build.log" | tee -a "$out/summary.txt"; finish 1; }
for v in $splits; do grep -q "^$v"$'\t' "$b/gen/manifest.tsv" || sum "MISSING variant $v"; done

phase "smoke subset" 60 "$out/more/smoke.log" "./$b/test/fly_gpu_subset" mx
grep -E "_s[248] " "$out/more/smoke.log" | head -40 >>"$out/summary.txt"
[ "$last_rc" -eq 124 ] && { sum "smoke subset timed out: a kernel hangs; stopping"; finish 1; }
# the every-variant case narrowed to the split variants and two unsplit references (the others ran
# on the H200 before); the default-dispatch case runs whole
export FLY_TEST_VARIANTS='_s[248]$|^mxfp_wgmma_n128_f0_p2$|^mxfp_gemm_m64_n64$'
phase "gpu tests [mx][gemm]" 100 "$out/gpu.log" "./$b/test/fly_gpu_tests" "[mx][gemm]"
unset FLY_TEST_VARIANTS
grep -E "variant mxfp_wgmma.*(split-K cases|worst)" "$out/gpu.log" | sed 's/^ *//' | head -30 >>"$out/summary.txt"
# the split variants alone ("topk": a family this build has no variant of, so only the --only names
# run; the unsplit mx variants were sanitizer-clean on the H200 before, docs/mxfp.md)
only=""; for v in $splits; do only="$only --only $v"; done
phase memcheck 50 "$out/memcheck.log" "$cs" --tool memcheck --error-exitcode 1 "./$b/test/fly_gpu_subset" topk $only
phase racecheck 40 "$out/racecheck.log" "$cs" --tool racecheck --error-exitcode 1 "./$b/test/fly_gpu_subset" topk $only

cat >"$out/more/decode.json" <<'EOF'
{"cases": [{"M": 1, "N": 4096, "K": 4096}, {"M": 32, "N": 4096, "K": 4096}, {"M": 32, "N": 14336, "K": 4096},
           {"M": 32, "N": 4096, "K": 14336}, {"M": 128, "N": 4096, "K": 4096}]}
EOF
for v in "" $splits; do
  l=$(left)
  if [ "$l" -le 12 ]; then sum "flybench ${v:-default}: SKIPPED (budget)"; continue; fi
  echo "== ${v:-default}" >>"$out/bench.log"
  timeout $(( l < 25 ? l : 25 )) "./$b/flybench" mxfp --suite "$out/more/decode.json" ${v:+--variant $v} >>"$out/bench.log" 2>&1
  sum "flybench ${v:-default} rc=$?"
done
phase initcheck 30 "$out/initcheck.log" "$cs" --tool initcheck --error-exitcode 1 "./$b/test/fly_gpu_subset" topk $only
finish 0
