#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The one device helper: the PyTorch package and a family's GPU checks and probes on the GPU
# machine, in one call (through the device tool), from the repository root:
#   tools/device_python.sh [steps...]   steps: build cpu gtests sanitize sanitize_all ctest tune check
#                                       tests bench flybench flytune ncu ptxas ab e2e
#                                       (default: build tests; with FAMILY, that family's checks)
#   FAMILY=<family> tools/device_python.sh [steps...]
# build: apply PATCH (a patch file, -p1, skipped when already applied: an experiment on the
# device's copy of the tree), configure (tools/device_run.sh BUILD_DIR CMAKE_ARGS; MATCH=REGEX adds
# -DFLY_ALL_VARIANTS=ON -DFLY_VARIANT_MATCH=REGEX), build BUILD_TARGETS (default the library and
# the GPU test binary, plus what the later steps run: flybench / flytune, fly_gpu_subset, everything
# for ctest) and, unless PIP=0, pip-install the package from that library;
# cpu: the CPU tests of CPU_TAGS (default GTEST_TAGS), the status mapping with no driver (as CI runs
# it) and the stand-in driver tests of CPU_TAGS (needs fly_cpu_tests and fly_fake_driver_tests built);
# gtests: the library's GPU tests of GTEST_TAGS (default "[attention_large]"), GTEST_REPEAT times
# (default 1; a failing run's log is kept as gtests-fail-N.log); the tests' own variables
# (FLY_TEST_VARIANTS, FLY_TEST_GEMM_ONLY, FLY_TEST_GROUPED_ONLY) pass through the environment;
# sanitize: compute-sanitizer's SAN_TOOLS (default "memcheck racecheck") over the GPU tests of
# SAN_FILTER (default GTEST_TAGS; SAN_FILTER_<tool>, e.g. SAN_FILTER_racecheck, for one tool), or,
# with SAN_SUBSET (e.g. "--only VARIANT --only VARIANT"), over fly_gpu_subset SAN_SUBSET;
# sanitize_all: test/sanitize/device_sanitize.sh, the four tools over every family (SAN_FAMILIES a
# subset, SAN_BUDGET_S its seconds, default 540); ctest: the build's ctest;
# tune: python -m flykernels tune over suites + model shapes, its dump merged into python/flykernels/
# decisions_sm_90a.sql (this card's rows replaced, the other card's kept) and copied to $OUT; with
# TUNE_OPS, one process per op instead, each dumping $OUT/rows_<op>.sql (merge them with
# bench/probes/decisions/merge_rows.py); check: tune --check (the rows' choice against stock);
# tests: pytest of PYTEST_FILES (default python/tests: CPU + GPU) with PYTEST_ARGS, lines matching
# PYTEST_GREP quoted;
# bench: each entry of BENCH: `name` runs bench/<name>_torch.py --json $OUT/<name>_torch.json
# BENCH_ARGS (from /tmp); `path/x.py` runs bench/path/x.py BENCH_ARGS (from the repository root);
# in BENCH_ARGS, @B is the build folder's absolute path and @R the repository root's;
# `path/x.cpp[:a,b]` builds a standalone probe against the library and runs it once per argument;
# flybench: BUILD_DIR's flybench FLYBENCH_ARGS (e.g. "attention --reps 10"), then once more per
# variant of FLYBENCH_VARIANTS with --variant (output $OUT/flybench.log);
# flytune: BUILD_DIR's flytune FLYTUNE_ARGS (e.g. "attention --quick") into $OUT/tune.sqlite,
# $OUT/sm_90a.sql (the rows, db/ format) and $OUT/tune_times.tsv; later steps of the call use that
# database (FLYKERNELS_TUNING_DB);
# ncu: Nsight Compute NCU_ARGS (e.g. "--clock-control none -k regex:mxfp --section SpeedOfLight")
# over the flybench step's command(s), one $OUT/ncu[-VARIANT].txt each;
# ptxas: ptxas -v (registers, spills, C75xx serialization warnings) of each generated unit of
# BUILD_DIR/gen matching PTXAS_GLOB (default *), into $OUT/ptxas.log;
# ab: an old library beside the new one: AB_REF (a commit; or AB_TARBALL, a .tar.gz of the old
# tree's AB_PATHS, for a checkout without history) replaces AB_PATHS (default kernels) in a copy of
# the tree, built with the same configure arguments (target flykernels) in /tmp/ab_old; then
# bench/probes/gemm/ab_libs.py --a old --b new AB_ARGS (default "--layouts nt,nn,tn,tt --rounds 5");
# e2e: bench/e2e.py --quick.
# FAMILY presets (the variables above, each unless already set, and the steps): glu (glu and rope),
# add_rmsnorm, moe_route, cross_entropy (a build of that family alone in build-ce); see
# bench/probes/README.md, which gives the helper command of every probe. Logs and results land in
# $OUT. Env also: TUNE_ARGS, E2E_ARGS, GTEST_TIMEOUT, SAN_TIMEOUT (seconds per tool, default 600),
# BENCH_TIMEOUT (default 600). CMAKE_ARGS is split on spaces.
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
export PATH=/usr/local/cuda/bin:$PATH
# shellcheck disable=SC2206  # CMAKE_ARGS: one argument per word
cmake_args=(${CMAKE_ARGS:-})
[ -n "${MATCH:-}" ] && cmake_args+=(-DFLY_ALL_VARIANTS=ON "-DFLY_VARIANT_MATCH=$MATCH")
has_step() { [[ " $steps " == *" $1 "* ]]; }
targets=${BUILD_TARGETS:-flykernels fly_gpu_tests}
{ has_step flybench || has_step flytune || has_step ncu; } && targets="$targets flybench flytune"
[ -n "${SAN_SUBSET:-}" ] && targets="$targets fly_gpu_subset"
has_step ctest && targets=all
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }
subst() { local a=${1//@B/$Babs}; echo "${a//@R/$root}"; }  # @B, @R in BENCH_ARGS
fb_runs() {  # the flybench step's commands, one per line: default, then each forced variant
  echo ""; for v in ${FLYBENCH_VARIANTS:-}; do echo "--variant $v"; done
}
for step in $steps; do
  case $step in
    build)
      if [ -n "${PATCH:-}" ]; then  # an experiment applied to the device's copy of the tree
        if patch -p1 -R --dry-run -s < "$PATCH" > /dev/null 2>&1; then echo "patch $PATCH: already applied"
        else patch -p1 < "$PATCH" > "$OUT/patch.log" 2>&1 || { cat "$OUT/patch.log"; exit 1; }; fi
      fi
      stamp "build $B ${cmake_args[*]}"
      tools/device_run.sh "$B" "${cmake_args[@]}" > "$OUT/configure.log" 2>&1  # incremental on a warm machine
      # shellcheck disable=SC2086
      cmake --build "$B" --target $targets -j16 > "$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -40; exit 1; }
      echo "$(ls "$B/cubins" 2>/dev/null | wc -l) cubins"
      [ "${PIP:-1}" = 0 ] && continue
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
      if [ -n "${TUNE_OPS:-}" ]; then  # one process per op: a CUDA error in one keeps the others' rows
        for op in $TUNE_OPS; do
          stamp "tune $op"
          (cd /tmp && python3 -m flykernels tune --ops "$op" --quick --suite "$root/suites" \
            --dump "$OUT/rows_$op.sql" --db "$OUT/tuned_$op.sqlite" ${TUNE_ARGS:-}) > "$OUT/tune_$op.log" 2>&1
          echo "rc=$?"; grep -E "decision rows|stopped" "$OUT/tune_$op.log"
        done
        continue
      fi
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
      n=${GTEST_REPEAT:-1}; pass=0; fail=0
      for i in $(seq 1 "$n"); do
        stamp "gtests $GTEST_TAGS${FLY_TEST_VARIANTS:+ (FLY_TEST_VARIANTS=$FLY_TEST_VARIANTS)} run $i of $n"
        if timeout ${GTEST_TIMEOUT:-300} "$B/test/fly_gpu_tests" "$GTEST_TAGS" > "$OUT/gtests.log" 2>&1; then pass=$((pass + 1))
        else fail=$((fail + 1)); [ "$n" -gt 1 ] && cp "$OUT/gtests.log" "$OUT/gtests-fail-$fail.log"; fi
      done
      echo "gtests: $pass passed, $fail failed"; grep -E "All tests passed|test cases:|assertions:|FAILED" "$OUT/gtests.log" | head -12
      ;;
    sanitize)
      for tool in ${SAN_TOOLS:-memcheck racecheck}; do
        stamp "sanitize $tool"
        if [ -n "${SAN_SUBSET:-}" ]; then
          # shellcheck disable=SC2086  # SAN_SUBSET: fly_gpu_subset's arguments
          timeout ${SAN_TIMEOUT:-600} compute-sanitizer --tool "$tool" --error-exitcode 9 "$B/test/fly_gpu_subset" $SAN_SUBSET \
            > "$OUT/$tool.log" 2>&1
        else
          var=SAN_FILTER_$tool; filter=${!var:-${SAN_FILTER:-$GTEST_TAGS}}
          timeout ${SAN_TIMEOUT:-600} compute-sanitizer --tool "$tool" --error-exitcode 9 "$B/test/fly_gpu_tests" "$filter" \
            > "$OUT/$tool.log" 2>&1
        fi
        echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$tool.log" | head -1; tail -1 "$OUT/$tool.log"
      done
      ;;
    sanitize_all)
      stamp "sanitize_all ${SAN_FAMILIES:-every family}"
      mkdir -p /tmp/san
      # shellcheck disable=SC2086
      BUILD="$B" SAN_SKIP_CTEST=1 SAN_BUDGET_S=${SAN_BUDGET_S:-540} bash test/sanitize/device_sanitize.sh /tmp/san \
        ${SAN_FAMILIES:-} 2>&1 | tee "$OUT/san-summary.txt"
      tar -C /tmp -czf "$OUT/san.tgz" san
      ;;
    ctest)
      stamp "ctest"
      (cd "$B" && timeout ${CTEST_TIMEOUT:-300} ctest --output-on-failure) > "$OUT/ctest.log" 2>&1
      echo "ctest rc=$?"; grep -E "tests passed|tests failed|\*\*\*" "$OUT/ctest.log" | head
      ;;
    bench)
      # shellcheck disable=SC2207
      bargs=($(subst "${BENCH_ARGS:-}"))
      for b in ${BENCH:-}; do
        stamp "bench $b ${bargs[*]}"
        case $b in
          *.cpp|*.cpp:*)  # a standalone probe against the library: path under bench/, arguments after ':'
            src=${b%%:*}; args=${b#"$src"}; args=${args#:}; exe="$B/$(basename "${src%.cpp}")"
            g++ -O2 -std=c++17 "bench/$src" -Iinclude -I/usr/local/cuda/include -L"$B" -lflykernels \
              -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,"$Babs" -o "$exe" >> "$OUT/build.log" 2>&1 \
              || { echo "$src: build failed ($OUT/build.log)"; continue; }
            IFS=, read -r -a argv <<< "$args"; [ ${#argv[@]} = 0 ] && argv=("")
            for a in "${argv[@]}"; do "$exe" $a; done 2>&1 | tee -a "$OUT/bench.log"
            ;;
          *.py)  # a probe or runner by its path under bench/, from the repository root
            PYTHONUNBUFFERED=1 timeout ${BENCH_TIMEOUT:-600} python3 "bench/$b" "${bargs[@]}" 2>&1 | tee -a "$OUT/bench.log"
            ;;
          *)
            (cd /tmp && PYTHONUNBUFFERED=1 timeout ${BENCH_TIMEOUT:-600} python3 "$root/bench/${b}_torch.py" \
              --json "$OUT/${b}_torch.json" "${bargs[@]}") 2>&1 | tee -a "$OUT/bench.log"
            ;;
        esac
      done
      ;;
    flybench)
      while read -r extra; do
        stamp "flybench ${FLYBENCH_ARGS:-} $extra"
        # shellcheck disable=SC2086
        { echo "== ${extra:-default}"; timeout ${BENCH_TIMEOUT:-600} "$B/flybench" ${FLYBENCH_ARGS:-} $extra 2>&1; } \
          | tee -a "$OUT/flybench.log" | cut -c1-190
      done < <(fb_runs)
      ;;
    flytune)
      stamp "flytune ${FLYTUNE_ARGS:-}"
      # shellcheck disable=SC2086
      timeout ${TUNE_TIMEOUT:-600} "$B/flytune" ${FLYTUNE_ARGS:-} --db "$OUT/tune.sqlite" --dump "$OUT/sm_90a.sql" \
        --times "$OUT/tune_times.tsv" > "$OUT/flytune.log" 2>&1
      echo "flytune rc=$?"; tail -3 "$OUT/flytune.log"
      grep -oE "'[a-z0-9_]+'" "$OUT/sm_90a.sql" 2>/dev/null | grep -E "_(bf16|fp16|fp32)|^'mx" | sort | uniq -c | head -30
      export FLYKERNELS_TUNING_DB="$OUT/tune.sqlite"
      ;;
    ncu)
      while read -r extra; do
        v=${extra#--variant }; log="$OUT/ncu${extra:+-$v}.txt"
        stamp "ncu ${NCU_ARGS:-} flybench ${FLYBENCH_ARGS:-} $extra"
        # shellcheck disable=SC2086
        timeout ${NCU_TIMEOUT:-300} ncu ${NCU_ARGS:-} "$B/flybench" ${FLYBENCH_ARGS:-} $extra 2>&1 | grep -v '^==PROF==' > "$log"
        echo "ncu rc=$? ($(wc -l < "$log") lines in $log)"
      done < <(fb_runs)
      ;;
    ptxas)
      stamp "ptxas $B/gen/${PTXAS_GLOB:-*}.cu"
      for u in "$B"/gen/${PTXAS_GLOB:-*}.cu; do
        nvcc -cubin -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Ikernels -Iinclude "$u" \
          -o /tmp/ptxas.cubin -Xptxas -v 2>&1 | grep -E "spill|registers|C75" | sed "s|^|$(basename "$u" .cu): |"
      done > "$OUT/ptxas.log"
      echo "$(grep -cE "[1-9][0-9]* bytes spill|C75" "$OUT/ptxas.log") ptxas lines with spills or C75xx ($OUT/ptxas.log)"
      ;;
    ab)
      old=/tmp/ab_old
      stamp "ab: old tree ${AB_REF:-$AB_TARBALL} (${AB_PATHS:-kernels})"
      rm -rf "$old" && mkdir -p "$old"
      tar --exclude='./build*' --exclude='./bd*' --exclude=./.git -cf - . | tar -xf - -C "$old"
      for p in ${AB_PATHS:-kernels}; do rm -rf "${old:?}/$p"; done
      if [ -n "${AB_REF:-}" ]; then
        # shellcheck disable=SC2086
        git archive "$AB_REF" ${AB_PATHS:-kernels} | tar -x -C "$old" || { echo "ab: no commit $AB_REF here (use AB_TARBALL)"; exit 1; }
      else
        tar -xzf "${AB_TARBALL:?AB_REF or AB_TARBALL}" -C "$old"
      fi
      (cd "$old" && tools/device_run.sh bd_old "${cmake_args[@]}" -DFLY_BUILD_TESTS=OFF -DFLY_BUILD_TOOLS=OFF &&
        cmake --build bd_old --target flykernels -j16) > "$OUT/ab_old_build.log" 2>&1 || { tail -20 "$OUT/ab_old_build.log"; exit 1; }
      # shellcheck disable=SC2086
      PYTHONUNBUFFERED=1 timeout ${BENCH_TIMEOUT:-600} python3 bench/probes/gemm/ab_libs.py --a "$old/bd_old/libflykernels.so" \
        --b "$B/libflykernels.so" ${AB_ARGS:---layouts nt,nn,tn,tt --rounds 5} > "$OUT/ab.log" 2>&1
      echo "ab rc=$?"; grep -E "geomean|WRONG" "$OUT/ab.log"
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
