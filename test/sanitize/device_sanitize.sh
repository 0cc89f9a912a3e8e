#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# On the GPU machine: build the default configuration (every family), ctest, then the four
# compute-sanitizer tools over the bounded workload (fly_gpu_subset), one process per family and
# tool, and memcheck over each family's GPU tests. Logs under $1 (default .); a summary line per
# run on stdout. Runs are skipped (and say so) once $SAN_BUDGET_S (default 520) seconds have gone.
#   bash test/sanitize/device_sanitize.sh "$OUT" [family ...]     (default: every family)
#   BUILD=build-gpu (build dir; reused when it holds a finished build), CMAKE_ARGS (extra),
#   SAN_SKIP_CTEST=1 (skip the ctest run)
set -uo pipefail
out=${1:-.}
shift || true
fams=${*:-rmsnorm topk gemm attention attention_bwd grouped_gemm mx}
bdir=${BUILD:-build-gpu}
budget=${SAN_BUDGET_S:-520}
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
if [ ! -x "$bdir/test/fly_gpu_subset" ]; then
  # shellcheck disable=SC2086
  bash tools/device_run.sh "$bdir" -DFLY_BUILD_TOOLS=OFF ${CMAKE_ARGS:-} >"$out/build.log" 2>&1
fi
ninja -C "$bdir" -j16 fly_cpu_tests fly_gpu_tests fly_fake_driver_tests fly_fuzz_driver fly_gpu_subset \
  fly_driver_probe flykernels >>"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 ))s"
if [ "${SAN_SKIP_CTEST:-0}" != 1 ]; then  # SAN_SKIP_CTEST=1: the caller has just run ctest on this build
  (cd "$bdir" && timeout 150 ctest --output-on-failure) >"$out/ctest.log" 2>&1
  echo "ctest rc=$? ($(( $(date +%s) - t0 ))s)"; grep -E "tests passed|Passed|Failed|Skipped|\*\*\*" "$out/ctest.log" | head -12
fi
fails=0
run() {  # run <log> <timeout> <cmd...>: one sanitizer process, its summary line
  local log=$1 lim=$2; shift 2
  local l; l=$(left)
  if [ "$l" -le 5 ]; then echo "SKIPPED (budget): $*"; return; fi
  [ "$l" -lt "$lim" ] && lim=$l
  timeout "$lim" "$@" >"$log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && fails=$((fails + 1))
  echo "rc=$rc ($(( $(date +%s) - t0 ))s) ${*:2:3} ${*: -1}: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|fly_gpu_subset:|test cases' "$log" | tr '\n' ' ')"
}
# Per family: memcheck/initcheck/synccheck/racecheck over the subset, then memcheck over its tests.
declare -A tag=([rmsnorm]="[rmsnorm]" [topk]="[topk]" [gemm]="" [attention]="[attention]"
                [attention_bwd]="[attention_bwd]" [grouped_gemm]="[grouped_gemm]" [mx]="[mx]")
for tool in memcheck initcheck synccheck racecheck; do
  for f in $fams; do
    run "$out/cs-$tool-$f.log" 150 "$cs" --tool "$tool" --error-exitcode 1 "./$bdir/test/fly_gpu_subset" "$f"
  done
done
for f in $fams; do
  [ -n "${tag[$f]:-}" ] || continue  # the GEMM tests whole take long under memcheck: the subset covers its paths
  run "$out/cs-memcheck-tests-$f.log" 120 "$cs" --tool memcheck --error-exitcode 1 --report-api-errors no \
    "./$bdir/test/fly_gpu_tests" "${tag[$f]}"
done
echo "device_sanitize: $fails failing run(s), $(( $(date +%s) - t0 ))s"
[ $fails -eq 0 ]
