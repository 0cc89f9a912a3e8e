#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Python package's GPU crash (docs/pytorch.md "Decisions", known issue) under AddressSanitizer:
# libflykernels and the extension built with ASan + UBSan (host code only: the kernels come from
# BLOBS, a finished build's kernels.flyar and tuning.sqlite), installed into a folder of its own,
# then ext.decide(), an eager F.rms_norm, test_cpu_parity.py (the MX scaled_mm Meta kernel under
# FakeTensor) and test_gpu_decisions.py run with the ASan runtime preloaded into python3. From the
# repository root on the GPU machine; logs in $OUT.
#   BLOBS=<dir> bash bench/probes/decisions/decide_asan_device.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; root=$(pwd)
: "${BLOBS:?BLOBS=<dir of kernels.flyar and tuning.sqlite>}"
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
san="-fsanitize=address,undefined -fno-sanitize=vptr -fno-omit-frame-pointer"
bash tools/device_run.sh build-asan -DCMAKE_BUILD_TYPE=Sanitize -DFLY_PREBUILT_BLOBS="$BLOBS" -DFLY_BUILD_TOOLS=OFF \
  -DFLY_BUILD_TESTS=OFF -DCMAKE_C_FLAGS="-O1 -g $san" -DCMAKE_CXX_FLAGS="-O1 -g $san" \
  -DCMAKE_SHARED_LINKER_FLAGS="$san" > "$OUT/asan_cfg.log" 2>&1 || { tail -20 "$OUT/asan_cfg.log"; exit 1; }
cmake --build build-asan --target flykernels -j"$(nproc)" > "$OUT/asan_build.log" 2>&1 ||
  { grep -A5 error "$OUT/asan_build.log" | head -30; exit 1; }
# The package from a copy of python/ whose extension carries the sanitizers too.
tree=/tmp/asan-tree; rm -rf "$tree"; mkdir -p "$tree"; cp -r include python CMakeLists.txt "$tree"/  # setup.py reads the version there
sed -i "s/extra_compile_args=\[[^]]*\]/extra_compile_args=[\"-O1\", \"-g\", $(printf '"%s", ' $san)]/; \
s/extra_link_args=\[/extra_link_args=[$(printf '"%s", ' $san)/" "$tree/python/setup.py"
grep -n "extra_" "$tree/python/setup.py" > "$OUT/asan_setup_args.txt"
site=/tmp/asan-site; rm -rf "$site"
FLYKERNELS_PREBUILT_DIR="$root/build-asan" MAX_JOBS="$(nproc)" python3 -m pip install -q --no-build-isolation --no-deps \
  --break-system-packages --target "$site" "$tree/python" > "$OUT/asan_pip.log" 2>&1 || { tail -20 "$OUT/asan_pip.log"; exit 1; }
cat > "$OUT/asan_probe.py" <<'PY'
import sys
import torch
import flykernels
import torch.nn.functional as F
print("flykernels", flykernels.__file__, "available", flykernels.available, flykernels.reason, flush=True)
ext = flykernels._loader.ext
step = sys.argv[1]
if step == "import":
    pass
elif step == "decide":
    print(ext.decide("rms_norm", "bf16", "w", 256, 64), flush=True)
elif step == "rms_norm":
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    print(F.rms_norm(x, (256,), w, 1e-6).float().sum().item(), flush=True)
print("done", step, flush=True)
PY
asan=$(gcc -print-file-name=libasan.so)
export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0:alloc_dealloc_mismatch=0:detect_odr_violation=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1
tests="$root/python/tests"
for step in import decide rms_norm parity gpu_decisions; do
  case $step in
    parity) cmd=(python3 -m pytest -q -x -p no:cacheprovider "$tests/test_cpu_parity.py") ;;
    gpu_decisions) cmd=(python3 -m pytest -q -x -p no:cacheprovider "$tests/test_gpu_decisions.py") ;;
    *) cmd=(python3 "$OUT/asan_probe.py" "$step") ;;
  esac
  (cd /tmp && PYTHONPATH="$site" LD_PRELOAD="$asan" timeout 300 "${cmd[@]}") > "$OUT/asan_$step.log" 2>&1
  echo "== asan $step: rc=$?"
  grep -E "^done|passed|failed|ERROR: AddressSanitizer|runtime error|SUMMARY" "$OUT/asan_$step.log" | head -5
  grep -E "^    #[0-9]+ " "$OUT/asan_$step.log" | grep -E "flykernels|_C\.|csrc|src/" | head -12
done
