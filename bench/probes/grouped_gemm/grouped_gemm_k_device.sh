#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for the ragged-K grouped GEMM (issue 27's dB_g = A_g^T @ dC_g, fly_grouped_gemm
# with 2-D a and b): build the grouped_gemm family, the mode's GPU tests (and the forward's, which
# must skip the mode-k variants), compute-sanitizer (memcheck and racecheck, SAN_TOOLS, over the
# mode-k sanitizer subset and over the mode-k GPU tests), the weight-gradient benchmark
# beside torch, and the python package's grouped tests (built in the background meanwhile).
#   OUT=... bash bench/probes/grouped_gemm/grouped_gemm_k_device.sh      (logs under $OUT)
set -uo pipefail
out=${OUT:-/tmp/gk}
mkdir -p "$out"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0))s] $*"; }
# FLY_MATCH=REGEX adds those mode-k variants (-DFLY_ALL_VARIANTS=ON) for DB_VARIANTS to time forced.
bash tools/device_run.sh bd -DFLY_FAMILIES=grouped_gemm ${FLY_MATCH:+-DFLY_ALL_VARIANTS=ON "-DFLY_VARIANT_MATCH=$FLY_MATCH"} \
  >"$out/build.log" 2>&1 &&
  ninja -C bd -j16 flykernels >>"$out/build.log" 2>&1 || {
  tail -40 "$out/build.log"
  exit 1
}
# The python package (its extension compiles against torch) while the rest builds and runs.
rm -rf /tmp/pyfk_dbk
[ "${SKIP_PY:-0}" = 1 ] || (FLYKERNELS_PREBUILT_DIR=bd MAX_JOBS=8 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/pyfk_dbk \
  ./python >"$out/pip.log" 2>&1
echo "pip rc=$?" >>"$out/pip.log") &
pip_pid=$!
ninja -C bd -j12 fly_gpu_tests fly_gpu_subset >>"$out/build.log" 2>&1 || {
  tail -40 "$out/build.log"
  exit 1
}
el "build: $(ls bd/cubins | wc -l) cubins"
{
  timeout 90 bd/test/fly_gpu_tests "grouped gemm k*" 2>&1
  echo "k tests rc=$?"
  timeout 60 bd/test/fly_gpu_tests "grouped gemm: *" 2>&1 | tail -4
  echo "forward tests rc=$?"
} >"$out/gpu_tests.log"
el "gpu tests: $(grep -E 'rc=|test cases|All tests' "$out/gpu_tests.log" | tr '\n' ' ')"
{
  sub="--only grouped_gemm_k_bf16_bm128_bn256_st4_e1 --only grouped_gemm_k_fp16_bm128_bn128_st5_e1"
  for tool in ${SAN_TOOLS:-memcheck racecheck}; do
    # shellcheck disable=SC2086
    timeout 30 compute-sanitizer --tool $tool --error-exitcode 9 bd/test/fly_gpu_subset $sub 2>&1 | tail -6
    echo "subset $tool rc=$?"
  done
  FLY_TEST_GROUPED_ONLY=_k_bf16_bm128_bn256 timeout 50 compute-sanitizer --tool memcheck --error-exitcode 9 \
    bd/test/fly_gpu_tests "grouped gemm k*" 2>&1 | tail -6
  echo "tests memcheck rc=$?"
  FLY_TEST_GROUPED_ONLY=_k_fp16_bm128_bn128 timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 \
    bd/test/fly_gpu_tests "grouped gemm k: every*,grouped gemm k: Ktot*" 2>&1 | tail -6
  echo "tests racecheck rc=$?"
} >"$out/sanitize.log"
el "sanitize: $(grep -E 'rc=' "$out/sanitize.log" | tr '\n' ' ')"
[ "${SKIP_BENCH:-0}" = 1 ] || PYTHONUNBUFFERED=1 timeout 70 python3 bench/grouped_gemm_torch.py --lib bd/libflykernels.so --suite suites/grouped_gemm.json \
  --dB --cases ${DB_CASES:-0,3,7,8,19,23} ${DB_VARIANTS:+--dB-variants $DB_VARIANTS} --json "$out/grouped_gemm_dB.json" >"$out/bench_dB.log" 2>&1
el "bench rc=$?"
wait $pip_pid
el "$(tail -1 "$out/pip.log")"
if [ -d /tmp/pyfk_dbk/flykernels ]; then
  (cd /tmp && PYTHONPATH=/tmp/pyfk_dbk timeout 60 python3 -m pytest -q -rs -p no:cacheprovider -k "${PYTEST_K:-grouped_mm and not compile and not inductor}" \
    "$OLDPWD/python/tests/test_cpu.py" "$OLDPWD/python/tests/test_gpu.py" 2>&1) >"$out/pytest.log"
  el "pytest rc=$?: $(tail -1 "$out/pytest.log")"
fi
