#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The PyTorch package and a family's GPU checks on the GPU machine, in one call (through the device
# tool), from the repository root:
#   tools/device_python.sh [steps...]   steps: build cpu gtests sanitize tune check tests bench e2e
#                                       (default: build tests; with FAMILY, that family's checks)
#   FAMILY=<family> tools/device_python.sh [steps...]
# build: configure (tools/device_run.sh BUILD_DIR CMAKE_ARGS), build BUILD_TARGETS (default the
# library and the GPU test binary) and pip-install the package from that library;
# cpu: the CPU tests of CPU_TAGS (default GTEST_TAGS), the status mapping with no driver (as CI runs
# it) and the stand-in driver tests of CPU_TAGS (needs fly_cpu_tests and fly_fake_driver_tests built);
# gtests: the library's GPU tests of GTEST_TAGS (default "[attention_large]");
# sanitize: compute-sanitizer's SAN_TOOLS (default "memcheck racecheck") over the GPU tests of
# SAN_FILTER (default GTEST_TAGS; SAN_FILTER_<tool>, e.g. SAN_FILTER_racecheck, for one tool);
# tune: python -m flykernels tune over suites + model shapes, its dump merged into python/flykernels/
# decisions_sm_90a.sql (this card's rows replaced, the other card's kept) and copied to $OUT;
# check: tune --check (the rows' choice against stock); tests: pytest of PYTEST_FILES (default
# python/tests: CPU + GPU) with PYTEST_ARGS, lines matching PYTEST_GREP quoted;
# bench: each entry of BENCH: `name` runs bench/<name>_torch.py --json $OUT/<name>_torch.json;
# `path/x.cpp[:a,b]` builds a standalone probe against the library and runs it once per argument;
# e2e: bench/e2e.py --quick.
# FAMILY presets (the variables above, each unless already set, and the steps): glu (glu and rope),
# add_rmsnorm, moe_route, cross_entropy (a build of that family alone in build-ce); see
# bench/probes/README.md. Logs and results land in $OUT. Env also: TUNE_ARGS, E2E_ARGS,
# GTEST_TIMEOUT, SAN_TIMEOUT (seconds per tool, default 600). CMAKE_ARGS is split on spaces.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
fam_steps="build tests"
def() { [ -n "${!1:-}" ] || printf -v "$1" '%s' "$2"; }  # def VAR value: VAR unless already set
case ${FAMILY:-} in
  "") ;;
  glu)  # glu and rope: the fused transformer-block ops Hugging Face models compose
    def GTEST_TAGS "[glu],[rope]"
    def SAN_FILTER "glu forward and backward against FP64,glu propagates NaN and infinities as the unfused ops do,[rope]"
    def PYTEST_FILES "python/tests/test_gpu_patch.py python/tests/test_cpu_patch.py"
    def BENCH "glu rope"
    fam_steps="build gtests sanitize tests bench" ;;
  add_rmsnorm)
    def BUILD_TARGETS "flykernels fly_gpu_tests fly_cpu_tests fly_fake_driver_tests"
    def GTEST_TAGS "[add_rmsnorm]"
    def SAN_FILTER "add_rms_norm forward and backward against FP64,add_rms_norm propagates NaN and infinities as the unfused ops do"
    def PYTEST_FILES "python/tests/test_gpu_patch.py python/tests/test_cpu_add_rmsnorm.py python/tests/test_cpu_patch.py"
    def BENCH "add_rmsnorm"
    fam_steps="build cpu gtests sanitize tests bench" ;;
  moe_route)
    def GTEST_TAGS "[moe_route]"
    def SAN_TOOLS "memcheck racecheck synccheck"
    def SAN_FILTER "moe router forward and backward against FP64,moe router: a NaN logit poisons its row like torch's softmax and no other row,moe permute and unpermute and their backward against the host,moe permute: no tokens zeroes the offsets"
    def PYTEST_FILES "python/tests/test_gpu_patch.py python/tests/test_cpu_patch.py"
    def PYTEST_ARGS "-s"
    def PYTEST_GREP "torch.topk on CUDA"
    def BENCH "moe_route"
    fam_steps="build gtests sanitize tests bench" ;;
  cross_entropy)  # this family alone (3 default cubins, no tools): about 5 minutes on an H100
    def BUILD_DIR "build-ce"
    def CMAKE_ARGS "-DFLY_FAMILIES=cross_entropy -DFLY_BUILD_TOOLS=OFF"
    def BUILD_TARGETS "flykernels fly_gpu_tests fly_cpu_tests fly_fake_driver_tests"
    def GTEST_TAGS "[cross_entropy]"
    def SAN_FILTER "cross_entropy against FP64 - dtypes tails strides in place loss only,cross_entropy - ignored rows all ignored and labels outside the vocabulary,cross_entropy propagates NaN and infinities as torch,cross_entropy - M = 0 is a no-op"
    # racecheck also over the real vocabularies: the shared-memory stash
    def SAN_FILTER_racecheck "$SAN_FILTER,cross_entropy - vocabularies of real models in registers shared memory and reread"
    def PYTEST_FILES "python/tests/test_gpu_cross_entropy.py python/tests/test_cpu_cross_entropy.py"
    def PYTEST_ARGS "-s"
    def PYTEST_GREP "peak"
    def BENCH "probes/cross_entropy/ce_bandwidth.cpp:bf16,fp32 cross_entropy"
    fam_steps="build cpu gtests sanitize bench tests" ;;
  *) echo "unknown FAMILY $FAMILY (glu, add_rmsnorm, moe_route, cross_entropy)"; exit 2 ;;
esac
steps=${*:-$fam_steps}
B=${BUILD_DIR:-build}
GTEST_TAGS=${GTEST_TAGS:-[attention_large]}
root=$(pwd)
case $B in /*) Babs=$B ;; *) Babs=$root/$B ;; esac
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }
for step in $steps; do
  case $step in
    build)
      stamp "build $B ${CMAKE_ARGS:-}"
      # shellcheck disable=SC2086  # CMAKE_ARGS: one argument per word
      tools/device_run.sh "$B" ${CMAKE_ARGS:-} > "$OUT/configure.log" 2>&1  # incremental on a warm machine
      # shellcheck disable=SC2086
      cmake --build "$B" --target ${BUILD_TARGETS:-flykernels fly_gpu_tests} -j16 > "$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -40; exit 1; }
      FLYKERNELS_PREBUILT_DIR="$Babs" MAX_JOBS=16 python3 -m pip install -q --no-build-isolation --no-deps \
        --break-system-packages "$root/python" > "$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
      (cd /tmp && python3 -m flykernels) | tee "$OUT/status.txt"
      ;;
    cpu)
      tags=${CPU_TAGS:-$GTEST_TAGS}
      stamp "cpu $tags"
      "$B/test/fly_cpu_tests" "$tags" > "$OUT/cpu.log" 2>&1; echo "cpu $tags rc=$?"; tail -2 "$OUT/cpu.log"
      FLYKERNELS_LIBCUDA=/nonexistent/libcuda.so.1 "$B/test/fly_cpu_tests" "[status]" > "$OUT/status.log" 2>&1
      echo "cpu [status] (no driver) rc=$?"; tail -2 "$OUT/status.log"
      FLYKERNELS_LIBCUDA="$Babs/test/libfly_fake_cuda.so" "$B/test/fly_fake_driver_tests" "$tags" > "$OUT/fake.log" 2>&1
      echo "fake driver $tags rc=$?"; tail -2 "$OUT/fake.log"
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
      stamp "tests ${PYTEST_FILES:-python/tests}"
      files=(); for f in ${PYTEST_FILES:-python/tests}; do files+=("$root/$f"); done
      (cd /tmp && python3 -m pytest -q -rs -p no:cacheprovider -x ${PYTEST_ARGS:-} "${files[@]}") > "$OUT/pytest.log" 2>&1
      echo "pytest rc=$?"
      [ -n "${PYTEST_GREP:-}" ] && grep -E "$PYTEST_GREP" "$OUT/pytest.log" | head -5
      tail -15 "$OUT/pytest.log"
      ;;
    gtests)
      stamp "gtests $GTEST_TAGS"
      timeout ${GTEST_TIMEOUT:-300} "$B/test/fly_gpu_tests" "$GTEST_TAGS" > "$OUT/gtests.log" 2>&1
      echo "rc=$?"; grep -E "All tests passed|test cases:|assertions:|FAILED" "$OUT/gtests.log" | head -12
      ;;
    sanitize)
      for tool in ${SAN_TOOLS:-memcheck racecheck}; do
        var=SAN_FILTER_$tool; filter=${!var:-${SAN_FILTER:-$GTEST_TAGS}}
        stamp "sanitize $tool"
        timeout ${SAN_TIMEOUT:-600} compute-sanitizer --tool "$tool" --error-exitcode 9 "$B/test/fly_gpu_tests" "$filter" \
          > "$OUT/$tool.log" 2>&1
        echo "$tool rc=$?"; tail -1 "$OUT/$tool.log"
      done
      ;;
    bench)
      for b in ${BENCH:-}; do
        stamp "bench $b"
        case $b in
          *.cpp|*.cpp:*)  # a standalone probe against the library: path under bench/, arguments after ':'
            src=${b%%:*}; args=${b#"$src"}; args=${args#:}; exe="$B/$(basename "${src%.cpp}")"
            g++ -O2 -std=c++17 "bench/$src" -Iinclude -I/usr/local/cuda/include -L"$B" -lflykernels \
              -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,"$Babs" -o "$exe" >> "$OUT/build.log" 2>&1 \
              || { echo "$src: build failed ($OUT/build.log)"; continue; }
            IFS=, read -r -a argv <<< "$args"; [ ${#argv[@]} = 0 ] && argv=("")
            for a in "${argv[@]}"; do "$exe" $a; done 2>&1 | tee -a "$OUT/bench.log"
            ;;
          *)
            (cd /tmp && python3 "$root/bench/${b}_torch.py" --json "$OUT/${b}_torch.json") 2>&1 | tee -a "$OUT/bench.log"
            ;;
        esac
      done
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
