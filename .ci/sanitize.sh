#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Host code under sanitizers (docs/robustness.md): the CPU tests, the stand-in driver tests (one
# device and two) and a bounded pass of the seeded C ABI fuzz driver under AddressSanitizer +
# UndefinedBehaviorSanitizer with every error fatal; the two-device, multi-thread tests under
# ThreadSanitizer; libFuzzer too when clang++ is installed. No kernel is recompiled: the
# sanitized build embeds the blobs of the finished default build (FLY_PREBUILT_BLOBS).
#   bash .ci/sanitize.sh [finished build dir, default: build]
# FLY_FUZZ_SEED picks the seed (default: today's date, printed, so a failure reproduces);
# FLY_FUZZ_SECONDS bounds each fuzz pass (default 25).
set -euo pipefail
cd "$(dirname "$0")/.."
blobs=$(cd "${1:-build}" && pwd)
for f in kernels.flyar tuning.sqlite; do
  [ -f "$blobs/$f" ] || { echo "sanitize.sh: $blobs/$f missing (build the default configuration first)" >&2; exit 1; }
done
seed=${FLY_FUZZ_SEED:-$(date -u +%Y%m%d)}
secs=${FLY_FUZZ_SECONDS:-25}
jobs=$(nproc)
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=0:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
start=$(date +%s)

# An unknown build type adds no flags of its own: exactly the ones below.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Sanitize -DFLY_PREBUILT_BLOBS="$blobs" -DFLY_BUILD_TOOLS=OFF \
  -DCMAKE_C_FLAGS="-O0 -g1 $san" -DCMAKE_CXX_FLAGS="-O0 -g1 $san" \
  -DCMAKE_EXE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san" >/dev/null
cmake --build build-asan -j"$jobs" --target fly_cpu_tests fly_fake_driver_tests fly_multi_device_tests fly_fuzz_driver \
  fly_driver_probe
fake=$PWD/build-asan/test/libfly_fake_cuda.so
echo "sanitize.sh: CPU tests (ASan + UBSan, fatal)"
./build-asan/test/fly_cpu_tests
echo "sanitize.sh: stand-in driver tests"
FLYKERNELS_LIBCUDA=$fake ./build-asan/test/fly_fake_driver_tests
FLYKERNELS_LIBCUDA=$fake ./build-asan/test/fly_multi_device_tests
echo "sanitize.sh: fuzz driver, seed $seed, ${secs}s without a driver and ${secs}s on the stand-in one"
FLYKERNELS_LIBCUDA=/nonexistent/libcuda.so.1 ./build-asan/test/fly_fuzz_driver --seed "$seed" --iterations 100000000 --seconds "$secs"
FLYKERNELS_LIBCUDA=$fake ./build-asan/test/fly_fuzz_driver --seed "$((seed + 1))" --iterations 100000000 --seconds "$secs"

echo "sanitize.sh: two devices, threads on both (ThreadSanitizer)"
tsan="-fsanitize=thread"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Sanitize -DFLY_PREBUILT_BLOBS="$blobs" -DFLY_BUILD_TOOLS=OFF \
  -DCMAKE_C_FLAGS="-O1 -g1 $tsan" -DCMAKE_CXX_FLAGS="-O1 -g1 $tsan" \
  -DCMAKE_EXE_LINKER_FLAGS="$tsan" -DCMAKE_SHARED_LINKER_FLAGS="$tsan" >/dev/null
cmake --build build-tsan -j"$jobs" --target fly_multi_device_tests
TSAN_OPTIONS=halt_on_error=1 FLYKERNELS_LIBCUDA=$PWD/build-tsan/test/libfly_fake_cuda.so \
  ./build-tsan/test/fly_multi_device_tests

if command -v clang++ >/dev/null 2>&1 && command -v clang >/dev/null 2>&1; then
  echo "sanitize.sh: libFuzzer (clang), ${secs}s on the stand-in driver"
  cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Sanitize -DFLY_PREBUILT_BLOBS="$blobs" -DFLY_BUILD_TOOLS=OFF \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_ASM_COMPILER=clang \
    -DCMAKE_C_FLAGS="-O1 -g $san -fsanitize=fuzzer-no-link" -DCMAKE_CXX_FLAGS="-O1 -g $san -fsanitize=fuzzer-no-link" \
    -DCMAKE_EXE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san" >/dev/null
  cmake --build build-fuzz -j"$jobs" --target fly_fuzz_abi fly_fake_cuda
  FLYKERNELS_LIBCUDA=$PWD/build-fuzz/test/libfly_fake_cuda.so \
    ./build-fuzz/test/fly_fuzz_abi -seed="$seed" -max_total_time="$secs" -max_len=2048 -print_final_stats=1
else
  echo "sanitize.sh: no clang++ here: libFuzzer pass skipped (the seeded driver above ran)"
fi
echo "sanitize.sh: clean in $(( $(date +%s) - start ))s"
