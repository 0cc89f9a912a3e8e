#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The glu and rope families' GPU checks in one run on a Hopper machine (repository root):
#   bash bench/probes/glu/verify_device.sh [OUT]
# builds the library, fly_gpu_tests and the PyTorch package, then: the [glu] and [rope] GPU tests,
# compute-sanitizer memcheck and racecheck over them, the patched-model GPU tests and
# bench/glu_torch.py and bench/rope_torch.py (the fused ops against the compositions on the
# e2e models' shapes).
# Logs and the benchmarks' JSON land in OUT (default /tmp/glu-verify).
set -uo pipefail
root=$(pwd); OUT=${1:-/tmp/glu-verify}; mkdir -p "$OUT"
tools/device_run.sh build > "$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build --target flykernels fly_gpu_tests -j"$(nproc)" > "$OUT/build.log" 2>&1 || { grep -A5 error "$OUT/build.log" | head -30; exit 1; }
FLYKERNELS_PREBUILT_DIR="$root/build" python3 -m pip install -q --no-build-isolation --no-deps --break-system-packages \
  "$root/python" > "$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
./build/test/fly_gpu_tests "[glu],[rope]" > "$OUT/glu.log" 2>&1; echo "[glu],[rope] rc=$?"; tail -2 "$OUT/glu.log"
small="glu forward and backward against FP64,glu propagates NaN and infinities as the unfused ops do,[rope]"
compute-sanitizer --tool memcheck ./build/test/fly_gpu_tests "$small" > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -1 "$OUT/memcheck.log"
compute-sanitizer --tool racecheck ./build/test/fly_gpu_tests "$small" > "$OUT/racecheck.log" 2>&1; echo "racecheck rc=$?"; tail -1 "$OUT/racecheck.log"
(cd /tmp && python3 -m pytest -q -rs -p no:cacheprovider "$root/python/tests/test_gpu_patch.py" "$root/python/tests/test_cpu_patch.py") \
  > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?"; tail -3 "$OUT/pytest.log"
(cd /tmp && python3 "$root/bench/glu_torch.py" --json "$OUT/glu_torch.json")
(cd /tmp && python3 "$root/bench/rope_torch.py" --json "$OUT/rope_torch.json")
