#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for the weight-only MX decode GEMM (kernels/mx/mx_decode.cu, docs/mxfp.md
# "Weight-only decode"). Stages (default "build cpu gpu sanitize probe"; any subset, in order):
#   build     configure + build the mx_decode family only (ALL=1: its whole variant space) with the
#             CPU / GPU tests, fly_gpu_subset and the probe
#   cpu       fly_cpu_tests "[mx_decode]" (widenings, plan, validation)
#   gpu       fly_gpu_tests "[mx_decode]" (FP64 reference; every bundled variant forced)
#   sanitize  compute-sanitizer memcheck, racecheck, synccheck, initcheck over `fly_gpu_subset mx`
#             (every bundled mx_decode variant: M = 5 + bias and M = its tile, N 300, K 1056, clusters),
#             then memcheck over fly_gpu_tests "[mx_decode]"
#   probe     bench/fly_mx_decode_probe, BF16 activations, the default shapes, M 1 4 16 32 64,
#             beside cuBLAS BF16 (then FP16 activations on two shapes)
#   sweep     (with ALL=1) every bundled BF16 variant forced (the plan's cluster size: not the _c
#             launch variants), M 1 and 16 (32 for m4, 32 and 64 for m8), three shapes, no cuBLAS:
#             which variant should the defaults / the DB rows name
# Logs under $OUT (default ./out-mxdecode): summary.txt and one log per stage.
#   OUT=out bash bench/probes/mx/mx_decode_device.sh [stages...]     (from the repository root)
set -uo pipefail
out=${OUT:-./out-mxdecode}
mkdir -p "$out"
b=${BUILD:-build-mxdecode}
stages=${*:-build cpu gpu sanitize probe}
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
t0=$(date +%s)
sum() { echo "$*" | tee -a "$out/summary.txt"; }
has() { case " $stages " in *" $1 "*) return 0 ;; esac; return 1; }
sum "mx_decode_device.sh on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) at $(date -u +%H:%M:%S) commit $(git rev-parse --short HEAD 2>/dev/null) stages: $stages"

if has build; then
  extra=()
  [ "${ALL:-0}" = 1 ] && extra+=(-DFLY_ALL_VARIANTS=ON)
  bash tools/device_run.sh "$b" -DFLY_FAMILIES=mx_decode -DFLY_BUILD_TOOLS=OFF ${extra[@]+"${extra[@]}"} >"$out/cfg.log" 2>&1
  ninja -C "$b" -j16 flykernels fly_cpu_tests fly_gpu_tests fly_gpu_subset fly_mx_decode_probe >"$out/build.log" 2>&1
  rc=$?
  sum "build rc=$rc ($(( $(date +%s) - t0 ))s); $(grep -c . "$b/gen/manifest.tsv" 2>/dev/null) variants"
  [ $rc -eq 0 ] || { tail -30 "$out/build.log" | tee -a "$out/summary.txt"; exit 1; }
fi
if has cpu; then
  timeout 120 "./$b/test/fly_cpu_tests" "[mx_decode]" >"$out/cpu.log" 2>&1
  sum "cpu rc=$? $(grep -E 'test cases|All tests passed' "$out/cpu.log" | tr '\n' ' ')"
fi
if has gpu; then
  timeout 400 "./$b/test/fly_gpu_tests" "[mx_decode]" >"$out/gpu.log" 2>&1
  sum "gpu rc=$? $(grep -E 'test cases|All tests passed' "$out/gpu.log" | tr '\n' ' ')"
  grep -E "FAILED|worst|first bad" "$out/gpu.log" | head -20 >>"$out/summary.txt"
fi
if has sanitize; then
  for tool in memcheck racecheck synccheck initcheck; do
    timeout 200 "$cs" --tool "$tool" --error-exitcode 1 "./$b/test/fly_gpu_subset" mx >"$out/cs-$tool.log" 2>&1
    sum "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|fly_gpu_subset:' "$out/cs-$tool.log" | tr '\n' ' ')"
  done
  # memcheck over the GPU tests too (every case; the forced-variant walk as bundled)
  timeout 400 "$cs" --tool memcheck --error-exitcode 1 --report-api-errors no "./$b/test/fly_gpu_tests" "[mx_decode]" \
    >"$out/cs-memcheck-tests.log" 2>&1
  sum "memcheck [mx_decode] tests rc=$? $(grep -E 'ERROR SUMMARY|test cases|All tests passed' "$out/cs-memcheck-tests.log" | tr '\n' ' ')"
fi
if has probe; then
  timeout 400 "./$b/bench/fly_mx_decode_probe" --tsv "$out/probe-bf16.tsv" >"$out/probe-bf16.log" 2>&1
  sum "probe bf16 rc=$?"
  cat "$out/probe-bf16.log" >>"$out/summary.txt"
  timeout 150 "./$b/bench/fly_mx_decode_probe" --act fp16 --shapes 14336x4096,4096x14336 --m 1,16,64 \
    --tsv "$out/probe-fp16.tsv" >"$out/probe-fp16.log" 2>&1
  sum "probe fp16 rc=$?"
  cat "$out/probe-fp16.log" >>"$out/summary.txt"
fi
if has sweep; then
  : >"$out/sweep.log"
  for v in $(grep -oE "^mx_decode_bf16_[a-z0-9_]+" "$b/gen/manifest.tsv" | grep -vE "_c[0-9]+$" | sort -u); do
    case "$v" in *_m8_*) m=32,64 ;; *_m4_*) m=32 ;; *_m1_*) m=1 ;; *) m=1,16 ;; esac
    case "$v" in *e2m1*) f=e2m1 ;; *) f=e4m3 ;; esac
    timeout 60 "./$b/bench/fly_mx_decode_probe" --no-cublas --reps 10 --warmup 3 --fmt "$f" --m "$m" \
      --shapes 14336x4096,4096x14336,6144x4096 --variant "$v" 2>&1 | grep -v "^#" | grep -v "^NxK" >>"$out/sweep.log"
  done
  sum "sweep: $(wc -l <"$out/sweep.log") rows ($(( $(date +%s) - t0 ))s); best per (shape, M, fmt):"
  sort -k1,1 -k2,2n -k3,3 -k4,4g "$out/sweep.log" | awk '!seen[$1" "$2" "$3]++' | tee -a "$out/summary.txt" >/dev/null
fi
sum "done ($(( $(date +%s) - t0 ))s)"
