#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call (<= 300 s) for the wide-head (D 257..512) attention backward (issue 28), written
# without a GPU and unmeasured until this runs: build attention + attention_bwd with the hd512
# backward variants (not defaults: -DFLY_ALL_VARIANTS=ON, matched by name; the forward's defaults
# and DB rows stay), the CPU plan tests, the wide GPU tests plus every bundled variant forced,
# the D 512 backward beside SDPA's memory-efficient backward (bench/attention_torch.py --bwd),
# compute-sanitizer memcheck and racecheck over the bounded wide cases. Run from the repo root:
#   bash bench/probes/attention/attention_bwd_wide_device.sh [stages]
# stages: any of test,bench,memcheck,racecheck (default: all). Worst case (every timeout hit)
# about 300 s: build 100, GPU tests 60, bench 55, memcheck 30, racecheck 40, configure + ptxas
# ~15. Results under $OUT (at most 8 files: summary.log, gpu_tests.log, memcheck.log,
# racecheck.log, torch.log, the bench json and png, logs.tar.gz with the configure / build logs).
set -uo pipefail
stages=${1:-test,bench,memcheck,racecheck}
out=${OUT:-/tmp/attn_bwd_wide_out}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
has() { [[ ",$stages," == *",$1,"* ]]; }
exec > >(tee "$out/summary.log") 2>&1
trap 'sleep 1' EXIT  # let tee write the last lines before $OUT is collected
t0=$(date +%s)
el() { echo "$(( $(date +%s) - t0 )) s"; }
bd=bww
bash tools/device_run.sh $bd "-DFLY_FAMILIES=attention;attention_bwd" -DFLY_ALL_VARIANTS=ON \
  "-DFLY_VARIANT_MATCH=${FLY_MATCH:-attention_bwd_.*_hd512_}" > "$out/cfg.log" 2>&1 || { tail -30 "$out/cfg.log"; exit 1; }
timeout ${BUILD_TIMEOUT:-100} cmake --build $bd -j16 > "$out/build.log" 2>&1 || {
  grep -E "error|Error" -A3 "$out/build.log" | head -40; tar czf "$out/logs.tar.gz" -C "$out" cfg.log build.log; exit 1; }
echo "build: $(el); bundled: $(ls $bd/gen | grep -c '^attention_bwd_.*hd512') wide bwd units"
# ptxas figures of the wide kernels as built here (the same flags as the library's cubins)
for u in $bd/gen/attention_bwd_*_hd512_*.cu; do
  nvcc -cubin -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Ikernels -Iinclude "$u" \
    -o /tmp/wide.cubin -Xptxas -v 2>&1 | grep -E "Compiling|spill|registers|C75" | sed "s|^|$(basename $u .cu): |"
done > "$out/ptxas.log"
grep -cE "[1-9][0-9]* bytes spill|C75" "$out/ptxas.log" | sed 's/^/ptxas lines with spills or C75xx: /'

if has test; then
  $bd/test/fly_cpu_tests "[attention_bwd]" | tail -2
  FLYKERNELS_LIBCUDA=$PWD/$bd/test/libfly_fake_cuda.so $bd/test/fly_fake_driver_tests "[attention_bwd]" | tail -2
  timeout ${GPU_TEST_TIMEOUT:-60} $bd/test/fly_gpu_tests \
    "[attention_bwd_wide],[attention_bwd_wide_small],attention_bwd: every bundled variant,attention_bwd: Sk = 0*" \
    > "$out/gpu_tests.log" 2>&1
  rc=$?
  echo "gpu tests rc=$rc ($(el))"; grep -E "FAILED|passed|failed|with expansion|-> " "$out/gpu_tests.log" | head -40
  [ $rc -eq 0 ] || { tail -5 "$out/gpu_tests.log"; echo "GPU tests failed: bench skipped, sanitizers still run"; stages=${stages//bench/}; }
fi
if has bench; then
  # flybench attention --bwd (its own FP64 spot check of dQ) and SDPA's backends in one run: at
  # D 512 only the memory-efficient backward runs (38 TFLOP/s; target >= 6x).
  PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-55} python3 bench/attention_torch.py --bwd --flybench $bd/flybench \
    --suite bench/probes/attention/attention_d512.json --no-decode --dtype bf16 --reps 10 \
    --png "$out/attention_bwd_d512.png" --json "$out/attention_bwd_d512.json" > "$out/torch.log" 2>&1
  echo "bench rc=$? ($(el))"; cut -c1-170 "$out/torch.log" | tail -22
fi
if has memcheck; then
  timeout ${MEMCHECK_TIMEOUT:-30} compute-sanitizer --tool memcheck --error-exitcode 9 $bd/test/fly_gpu_tests \
    "[attention_bwd_wide_small],attention_bwd wide: head dims*" > "$out/memcheck.log" 2>&1
  echo "memcheck rc=$? ($(el))"; grep -E "ERROR SUMMARY|passed|failed|Invalid" "$out/memcheck.log" | head -8
fi
if has racecheck; then
  timeout ${RACECHECK_TIMEOUT:-40} compute-sanitizer --tool racecheck --error-exitcode 9 $bd/test/fly_gpu_tests \
    "[attention_bwd_wide_small]" > "$out/racecheck.log" 2>&1
  echo "racecheck rc=$? ($(el))"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|passed|failed|hazard" "$out/racecheck.log" | head -8
fi
tar czf "$out/logs.tar.gz" -C "$out" cfg.log build.log ptxas.log && rm -f "$out/cfg.log" "$out/build.log" "$out/ptxas.log"
echo "total: $(el)"
