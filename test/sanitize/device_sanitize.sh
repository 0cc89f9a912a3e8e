#!/usr/bin/env bash
# On the GPU machine: build rmsnorm/topk/gemm, ctest, then the four compute-sanitizer tools over
# the bounded workload (fly_gpu_subset) and the rmsnorm/topk GPU tests. Logs under $1 (default .).
#   bash test/sanitize/device_sanitize.sh "$OUT"
set -uo pipefail
out=${1:-.}
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
t0=$(date +%s)
bash tools/device_run.sh build-gpu -DFLY_FAMILIES="rmsnorm;topk;gemm" -DFLY_BUILD_TOOLS=OFF >"$out/build.log" 2>&1
ninja -C build-gpu -j16 fly_cpu_tests fly_gpu_tests fly_fake_driver_tests fly_fuzz_driver fly_gpu_subset \
  fly_driver_probe flykernels >>"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 ))s"
(cd build-gpu && timeout 90 ctest --output-on-failure) >"$out/ctest.log" 2>&1
echo "ctest rc=$? ($(( $(date +%s) - t0 ))s)"; grep -E "tests passed|Passed|Failed|Skipped|\*\*\*" "$out/ctest.log" | head -12
for tool in memcheck racecheck initcheck synccheck; do
  log="$out/cs-$tool.log"
  timeout 40 "$cs" --tool "$tool" --error-exitcode 1 ./build-gpu/test/fly_gpu_subset >"$log" 2>&1
  rc=$?
  echo "$tool fly_gpu_subset rc=$rc ($(( $(date +%s) - t0 ))s): $(grep -E 'ERROR SUMMARY|fly_gpu_subset:' "$log" | tr '\n' ' ')"
done
# The rmsnorm and topk GPU tests whole (bounded), under memcheck.
timeout 30 "$cs" --tool memcheck --error-exitcode 1 ./build-gpu/test/fly_gpu_tests "[rmsnorm],[topk]" >"$out/cs-memcheck-tests.log" 2>&1
echo "memcheck fly_gpu_tests [rmsnorm],[topk] rc=$? ($(( $(date +%s) - t0 ))s): $(grep -E 'ERROR SUMMARY|test cases' "$out/cs-memcheck-tests.log" | tr '\n' ' ')"
