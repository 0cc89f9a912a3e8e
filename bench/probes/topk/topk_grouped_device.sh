#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call (<= 450 s): the TopK long rows after the DB change (issue 25: flybench + torch.topk
# on suites/topk_long.json, largest and smallest) and the grouped GEMM beside Inductor's Triton
# grouped GEMM (issue 27: bench/grouped_gemm_torch.py --triton over CASES, each compiled and
# autotuned once per shape). One build of the topk and grouped_gemm families. Logs under $OUT.
#   bash bench/probes/topk/topk_grouped_device.sh          (from the repository root, .devdeps carried)
set -uo pipefail
out=${OUT:-/tmp/topk_grouped}; mkdir -p "$out/topk"
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
bash tools/device_run.sh build "-DFLY_FAMILIES=topk;grouped_gemm" >"$out/build.log" 2>&1 &&
  cmake --build build -j16 >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
el "build: $(ls build/cubins | wc -l) cubins"
timeout 200 bash kernels/topk/dev/long_device.sh "$out/topk" bench bench0 >"$out/topk-long.log" 2>&1
el "topk long rows rc=$?"; tail -12 "$out/topk-long.log"
PYTHONUNBUFFERED=1 timeout ${TRITON_TIMEOUT:-230} python3 bench/grouped_gemm_torch.py --lib build/libflykernels.so --triton \
  --cases "${CASES:-0,3,6,8,12,14,16,18,19,21,23}" --json "$out/grouped_triton.json" 2>&1 | grep -v Warning >"$out/grouped-triton.log"
el "grouped vs triton rc=$?"; cut -c1-200 "$out/grouped-triton.log" | tail -24
tar -C "$out" -czf "$out/topk_logs.tgz" topk build.log && rm -rf "$out/topk" "$out/build.log"
