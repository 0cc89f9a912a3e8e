#!/usr/bin/env bash
# One device call for the attention forward's inter-warpgroup ping-pong variants (`_pp1`,
# attention_fwd.cu PingPong; written 2026-12-02 without device time). Builds the attention family
# with, per head dim, the shipped tile in three schedules (ov0 = the defaults, ov1, ov1_pp1), both
# dtypes; runs the attention GPU tests (the "every bundled variant" case forces each pp1 variant,
# causal and not, Sq 190 / Sk 300), racecheck over that forced case (the named-barrier turns),
# then `flytune attention --quick --dtype bf16` over the three schedules: its times TSV
# ($OUT/tune_times.tsv) is the A/B per suite key, and its re-dumped rows ($OUT/sm_90a.sql) say
# whether pp1 wins any. Run from the repository root (carry .devdeps):
#   bash bench/probes/attention_pingpong_device.sh
# then, if pp1 wins: copy the attention_fwd rows of $OUT/sm_90a.sql into db/sm_90a.sql and run
# `bench/probes/attention_device.sh test,torch,memcheck,racecheck` on the default build.
set -uo pipefail
export FLY_MATCH='_hd(64_m128_n192|128_m128_n128|192_m128_n112|256_m128_n64)_st2_ov1(_pp1)?$'
export TUNE_ARGS="--dtype bf16" TUNE_TIMEOUT=${TUNE_TIMEOUT:-240}
export RACE_TESTS="attention_fwd: every bundled variant" RACE_TIMEOUT=${RACE_TIMEOUT:-200}
exec bash "$(dirname "$0")/attention_device.sh" test,racecheck,tune
