#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The add_rmsnorm family's GPU checks in one run on a Hopper machine (repository root):
#   bash bench/probes/add_rmsnorm/verify_device.sh [OUT]
# builds the library (default variants), fly_gpu_tests, fly_cpu_tests and the PyTorch package, then:
# the CPU argument tests, the [add_rmsnorm] GPU tests, compute-sanitizer memcheck and racecheck
# over them, the op and patched-model GPU tests and the CPU-side Python tests (with transformers
# installed: tiny Hugging Face models patched against stock), and bench/add_rmsnorm_torch.py (the
# fused op against Hugging Face's composition and the add + F.rms_norm on the e2e models' shapes).
# Logs and the benchmark's JSON land in OUT (default /tmp/add-rmsnorm-verify); a summary on stdout.
set -uo pipefail
root=$(pwd); OUT=${1:-/tmp/add-rmsnorm-verify}; mkdir -p "$OUT"
tools/device_run.sh build > "$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build --target flykernels fly_gpu_tests fly_cpu_tests fly_fake_driver_tests -j"$(nproc)" > "$OUT/build.log" 2>&1 \
  || { grep -A5 error "$OUT/build.log" | head -30; exit 1; }
FLYKERNELS_PREBUILT_DIR="$root/build" python3 -m pip install -q --no-build-isolation --no-deps --break-system-packages \
  "$root/python" > "$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
# CPU side: the argument tests (either side of the device check), the status mapping as CI runs it
# (no driver: valid calls end on FLY_ERROR_NO_DEVICE) and the launches on the stand-in driver.
./build/test/fly_cpu_tests "[add_rmsnorm]" > "$OUT/cpu.log" 2>&1; echo "cpu [add_rmsnorm] rc=$?"; tail -2 "$OUT/cpu.log"
FLYKERNELS_LIBCUDA=/nonexistent/libcuda.so.1 ./build/test/fly_cpu_tests "[status]" > "$OUT/status.log" 2>&1
echo "cpu [status] (no driver) rc=$?"; tail -2 "$OUT/status.log"
FLYKERNELS_LIBCUDA="$root/build/test/libfly_fake_cuda.so" ./build/test/fly_fake_driver_tests "[add_rmsnorm]" \
  > "$OUT/fake.log" 2>&1; echo "fake driver [add_rmsnorm] rc=$?"; tail -2 "$OUT/fake.log"
./build/test/fly_gpu_tests "[add_rmsnorm]" > "$OUT/gpu.log" 2>&1; echo "gpu [add_rmsnorm] rc=$?"; tail -2 "$OUT/gpu.log"
# The sanitizers over the FP64-reference cases and NaN propagation (the many-rows case is the same
# code at a size that takes minutes under memcheck).
small="add_rms_norm forward and backward against FP64,add_rms_norm propagates NaN and infinities as the unfused ops do"
compute-sanitizer --tool memcheck --error-exitcode 9 ./build/test/fly_gpu_tests "$small" > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -1 "$OUT/memcheck.log"
compute-sanitizer --tool racecheck --error-exitcode 9 ./build/test/fly_gpu_tests "$small" > "$OUT/racecheck.log" 2>&1
echo "racecheck rc=$?"; tail -1 "$OUT/racecheck.log"
(cd /tmp && python3 -m pytest -q -rs -p no:cacheprovider "$root/python/tests/test_gpu_patch.py" \
  "$root/python/tests/test_cpu_add_rmsnorm.py" "$root/python/tests/test_cpu_patch.py") > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$OUT/pytest.log"
(cd /tmp && python3 "$root/bench/add_rmsnorm_torch.py" --json "$OUT/add_rmsnorm_torch.json") 2>&1 | tee "$OUT/bench.log"
