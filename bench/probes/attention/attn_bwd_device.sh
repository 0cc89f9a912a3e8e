#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Device script of the attention backward (run from the repo root on the GPU machine):
#   bench/probes/attention/attn_bwd_device.sh <stage...>: build | test | sanitize | bench
set -uo pipefail
fams="${FLY_BWD_FAMILIES:-attention_bwd}"
for stage in "$@"; do
  case $stage in
    build)
      bash tools/device_run.sh build -DFLY_FAMILIES="$fams" >$OUT/cfg.log 2>&1 || { tail -30 $OUT/cfg.log; exit 1; }
      (time cmake --build build -j16) >$OUT/build.log 2>&1 || { grep -E "error|Error" -A3 $OUT/build.log | head -60; exit 1; }
      tail -2 $OUT/build.log ;;
    test)
      timeout 150 build/test/fly_gpu_tests "[attention_bwd]" 2>&1 | tail -60 | tee $OUT/test.log ;;
    sanitize)
      for tool in memcheck racecheck; do
        timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 build/test/fly_gpu_tests "[attention_bwd]" >$OUT/san_$tool.log 2>&1
        echo "$tool rc=$?"; tail -4 $OUT/san_$tool.log
      done ;;
    racecheck-small)
      timeout 110 compute-sanitizer --tool racecheck --error-exitcode 9 build/test/fly_gpu_tests "[attention_bwd_small]" >$OUT/san_racecheck_small.log 2>&1
      echo "racecheck small rc=$?"; tail -4 $OUT/san_racecheck_small.log ;;
    bench)
      fb=$(find build -maxdepth 2 -name flybench -type f | head -1)
      timeout 240 python3 bench/attention_torch.py --bwd --flybench "$fb" --dtype bf16 --reps 10 \
        --png $OUT/attention_bwd.png --json $OUT/attention_bwd.json 2>&1 | tee $OUT/bench.log | tail -45 ;;
  esac
done
