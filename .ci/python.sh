#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CI, Python side (after .ci/run built build/): torch pinned to the GPU machine's version (PyPI) in
# a venv, the flykernels package built against it reusing build/'s libflykernels, then the CPU-side
# tests (the GPU tests skip visibly: no device here). Needs python3-venv and python3-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${FLY_CI_VENV:-/tmp/flykernels-ci-venv}
torch_version=2.11.0  # the GPU machine runs 2.11.0+cu130; PyPI's Linux wheel is that cu130 build
t0=$SECONDS
python3 -m venv "$venv"
"$venv/bin/pip" install -q --no-cache-dir "torch==$torch_version" "setuptools>=77,<82" wheel pytest numpy
echo "python.sh: torch $torch_version installed in $((SECONDS - t0)) s"
t1=$SECONDS
FLYKERNELS_PREBUILT_DIR="$root/build" MAX_JOBS="$(nproc)" \
  "$venv/bin/pip" install -q --no-cache-dir --no-build-isolation --no-deps "$root/python"
echo "python.sh: flykernels extension built and installed in $((SECONDS - t1)) s"
t2=$SECONDS
cd /tmp  # import the installed package, not the source folder
"$venv/bin/python" -m flykernels
"$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/python/tests" "$root/test/upstream/test_compare.py"
echo "python.sh: tests in $((SECONDS - t2)) s; total $((SECONDS - t0)) s"
