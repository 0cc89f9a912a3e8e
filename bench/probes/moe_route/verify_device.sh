#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The moe_route family's GPU checks in one run on a Hopper machine (repository root):
#   bash bench/probes/moe_route/verify_device.sh [OUT]
# builds the library, fly_gpu_tests and the PyTorch package, then: the [moe_route] GPU tests,
# compute-sanitizer memcheck and racecheck over them (the small cases), the patched-model and
# MoE-op GPU tests (and the CPU patch tests), and bench/moe_route_torch.py (the fused routing glue
# against Hugging Face's composition on Qwen3-MoE, OLMoE and Mixtral shapes, forward and backward).
# Logs and the benchmark's JSON land in OUT (default /tmp/moe-route-verify).
set -uo pipefail
root=$(pwd); OUT=${1:-/tmp/moe-route-verify}; mkdir -p "$OUT"
tools/device_run.sh build > "$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build --target flykernels fly_gpu_tests -j"$(nproc)" > "$OUT/build.log" 2>&1 || { grep -A5 error "$OUT/build.log" | head -30; exit 1; }
FLYKERNELS_PREBUILT_DIR="$root/build" python3 -m pip install -q --no-build-isolation --no-deps --break-system-packages \
  "$root/python" > "$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
./build/test/fly_gpu_tests "[moe_route]" > "$OUT/moe_route.log" 2>&1; echo "[moe_route] rc=$?"; tail -2 "$OUT/moe_route.log"
small="moe router forward and backward against FP64,moe router: a NaN logit poisons its row like torch's softmax and no other row,moe permute and unpermute and their backward against the host,moe permute: no tokens zeroes the offsets"
compute-sanitizer --tool memcheck ./build/test/fly_gpu_tests "$small" > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -1 "$OUT/memcheck.log"
compute-sanitizer --tool racecheck ./build/test/fly_gpu_tests "$small" > "$OUT/racecheck.log" 2>&1; echo "racecheck rc=$?"; tail -1 "$OUT/racecheck.log"
compute-sanitizer --tool synccheck ./build/test/fly_gpu_tests "$small" > "$OUT/synccheck.log" 2>&1; echo "synccheck rc=$?"; tail -1 "$OUT/synccheck.log"
(cd /tmp && python3 -m pytest -q -rs -s -p no:cacheprovider "$root/python/tests/test_gpu_patch.py" "$root/python/tests/test_cpu_patch.py") \
  > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?"; grep -m1 "torch.topk on CUDA" "$OUT/pytest.log"; tail -3 "$OUT/pytest.log"
(cd /tmp && python3 "$root/bench/moe_route_torch.py" --json "$OUT/moe_route_torch.json") > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; tail -8 "$OUT/bench.log"
