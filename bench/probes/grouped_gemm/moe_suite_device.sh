#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for the model-shape MoE suite (suites/moe.json, issue 49): build the grouped_gemm
# family only (bd/), flybench grouped_gemm on the suite (fwd cases in nt, dA in nn; dB skipped),
# then bench/grouped_gemm_torch.py --suite moe beside F.grouped_mm (all three passes). Logs and
# JSON under $OUT. Estimated on an H100 (not yet run): build 1-3 min, torch 2-5 min, bench 1-2 min;
# under a 10-minute call limit run torch and bench in two calls (bd/ stays on a warm machine).
#   OUT=... bash bench/probes/grouped_gemm/moe_suite_device.sh [stages]   stages: torch (default), bench
#   MOE_ARGS="--phases decode" (or --models, --passes, --tokens) narrows the torch stage.
set -uo pipefail
stages=${1:-torch}
out=${OUT:-/tmp/moe_out}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
has() { [[ ",$stages," == *",$1,"* ]]; }
t0=$(date +%s)
python3 suites/gen_moe.py --check || exit 1
tools/device_run.sh bd -DFLY_FAMILIES=grouped_gemm > "$out/cfg.log" 2>&1 || { tail -30 "$out/cfg.log"; exit 1; }
cmake --build bd -j16 --target flykernels flybench > "$out/build.log" 2>&1 || { grep -E "error" -A3 "$out/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
if has bench; then
  timeout ${BENCH_TIMEOUT:-150} bd/flybench grouped_gemm --suite suites/moe.json --json "$out/flybench_moe.json" > "$out/flybench_moe.log" 2>&1
  echo "flybench rc=$? ($(( $(date +%s) - t0 )) s)"; cut -c1-170 "$out/flybench_moe.log" | tail -${TAIL:-130}
fi
if has torch; then
  PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-420} python3 bench/grouped_gemm_torch.py --lib bd/libflykernels.so --suite moe \
    ${MOE_ARGS:-} --json "$out/moe_latest.json" > "$out/moe.log" 2>&1
  echo "torch rc=$? ($(( $(date +%s) - t0 )) s)"; cut -c1-200 "$out/moe.log"
fi
