#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The PyTorch package on the GPU machine, in one call (through the device tool):
#   tools/device_python.sh [steps...]     steps: build tune check tests gtests e2e (default: build tests)
# build: the library (default variant set), the GPU test binary and the package installed from the
# library; gtests: the library's GPU tests of GTEST_TAGS (default "[attention_large]"); tune: python -m
# flykernels tune over suites + model shapes, its dump merged into python/flykernels/
# decisions_sm_90a.sql (this card's rows replaced, the other card's kept) and copied to $OUT;
# check: tune --check (the rows' choice against stock); tests: pytest python/tests (CPU + GPU);
# e2e: bench/e2e.py --quick. Logs and results land in $OUT. Env: TUNE_ARGS, E2E_ARGS, PYTEST_ARGS.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
steps=${*:-build tests}
root=$(pwd)
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }
for step in $steps; do
  case $step in
    build)
      stamp "build"
      tools/device_run.sh build > "$OUT/configure.log" 2>&1  # incremental on a warm machine
      cmake --build build --target flykernels fly_gpu_tests -j16 > "$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -40; exit 1; }
      FLYKERNELS_PREBUILT_DIR="$root/build" MAX_JOBS=16 python3 -m pip install -q --no-build-isolation --no-deps \
        --break-system-packages "$root/python" > "$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
      (cd /tmp && python3 -m flykernels) | tee "$OUT/status.txt"
      ;;
    tune)
      stamp "tune"
      (cd /tmp && python3 -m flykernels tune --suite "$root/suites" --db "$OUT/tuned.sqlite" \
        --dump "$root/python/flykernels/decisions_sm_90a.sql" --merge ${TUNE_ARGS:-}) > "$OUT/tune.log" 2> "$OUT/tune.err"
      rc=$?; tail -5 "$OUT/tune.err" | tr '\r' '\n' | tail -3; grep -E "decision rows|dump" "$OUT/tune.log"
      cp "$root/python/flykernels/decisions_sm_90a.sql" "$OUT/"
      [ $rc = 0 ] || exit 1
      # the installed package reads the shipped file from site-packages: refresh it
      cp "$root/python/flykernels/decisions_sm_90a.sql" "$(python3 -c 'import flykernels,os;print(os.path.dirname(flykernels.__file__))' 2>/dev/null)/" 2>/dev/null
      ;;
    check)
      stamp "check"
      (cd /tmp && python3 -m flykernels tune --check --suite "$root/suites" ${TUNE_ARGS:-}) > "$OUT/check.log" 2> "$OUT/check.err"
      tail -14 "$OUT/check.log"
      ;;
    tests)
      stamp "tests"
      (cd /tmp && python3 -m pytest -q -rs -p no:cacheprovider -x ${PYTEST_ARGS:-} "$root/python/tests") > "$OUT/pytest.log" 2>&1
      tail -15 "$OUT/pytest.log"
      ;;
    gtests)
      stamp "gtests ${GTEST_TAGS:-[attention_large]}"
      timeout ${GTEST_TIMEOUT:-300} ./build/test/fly_gpu_tests "${GTEST_TAGS:-[attention_large]}" > "$OUT/gtests.log" 2>&1
      echo "rc=$?"; grep -E "All tests passed|test cases:|assertions:|FAILED" "$OUT/gtests.log" | head -12
      ;;
    e2e)
      stamp "e2e"
      python3 bench/e2e.py --quick --json "$OUT/e2e.json" --png "$OUT/e2e.png" ${E2E_ARGS:-} > "$OUT/e2e.log" 2>&1
      tail -40 "$OUT/e2e.log"
      ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
stamp "done"
