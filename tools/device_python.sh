#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The one device helper: the PyTorch package and a family's GPU checks and probes on the GPU
# machine, in one call (through the device tool), from the repository root:
#   tools/device_python.sh [steps...]   steps: build cpu gtests sanitize sanitize_all ctest tune check
#                                       tests bench flybench flytune ncu ptxas ab e2e
#                                       (default: build tests; with FAMILY, that family's checks)
#   FAMILY=<family> tools/device_python.sh [steps...]   a family's GPU checks
#   PROBE=<probe> tools/device_python.sh [steps...]     a probe of bench/probes/README.md
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
# tests: pytest of PYTEST_FILES (default python/tests: CPU + GPU) with PYTEST_ARGS (and -k PYTEST_K),
# lines matching PYTEST_GREP quoted;
# bench: each entry of BENCH: `name` runs bench/<name>_torch.py --json $OUT/<name>_torch.json
# BENCH_ARGS (from /tmp); `path/x.py[:runs]` runs bench/path/x.py RUN BENCH_ARGS (from the repository
# root); `path/x.cpp[:runs]` builds a standalone probe against the library and runs it with each
# RUN; runs: comma-separated, a run's words joined by '+' (`gemm_random.py:--seed+1,--seed+2`); in
# BENCH_ARGS, @B is the build folder's absolute path and @R the repository root's;
# flybench: BUILD_DIR's flybench FLYBENCH_ARGS (e.g. "attention --reps 10") once per entry of
# FLYBENCH_EXTRA (';'-separated extra arguments; default one run with none, "-" none at all), then once more per
# variant of FLYBENCH_VARIANTS and of the generated units matching FLYBENCH_VARIANTS_MATCH, with
# --variant (output $OUT/flybench.log);
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
# add_rmsnorm, moe_route, cross_entropy (a build of that family alone in build-ce); PROBE presets
# likewise: attention, attention_bwd, attention_wide, attention_bwd_wide, attention_decode,
# attention_pingpong, attention_bwdtune, attention_atomic_dq, gemm_packed, gemm_core_ab,
# grouped_gemm, grouped_gemm_k, grouped_triton, mx_widen, mx_widen_repeat, mx_splitk, mx_quant,
# verify (each commented where it is defined); see
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
# PROBE presets: the probes of bench/probes/README.md that are runs of these steps (each replaced a
# one-off device script); the same rule: a variable already set wins, steps given on the line win.
mx_match='^(mx_quantize_t256_hw1|mxfp_gemm_m64_n64|mxfp_wgmma_n(32|64|128)_f[01](_p[12])?(_s4)?|mxfp_widen_n.*)$'
mx_splits="mxfp_wgmma_n32_f0_p2_s2 mxfp_wgmma_n32_f0_p2_s4 mxfp_wgmma_n32_f0_p2_s8 mxfp_wgmma_n64_f0_p2_s2 mxfp_wgmma_n64_f0_p2_s4 mxfp_wgmma_n64_f0_p2_s8 mxfp_wgmma_n128_f0_p2_s2 mxfp_wgmma_n128_f0_p2_s4 mxfp_wgmma_n128_f0_p2_s8"
mx_prefill="mx_decode_prefill_bf16_e4m3_n256_s3_r4 mx_decode_prefill_bf16_e2m1_n256_s4_r4 mx_decode_prefill_bf16_e4m3_n128_s4_r4 mx_decode_prefill_bf16_e2m1_n128_s4_r4"
mx_swapped="mxfp_widen_n32_t1_s1 mxfp_widen_n32_t1_s2 mxfp_widen_n32_t1_s4 mxfp_widen_n64_t1_s1 mxfp_widen_n64_t1_s2 mxfp_widen_n64_t1_s4"
attn_packed="attention_fwd: strides TMA cannot take run on aligned copies,attention_bwd: strides TMA cannot take run on aligned copies"
case ${PROBE:-} in
  "") ;;
  attention)  # the attention forward alone: CPU + GPU tests, flybench, sanitizers; also tune, the suite
    def BUILD_DIR "build-attn"; def CMAKE_ARGS "-DFLY_FAMILIES=attention"; def PIP 0
    def BUILD_TARGETS "flykernels fly_gpu_tests fly_cpu_tests fly_fake_driver_tests"
    def GTEST_TAGS "[attention]"
    def SAN_FILTER_racecheck "attention_fwd: grouped-query*,attention_fwd: one query*"
    def FLYBENCH_ARGS "attention --reps 10"; def FLYTUNE_ARGS "attention --quick"
    def BENCH "attention"; def BENCH_ARGS "--flybench @B/flybench --reps 10 --png $OUT/attention.png"
    fam_steps="build cpu gtests flybench sanitize" ;;
  attention_bwd)  # the backward: [attention_bwd] tests, sanitizers, the backward suite beside SDPA
    def BUILD_DIR "build-attn-bwd"; def CMAKE_ARGS "-DFLY_FAMILIES=attention_bwd"; def PIP 0
    def BUILD_TARGETS "flykernels fly_gpu_tests flybench"
    def GTEST_TAGS "[attention_bwd]"; def SAN_FILTER_racecheck "[attention_bwd_small]"
    def BENCH "attention"; def BENCH_ARGS "--bwd --flybench @B/flybench --dtype bf16 --reps 10 --png $OUT/attention_bwd.png"
    fam_steps="build gtests sanitize bench" ;;
  attention_wide)  # D 257..512 forward: every hd512 variant, the D 512 suite beside SDPA, per variant
    def BUILD_DIR "build-attn-wide"; def CMAKE_ARGS "-DFLY_FAMILIES=attention"; def MATCH "hd512"; def PIP 0
    def BUILD_TARGETS "flykernels fly_gpu_tests flybench"
    def GTEST_TAGS "[attention_wide],[attention_wide_small],attention_fwd: every bundled variant,attention_fwd: Sk = 0*"
    def SAN_FILTER_memcheck "[attention_wide],[attention_wide_small],attention_fwd: every bundled variant"
    def SAN_FILTER_racecheck "[attention_wide_small]"
    def BENCH "attention"
    def BENCH_ARGS "--flybench @B/flybench --suite @R/bench/probes/attention/attention_d512.json --no-decode --reps 10 --png $OUT/attention_d512.png"
    def FLYBENCH_ARGS "attention --suite bench/probes/attention/attention_d512.json --no-decode --dtype bf16 --reps 5"
    def FLYBENCH_EXTRA "-"; def FLYBENCH_VARIANTS_MATCH "^attention_fwd_bf16_hd512.*_mc"
    fam_steps="build gtests bench flybench sanitize" ;;
  attention_bwd_wide)  # D 257..512 backward: ptxas, every variant forced, beside SDPA memory-efficient
    def BUILD_DIR "build-attn-bww"; def CMAKE_ARGS "-DFLY_FAMILIES=attention;attention_bwd"
    def MATCH "attention_bwd_.*_hd512_"; def PIP 0
    def BUILD_TARGETS "flykernels fly_gpu_tests fly_cpu_tests fly_fake_driver_tests flybench"
    def PTXAS_GLOB "attention_bwd_*_hd512_*"; def CPU_TAGS "[attention_bwd]"
    def GTEST_TAGS "[attention_bwd_wide],[attention_bwd_wide_small],attention_bwd: every bundled variant,attention_bwd: Sk = 0*"
    def SAN_FILTER_memcheck "[attention_bwd_wide_small],attention_bwd wide: head dims*"
    def SAN_FILTER_racecheck "[attention_bwd_wide_small]"
    def BENCH "attention"
    def BENCH_ARGS "--bwd --flybench @B/flybench --suite @R/bench/probes/attention/attention_d512.json --no-decode --dtype bf16 --reps 10 --png $OUT/attention_bwd_d512.png"
    fam_steps="build ptxas cpu gtests bench sanitize" ;;
  attention_decode)  # the fused split-key merge: every attention test, split-key sanitizers, decode rows
    def BUILD_DIR "build-attn"; def CMAKE_ARGS "-DFLY_FAMILIES=attention"; def PIP 0
    def BUILD_TARGETS "flykernels fly_gpu_tests flybench"
    def GTEST_TAGS "[attention]"; def SAN_FILTER "attention_fwd: one query*,attention_fwd: persistent*,[attention_wide_small]"
    def BENCH "attention"
    def BENCH_ARGS "--flybench @B/flybench --suite @R/bench/probes/attention/attention_prefill_one.json --reps 20"
    fam_steps="build gtests sanitize bench" ;;
  attention_pingpong)  # the persistent (_ps1) and ping-pong (_pp1) forward schedules: tests, A/B by flytune
    def BUILD_DIR "build-attn-pp"; def CMAKE_ARGS "-DFLY_FAMILIES=attention"; def PIP 0
    def MATCH 'attention_fwd_bf16_hd(64_m128_n192|128_m128_n128|192_m128_n112|256_m128_n64)_st2_ov[01](_pp[01]_ps[01])?$'
    def GTEST_TAGS "[attention_ps],attention_fwd: every bundled variant"
    def SAN_TOOLS "memcheck racecheck synccheck"
    def SAN_FILTER_memcheck "[attention_ps]"; def SAN_FILTER "attention_fwd: every bundled variant"
    def FLYTUNE_ARGS "attention --quick --dtype bf16"
    fam_steps="build gtests sanitize flytune" ;;
  attention_bwdtune)  # every BF16 backward tile and the FP16 forward tiles: flytune's first rows for them
    def BUILD_DIR "build-bwt"; def CMAKE_ARGS "-DFLY_FAMILIES=attention;attention_bwd"; def PIP 0
    def MATCH 'attention_bwd_bf16_hd(64|128|192|256)_|attention_fwd_fp16_hd(64_m128_n192|128_m128_n128|192_m128_n112|256_m128_n64)_st2_ov0(_pp0_ps1)?$'
    def FLYTUNE_ARGS "attention --bwd --quick --dtype bf16"  # FLYTUNE_ARGS="attention --quick --dtype fp16": the FP16 forward
    def GTEST_TAGS "attention_fwd: every bundled variant,attention_bwd: every bundled variant"
    fam_steps="build flytune gtests" ;;
  attention_atomic_dq)  # the atomic-dQ backward experiment (not shipped): the patch applied to this copy
    def PATCH "bench/probes/attention/atomic_dq_bulk32k.patch"
    def BUILD_DIR "build-attn-atomic"; def CMAKE_ARGS "-DFLY_FAMILIES=attention;attention_bwd"; def PIP 0
    def GTEST_TAGS "[attention_bwd_atomic]"; def SAN_FILTER "[attention_bwd_small]"
    def FLYBENCH_ARGS "attention --bwd --dtype bf16 --reps 10"; def FLYBENCH_EXTRA ";--nondeterministic"
    fam_steps="build gtests flybench sanitize" ;;
  gemm_packed)  # GEMM on strides TMA cannot take: [odd] + [gemm] tests, cp.async subset sanitized, probes
    def PIP 0; def BUILD_TARGETS "flykernels fly_gpu_tests fly_gpu_subset"
    def GTEST_TAGS "[odd],[gemm]~[mx]"
    def SAN_SUBSET "--only gemm_odd_bf16_bn128_st6 --only gemm_odd_fp16_bn128_st6"
    def BENCH "probes/gemm/gemm_odd_granules.py gemm_random.py:--seed+1+--count+60,--odd+--seed+1+--count+8+--max-tflop+0.5+--max-gib+2,--odd+--seed+2+--count+8+--max-tflop+0.5+--max-gib+2"
    def BENCH_ARGS "--lib @B/libflykernels.so"
    fam_steps="build gtests sanitize bench" ;;
  gemm_core_ab)  # a GEMM kernel change against the tree before it (issue 24's proof): tests, A/B
    def BUILD_DIR "build-gemm-ab"; def CMAKE_ARGS "-DFLY_FAMILIES=gemm -DFLY_BUILD_TOOLS=OFF"; def PIP 0
    def MATCH 'gemm_(bf16|fp16)_dec_w8_r16_m8_d4|gemm_(bf16|fp16)_dec_w4_r16_m2_d2|gemm_(bf16|fp16)_dec_w8_r32_m4_d2'
    def AB_REF "3f0a9cc"; def AB_PATHS "kernels/gemm"
    def GTEST_TAGS "[gemm]~[mx]"; def SAN_FILTER "gemm: every bundled variant is right"
    fam_steps="build gtests sanitize ab" ;;
  grouped_gemm)  # the grouped_gemm family alone: tests, sanitizers, flybench, the suite beside F.grouped_mm
    def BUILD_DIR "build-grouped"; def CMAKE_ARGS "-DFLY_FAMILIES=grouped_gemm"; def PIP 0
    def GTEST_TAGS "[grouped_gemm]"
    def SAN_FILTER_racecheck "grouped gemm: ragged groups*,grouped gemm: every bundled variant forced"
    def FLYBENCH_ARGS "grouped_gemm --layouts nt --json $OUT/flybench.json"; def FLYTUNE_ARGS "grouped_gemm --quick"
    def BENCH "grouped_gemm"; def BENCH_ARGS "--lib @B/libflykernels.so --fly-json $OUT/flybench.json"
    fam_steps="build gtests sanitize flybench bench" ;;
  grouped_gemm_k)  # the ragged-K weight gradient: its tests, sanitizers, the dB benchmark, the package
    def BUILD_DIR "build-grouped"; def CMAKE_ARGS "-DFLY_FAMILIES=grouped_gemm"
    def BUILD_TARGETS "flykernels fly_gpu_tests fly_gpu_subset"
    def GTEST_TAGS "grouped gemm k*,grouped gemm: *"
    def SAN_SUBSET "--only grouped_gemm_k_bf16_bm128_bn256_st4_e1 --only grouped_gemm_k_fp16_bm128_bn128_st5_e1"
    def BENCH "grouped_gemm"; def BENCH_ARGS "--lib @B/libflykernels.so --suite @R/suites/grouped_gemm.json --dB --cases 0,3,7,8,19,23"
    def PYTEST_FILES "python/tests/test_cpu.py python/tests/test_gpu.py"
    def PYTEST_K "grouped_mm and not compile and not inductor"
    fam_steps="build gtests sanitize bench tests" ;;
  grouped_triton)  # the grouped GEMM beside Inductor's Triton grouped GEMM (11 cases, each kind)
    def CMAKE_ARGS "-DFLY_FAMILIES=topk;grouped_gemm"; def PIP 0
    def BENCH "grouped_gemm"; def BENCH_ARGS "--lib @B/libflykernels.so --triton --cases 0,3,6,8,12,14,16,18,19,21,23"
    fam_steps="build bench" ;;
  mx_widen)  # the BF16-widening MX GEMM: forced tests, sanitizers per variant, the suite beside cuBLAS
    def BUILD_DIR "build-mxwiden"; def CMAKE_ARGS "-DFLY_FAMILIES=mx_quantize;mxfp"; def MATCH "$mx_match"; def PIP 0
    def BUILD_TARGETS "flykernels fly_gpu_tests fly_gpu_subset flybench"
    def GTEST_TAGS "[mx]"; def FLY_TEST_VARIANTS '^mxfp_(widen|wgmma_n128_f0_p2_s4)|^mx_quantize'; export FLY_TEST_VARIANTS
    def SAN_TOOLS "memcheck racecheck synccheck"
    def SAN_SUBSET "$(for v in ${VARIANTS:-$mx_swapped} mx_quantize_t256_hw1; do printf -- '--only %s ' "$v"; done)"
    def BENCH "mxfp"
    def BENCH_ARGS "--flybench @B/flybench --reps 10 $(for v in ${VARIANTS:-$mx_swapped}; do printf -- '--variant %s ' "$v"; done)"
    fam_steps="build gtests sanitize bench" ;;
  mx_widen_repeat)  # the widening kernel's GPU tests 8 times (an intermittent mismatch), sanitizers, 2 shapes
    def BUILD_DIR "build-mxwiden"; def CMAKE_ARGS "-DFLY_FAMILIES=mx_quantize;mxfp"; def MATCH "$mx_match"; def PIP 0
    def BUILD_TARGETS "flykernels fly_gpu_tests fly_gpu_subset flybench"
    def GTEST_TAGS "[mx][gemm]"; def GTEST_REPEAT 8
    def FLY_TEST_VARIANTS '^mxfp_widen_n128$'; export FLY_TEST_VARIANTS  # '^mxfp_widen_n128_ov0$': the probe
    def SAN_TOOLS "memcheck racecheck synccheck"; def SAN_SUBSET "--only mxfp_widen_n128 --only mxfp_widen_n128_ov0"
    def FLYBENCH_ARGS "mxfp --suite bench/probes/mxfp/mx_two.json"; def FLYBENCH_EXTRA "-"
    def FLYBENCH_VARIANTS "mxfp_widen_n128 mxfp_widen_n128_ov0 mxfp_wgmma_n128_f0_p2"
    fam_steps="build gtests sanitize flybench" ;;
  mx_splitk)  # the FP8 design's split-K variants: forced tests, sanitizers, flybench on the decode shapes
    def BUILD_DIR "build-mxsplit"; def CMAKE_ARGS "-DFLY_FAMILIES=mx_quantize;mxfp"; def PIP 0
    def MATCH '^(mx_quantize_t256_hw1|mxfp_gemm_m64_n64|mxfp_wgmma_n(32|64|128)_f0_p2(_s[248])?)$'
    def BUILD_TARGETS "flykernels fly_gpu_tests fly_gpu_subset flybench"
    def GTEST_TAGS "[mx][gemm]"; def FLY_TEST_VARIANTS '_s[248]$|^mxfp_wgmma_n128_f0_p2$|^mxfp_gemm_m64_n64$'; export FLY_TEST_VARIANTS
    def SAN_TOOLS "memcheck racecheck initcheck"
    def SAN_SUBSET "topk $(for v in $mx_splits; do printf -- '--only %s ' "$v"; done)"
    def FLYBENCH_ARGS "mxfp --suite bench/probes/mxfp/mx_decode.json"; def FLYBENCH_VARIANTS "$mx_splits"
    fam_steps="build gtests sanitize flybench" ;;
  mx_quant)  # the quantizer: ncu of the shipped one, then QVARIANTS timed beside it, the bit-exact test
    def BUILD_DIR "build-mxq"; def CMAKE_ARGS "-DFLY_FAMILIES=mx_quantize;mxfp"; def PIP 0
    def MATCH '^(mx_quantize_t256_hw1.*|mxfp_widen_n128)$'; def BUILD_TARGETS "flykernels fly_gpu_tests flybench"
    def NCU_ARGS "--clock-control none -k regex:mx_quantize -s 2 -c 4 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats"
    def FLYBENCH_ARGS "mxfp --suite bench/probes/mxfp/mx_quant3.json"
    def FLYBENCH_EXTRA "$(for v in ${QVARIANTS:-mx_quantize_t256_hw1 mx_quantize_t256_hw1_pf1}; do printf -- '--quant-variant %s;' "$v"; done)"
    def GTEST_TAGS "[mx][quantize]"; def FLY_TEST_VARIANTS '^mx_quantize'; export FLY_TEST_VARIANTS
    fam_steps="build flybench gtests" ;;
  mx_decode)  # the weight-only MX decode: CPU and stand-in tests, GPU tests, four sanitizers over every
    # bundled variant (fly_gpu_subset mx), the probe beside cuBLAS BF16 (its default shapes and M)
    def BUILD_DIR "build-mxdecode"; def CMAKE_ARGS "-DFLY_FAMILIES=mx_decode -DFLY_BUILD_TOOLS=OFF"; def PIP 0
    def BUILD_TARGETS "flykernels fly_cpu_tests fly_fake_driver_tests fly_gpu_tests fly_gpu_subset"
    def GTEST_TAGS "[mx_decode]"; def SAN_TOOLS "memcheck racecheck synccheck initcheck"; def SAN_SUBSET "mx"
    def BENCH "probes/mx_decode/mx_decode_probe.cpp"
    fam_steps="build cpu gtests sanitize bench" ;;
  mx_prefill)  # the weight-only MX prefill kernel (src/ops/mx.cpp kPrefillDispatch: forced only until this
    # passes): GPU tests [mx_prefill], memcheck / racecheck over its bundled variants (split and
    # persistent paths), each default variant beside cuBLAS BF16 at M 256 / 2048 on the Llama shapes
    def BUILD_DIR "build-mxdecode"; def CMAKE_ARGS "-DFLY_FAMILIES=mx_decode -DFLY_BUILD_TOOLS=OFF"; def PIP 0
    def BUILD_TARGETS "flykernels fly_cpu_tests fly_fake_driver_tests fly_gpu_tests fly_gpu_subset"
    def GTEST_TAGS "[mx_prefill]"; def SAN_TOOLS "memcheck racecheck"
    def SAN_SUBSET "$(for v in $mx_prefill; do printf -- '--only %s ' "$v"; done)"
    # (the probe's default shapes: the Llama projections; runs are comma-separated, so one M a run)
    def BENCH "probes/mx_decode/mx_decode_probe.cpp:$(for v in $mx_prefill; do f=${v#*_bf16_}; for m in 256 2048; do
      printf -- '--m+%s+--reps+8+--fmt+%s+--variant+%s,' "$m" "${f%%_*}" "$v"; done; done)"
    fam_steps="build cpu gtests sanitize bench" ;;
  moe_suite)  # the grouped GEMM on real MoE models' shapes (suites/moe.json) beside F.grouped_mm;
    # MOE_ARGS narrows it (e.g. "--phases decode"); the flybench step runs its row-mode cases
    def BUILD_DIR "build-grouped"; def CMAKE_ARGS "-DFLY_FAMILIES=grouped_gemm"; def PIP 0
    def BUILD_TARGETS "flykernels flybench"
    def FLYBENCH_ARGS "grouped_gemm --suite suites/moe.json --json $OUT/flybench_moe.json"
    def BENCH "grouped_gemm"; def BENCH_ARGS "--lib @B/libflykernels.so --suite moe ${MOE_ARGS:-}"
    fam_steps="build bench" ;;
  verify)  # code merged without a GPU: the packed-path tests with memcheck, ctest, the package's tests
    def GTEST_TAGS "[odd],$attn_packed"; def SAN_TOOLS "memcheck"; def SAN_FILTER "$attn_packed"
    fam_steps="build gtests sanitize ctest tests" ;;
  *) echo "unknown PROBE $PROBE (see bench/probes/README.md)"; exit 2 ;;
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
fb_runs() {  # the flybench step's runs, one line of extra arguments each
  local IFS=';' e
  [ "${FLYBENCH_EXTRA:-}" = "-" ] || for e in ${FLYBENCH_EXTRA:-""}; do echo "$e"; done  # "-": the variants only
  IFS=$' \t\n'
  local vs=${FLYBENCH_VARIANTS:-}
  [ -n "${FLYBENCH_VARIANTS_MATCH:-}" ] &&
    vs="$vs $(find "$B/gen" -name '*.cu' -printf '%f\n' 2>/dev/null | sed 's/\.cu$//' | grep -E "$FLYBENCH_VARIANTS_MATCH" | sort)"
  for v in $vs; do echo "--variant $v"; done
}
entry_runs() {  # `path:a+b,c` -> one line per run (`a b`, `c`); none -> one empty run
  local args=${1#*:}; [ "$args" = "$1" ] && { echo ""; return; }
  local IFS=, r; for r in $args; do echo "${r//+/ }"; done
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
      (cd /tmp && python3 -m pytest -q -rs -p no:cacheprovider -x ${PYTEST_ARGS:-} ${PYTEST_K:+-k "$PYTEST_K"} "${files[@]}") > "$OUT/pytest.log" 2>&1
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
          *.cpp|*.cpp:*)  # a standalone probe against the library: path under bench/, runs after ':'
            src=${b%%:*}; exe="$B/$(basename "${src%.cpp}")"
            # cuBLAS for the probes that time it beside ours (--as-needed: linked only where used)
            g++ -O2 -std=c++17 "bench/$src" -Iinclude -I/usr/local/cuda/include -Wl,--as-needed -L"$B" -lflykernels \
              -L/usr/local/cuda/lib64 -lcudart -lcublas -Wl,-rpath,"$Babs" -o "$exe" >> "$OUT/build.log" 2>&1 \
              || { echo "$src: build failed ($OUT/build.log)"; continue; }
            # shellcheck disable=SC2086  # a run's words
            while read -r a; do "$exe" $a; done < <(entry_runs "$b") 2>&1 | tee -a "$OUT/bench.log"
            ;;
          *.py|*.py:*)  # a probe or runner by its path under bench/, from the repository root, runs after ':'
            while read -r a; do
              # shellcheck disable=SC2086
              PYTHONUNBUFFERED=1 timeout ${BENCH_TIMEOUT:-600} python3 "bench/${b%%:*}" $a "${bargs[@]}" 2>&1 < /dev/null
            done < <(entry_runs "$b") | tee -a "$OUT/bench.log"
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
