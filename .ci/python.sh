#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CI, Python side (after .ci/run built build/): torch pinned to the GPU machine's version (PyPI) in
# a build venv; the flykernels wheel built against it from build/'s libflykernels; the wheel
# installed into a fresh venv and the CPU-side tests run from that install (the GPU tests skip
# visibly: no device here). Needs python3-venv and python3-dev.
#
# torch and its nvidia-* dependencies (several GB) are downloaded and unpacked once: the fresh
# venv sees the build venv's site-packages (torch, pip, pytest) through a .pth file, after its
# own; they hold no flykernels, so what it tests of flykernels comes from the wheel alone, and pip
# checks the wheel's torch requirement against that torch.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${FLY_CI_VENV:-/tmp/flykernels-ci-venv}                  # torch, build tools, pytest
wheel_venv=${FLY_CI_WHEEL_VENV:-/tmp/flykernels-ci-wheel-venv}  # the wheel alone
dist=${FLY_CI_DIST:-/tmp/flykernels-ci-dist}
torch_version=2.11.0  # the GPU machine runs 2.11.0+cu130; PyPI's Linux wheel is that cu130 build
t0=$SECONDS
# --prepare: only the build venv (torch from PyPI: network-bound, so .ci/run starts it beside the
# nvcc build); a later plain run finds it ready (the marker) and goes on from the wheel.
prepared="$venv/.flykernels-ci-prepared-$torch_version"
if [ "${1:-}" != "--prepare" ] && [ -f "$prepared" ]; then
  echo "python.sh: torch $torch_version prepared in the background while the library built"
else
python3 -m venv "$venv"
# ninja: the extension's C++ files compile in parallel (MAX_JOBS); without it one after the other.
# --no-compile: no .pyc for torch's thousands of files now; those imported are compiled on first use
"$venv/bin/pip" install -q --no-cache-dir --no-compile "torch==$torch_version" "setuptools>=77,<82" wheel ninja \
  pytest numpy
if "$venv/bin/pip" show -q flykernels 2>/dev/null; then "$venv/bin/pip" uninstall -q -y flykernels; fi  # an older run's
echo "python.sh: torch $torch_version installed in $((SECONDS - t0)) s"
touch "$prepared"
fi
[ "${1:-}" = "--prepare" ] && exit 0

t1=$SECONDS
rm -rf "$dist"
PATH="$venv/bin:$PATH" FLYKERNELS_PREBUILT_DIR="$root/build" MAX_JOBS="$(nproc)" \
  "$venv/bin/python" -m pip wheel -q --no-cache-dir --no-build-isolation --no-deps "$root/python" -w "$dist"
wheel=$(echo "$dist"/flykernels-*.whl)
[ -f "$wheel" ] || { echo "python.sh: no wheel in $dist" >&2; exit 1; }
echo "python.sh: wheel $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB) built in $((SECONDS - t1)) s"

t2=$SECONDS
python3 -m venv --clear --without-pip "$wheel_venv"  # pip too comes from the build venv
purelib() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
purelib "$venv" > "$(purelib "$wheel_venv")/flykernels-ci-build-venv.pth"
"$wheel_venv/bin/python" -m pip install -q --no-index "$wheel"  # into the fresh venv; torch>=2.11,<2.12 checked
echo "python.sh: wheel installed in a fresh venv in $((SECONDS - t2)) s"

t3=$SECONDS
cd /tmp  # import the installed package, not the source folder
"$wheel_venv/bin/python" - "$wheel_venv" <<'EOF'
import os, sys
import flykernels
pkg = os.path.dirname(flykernels.__file__)
assert pkg.startswith(os.path.realpath(sys.argv[1])) or pkg.startswith(sys.argv[1]), pkg
assert os.path.exists(os.path.join(pkg, "libflykernels.so.0")) and os.path.exists(os.path.join(pkg, "py.typed"))
print(f"python.sh: flykernels {flykernels.__version__} imported from {pkg}")
EOF
"$wheel_venv/bin/python" -m flykernels
# bench/test_bench_cpu.py: the benchmark scripts' own logic (MoE suite runner, gemm_random's stride classes)
# with CPU stand-ins for the device; it needs torch, not the package.
"$wheel_venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/python/tests" "$root/test/upstream/test_compare.py" \
  "$root/bench/test_bench_cpu.py"
echo "python.sh: tests in $((SECONDS - t3)) s; total $((SECONDS - t0)) s"
