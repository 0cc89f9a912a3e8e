# SPDX-License-Identifier: Apache-2.0
# Shared by the MX device probes (mx_widen_device.sh, mx_splitk_device.sh): sourced after they set
#   out (log folder, with out/more for the logs that are tarred), budget (seconds), t0 (start), name
#   (the script's name for the header) and, optionally, phase_pat / phase_lines (what a phase's
#   summary line quotes from its log).
# Defines left, sum, finish, phase and cs; links .devdeps from two levels up when it is not here;
# writes the GPU line and the header into summary.txt.
left() { echo $(( budget - ($(date +%s) - t0) )); }
sum() { echo "$*" | tee -a "$out/summary.txt"; }
finish() { sum "done ($(( $(date +%s) - t0 ))s)"; tar czf "$out/logs.tgz" -C "$out" more; rm -rf "$out/more"; exit "${1:-0}"; }
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -e .devdeps ] || { [ -e ../../.devdeps ] && ln -sfn ../../.devdeps .devdeps; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >"$out/more/gpu.txt" 2>&1
sum "$name on $(head -1 "$out/more/gpu.txt") at $(date -u +%H:%M:%S) commit $(git rev-parse --short HEAD 2>/dev/null)"
last_rc=0
phase() {  # phase <name> <timeout> <log> <cmd...>: run with the budget left, rc in last_rc
  local pname=$1 lim=$2 log=$3; shift 3
  local l; l=$(left)
  if [ "$l" -le 10 ]; then sum "$pname: SKIPPED (budget)"; last_rc=0; return; fi
  [ "$l" -lt "$lim" ] && lim=$l
  local ts; ts=$(date +%s)
  timeout "$lim" "$@" >"$log" 2>&1
  last_rc=$?
  sum "$pname: rc=$last_rc ($(( $(date +%s) - ts ))s) $(grep -E "${phase_pat:-ERROR SUMMARY|RACECHECK SUMMARY|test cases|All tests passed}" "$log" | head -"${phase_lines:-4}" | tr '\n' ' ')"
}
