#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ncu of the MX quantizer (mx_quantize_t256_hw1) on 4096 x 4096 BF16 -> MXFP4 and MXFP8 (the suite's
# lowest %copy rows): duration, DRAM throughput, issue activity, warp stalls. One device call
# (carry .devdeps); output $OUT/ncu-quant.txt.   OUT=... bash bench/probes/mxfp/mx_quant_profile.sh
set -uo pipefail
out=${OUT:-./out-mxq}; mkdir -p "$out"; b=build-mxq
export PATH=/usr/local/cuda/bin:$PATH
bash tools/device_run.sh "$b" -DFLY_FAMILIES="mx_quantize;mxfp" -DFLY_ALL_VARIANTS=ON \
  -DFLY_VARIANT_MATCH="^(mx_quantize_t256_hw1|mxfp_widen_n128)$" >/dev/null 2>&1
ninja -C "$b" -j16 flybench >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
echo '{"cases": [{"M": 4096, "N": 4096, "K": 4096}]}' >/tmp/q.json
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,smsp__issue_active.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread
timeout 200 ncu --clock-control none -k regex:mx_quantize -s 2 -c 4 --metrics $M --section WarpStateStats --csv \
  "./$b/flybench" mxfp --suite /tmp/q.json 2>&1 | grep -v '^==PROF==' >"$out/ncu-quant.txt"
echo "ncu rc=$?"; wc -l "$out/ncu-quant.txt"
