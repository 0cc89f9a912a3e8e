#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GPU kernel durations (torch.profiler / CUPTI) of our GEMM and cuBLAS's on suite shapes, with the
L2 warm (back-to-back calls on the same operands) and cold (a 256 MiB read flush before each call):
what each kernel costs without launch gaps or event overhead, and how much of it is the first read
of the operands from DRAM.

  python3 bench/probes/gemm/kernel_times.py --lib build/libflykernels.so [--suite suites/gemm_bf16.json]
                                [--layouts nt] [--min-m 1] [--max-m 512] [--calls 20] [--force V1,V2,..]

Per shape, layout and mode, the median duration of the GPU kernels each call launched (ours:
names starting fly_gemm; cuBLAS: every other kernel torch.mm launched, split-K reductions
included, summed per call). --force adds a row per named variant (forced with fly_force_variant;
skipped where it cannot take the shape) after the database's pick.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/: fly_abi, timing
import timing  # noqa: E402
from fly_abi import add_suite_args, force_variant, gemm_caller, load, suite_cases  # noqa: E402
from gemm_torch import make_operands  # noqa: E402


def per_call_us(fn, calls, flush):
    """Median over `calls` calls of the summed duration of the kernels one call of fn launches, and
    the first kernel's name. Each call launches the same number of kernels (cuBLAS's split-K GEMM
    and its reduction are two), so consecutive groups of that many are one call each."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    marks = timing.profiled_kernels(fn, calls, flush)
    if not marks:
        return float("nan"), ""
    k = max(1, len(marks) // calls)
    per = sorted(sum(m[1] for m in marks[j:j + k]) for j in range(0, len(marks) - k + 1, k))
    return per[len(per) // 2], marks[0][2][:60]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_suite_args(ap, "nt", 512)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--force", default="", help="comma-separated variants to time beside the pick")
    a = ap.parse_args()
    lib = load(a.lib)
    cases = suite_cases(a)
    print("kernel durations (us), median per call; warm: back-to-back, cold: L2 flushed before each call")
    print(f"{'layout':6s} {'shape':>16s} {'ours warm':>10s} {'cuBLAS warm':>12s} {'ours cold':>10s} "
          f"{'cuBLAS cold':>12s}  cold ratio  kernels")
    for layout in a.layouts.split(","):
        for M, N, K in cases:
            x, b = make_operands(M, N, K, layout, torch.bfloat16)
            c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            ours = gemm_caller(lib, x, b, c)
            cub = lambda: torch.mm(x, b, out=c)  # noqa: E731
            cw, cname = per_call_us(cub, a.calls, False)
            cc, _ = per_call_us(cub, a.calls, True)
            for forced in [None] + [v for v in a.force.split(",") if v]:
                force_variant(lib, forced)
                try:
                    ours()
                except RuntimeError:
                    continue  # this variant cannot take the shape
                torch.cuda.synchronize()
                variant = lib.fly_last_variant().decode() + (" (forced)" if forced else "")
                ow, _ = per_call_us(ours, a.calls, False)
                oc, _ = per_call_us(ours, a.calls, True)
                print(f"{layout:6s} {f'{M}x{N}x{K}':>16s} {ow:10.2f} {cw:12.2f} {oc:10.2f} {cc:12.2f}  "
                      f"{cc / oc:9.3f}x  {variant} | {cname}", flush=True)
            force_variant(lib, None)


if __name__ == "__main__":
    main()
