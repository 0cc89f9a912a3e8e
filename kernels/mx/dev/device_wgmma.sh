#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for the wgmma MX GEMM (kernels/mx/mxfp_wgmma.cu, variants mxfp_wgmma_n{32,64,128}_f{0,1},
# not in the defaults): build the MX families with every variant, the GPU tests
# (every bundled mxfp variant forced), compute-sanitizer memcheck + racecheck, then flybench mxfp
# and bench/mxfp_torch.py with each wgmma variant forced beside the default kernel and the torch
# baselines (dequantize + cuBLAS BF16, cuBLAS BF16, cuBLAS FP8 rowwise).
#   bash kernels/mx/dev/device_wgmma.sh [all|check|bench|tune] (run from the repository root)
# tune: flytune mxfp over every bundled mxfp variant of this build; the re-dumped db/sm_90a.sql
# comes back as $OUT/sm_90a.sql (copy it over db/sm_90a.sql to ship the new rows).
# Logs under $OUT (default ./out-mxw): summary.txt, gpu.log, memcheck.log, racecheck.log,
# bench.log (the tables), torch.log, torch.json, and logs.tgz with the rest (at most 8 files come back).
# QUICK=1 skips memcheck over the tests and synccheck; REPS, VARIANTS ("--variant NAME ...") set the bench.
# Phases are skipped, saying so, once $BUDGET_S (default 570) seconds have gone; `bench` alone
# reuses the build dir when the machine is still warm (else it builds first).
set -uo pipefail
mode=${1:-all}
out=${OUT:-./out-mxw}
mkdir -p "$out/more"
bdir=${BUILD:-build-mxw}
case $bdir in /*) bx=$bdir ;; *) bx=./$bdir ;; esac  # the binaries, run by path
budget=${BUDGET_S:-570}
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
sum() { echo "$*" | tee -a "$out/summary.txt"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -e .devdeps ] || { [ -e ../../.devdeps ] && ln -sfn ../../.devdeps .devdeps; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >"$out/more/gpu.txt" 2>&1
sum "device_wgmma.sh $mode on $(head -1 "$out/more/gpu.txt") at $(date -u +%H:%M:%S) commit $(git rev-parse --short HEAD 2>/dev/null)"

build() {
  if [ ! -x "$bdir/test/fly_gpu_tests" ] || [ ! -x "$bdir/flybench" ] || [ ! -x "$bdir/flytune" ]; then
    bash tools/device_run.sh "$bdir" -DFLY_FAMILIES="mx_quantize;mxfp" -DFLY_ALL_VARIANTS=ON \
      -DFLY_VARIANT_MATCH="mx" >"$out/more/cfg.log" 2>&1
  fi
  ninja -C "$bdir" -j16 flykernels fly_gpu_tests fly_cpu_tests fly_gpu_subset flybench flytune >"$out/more/build.log" 2>&1
  local rc=$?
  sum "build rc=$rc ($(( $(date +%s) - t0 ))s); cubins: $(ls "$bdir"/cubins 2>/dev/null | tr '\n' ' ')"
  [ $rc -eq 0 ] || { tail -40 "$out/more/build.log"; return 1; }
  ls "$bdir"/cubins >"$out/more/cubins.txt" 2>&1
  grep -q mxfp_wgmma "$out/more/cubins.txt" || { sum "no mxfp_wgmma cubin in the build"; return 1; }
}
phase() {  # phase <name> <timeout> <log> <cmd...>
  local name=$1 lim=$2 log=$3; shift 3
  local l; l=$(left)
  if [ "$l" -le 15 ]; then sum "$name: SKIPPED (budget)"; return; fi
  [ "$l" -lt "$lim" ] && lim=$l
  local ts=$(date +%s)
  timeout "$lim" "$@" >"$log" 2>&1
  local rc=$?
  last_rc=$rc
  sum "$name: rc=$rc ($(( $(date +%s) - ts ))s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test cases|All tests passed|geomean' "$log" | head -6 | tr '\n' ' ')"
}

build || { tar czf "$out/logs.tgz" -C "$out" more; exit 1; }
last_rc=0
# smoke: every mx variant once on a small problem (fly_gpu_subset); a hang (rc 124) stops here
phase "smoke subset" 60 "$out/more/smoke.log" "$bx/test/fly_gpu_subset" mx
cat "$out/more/smoke.log" | tail -20 | tee -a "$out/summary.txt"
if [ "$last_rc" -eq 124 ]; then
  sum "smoke subset timed out: a kernel hangs; stopping"
  tar czf "$out/logs.tgz" -C "$out" more
  exit 1
fi
if [ "$mode" = all ] || [ "$mode" = check ]; then
  phase "gpu tests [mx]" 150 "$out/gpu.log" "$bx/test/fly_gpu_tests" "[mx]" --durations yes
  grep -E "worst \|err\|" "$out/gpu.log" | sort -u | tee -a "$out/summary.txt"
  phase "memcheck subset" 90 "$out/memcheck.log" "$cs" --tool memcheck --error-exitcode 1 "$bx/test/fly_gpu_subset" mx
  phase "racecheck subset" 120 "$out/racecheck.log" "$cs" --tool racecheck --error-exitcode 1 "$bx/test/fly_gpu_subset" mx
  if [ "${QUICK:-0}" != 1 ]; then  # QUICK=1: the subset's memcheck and racecheck only (short device budgets)
    phase "memcheck tests" 150 "$out/more/memcheck-tests.log" "$cs" --tool memcheck --error-exitcode 1 \
      --report-api-errors no "$bx/test/fly_gpu_tests" "[mx][gemm]"
    phase "synccheck subset" 60 "$out/more/synccheck.log" "$cs" --tool synccheck --error-exitcode 1 "$bx/test/fly_gpu_subset" mx
  fi
fi
if [ "$mode" = all ] || [ "$mode" = bench ]; then
  # flybench mxfp five times (default dispatch, four wgmma variants forced), then the torch
  # baselines on the same shapes in the same process run; flybench's own tables are in torch.log
  PYTHONUNBUFFERED=1 phase "mxfp_torch.py" 480 "$out/torch.log" python3 bench/mxfp_torch.py --flybench "$bx/flybench" \
    --reps "${REPS:-10}" --json "$out/torch.json" ${VARIANTS:---variant mxfp_wgmma_n128_f0_p2 --variant mxfp_wgmma_n64_f0_p2 \
    --variant mxfp_wgmma_n32_f0_p2 --variant mxfp_wgmma_n128_f0_p1 --variant mxfp_wgmma_n32_f0}
  grep -E "^(mxfp|fmt)|vs_default" "$out/torch.log" >"$out/bench.log"
  # the quantizer's hardware-cvt variant (bytes checked equal to the default's, then timed): its
  # quant_us / %copy columns beside the default's in torch.log
  phase "quantizer _hw1" 60 "$out/more/quant-hw.log" "$bx/flybench" mxfp --quant-variant mx_quantize_t256_hw1
  grep -E "^(mxfp|fmt)" "$out/more/quant-hw.log" | awk '{print "quant_hw1", $1, $2, $3, $4, $8, $9}' >>"$out/bench.log"
  tail -8 "$out/torch.log" | tee -a "$out/summary.txt"
fi
if [ "$mode" = tune ]; then
  cp db/sm_90a.sql "$out/sm_90a.sql"
  phase "flytune mxfp" 400 "$out/more/tune.log" "$bx/flytune" mxfp --db "$out/more/tune.sqlite" --dump "$out/sm_90a.sql" \
    --times "$out/more/tune-times.tsv"
  tail -3 "$out/more/tune.log" | tee -a "$out/summary.txt"
fi
sum "done ($(( $(date +%s) - t0 ))s)"
tar czf "$out/logs.tgz" -C "$out" more
rm -rf "$out/more"
