#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The command-line contract of flyinfo, flytune and flybench, on the paths that need no GPU
# (ctest `tools`; the GPUs are hidden, so it checks the same on a GPU machine):
#   --version on every tool (the library's version, exit 0); usage errors diagnosed with a message
#   and exit 2 before the device is looked for (an option that takes a value given none, a --suite
#   that is not there, an unknown option); "no CUDA device" the same exit code, 3, in flybench and
#   flytune, and said in --help; flyinfo's family column as wide as its longest family name.
# usage: tools_check.sh BUILD_DIR
set -uo pipefail
bin=${1:?usage: tools_check.sh BUILD_DIR}
# No GPU, whatever the machine: the CUDA runtime sees no device, the library loads no driver.
export CUDA_VISIBLE_DEVICES=""
export FLYKERNELS_LIBCUDA=/nonexistent/libcuda.so.1
failures=0
fail() { echo "tools_check: FAIL: $*" >&2; failures=$((failures + 1)); }
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
# run EXPECTED_RC TOOL ARGS...: runs it, checks the exit code.
run() {
  local want=$1; shift
  local rc=0
  "$bin/$1" "${@:2}" > "$out" 2> "$err" || rc=$?
  if [ "$rc" != "$want" ]; then
    fail "$* exited $rc, expected $want; stdout: $(head -c 400 "$out"); stderr: $(head -c 400 "$err")"
    return 1
  fi
  return 0
}

version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$bin/CMakeCache.txt")
for t in flyinfo flytune flybench; do
  if run 0 "$t" --version; then
    grep -qx "$t $version" "$out" || fail "$t --version printed '$(cat "$out")', expected '$t $version'"
  fi
  run 2 "$t" --no-such-option && { grep -q "no-such-option" "$err" || fail "$t --no-such-option did not name it"; }
done

# Usage errors are diagnosed before the device check (exit 2 with a message, not the no-GPU 3).
if run 2 flytune rmsnorm --db; then grep -q -- "--db needs a value" "$err" || fail "flytune rmsnorm --db: $(cat "$err")"; fi
if run 2 flytune rmsnorm --db --quick; then grep -q -- "--db needs a value" "$err" || fail "flytune --db --quick: $(cat "$err")"; fi
if run 2 flybench gemm --suite /nonexistent.json; then
  grep -q "/nonexistent.json" "$err" || fail "flybench gemm --suite /nonexistent.json did not name the file: $(cat "$err")"
fi
if run 2 flytune topk --suite /nonexistent.json; then grep -q "/nonexistent.json" "$err" || fail "flytune --suite: $(cat "$err")"; fi
if run 2 flybench rmsnorm --json; then grep -q -- "--json needs a value" "$err" || fail "flybench --json: $(cat "$err")"; fi
if run 2 flybench --data-dir; then grep -q -- "--data-dir needs a value" "$err" || fail "flybench --data-dir: $(cat "$err")"; fi
run 2 flybench rmsnorm --no-such-option

# No GPU: exit 3 from both, with a message on stderr; --help says so.
for t in flytune flybench; do
  if run 3 "$t" rmsnorm; then grep -q "no CUDA device" "$err" || fail "$t rmsnorm without a GPU said: $(cat "$err")"; fi
  run 0 "$t" --help && { grep -q "3 no CUDA device" "$out" || fail "$t --help does not document exit 3"; }
  run 0 "$t" --help && { grep -q -- "--version" "$out" || fail "$t --help does not mention --version"; }
done
# The suite is checked before the device, and a good one passes the check (then: no GPU, 3).
if [ -f "$(dirname "$0")/../../suites/gemm_bf16.json" ]; then
  run 3 flybench gemm --suite "$(dirname "$0")/../../suites/gemm_bf16.json"
fi
if [ -f "$(dirname "$0")/../../suites/moe.json" ]; then
  run 3 flybench grouped_gemm --suite "$(dirname "$0")/../../suites/moe.json"
  run 3 flytune grouped_gemm --suite "$(dirname "$0")/../../suites/moe.json"
fi

# flyinfo: exit 0 without a GPU, its family column aligned (every count starts in one column).
if run 0 flyinfo; then
  cols=$(sed -n '/^bundled kernel variants/,/^device:/p' "$out" | grep -E '^  [a-z_]+ +[0-9]+ variants$' |
         awk '{ match($0, /[0-9]+ variants$/); print RSTART + RLENGTH }' | sort -u | wc -l)
  rows=$(grep -cE '^  [a-z_]+ +[0-9]+ variants$' "$out")
  [ "$rows" -ge 1 ] || fail "flyinfo lists no family rows: $(cat "$out")"
  [ "$cols" = 1 ] || fail "flyinfo's family rows do not end in one column: $(grep 'variants$' "$out")"
  grep -q "device: none usable: FLY_ERROR_NO_DEVICE" "$out" || fail "flyinfo without a GPU: $(grep '^device' "$out")"
fi
run 0 flyinfo --help && { grep -q -- "--version" "$out" || fail "flyinfo --help does not mention --version"; }

if [ "$failures" -gt 0 ]; then echo "tools_check: $failures failure(s)" >&2; exit 1; fi
echo "tools_check: OK"
