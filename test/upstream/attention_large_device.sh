#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Device script of issue 46's attention part (large finite inputs), run from the repo root on the GPU
# machine; logs land in $OUT.
#   bash test/upstream/attention_large_device.sh [stages...]   (default: build large memcheck)
# stages:
#   build     configure + build the attention families (tools/device_run.sh, FLY_FAMILIES below)
#   large     the CPU emulation ([emu]) and the new GPU tests: fly_gpu_tests "[attention_large]"
#   memcheck  compute-sanitizer memcheck over "[attention_large]"
#   regress   the existing attention GPU tests over the changed kernels: [attention], [attention_bwd],
#             [attention_wide], [attention_bwd_wide] (CPU: [attention], [attention_bwd])
#   racecheck compute-sanitizer racecheck over the bounded shapes ([attention_bwd_small],
#             [attention_wide_small]) and one large-input decode case (the split merge)
#   ab        timing A/B against BASE_REF (default 8916fce, the commit before the fix): builds it in a
#             git worktree, then flybench attention (forward, --bwd) alternating base / new, twice
#             each, and prints new / base per case (needs the repo's .git on the machine, or
#             BASE_DIR=<a source tree of the base>)
# Env: FLY_FAMILIES (default "attention;attention_bwd"), BUILD (build dir, default build),
#      BASE_REF, BASE_DIR, TIMEOUT_LARGE (default 400 s), TIMEOUT_MEMCHECK (default 500 s).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
fams=${FLY_FAMILIES:-attention;attention_bwd}
bd=${BUILD:-build}
root=$(pwd)
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }
summary() { grep -E "All tests passed|test cases:|assertions:|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|No tests ran" "$1" | head -${2:-12}; }

for stage in ${*:-build large memcheck}; do
  case $stage in
    build)
      stamp "build ($fams)"
      bash tools/device_run.sh "$bd" -DFLY_FAMILIES="$fams" > "$OUT/cfg.log" 2>&1 || { tail -30 "$OUT/cfg.log"; exit 1; }
      cmake --build "$bd" -j16 > "$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
      grep -c "C7512" "$OUT/build.log" | sed 's/^/ptxas C7512 (wgmma serialized) warnings: /'
      ;;
    large)
      stamp "cpu [emu]"
      "$bd/test/fly_cpu_tests" "[emu]" > "$OUT/cpu_emu.log" 2>&1; echo "rc=$?"; summary "$OUT/cpu_emu.log" 4
      stamp "gpu [attention_large]"
      timeout "${TIMEOUT_LARGE:-400}" "$bd/test/fly_gpu_tests" "[attention_large]" > "$OUT/gpu_large.log" 2>&1
      echo "rc=$?"; summary "$OUT/gpu_large.log" 40
      grep -E "with expansion|-> |worst|max \|err\|" "$OUT/gpu_large.log" | head -40
      ;;
    memcheck)
      stamp "memcheck [attention_large]"
      timeout "${TIMEOUT_MEMCHECK:-500}" compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$bd/test/fly_gpu_tests" "[attention_large]" > "$OUT/memcheck_large.log" 2>&1
      echo "rc=$?"; summary "$OUT/memcheck_large.log" 8
      ;;
    regress)
      stamp "cpu [attention],[attention_bwd]"
      "$bd/test/fly_cpu_tests" "[attention],[attention_bwd]" > "$OUT/cpu_attention.log" 2>&1; echo "rc=$?"; summary "$OUT/cpu_attention.log" 4
      for tag in attention attention_bwd attention_wide attention_bwd_wide; do
        stamp "gpu [$tag]"
        timeout 300 "$bd/test/fly_gpu_tests" "[$tag]" > "$OUT/gpu_$tag.log" 2>&1
        echo "rc=$?"; summary "$OUT/gpu_$tag.log" 20
      done
      ;;
    racecheck)
      for tag in attention_bwd_small attention_wide_small; do
        stamp "racecheck [$tag]"
        timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 "$bd/test/fly_gpu_tests" "[$tag]" \
          > "$OUT/racecheck_$tag.log" 2>&1
        echo "rc=$?"; summary "$OUT/racecheck_$tag.log" 6
      done
      stamp "racecheck: large-input decode (split merge)"
      timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$bd/test/fly_gpu_tests" \
        "attention large inputs: decode, split keys of unequal counts, GQA packed and not" > "$OUT/racecheck_decode.log" 2>&1
      echo "rc=$?"; summary "$OUT/racecheck_decode.log" 6
      ;;
    ab)
      ref=${BASE_REF:-8916fce}
      base=${BASE_DIR:-/tmp/fly_base}
      if [ -z "${BASE_DIR:-}" ]; then
        if ! git rev-parse --verify -q "$ref^{commit}" > /dev/null 2>&1; then
          echo "ab: $ref is not in this repository's history here (no .git?): skipped (BASE_DIR=<a tree of the base> works without git)"
          continue
        fi
        stamp "ab: base $ref in $base"
        [ -d "$base" ] || git worktree add --detach "$base" "$ref" > "$OUT/ab_worktree.log" 2>&1 || { tail -5 "$OUT/ab_worktree.log"; continue; }
      fi
      [ -e "$base/.devdeps" ] || ln -s "$root/.devdeps" "$base/.devdeps"
      (cd "$base" && bash tools/device_run.sh build -DFLY_FAMILIES="$fams" > "$OUT/ab_cfg.log" 2>&1 &&
        cmake --build build -j16 --target flybench > "$OUT/ab_build.log" 2>&1) || { grep -E "error" "$OUT/ab_build.log" | head; continue; }
      [ -x "$bd/flybench" ] || cmake --build "$bd" -j16 --target flybench > "$OUT/build_flybench.log" 2>&1
      for dir in fwd bwd; do
        flag=""; [ $dir = bwd ] && flag=--bwd
        for round in 1 2; do
          for side in base new; do
            fb=$bd/flybench; [ $side = base ] && fb=$base/build/flybench
            (cd "$([ $side = base ] && echo "$base" || echo "$root")" && timeout 240 "$fb" attention $flag --reps 10 \
              --json "$OUT/ab_${dir}_${side}_$round.json") > "$OUT/ab_${dir}_${side}_$round.log" 2>&1
          done
        done
        python3 - "$OUT" "$dir" <<'EOF'
import json, math, sys
out, d = sys.argv[1], sys.argv[2]
def load(side):
    best = {}
    for r in (1, 2):
        try:
            cases = json.load(open(f"{out}/ab_{d}_{side}_{r}.json"))["cases"]
        except (OSError, ValueError, KeyError):
            continue
        for c in cases:
            k = (c["dtype"], c["B"], c["Hq"], c["Hkv"], c["Sq"], c["Sk"], c["D"], c["causal"])
            best[k] = min(best.get(k, float("inf")), c["us"])
    return best
b, n = load("base"), load("new")
ks = sorted(set(b) & set(n))
if not ks:
    print(f"ab {d}: no common cases (see {out}/ab_{d}_*.log)"); sys.exit()
logs = []
print(f"ab {d}: new / base time per case (min of 2 runs each, alternating)")
for k in ks:
    r = n[k] / b[k]
    logs.append(math.log(r))
    print(f"  {k[0]} B{k[1]} Hq{k[2]} Hkv{k[3]} Sq{k[4]} Sk{k[5]} D{k[6]}{' causal' if k[7] else ''}: "
          f"{b[k]:9.1f} -> {n[k]:9.1f} us  x{r:.3f}")
print(f"ab {d}: geometric mean x{math.exp(sum(logs) / len(logs)):.4f} over {len(ks)} cases")
EOF
      done
      ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
stamp "done"
