#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The fused split-key merge of the attention forward (docs/attention.md "Decode: the fused merge"):
# one device call that builds the attention family (shipped rows), runs every attention GPU test,
# compute-sanitizer memcheck and racecheck on the split-key tests (decode, persistent, wide small),
# then bench/attention_torch.py on one prefill case plus the decode cases of tuning/attention.json
# beside SDPA's cuDNN / flash in the same run. Logs under $OUT. Carry .devdeps.
#   OUT=... bash bench/probes/attention/attention_decode_device.sh
set -uo pipefail
out=${OUT:-./out-attdec}; mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
t0=$(date +%s)
sum() { echo "$*" | tee -a "$out/summary.txt"; }
bash tools/device_run.sh build-attdec -DFLY_FAMILIES=attention >"$out/cfg.log" 2>&1
cmake --build build-attdec -j16 >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
sum "build $(( $(date +%s) - t0 ))s"
timeout 200 build-attdec/test/fly_gpu_tests "[attention]" >"$out/gpu.log" 2>&1
sum "gpu tests [attention] rc=$? $(grep -E 'test cases|All tests passed' "$out/gpu.log" | tail -1)"
grep -E "FAILED|with expansion" "$out/gpu.log" | head -20 >>"$out/summary.txt"
split_tests='attention_fwd: one query*,attention_fwd: persistent*,[attention_wide_small]'  # Catch2: a comma separates patterns
for tool in memcheck racecheck; do
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 build-attdec/test/fly_gpu_tests "$split_tests" >"$out/$tool.log" 2>&1
  sum "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | head -1) $(grep -E 'test cases' "$out/$tool.log" | tail -1)"
done
echo '{"op":"attention","dtype":["bf16","fp16"],"cases":[{"B":4,"Hq":16,"Hkv":16,"Sq":4096,"Sk":4096,"D":128,"causal":false}]}' >/tmp/one.json
PYTHONUNBUFFERED=1 timeout 200 python3 bench/attention_torch.py --flybench build-attdec/flybench --suite /tmp/one.json --reps 20 \
  --json "$out/torch.json" >"$out/torch.log" 2>&1
sum "torch rc=$?"; grep -v "^bf16 B=\|^fp16 B=" "$out/torch.log" | tail -15 >>"$out/summary.txt"
sum "done $(( $(date +%s) - t0 ))s"
