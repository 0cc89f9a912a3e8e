#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for issue 25's denser GEMM database: tune training shapes drawn from
# gemm_random.py's distribution on seeds disjoint from the benchmark's, then run the benchmark's
# held-out seeds with and without the new rows (as an overlay database), in the same call.
#   OUT=... bash bench/probes/gemm/gemm_densify_device.sh       (carry .devdeps)
# Env: SEEDS (training, default 101-108), PER_SEED (25), MAX_TFLOP (1.0), SUITE_MIN (0.45: the
# --max-minutes of each of the 8 (dtype, layout) suites), TEST_SEEDS ("1 2 3"), COUNT (60).
# Writes $OUT/train_rows.sql (the rows, db/sm_90a.sql format), $OUT/train_times.tsv.gz and the logs.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
if ! { [ -f build/libflykernels.so ] && [ -x build/flytune ]; }; then
  bash tools/device_run.sh build >"$OUT/build.log" 2>&1 && cmake --build build -j16 >>"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
  el "build done: $(ls build/cubins | wc -l) cubins"
fi
python3 bench/probes/gemm/gemm_train_shapes.py --out /tmp/train --seeds "${SEEDS:-101-108}" --per-seed "${PER_SEED:-25}" \
  --max-tflop "${MAX_TFLOP:-1.0}"
rm -f /tmp/train.sqlite "$OUT/train_rows.sql" /tmp/train_times.tsv
for f in /tmp/train/*.json; do
  b=$(basename "$f" .json); dt=${b%_*}; lay=${b#*_}
  timeout 200 build/flytune gemm --quick --suite "$f" --dtype "$dt" --layouts "$lay" --warm-ms 5 \
    --max-minutes "${SUITE_MIN:-0.45}" --db /tmp/train.sqlite --dump "$OUT/train_rows.sql" --times /tmp/train_times.tsv \
    >>"$OUT/train.log" 2>&1
  el "tuned $b rc=$?: $(tail -1 "$OUT/train.log")"
done
gzip -c /tmp/train_times.tsv >"$OUT/train_times.tsv.gz"
for seed in ${TEST_SEEDS:-1 2 3}; do
  timeout 150 python3 bench/gemm_random.py --lib build/libflykernels.so --seed "$seed" --count "${COUNT:-60}" \
    --json /tmp/base$seed.json >/tmp/base$seed.log 2>&1
  el "seed $seed shipped DB: $(grep geomean /tmp/base$seed.log)"
  FLYKERNELS_TUNING_DB=/tmp/train.sqlite timeout 150 python3 bench/gemm_random.py --lib build/libflykernels.so \
    --seed "$seed" --count "${COUNT:-60}" --json /tmp/dense$seed.json >/tmp/dense$seed.log 2>&1
  el "seed $seed with the training rows: $(grep geomean /tmp/dense$seed.log)"
done
tar -C /tmp -czf "$OUT/validate.tgz" $(cd /tmp && ls base*.json base*.log dense*.json dense*.log 2>/dev/null)
el "done"
