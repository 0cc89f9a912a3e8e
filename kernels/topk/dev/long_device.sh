#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for the long-row TopK work (issue 25): build the topk family, tune the long-row
# keys over the split variants (and radix t1024 for reference), the GPU tests with those rows as
# the overlay DB, flybench + torch.topk on suites/topk_long.json, compute-sanitizer.
#   bash kernels/topk/dev/long_device.sh OUT [steps...]   steps: build tune test bench bench0 san full
set -uo pipefail
out=${1:-/tmp/out}; shift || true
steps=" ${*:-build tune test bench san} "
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
if [[ $steps == *" build "* ]]; then
  bash tools/device_run.sh build -DFLY_FAMILIES=topk >"$out/build.log" 2>&1
  ninja -C build -j16 flykernels fly_gpu_tests flybench flytune fly_gpu_subset >>"$out/build.log" 2>&1 \
    || { tail -30 "$out/build.log"; exit 1; }
  el "build done"
fi
if [[ $steps == *" tune "* ]]; then
  timeout 40 ./build/flytune topk --quick --suite suites/topk_long_tune.json --variants 'split|radix_fp32_t1024' \
    --db /tmp/tune.sqlite --dump "$out/tune.sql" --times /tmp/tune_times.tsv >"$out/tune.log" 2>&1
  el "tune rc=$? $(tail -1 "$out/tune.log")"; cat /tmp/tune_times.tsv >>"$out/tune.log"
fi
[ -f /tmp/tune.sqlite ] && export FLYKERNELS_TUNING_DB=/tmp/tune.sqlite
if [[ $steps == *" test "* ]]; then
  timeout 50 ./build/test/fly_gpu_tests "${TESTS:-[topk][long]}" >"$out/tests.log" 2>&1
  el "tests rc=$? $(grep -E 'test cases|assertions' "$out/tests.log" | tr '\n' ' ')"
  grep -B3 -A12 -m3 "FAILED" "$out/tests.log" | head -60
fi
if [[ $steps == *" bench "* ]]; then
  timeout 45 ./build/flybench topk --suite suites/topk_long.json --json /tmp/fb.json >"$out/bench.log" 2>&1
  el "flybench rc=$?"
  PYTHONUNBUFFERED=1 timeout 40 python3 bench/topk_torch.py --long --ours-json /tmp/fb.json --json /tmp/long.json \
    --png /tmp/long.png >>"$out/bench.log" 2>&1
  el "torch rc=$?"; grep -E "geomean" "$out/bench.log"
fi
if [[ $steps == *" bench0 "* ]]; then
  timeout 80 ./build/flybench topk --largest 0 --suite suites/topk_long.json --json /tmp/fb0.json >"$out/bench0.log" 2>&1
  el "flybench largest=0 rc=$?"
  PYTHONUNBUFFERED=1 timeout 80 python3 bench/topk_torch.py --long --largest 0 --ours-json /tmp/fb0.json \
    --json /tmp/long0.json --png /tmp/long0.png >>"$out/bench0.log" 2>&1
  el "torch largest=0 rc=$?"; grep -E "geomean" "$out/bench0.log"
fi
if [[ $steps == *" san "* ]]; then
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do
    timeout 30 "$cs" --tool $tool --error-exitcode 1 ./build/test/fly_gpu_subset topk >"$out/cs-$tool.log" 2>&1
    el "$tool subset rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/cs-$tool.log" | tr '\n' ' ')"
  done
  [[ $steps == *" sanlong "* ]] || exit 0
  timeout 120 "$cs" --tool memcheck --error-exitcode 1 ./build/test/fly_gpu_tests "[topk][long]" >"$out/cs-memcheck-long.log" 2>&1
  el "memcheck [topk][long] rc=$? $(grep -E 'ERROR SUMMARY|test cases' "$out/cs-memcheck-long.log" | tr '\n' ' ')"
fi
