#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# PyTorch's upstream tests for the ops FlyKernels overrides (SDPA: test_transformers.py; F.grouped_mm:
# test_matmul_cuda.py's grouped tests; F.scaled_mm: test_scaled_matmul_cuda.py), run twice on the
# GPU machine, stock (FLYKERNELS_TORCH=0) and with flykernels, then compared: every test that passes
# stock and fails with flykernels is listed (exit status 1 when there is one). README.md beside this.
#
#   test/upstream/run.sh [options]
#     --src DIR       the fetched files (DIR/test/test_*.py; test/upstream/fetch.sh writes them);
#                     default $UPSTREAM_DIR, else .upstream/v<installed torch version>
#     --out DIR       results: stock.xml, fly.xml (JUnit), *.meta.json, *.log, report.md,
#                     report.json; default $OUT, else /tmp/upstream
#     --sample N      run 1 in N parametrizations of each test function, at least one per
#                     function (default 16; 1 = all)
#     --files LIST    comma list of transformers,matmul,scaled (default all three)
#     --select SPEC   which test functions of each file: "file_stem=regex;..." (default
#                     "test_matmul_cuda=grouped": the grouped_mm tests of that file, all of the others)
#     -k EXPR         an extra pytest -k expression (both runs)
#     --runs LIST     stock,fly (default both; compare needs both)
#     --no-force      with flykernels: the shipped decision rows decide which calls run ours
#                     (default: flykernels.torch.forced("ours"), every eligible call runs ours)
#     --budget S      seconds per run before it is stopped (SIGINT: the JUnit file is still
#                     written; unfinished tests count as missing) (default 300)
#     --install       build the library and pip-install the package first (tools/device_python.sh build)
#   Needs: python3 with torch (CUDA) and pytest; flykernels importable (or --install).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
src=${UPSTREAM_DIR:-}
out=${OUT:-/tmp/upstream}
sample=16
files="transformers,matmul,scaled"
select="test_matmul_cuda=grouped"
kexpr=""
runs="stock,fly"
force=ours
budget=300
install=0
while [ $# -gt 0 ]; do
  case $1 in
    --src) src=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --sample) sample=$2; shift 2 ;;
    --files) files=$2; shift 2 ;;
    --select) select=$2; shift 2 ;;
    -k) kexpr=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --no-force) force=""; shift ;;
    --budget) budget=$2; shift 2 ;;
    --install) install=1; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

if [ $install = 1 ]; then
  (cd "$root" && OUT="$out" tools/device_python.sh build) || { echo "run.sh: the package build failed ($out/build.log, pip.log)" >&2; exit 2; }
fi
tv=$(python3 -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null) || {
  echo "run.sh: no torch in python3" >&2
  exit 2
}
python3 -c 'import pytest' 2>/dev/null || { echo "run.sh: pytest is not installed (python3 -m pip install pytest)" >&2; exit 2; }
if [[ ",$runs," == *",fly,"* ]]; then
  (cd /tmp && python3 -c 'import flykernels') 2>/dev/null || {
    echo "run.sh: flykernels is not importable: build and install it (run.sh --install, or tools/device_python.sh build)" >&2
    exit 2
  }
fi
[ -n "$src" ] || src=$root/.upstream/v$tv
if [ ! -d "$src/test" ]; then
  echo "run.sh: no upstream tests in $src/test (test/upstream/fetch.sh $tv fetches them where there is network;" \
       "carry .upstream/ to this machine)" >&2
  exit 2
fi
if [ -f "$src/SOURCE" ] && ! grep -q "^tag v$tv\$" "$src/SOURCE"; then
  echo "run.sh: warning: $src holds $(head -1 "$src/SOURCE"), the installed torch is $tv" >&2
fi

paths=()
for f in ${files//,/ }; do
  case $f in
    transformers) p=test_transformers.py ;;
    matmul) p=test_matmul_cuda.py ;;
    scaled) p=test_scaled_matmul_cuda.py ;;
    *) echo "run.sh: unknown file $f (transformers, matmul, scaled)" >&2; exit 2 ;;
  esac
  [ -f "$src/test/$p" ] && paths+=("$p") || echo "run.sh: warning: $src/test/$p missing, skipped" >&2
done
[ ${#paths[@]} -gt 0 ] || { echo "run.sh: nothing to run" >&2; exit 2; }
timeout_args=()
python3 -c 'import pytest_timeout' 2>/dev/null && timeout_args=(--timeout=120)

run_one() {  # run_one NAME FLYKERNELS_TORCH
  local name=$1 fly=$2
  local t0=$SECONDS
  echo "== $name run (FLYKERNELS_TORCH=$fly, sample 1 in $sample, budget ${budget}s): ${paths[*]}"
  # The test files import their helpers from their own folder: run from there.
  (cd "$src/test" && FLYKERNELS_TORCH=$fly UPSTREAM_FORCE=$force UPSTREAM_SAMPLE=$sample UPSTREAM_SELECT="$select" \
    UPSTREAM_META="$out/$name.meta.json" PYTORCH_TESTING_DEVICE_ONLY_FOR=cuda \
    PYTHONPATH="$root/test/upstream:$src/test${PYTHONPATH:+:$PYTHONPATH}" \
    timeout --signal=INT --kill-after=60 "$budget" \
    python3 -m pytest -p flykernels_upstream -p no:cacheprovider -q -rN -o junit_family=xunit1 \
      --junitxml="$out/$name.xml" ${kexpr:+-k "$kexpr"} "${timeout_args[@]}" "${paths[@]}") > "$out/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc after $((SECONDS - t0)) s; $(tail -1 "$out/$name.log")"
  [ $rc = 124 ] || [ $rc = 130 ] && echo "   stopped at the budget: raise --budget or --sample" >&2
  return 0
}

[[ ",$runs," == *",stock,"* ]] && run_one stock 0
[[ ",$runs," == *",fly,"* ]] && run_one fly 1
if [ -f "$out/stock.xml" ] && [ -f "$out/fly.xml" ]; then
  python3 "$root/test/upstream/compare.py" "$out/stock.xml" "$out/fly.xml" --json "$out/report.json" --md "$out/report.md"
  exit $?
fi
echo "run.sh: both stock.xml and fly.xml are needed for the comparison (in $out)"
