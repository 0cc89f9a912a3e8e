#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 23's gap, measured (docs/attention.md "The gap to cuDNN, profiled"): one device call that
# builds the attention family (shipped rows), then runs ncu (--clock-control none) over
#   - our forward (fly_attn_fwd) and SDPA's cuDNN forward on B 4, H 16, S 4096, D 128 and D 64, BF16,
#     non-causal: duration, tensor-pipe activity, issue activity, instructions, the XU (exp2) pipe,
#     warp-state stall reasons;
#   - the decode case (B 8, Hq 32, Hkv 8, Sq 1, Sk 8192, D 128): our split-key kernel and combine
#     beside cuDNN's, duration and DRAM bytes / throughput.
# Logs under $OUT: ncu-*.csv, summary.txt.   OUT=... bash bench/probes/attention/attention_gap_profile.sh (carry .devdeps)
set -uo pipefail
out=${OUT:-./out-attgap}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
t0=$(date +%s)
bash tools/device_run.sh build-attgap -DFLY_FAMILIES=attention >"$out/cfg.log" 2>&1
cmake --build build-attgap -j16 --target flybench >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 ))s" | tee "$out/summary.txt"
case_json() { echo "{\"op\":\"attention\",\"dtype\":[\"bf16\"],\"cases\":[{\"B\":$1,\"Hq\":$2,\"Hkv\":$3,\"Sq\":$4,\"Sk\":$5,\"D\":$6,\"causal\":false}]}"; }
M0=gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,dram__bytes_read.sum
M=gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,sm__inst_executed_pipe_xu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_alu.sum,launch__registers_per_thread,launch__grid_size,launch__block_size,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second
cat >/tmp/sdpa_case.py <<'PY'
import sys, torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
B, Hq, Hkv, Sq, Sk, D = map(int, sys.argv[1:7])
q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=torch.bfloat16)
k = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16)
v = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for _ in range(4):
        o = F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv)
torch.cuda.synchronize()
PY
for c in "4 16 16 4096 4096 128 d128" "4 16 16 4096 4096 64 d64" "8 32 8 1 8192 128 decode"; do
  set -- $c
  case_json $1 $2 $3 $4 $5 $6 >/tmp/case.json
  timeout 150 ncu --clock-control none -k regex:fly_attn_fwd -s 4 -c 2 --metrics $M --section WarpStateStats --csv \
    ./build-attgap/flybench attention --suite /tmp/case.json --reps 3 --no-decode --no-flush >"$out/ncu-fly-$7.csv" 2>"$out/ncu-fly-$7.err"
  rc=$?; echo "ncu fly $7 rc=$rc" | tee -a "$out/summary.txt"
  [ $rc -ne 0 ] && { M=$M0; timeout 150 ncu --clock-control none -k regex:fly_attn_fwd -s 4 -c 2 --metrics $M --section WarpStateStats --csv \
    ./build-attgap/flybench attention --suite /tmp/case.json --reps 3 --no-decode --no-flush >"$out/ncu-fly-$7.csv" 2>>"$out/ncu-fly-$7.err"; echo "ncu fly $7 (fewer metrics) rc=$?" | tee -a "$out/summary.txt"; }
  timeout 150 ncu --clock-control none -k regex:'sdpa|fprop|flash|fmha' -s 2 -c 2 --metrics $M --section WarpStateStats --csv \
    python3 /tmp/sdpa_case.py $1 $2 $3 $4 $5 $6 >"$out/ncu-cudnn-$7.csv" 2>"$out/ncu-cudnn-$7.err"
  echo "ncu cudnn $7 rc=$?" | tee -a "$out/summary.txt"
done
# one file back (the device returns a few files only)
for f in "$out"/ncu-*.csv; do echo "=== $(basename "$f")"; grep -v '^==PROF==' "$f"; done >"$out/ncu-all.txt"
for f in "$out"/ncu-*.err; do echo "=== $(basename "$f")"; tail -5 "$f"; done >>"$out/ncu-all.txt"
rm -f "$out"/ncu-*.csv "$out"/ncu-*.err
echo "done $(( $(date +%s) - t0 ))s" | tee -a "$out/summary.txt"
