#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for the wide-head (D 257..512) attention forward: build the attention family
# with every hd512 variant, GPU tests (the wide cases and every bundled variant), the D 512 suite
# beside SDPA (bench/attention_torch.py) and per-variant flybench, memcheck and racecheck on the
# wide tests. Logs under $OUT. Usage: bench/probes/attention/attention_wide_device.sh [stages]
# stages: any of test,torch,variants,memcheck,racecheck (default: all)
set -uo pipefail
stages=${1:-test,torch,variants,memcheck,racecheck}
out=${OUT:-/tmp/attn_out}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
has() { [[ ",$stages," == *",$1,"* ]]; }
t0=$(date +%s)
tools/device_run.sh bw -DFLY_FAMILIES=attention -DFLY_ALL_VARIANTS=ON "-DFLY_VARIANT_MATCH=${FLY_MATCH:-hd512}" > "$out/cfg.log" 2>&1 || { tail -30 "$out/cfg.log"; exit 1; }
cmake --build bw -j16 > "$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
if has test; then
  bw/test/fly_cpu_tests "[attention]" | tail -2
  timeout ${GPU_TEST_TIMEOUT:-70} bw/test/fly_gpu_tests "[attention_wide],[attention_wide_small],attention_fwd: every bundled variant,attention_fwd: Sk = 0*" > "$out/gpu_tests.log" 2>&1
  rc=$?
  echo "gpu tests rc=$rc ($(( $(date +%s) - t0 )) s)"; grep -E "FAILED|passed|failed|with expansion|-> " "$out/gpu_tests.log" | head -40
  [ $rc -eq 0 ] || { tail -5 "$out/gpu_tests.log"; echo "GPU tests failed: later stages skipped"; exit 1; }
fi
if has torch; then
  PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-60} python3 bench/attention_torch.py --flybench bw/flybench --suite bench/probes/attention/attention_d512.json --no-decode --reps 10 --png "$out/attention_d512.png" --json "$out/attention_d512.json" > "$out/torch.log" 2>&1
  echo "torch rc=$? ($(( $(date +%s) - t0 )) s)"; cut -c1-170 "$out/torch.log"
fi
if has variants; then
  for v in $(ls bw/gen | grep "^attention_fwd_bf16_hd512.*_mc" | sed "s/\.cu$//"); do
    timeout 30 bw/flybench attention --suite bench/probes/attention/attention_d512.json --no-decode --dtype bf16 --reps 5 --variant "$v" 2>&1 | grep -E "D=512" | sed "s/^/$v /" | cut -c1-190
  done > "$out/variants.log"
  echo "variants ($(( $(date +%s) - t0 )) s):"; cat "$out/variants.log"
fi
if has memcheck; then
  timeout ${MEMCHECK_TIMEOUT:-70} compute-sanitizer --tool memcheck --error-exitcode 9 bw/test/fly_gpu_tests "[attention_wide],[attention_wide_small],attention_fwd: every bundled variant" > "$out/memcheck.log" 2>&1
  echo "memcheck rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "ERROR SUMMARY|passed|failed|Invalid" "$out/memcheck.log" | head -8
fi
if has racecheck; then
  timeout ${RACECHECK_TIMEOUT:-60} compute-sanitizer --tool racecheck --error-exitcode 9 bw/test/fly_gpu_tests "[attention_wide_small]" > "$out/racecheck.log" 2>&1
  echo "racecheck rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed|failed|hazard" "$out/racecheck.log" | head -8
fi
echo "total: $(( $(date +%s) - t0 )) s"
