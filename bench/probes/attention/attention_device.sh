#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for the attention family: build (attention only), CPU + GPU tests, flybench,
# compute-sanitizer memcheck/racecheck. Logs under $OUT. Usage: bench/probes/attention/attention_device.sh [stages]
# FLY_MATCH=REGEX builds every variant matching it (tuning); RACE_TESTS: the Catch2 filter racecheck runs. stages: any of test,bench,tune,torch,memcheck,racecheck (default: test,bench,memcheck,racecheck)
set -uo pipefail
stages=${1:-test,bench,memcheck,racecheck}
out=${OUT:-/tmp/attn_out}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
has() { [[ ",$stages," == *",$1,"* ]]; }
t0=$(date +%s)
tools/device_run.sh bd -DFLY_FAMILIES=attention ${FLY_MATCH:+-DFLY_ALL_VARIANTS=ON "-DFLY_VARIANT_MATCH=$FLY_MATCH"} > "$out/cfg.log" 2>&1 || { tail -30 "$out/cfg.log"; exit 1; }
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
if has tune; then
  timeout ${TUNE_TIMEOUT:-200} bd/flytune attention --quick ${TUNE_ARGS:-} --db "$out/attn_tune.sqlite" --dump "$out/sm_90a.sql" --times "$out/tune_times.tsv" > "$out/tune.log" 2>&1
  echo "tune rc=$?"; tail -3 "$out/tune.log"; grep -c attention_fwd "$out/sm_90a.sql"
  export FLYKERNELS_TUNING_DB="$out/attn_tune.sqlite"
fi
if has torch; then
  PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-240} python3 bench/attention_torch.py --flybench bd/flybench --reps 10 ${TORCH_ARGS:-} --png "$out/attention.png" --json "$out/attention_latest.json" > "$out/torch.log" 2>&1
  echo "torch rc=$?"; grep -v "^bf16 B=\|^fp16 B=" "$out/torch.log" | cut -c1-170
fi
if has memcheck; then
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 bd/test/fly_gpu_tests "[attention]" > "$out/memcheck.log" 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed|Invalid" "$out/memcheck.log" | head -8
fi
if has racecheck; then
  timeout ${RACE_TIMEOUT:-150} compute-sanitizer --tool racecheck --error-exitcode 9 bd/test/fly_gpu_tests "${RACE_TESTS:-attention_fwd: grouped-query*,attention_fwd: one query*}" > "$out/racecheck.log" 2>&1
  echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed|failed|hazard" "$out/racecheck.log" | head -8
fi
echo "total: $(( $(date +%s) - t0 )) s"
