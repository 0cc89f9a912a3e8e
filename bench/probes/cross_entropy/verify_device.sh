#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The cross_entropy family's GPU checks in one run on a Hopper machine (repository root):
#   bash bench/probes/cross_entropy/verify_device.sh [OUT]
# builds the library with this family only (build-ce: 3 default cubins, no tools), fly_gpu_tests,
# fly_cpu_tests, the stand-in driver tests and the PyTorch package (in the background, while the
# C++ checks run), then: the CPU argument and status tests, the [cross_entropy] GPU tests,
# compute-sanitizer memcheck and racecheck over the small cases (racecheck also over the real
# vocabularies: the shared-memory stash), the bandwidth probe (ce_bandwidth.cpp), the Python
# tests (test_gpu_cross_entropy.py, test_cpu_cross_entropy.py: with transformers installed, tiny
# Hugging Face models patched against stock) and bench/cross_entropy_torch.py.
# Logs land in OUT (default /tmp/cross-entropy-verify): build.log, tests.log (every test run, one
# after the other), sanitize.log, pytest.log, bench.log and cross_entropy_torch.json; a summary on
# stdout. About 5 minutes on an H100 with 16 cores (the extension's compile is most of it).
set -uo pipefail
root=$(pwd); OUT=${1:-/tmp/cross-entropy-verify}; mkdir -p "$OUT"
B=build-ce
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  2>&1 | tee "$OUT/versions.log"
tools/device_run.sh "$B" -DFLY_FAMILIES=cross_entropy -DFLY_BUILD_TOOLS=OFF > "$OUT/build.log" 2>&1 \
  || { tail -20 "$OUT/build.log"; exit 1; }
cmake --build "$B" --target flykernels fly_gpu_tests fly_cpu_tests fly_fake_driver_tests -j"$(nproc)" >> "$OUT/build.log" 2>&1 \
  || { grep -A5 error "$OUT/build.log" | head -30; exit 1; }
# The package compiles on one core for minutes: in the background, beside the C++ checks.
(FLYKERNELS_PREBUILT_DIR="$root/$B" MAX_JOBS=4 python3 -m pip install -q --no-build-isolation --no-deps \
  --break-system-packages "$root/python" > "$OUT/pip.log" 2>&1; echo "pip rc=$?" >> "$OUT/pip.log") &
pip_pid=$!
T="$OUT/tests.log"; : > "$T"
run() { echo "== $*" >> "$T"; "$@" >> "$T" 2>&1; local rc=$?; echo "$1 ${2:-} rc=$rc"; tail -2 "$T"; }
run ./$B/test/fly_cpu_tests "[cross_entropy]"
FLYKERNELS_LIBCUDA=/nonexistent/libcuda.so.1 run ./$B/test/fly_cpu_tests "[status]"
FLYKERNELS_LIBCUDA="$root/$B/test/libfly_fake_cuda.so" run ./$B/test/fly_fake_driver_tests "[cross_entropy]"
run ./$B/test/fly_gpu_tests "[cross_entropy]"
small="cross_entropy against FP64 - dtypes tails strides in place loss only,cross_entropy - ignored rows all ignored and labels outside the vocabulary,cross_entropy propagates NaN and infinities as torch,cross_entropy - M = 0 is a no-op"
S="$OUT/sanitize.log"; : > "$S"
compute-sanitizer --tool memcheck --error-exitcode 9 ./$B/test/fly_gpu_tests "$small" >> "$S" 2>&1
echo "memcheck rc=$?"; tail -1 "$S"
compute-sanitizer --tool racecheck --error-exitcode 9 ./$B/test/fly_gpu_tests \
  "$small,cross_entropy - vocabularies of real models in registers shared memory and reread" >> "$S" 2>&1
echo "racecheck rc=$?"; tail -1 "$S"
g++ -O2 -std=c++17 bench/probes/cross_entropy/ce_bandwidth.cpp -Iinclude -I/usr/local/cuda/include -L"$B" \
  -lflykernels -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,"$root/$B" -o "$B/ce_bandwidth" >> "$OUT/build.log" 2>&1
for dt in bf16 fp32; do ./$B/ce_bandwidth $dt; done 2>&1 | tee "$OUT/bench.log"
wait "$pip_pid"; tail -1 "$OUT/pip.log"
(cd /tmp && python3 -m pytest -q -rs -p no:cacheprovider "$root/python/tests/test_gpu_cross_entropy.py" \
  "$root/python/tests/test_cpu_cross_entropy.py" -s) > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "peak|passed|failed" "$OUT/pytest.log" | tail -4
(cd /tmp && python3 "$root/bench/cross_entropy_torch.py" --json "$OUT/cross_entropy_torch.json") 2>&1 | tee -a "$OUT/bench.log"
