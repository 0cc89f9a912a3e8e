#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call (<= 560 s): the default build (with the attention forward's
# persistent rows and the hd 512 backward as a default), the python package and every python
# GPU test on it; meanwhile a build of every BF16 attention backward variant (hd 64..256) and the
# FP16 forward's shipped tiles in the ov0 / ps1 schedules, for `flytune attention --bwd --dtype bf16`
# (the backward's first tuning rows) and `flytune attention --dtype fp16` (FP16's first forward
# rows): $OUT/tune.sql has both (copy its rows into db/sm_90a.sql); then the every-variant GPU tests
# of both families on that build. Logs under $OUT (at most 8 files). Run from the repository root with .devdeps and .whl carried:
#   bash bench/probes/attention/defaults_bwdtune_device.sh
set -uo pipefail
out=${OUT:-/tmp/defaults_bwdtune}; mkdir -p "$out"
R=$PWD
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
bash tools/device_run.sh build >"$out/build.log" 2>&1 && cmake --build build -j16 >>"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
el "default build: $(ls build/cubins | wc -l) cubins"
# the backward variants' build runs beside the python tests (CPU), the tuning after them (GPU)
( bash tools/device_run.sh bwt "-DFLY_FAMILIES=attention;attention_bwd" -DFLY_ALL_VARIANTS=ON \
    "-DFLY_VARIANT_MATCH=attention_bwd_bf16_hd(64|128|192|256)_|attention_fwd_fp16_hd(64_m128_n192|128_m128_n128|192_m128_n112|256_m128_n64)_st2_ov0(_pp0_ps1)?$" \
    && cmake --build bwt -j8 ) >"$out/bwt_build.log" 2>&1 &
bpid=$!
if ls .whl/expecttest-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
FLYKERNELS_PREBUILT_DIR=build MAX_JOBS=8 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/pyfk \
  ./python >"$out/pip.log" 2>&1 || { tail -30 "$out/pip.log"; exit 1; }
el "python package installed"
(cd /tmp && PYTHONPATH=/tmp/pyfk:${PYTHONPATH:-} timeout 280 python3 -m pytest -q -rs -p no:cacheprovider \
  "$R/python/tests" 2>&1) >"$out/pytest.log"
el "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED|Error" "$out/pytest.log" | tail -20
wait $bpid; el "backward variants build rc=$? ($(ls bwt/cubins | grep -c attention_bwd) backward cubins)"
timeout 150 bwt/flytune attention --bwd --quick --dtype bf16 --db /tmp/tune.sqlite --dump "$out/tune.sql" \
  --times "$out/tune_times.tsv" >"$out/bwd_tune.log" 2>&1
el "bwd tune rc=$?"; tail -1 "$out/bwd_tune.log"
timeout 60 bwt/flytune attention --quick --dtype fp16 --db /tmp/tune.sqlite --dump "$out/tune.sql" \
  --times "$out/tune_times.tsv" >"$out/fwd_tune.log" 2>&1
el "fp16 forward tune rc=$?"; tail -1 "$out/fwd_tune.log"
grep -oE "'attention_(bwd|fwd)_[a-z0-9_]+'" "$out/tune.sql" | sort | uniq -c
timeout 90 bwt/test/fly_gpu_tests "attention_fwd: every bundled variant,attention_bwd: every bundled variant" \
  >"$out/every_variant.log" 2>&1
el "every-variant GPU tests rc=$?"; grep -E "FAILED|passed|failed" "$out/every_variant.log" | head -8
tar -C "$out" -czf "$out/logs.tgz" build.log bwt_build.log pip.log bwd_tune.log fwd_tune.log every_variant.log &&
  rm -f "$out"/{build,bwt_build,pip,bwd_tune,fwd_tune,every_variant}.log
el "done"
