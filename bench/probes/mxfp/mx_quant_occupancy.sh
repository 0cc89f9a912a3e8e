#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The quantizer probes beside mx_quantize_t256_hw1: QVARIANTS (default the look-ahead _pf1; _o6 / _o8: __launch_bounds__ min
# blocks 6 / 8: 40 / 32 registers, with spills) on three suite shapes, flybench mxfp --quant-variant.
#   OUT=... bash bench/probes/mxfp/mx_quant_occupancy.sh   (carry .devdeps)
set -uo pipefail
out=${OUT:-./out-mxqo}; mkdir -p "$out"; b=build-mxq
bash tools/device_run.sh "$b" -DFLY_FAMILIES="mx_quantize;mxfp" -DFLY_ALL_VARIANTS=ON \
  -DFLY_VARIANT_MATCH="^(mx_quantize_t256_hw1.*|mxfp_widen_n128)$" >/dev/null 2>&1
ninja -C "$b" -j16 flybench fly_gpu_tests >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
echo '{"cases": [{"M": 4096, "N": 4096, "K": 4096}, {"M": 2048, "N": 14336, "K": 4096}, {"M": 4096, "N": 28672, "K": 8192}]}' >/tmp/q3.json
for v in ${QVARIANTS:-mx_quantize_t256_hw1 mx_quantize_t256_hw1_pf1}; do
  echo "== $v"; timeout 60 "./$b/flybench" mxfp --suite /tmp/q3.json --quant-variant $v 2>&1 | grep -E "^mxfp" | awk '{print $1,$2,$3,$4,$8,$9}'
done | tee "$out/quant.txt"
FLY_TEST_VARIANTS='^mx_quantize' timeout 100 "./$b/test/fly_gpu_tests" "[mx][quantize]" 2>&1 | tail -2 | tee -a "$out/quant.txt"
