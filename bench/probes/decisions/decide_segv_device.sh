#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Where the per-call decision segfaults on a GPU (docs/pytorch.md "Decisions", known issue): builds
# the library and the package with debug info, then runs ext.decide() and an eager F.rms_norm
# under a SIGSEGV handler that prints the native backtrace, and maps the frames of the extension
# and libflykernels to functions and lines (addr2line). From the repository root on the GPU
# machine; logs in $OUT. BLOBS=<dir of kernels.flyar and tuning.sqlite> skips the nvcc build.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; root=$(pwd)
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
bash tools/device_run.sh build ${BLOBS:+-DFLY_PREBUILT_BLOBS=$BLOBS} > "$OUT/cfg.log" 2>&1 || { tail -20 "$OUT/cfg.log"; exit 1; }
cmake --build build --target flykernels -j"$(nproc)" > "$OUT/build.log" 2>&1 || { grep -A5 error "$OUT/build.log" | head -30; exit 1; }
gcc -shared -fPIC -O1 -o "$OUT/libsegv.so" bench/probes/decisions/segv_backtrace.c
sed -i 's/extra_compile_args=\["-O2", "-g0"\]/extra_compile_args=["-O2", "-g"]/' python/setup.py  # debug info
FLYKERNELS_PREBUILT_DIR="$root/build" MAX_JOBS="$(nproc)" python3 -m pip install -q --no-build-isolation --no-deps \
  --break-system-packages "$root/python" > "$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; exit 1; }
git checkout -- python/setup.py 2>/dev/null
cat > "$OUT/probe.py" <<'PY'
import sys
import torch, flykernels
import torch.nn.functional as F
x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
if sys.argv[1] == "decide":
    print(flykernels._loader.ext.decide("rms_norm", "bf16", "w", 256, 64), flush=True)
else:
    print(F.rms_norm(x, (256,), w, 1e-6).float().sum().item(), flush=True)
PY
pkg=$(cd /tmp && python3 -c "import flykernels, os; print(os.path.dirname(flykernels.__file__))")
for step in decide rms_norm; do
  (cd /tmp && LD_PRELOAD="$OUT/libsegv.so" timeout 60 python3 "$OUT/probe.py" $step) > "$OUT/bt_$step.log" 2>&1
  echo "== $step: rc=$?"
  grep -oE "(_C[^ (]*\.so|libflykernels[^ (]*)\(\+0x[0-9a-f]+\)" "$OUT/bt_$step.log" | while read -r fr; do
    lib=$(basename "${fr%%(*}"); off=$(echo "$fr" | grep -oE "0x[0-9a-f]+")
    echo "  $lib $off: $(addr2line -f -C -i -e "$pkg/$lib" "$off" | paste -sd' ' | cut -c1-240)"
  done
  grep -A30 "\*\*\* signal" "$OUT/bt_$step.log" | grep -vE "_C[^ (]*\.so|libflykernels" | head -12
done
