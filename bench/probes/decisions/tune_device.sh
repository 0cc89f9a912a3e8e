#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The decision rows of one card, measured on the GPU machine (repository root):
#   OUT=/tmp/out bash bench/probes/decisions/tune_device.sh [ops...]   (default: every op)
# Builds the library and the package (tools/device_run.sh; FLY_PREBUILT_BLOBS=<dir> in the
# environment embeds a finished build's kernels instead of compiling them), then runs
# `python -m flykernels tune --quick` once per op (one process each, so a CUDA error in one op
# keeps the others' rows), each with its own dump in $OUT/rows_<op>.sql. Merge the dumps into
# python/flykernels/decisions_sm_90a.sql afterwards (a card's rows of an op replace that card's
# earlier rows of it). Logs in $OUT/logs.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/out}; L=/tmp/tune-logs; mkdir -p "$L" "$OUT"; root=$(pwd)
export PATH=/usr/local/cuda/bin:$PATH
trap 'cp "$L"/rows_*.sql "$OUT"/ 2>/dev/null; tar czf "$OUT/logs.tgz" -C "$L" .' EXIT
t0=$SECONDS; stamp() { echo "[$((SECONDS - t0)) s] $*"; }
blobs=""; [ -n "${FLY_PREBUILT_BLOBS:-}" ] && blobs="-DFLY_PREBUILT_BLOBS=$FLY_PREBUILT_BLOBS"
stamp build
bash tools/device_run.sh build $blobs > "$L/cfg.log" 2>&1 || { tail -30 "$L/cfg.log"; exit 1; }
cmake --build build -j"$(nproc)" --target flykernels > "$L/build.log" 2>&1 || { grep -A3 error "$L/build.log" | head -30; exit 1; }
FLYKERNELS_PREBUILT_DIR="$root/build" MAX_JOBS="$(nproc)" python3 -m pip install -q --no-build-isolation --no-deps \
  --break-system-packages "$root/python" > "$L/pip.log" 2>&1 || { tail -30 "$L/pip.log"; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader
for op in ${*:-sdpa sdpa_bwd grouped_mm rms_norm topk mm}; do
  stamp "tune $op"
  (cd /tmp && python3 -m flykernels tune --ops "$op" --quick --suite "$root/suites" \
     --dump "$L/rows_$op.sql" --db "$L/tuned_$op.sqlite") > "$L/tune_$op.log" 2>&1
  echo "rc=$?"; grep -E "decision rows|stopped" "$L/tune_$op.log"
done
stamp done
