#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A/B of two builds of the library on the GEMM suite: each build's own database pick (or a forced
variant) per shape, beside torch.mm, timed interleaved in one process.

  python3 bench/probes/gemm/ab_libs.py --a build-old/libflykernels.so --b build/libflykernels.so
                           [--suite suites/gemm_bf16.json] [--layouts nt] [--min-m 1] [--max-m 1e9]
                           [--rounds 5] [--dtype bf16] [--force VARIANT]

For a kernel change that keeps the variant names (the same database rows, new code): build the
old tree in one directory and the new in another, then run this. Both libraries live in the
process side by side (ctypes loads each with RTLD_LOCAL, so each binds its own symbols; the paths
must differ). Each contender is checked against an FP32 reference first. Timing: bench/timing.py
interleaved_us (ROUNDS rounds in a rotating order, ~30 ms of back-to-back calls before each
timing, the L2 flushed by a read before every call, median over the rounds). Prints per shape the
three times, each build's ratio to torch.mm and b's speedup over a, then the geometric means.
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/: fly_abi, timing
import timing  # noqa: E402
from fly_abi import force_variant, gemm_caller, load, poisoned_err  # noqa: E402
from gemm_torch import geomean, make_operands  # noqa: E402


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="libflykernels.so of build A (the reference)")
    ap.add_argument("--b", required=True, help="libflykernels.so of build B (the candidate)")
    ap.add_argument("--suite", default=os.path.join(here, "..", "..", "..", "suites", "gemm_bf16.json"))
    ap.add_argument("--layouts", default="nt")
    ap.add_argument("--min-m", type=int, default=1)
    ap.add_argument("--max-m", type=int, default=1 << 30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--force", default=None, help="force this variant in both builds (shapes it refuses are skipped)")
    a = ap.parse_args()
    if os.path.realpath(a.a) == os.path.realpath(a.b):
        sys.exit("--a and --b are the same file: the loader would return one library twice")
    libs = {"a": load(os.path.abspath(a.a)), "b": load(os.path.abspath(a.b))}
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    cases = [c for c in json.load(open(a.suite))["cases"] if a.min_m <= c["M"] <= a.max_m]
    print(f"{a.dtype}, {a.rounds} rounds interleaved, ~30 ms warm-up, read flush; us (ratio: torch.mm / it)")
    ratios = {"a": [], "b": [], "b/a": []}
    failed = 0
    for layout in [l for l in a.layouts.split(",") if l]:
        for c in cases:
            M, N, K = c["M"], c["N"], c["K"]
            torch.manual_seed(0)
            x, w = make_operands(M, N, K, layout, dtype)
            y = torch.empty(M, N, device="cuda", dtype=dtype)
            ref = x.float() @ w.float()
            contenders = [("torch.mm", lambda: torch.mm(x, w, out=y))]
            picks = {}
            for tag, lib in libs.items():
                if a.force:
                    force_variant(lib, a.force)
                call = gemm_caller(lib, x, w, y)
                try:
                    err = poisoned_err(call, y, ref)
                except RuntimeError as e:  # a forced variant that cannot take the shape
                    if not a.force:
                        raise
                    print(f"{layout} {M}x{N}x{K} {tag}: skipped ({e})")
                    continue
                picks[tag] = lib.fly_last_variant().decode()
                if not err < 2e-2:
                    print(f"{layout} {M}x{N}x{K} {tag} ({picks[tag]}): WRONG (max rel err {err:.3g})")
                    failed += 1
                    continue
                contenders.append((tag, call))
            if len(contenders) == 1:
                continue
            med = timing.interleaved_us(contenders, a.rounds, warm_ms=30.0)
            base = med["torch.mm"]
            cells = "  ".join(f"{k} {t:8.1f} ({base / t:.3f}x)" for k, t in med.items())
            sp = med["a"] / med["b"] if "a" in med and "b" in med else float("nan")
            print(f"{layout} {M:5d}x{N:5d}x{K:5d}  {cells}  b/a {sp:.3f}  [a {picks.get('a')}, b {picks.get('b')}]", flush=True)
            for k in ("a", "b"):
                if k in med:
                    ratios[k].append(base / med[k])
            if not math.isnan(sp):
                ratios["b/a"].append(sp)
    for k, rs in ratios.items():
        if rs:
            what = "speedup of b over a" if k == "b/a" else f"{k} vs torch.mm"
            print(f"geomean {what}: {geomean(rs):.3f}x over {len(rs)} shapes (min {min(rs):.3f}x)")
    if failed:
        sys.exit(f"{failed} wrong results")


if __name__ == "__main__":
    main()
