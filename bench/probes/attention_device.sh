#!/usr/bin/env bash
# One device call for the attention family: build (attention only), CPU + GPU tests, flybench,
# compute-sanitizer memcheck/racecheck. Logs under $OUT. Usage: bench/probes/attention_device.sh [stages]
# stages: any of test,bench,memcheck,racecheck,torch (default: test,bench,memcheck,racecheck)
set -uo pipefail
stages=${1:-test,bench,memcheck,racecheck}
out=${OUT:-/tmp/attn_out}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
has() { [[ ",$stages," == *",$1,"* ]]; }
t0=$(date +%s)
tools/device_run.sh bd -DFLY_FAMILIES=attention ${FLY_CMAKE_EXTRA:-} > "$out/cfg.log" 2>&1 || { tail -30 "$out/cfg.log"; exit 1; }
cmake --build bd -j16 > "$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
if has test; then
  bd/test/fly_cpu_tests "[attention]" | tail -2
  timeout ${GPU_TEST_TIMEOUT:-150} bd/test/fly_gpu_tests "[attention]" > "$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "FAILED|passed|failed|with expansion|-> " "$out/gpu_tests.log" | head -60
fi
if has bench; then
  timeout ${BENCH_TIMEOUT:-150} bd/flybench attention --reps 10 --json "$out/bench.json" > "$out/bench.log" 2>&1
  echo "bench rc=$?"; cat "$out/bench.log" | cut -c1-150
fi
if has memcheck; then
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 bd/test/fly_gpu_tests "[attention]" > "$out/memcheck.log" 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed|Invalid" "$out/memcheck.log" | head -8
fi
if has racecheck; then
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 bd/test/fly_gpu_tests "attention_fwd: grouped-query, both layouts, padded rows, explicit scale" > "$out/racecheck.log" 2>&1
  echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed|failed|hazard" "$out/racecheck.log" | head -8
fi
echo "total: $(( $(date +%s) - t0 )) s"
