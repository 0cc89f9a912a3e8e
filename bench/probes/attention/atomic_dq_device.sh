#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for the attention backward's atomic dQ experiment (nondeterministic = 1; measured
# slower than the deterministic kernels and not shipped: bench/RESULTS.md "Attention backward, atomic dQ"). Applies
# bench/probes/attention/atomic_dq_bulk32k.patch to the tree (the copy the device call works on), builds the
# two attention families, runs the [attention_bwd_atomic] GPU tests, flybench attention --bwd beside
# --nondeterministic on the suite (BF16), then compute-sanitizer memcheck and racecheck over the
# bounded shapes ([attention_bwd_small], which run each shape both ways).
#   OUT=... bash bench/probes/attention/atomic_dq_device.sh        (carry .devdeps; run it on a scratch copy)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
B=build-attn
grep -q fly_attn_bwd_dq_convert kernels/attention/attention_bwd.cu ||
  patch -p1 <bench/probes/attention/atomic_dq_bulk32k.patch >"$OUT/patch.log" 2>&1 || { cat "$OUT/patch.log"; exit 1; }
if ! [ -x $B/flybench ]; then
  bash tools/device_run.sh $B -DFLY_FAMILIES="attention;attention_bwd" >"$OUT/build.log" 2>&1 &&
    cmake --build $B -j16 >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
el "build: $(ls $B/cubins | wc -l) cubins"
timeout 150 $B/test/fly_gpu_tests "[attention_bwd_atomic]" >"$OUT/atomic-tests.log" 2>&1
el "[attention_bwd_atomic] rc=$?: $(tail -2 "$OUT/atomic-tests.log" | tr '\n' ' ')"
grep -E "FAILED|with expansion|rel dq" -A2 "$OUT/atomic-tests.log" | head -30
for mode in det nondet; do
  extra=(); [ $mode = nondet ] && extra=(--nondeterministic)
  timeout 120 $B/flybench attention --bwd --dtype bf16 --reps 10 "${extra[@]}" --json "$OUT/bwd-$mode.json" \
    >"$OUT/bwd-$mode.log" 2>&1
  el "flybench --bwd $mode rc=$?"
done
python3 - "$OUT" <<'PY'
import json, math, sys
o = sys.argv[1]
d = {(c["B"], c["Hq"], c["Hkv"], c["Sq"], c["Sk"], c["D"], c["causal"]): c for c in json.load(open(f"{o}/bwd-det.json"))["cases"]}
r = []
for c in json.load(open(f"{o}/bwd-nondet.json"))["cases"]:
    k = (c["B"], c["Hq"], c["Hkv"], c["Sq"], c["Sk"], c["D"], c["causal"])
    if k in d:
        x = d[k]["us"] / c["us"]
        r.append((x, c["D"]))
        print(f"{str(k):48} det {d[k]['us']:9.1f} us  atomic {c['us']:9.1f} us  {x:5.3f}x  {c['tflops']:6.1f} TF  {c['variant'][14:]}")
g = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float('nan')
print(f"atomic over deterministic: geomean {g([x for x, _ in r]):.3f}x; D 64/128/256: {g([x for x, D in r if D in (64, 128, 256)]):.3f}x")
PY
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/test/fly_gpu_tests "[attention_bwd_small]" >"$OUT/memcheck.log" 2>&1
el "memcheck small rc=$?: $(grep -E 'ERROR SUMMARY|test cases' "$OUT/memcheck.log" | tr '\n' ' ')"
timeout ${RACE_S:-150} compute-sanitizer --tool racecheck --error-exitcode 9 $B/test/fly_gpu_tests "[attention_bwd_small]" >"$OUT/racecheck.log" 2>&1
el "racecheck small rc=$?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|test cases' "$OUT/racecheck.log" | tr '\n' ' ')"
