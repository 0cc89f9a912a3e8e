#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Training shapes for a denser GEMM tuning database (issue 25): gemm_random.py's distribution
drawn from seeds disjoint from the benchmark's (default 101..), written as one flytune suite per
(dtype, layout), so `flytune gemm --quick --suite <file> --dtype D --layouts L` tunes exactly them.

  python3 bench/probes/gemm/gemm_train_shapes.py --out /tmp/train [--seeds 101-108] [--per-seed 25]
      [--max-tflop 1.0]

TN / TT shapes get M rounded up to a multiple of 8 (A column-major with lda = M: the TMA kernel's
own shape, not the packed path's copy). Shapes over --max-tflop are redrawn (tuning time); the
benchmark's seeds 1..100 are never used here, so gemm_random.py on them stays a held-out test.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/
try:
    from gemm_random import draw_shapes  # noqa: E402
except ImportError:  # no torch here (draw_shapes itself needs none): the drawing only
    import types
    for name in ("torch", "timing", "fly_abi", "gemm_torch"):
        sys.modules.setdefault(name, types.SimpleNamespace(interleaved_us=None, gemm_caller=None, load=None,
                                                           max_rel_err=None, geomean=None, make_operands=None))
    from gemm_random import draw_shapes  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", default="101-108")
    ap.add_argument("--per-seed", type=int, default=25)
    ap.add_argument("--max-tflop", type=float, default=1.0)
    ap.add_argument("--max-gib", type=float, default=8.0)
    args = ap.parse_args()
    lo, _, hi = args.seeds.partition("-")
    seeds = range(int(lo), int(hi or lo) + 1)
    if min(seeds) <= 100:
        sys.exit("--seeds: 1..100 are the benchmark's held-out seeds")
    os.makedirs(args.out, exist_ok=True)
    suites = {}
    for seed in seeds:
        for s in draw_shapes(seed, args.per_seed, args.max_gib, args.max_tflop):
            M = s["M"]
            if s["layout"][0] == "t":
                M = (M + 7) // 8 * 8
            cases = suites.setdefault((s["dtype"], s["layout"]), [])
            if not any(c["M"] == M and c["N"] == s["N"] and c["K"] == s["K"] for c in cases):
                cases.append({"M": M, "N": s["N"], "K": s["K"]})
    for (dt, lay), cases in sorted(suites.items()):
        path = os.path.join(args.out, f"{dt}_{lay}.json")
        json.dump({"op": "gemm", "dtype": dt, "note": f"training shapes, seeds {args.seeds}", "cases": cases},
                  open(path, "w"), indent=1)
        print(f"{path}: {len(cases)} shapes")


if __name__ == "__main__":
    main()
