#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks by stage for code that has not run on a GPU yet, one device call per stage (carry
# .devdeps; .whl for the python tests; .ab for the GEMM A/B). Run `tests` again after any change
# that touches the default build; the figures each stage gave are in bench/RESULTS.md and
# docs/robustness.md.
#   bash bench/probes/common/pending_device.sh packed   # the packed paths (kernels/common/pack_lines.cuh):
#       [odd], [attention] and [attention_bwd] GPU tests (the "strides TMA cannot take run on aligned
#       copies" cases), compute-sanitizer memcheck on those, memcheck / racecheck over a cp.async GEMM
#       variant and one attention forward and backward variant of the subset (each includes a packed
#       call), and the granule probe (bench/probes/gemm/gemm_odd_granules.py)
#   bash bench/probes/common/pending_device.sh tests    # default build, ctest, python package + every python GPU test
#                                                # (pytest twice: the second pass with Inductor's caches warm)
#   bash bench/probes/common/pending_device.sh sanitize # the four compute-sanitizer tools over every family
#   bash bench/probes/common/pending_device.sh mxprof   # ncu of the MX decode shape (M 32, N = K = 4096), split and unsplit
#   bash bench/probes/common/pending_device.sh bench    # TopK long rows after the DB change, compiled GEMM from suite shape 5
# bench/probes/common/verify_device.sh runs `packed`'s tests, ctest and the Python GPU tests in one call.
# Logs under $OUT (at most 8 files come back: the stages tar their logs).
set -uo pipefail
stage=${1:-tests}
OUT=${OUT:-/tmp/out}
R=$PWD
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
build() {
  [ -f build/libflykernels.so ] && [ -x build/test/fly_gpu_subset ] && return 0
  bash tools/device_run.sh build >"$OUT/build.log" 2>&1 && cmake --build build -j16 >>"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
  el "build done: $(ls build/cubins | wc -l) cubins"
}
pyinstall() {
  [ -d /tmp/pyfk/flykernels ] && return 0
  if ls .whl/expecttest-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  fi
  FLYKERNELS_PREBUILT_DIR=build MAX_JOBS=16 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/pyfk \
    ./python >"$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
  el "python package installed"
}
case "$stage" in
  tests)
    build
    (cd build && timeout 200 ctest --output-on-failure) >"$OUT/ctest.log" 2>&1
    el "ctest rc=$?"; grep -E "tests passed|Failed|\*\*\*" "$OUT/ctest.log" | head
    pyinstall
    (cd /tmp && PYTHONPATH=/tmp/pyfk:${PYTHONPATH:-} timeout 300 python3 -m pytest -q -rs -p no:cacheprovider \
      "$R/python/tests" 2>&1) >"$OUT/pytest.log"
    el "pytest rc=$?"; grep -E "passed|failed|FAILED|SKIPPED" "$OUT/pytest.log" | tail -20
    # again, now with Inductor's caches warm: compiled graphs that picked ours come back from them
    (cd /tmp && PYTHONPATH=/tmp/pyfk:${PYTHONPATH:-} timeout 120 python3 -m pytest -q -p no:cacheprovider \
      -k "compile or grouped" "$R/python/tests" 2>&1) >"$OUT/pytest-cached.log"
    el "pytest (warm caches) rc=$?"; tail -3 "$OUT/pytest-cached.log"
    ;;
  sanitize)
    build
    mkdir -p /tmp/san
    # SAN_FAMILIES: a subset (default: every family); SAN_BUDGET_S: the pass's seconds
    # shellcheck disable=SC2086
    BUILD=build SAN_SKIP_CTEST=1 SAN_BUDGET_S=${SAN_BUDGET_S:-540} bash test/sanitize/device_sanitize.sh /tmp/san \
      ${SAN_FAMILIES:-} 2>&1 | tee "$OUT/san-summary.txt"
    tar -C /tmp -czf "$OUT/san.tgz" san
    ;;
  bench)
    build
    pyinstall
    mkdir -p "$OUT/topk"  # the default build's tools and DB rows (its own build step would configure topk only)
    timeout 200 bash kernels/topk/dev/long_device.sh "$OUT/topk" bench bench0 >"$OUT/topk-long.log" 2>&1
    el "topk long rows rc=$?"; tail -12 "$OUT/topk-long.log"
    PYTHONPATH=/tmp/pyfk PYTHONUNBUFFERED=1 timeout 330 python3 bench/torch_api.py --suites gemm --gemm-full \
      --gemm-budget-s 300 --gemm-from 5 --json "$OUT/torch_api_gemm_from5.json" 2>&1 | grep -v Warning >"$OUT/compiled-gemm.log"
    el "compiled GEMM rc=$?"; tail -20 "$OUT/compiled-gemm.log"
    ;;
  packed)
    build
    timeout 120 build/test/fly_gpu_tests "[odd]" >"$OUT/odd-tests.log" 2>&1
    el "[odd] rc=$?: $(tail -2 "$OUT/odd-tests.log" | tr '\n' ' ')"
    timeout 300 build/test/fly_gpu_tests "[attention]" >"$OUT/attention-tests.log" 2>&1
    el "[attention] rc=$?: $(tail -2 "$OUT/attention-tests.log" | tr '\n' ' ')"
    timeout 300 build/test/fly_gpu_tests "[attention_bwd]" >"$OUT/attention-bwd-tests.log" 2>&1
    el "[attention_bwd] rc=$?: $(tail -2 "$OUT/attention-bwd-tests.log" | tr '\n' ' ')"
    for t in "attention_fwd: strides TMA cannot take run on aligned copies" \
             "attention_bwd: strides TMA cannot take run on aligned copies"; do
      timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 build/test/fly_gpu_tests "$t" \
        >>"$OUT/attn-packed-memcheck.log" 2>&1
      el "memcheck '$t' rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/attn-packed-memcheck.log" | tail -1)"
    done
    for tool in memcheck racecheck; do
      timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 build/test/fly_gpu_subset \
        --only gemm_odd_bf16_bn128_st6 --only attention_fwd_bf16_hd128_m128_n128_st2_ov0 \
        --only attention_bwd_bf16_hd128_kn128_qm64_mq128_nq128 >"$OUT/packed-$tool.log" 2>&1
      el "$tool subset rc=$?: $(grep -E 'SUMMARY|variants' "$OUT/packed-$tool.log" | tr '\n' ' ')"
    done
    timeout 200 python3 bench/probes/gemm/gemm_odd_granules.py --lib build/libflykernels.so --layouts nt,tn >"$OUT/granules.log" 2>&1
    el "granules rc=$?"; cat "$OUT/granules.log"
    ;;
  mxprof)
    # where the MX decode time goes: ncu over flybench mxfp at M = 32, N = K = 4096 (the shipped
    # split-K row, then the unsplit n32_f0 forced), both formats
    build
    echo '{"cases": [{"M": 32, "N": 4096, "K": 4096}]}' >/tmp/mxdec.json
    for v in "" mxfp_wgmma_n32_f0; do
      timeout 200 ncu --clock-control none -k regex:mxfp -c 150 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
        build/flybench mxfp --suite /tmp/mxdec.json ${v:+--variant $v} >"$OUT/mxprof-${v:-default}.log" 2>&1
      el "ncu ${v:-default} rc=$?"
      grep -E "mxfp_|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Registers|Grid Size|Stall|Warp Cycles Per Issued" \
        "$OUT/mxprof-${v:-default}.log" | sort | uniq -c | sort -rn | head -40
    done
    # per-instruction stall samples of one split GEMM launch (which SASS lines the warps wait on)
    timeout 150 ncu --clock-control none -k regex:mxfp_wgmma -s 10 -c 1 --section WarpStateStats --section SourceCounters \
      --import-source no -f -o /tmp/mxsrc build/flybench mxfp --suite /tmp/mxdec.json >"$OUT/mxsrc-run.log" 2>&1
    el "ncu source rc=$?"
    ncu -i /tmp/mxsrc.ncu-rep --page source --csv --print-source sass >"$OUT/mxsrc-sass.csv" 2>&1
    el "sass page rc=$? lines=$(wc -l <"$OUT/mxsrc-sass.csv")"
    SASS="$OUT/mxsrc-sass.csv" python3 - <<'PY' || true
import csv, os, sys
rows = list(csv.reader(open(os.environ['SASS'], errors='replace')))
hdr = next((i for i, r in enumerate(rows) if any('Source' == c or 'Warp Stall Sampling' in c for c in r)), None)
if hdr is None:
    print('no header'); sys.exit()
h = rows[hdr]; body = rows[hdr + 1:]
si = next(i for i, c in enumerate(h) if c.startswith('Warp Stall Sampling (All'))
src = next(i for i, c in enumerate(h) if c == 'Source')
def num(x):
    try: return float(x.replace(',', ''))
    except: return 0.0
tot = sum(num(r[si]) for r in body if len(r) > si) or 1
print('top stall lines (share of all samples):')
for r in sorted(body, key=lambda r: -num(r[si]) if len(r) > si else 0)[:25]:
    print(f'{100 * num(r[si]) / tot:5.1f}%  {r[0]:>6}  {r[src][:110]}')
PY
    # the decode shapes, every bundled MX GEMM variant forced (same machine, L2 flushed)
    echo '{"cases": [{"M": 1, "N": 4096, "K": 4096}, {"M": 32, "N": 4096, "K": 4096}, {"M": 32, "N": 4096, "K": 14336}, {"M": 128, "N": 4096, "K": 4096}, {"M": 32, "N": 14336, "K": 4096}]}' >/tmp/mxdec5.json
    for v in "" $(ls build/cubins | sed -n 's/^\(mxfp_wgmma_[a-z0-9_]*\)\.cubin$/\1/p'); do
      echo "== ${v:-default}"
      timeout 60 build/flybench mxfp --suite /tmp/mxdec5.json ${v:+--variant $v} 2>&1 | tail -12
    done >"$OUT/mxvar.log" 2>&1
    el "variant sweep done"; cat "$OUT/mxvar.log" | head -120
    ;;
  *)
    echo "usage: pending_device.sh tests|sanitize|bench|packed|mxprof" >&2
    exit 2
    ;;
esac
el "stage $stage done"
