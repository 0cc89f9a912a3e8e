#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# One device call: harness (correctness + timing of every config) then torch.topk timings.
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
# Prebuilt (kernels/topk/dev/topk_harness, built on the workstation and left untracked) or built here.
BIN=kernels/topk/dev/topk_harness
$BIN >/dev/null 2>&1; rc=$?
if [ $rc -ne 1 ]; then
  nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I kernels -I include kernels/topk/dev/harness.cu -o /tmp/topk_harness || exit 1
  BIN=/tmp/topk_harness
fi
timeout 115 $BIN suites/topk.json $OUT 2>$OUT/harness_err.log | tee $OUT/harness.log
echo "harness rc=${PIPESTATUS[0]}"; grep -v '^adv ' $OUT/harness_err.log | head -40
PYTHONUNBUFFERED=1 timeout 60 python3 bench/topk_torch.py --ours-json $OUT/ours_best.json --png $OUT/topk.png 2>&1 | tee $OUT/torch.log
