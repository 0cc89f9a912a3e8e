#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call (<= 600 s) for the attention forward's persistent (`_ps1`) and ping-pong (`_pp1`)
# schedules (docs/attention.md, "Ping-pong and persistent"). Builds the attention family with, per head dim, the shipped BF16 tile in every
# schedule (ov0 = the defaults, ov1, and the new space's ov0_pp0_ps1 / ov1_pp0_ps1 / ov1_pp1_ps0 /
# ov1_pp1_ps1), then:
#   1. the GPU tests: "[attention_ps]" (each new variant forced on 288-tile grids, causal and not,
#      and a split-key GQA decode) and "every bundled variant" (each forced, Sq 190 / Sk 300);
#   2. compute-sanitizer memcheck over "[attention_ps]", racecheck and synccheck over the small
#      forced case (the named-barrier turns, the Q reload);
#   3. `flytune attention --quick --dtype bf16` over these schedules: $OUT/tune_times.tsv is the
#      A/B per suite key, $OUT/sm_90a.sql the rows (copy its attention_fwd rows into db/sm_90a.sql
#      where a new schedule wins, then run `bench/probes/attention/attention_device.sh test,torch` on the
#      default build for the suite figures beside cuDNN).
# Run from the repository root with .devdeps carried: bash bench/probes/attention/attention_pingpong_device.sh
set -uo pipefail
out=${OUT:-/tmp/attn_pp}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
match='attention_fwd_bf16_hd(64_m128_n192|128_m128_n128|192_m128_n112|256_m128_n64)_st2_ov[01](_pp[01]_ps[01])?$'
tools/device_run.sh bd -DFLY_FAMILIES=attention -DFLY_ALL_VARIANTS=ON "-DFLY_VARIANT_MATCH=$match" >"$out/cfg.log" 2>&1 ||
  { tail -30 "$out/cfg.log"; exit 1; }
cmake --build bd -j16 >"$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -40; exit 1; }
el "build: $(ls bd/cubins | tr '\n' ' ')"
timeout 200 bd/test/fly_gpu_tests "[attention_ps],attention_fwd: every bundled variant" >"$out/gpu_tests.log" 2>&1
el "gpu tests rc=$?"; grep -E "FAILED|passed|failed|with expansion|-> " "$out/gpu_tests.log" | head -40
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 bd/test/fly_gpu_tests "[attention_ps]" >"$out/memcheck.log" 2>&1
el "memcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed" "$out/memcheck.log" | head -4
for tool in racecheck synccheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 bd/test/fly_gpu_tests "attention_fwd: every bundled variant" \
    >"$out/$tool.log" 2>&1
  el "$tool rc=$?"; grep -E "SUMMARY|passed|failed" "$out/$tool.log" | head -4
done
timeout 200 bd/flytune attention --quick --dtype bf16 --db "$out/attn_tune.sqlite" --dump "$out/sm_90a.sql" \
  --times "$out/tune_times.tsv" >"$out/tune.log" 2>&1
el "tune rc=$?"; tail -3 "$out/tune.log"; grep attention_fwd "$out/sm_90a.sql" | grep -oE "'attention_fwd_[a-z0-9_]+'" | sort | uniq -c
tar -C "$out" -czf "$out/logs.tgz" cfg.log build.log memcheck.log racecheck.log synccheck.log tune.log 2>/dev/null
