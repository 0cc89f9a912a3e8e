#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The cp.async GEMM path (kernels/gemm/gemm_odd_sm90.cu) by load granule, beside torch.mm on the
same strided views and beside our TMA kernel on the aligned layout, in one process.

  python3 bench/probes/gemm/gemm_odd_granules.py --lib build/libflykernels.so [-M 4096 -N 4096 -K 4096]

For each layout (NT, NN, TN, TT) and each leading-dimension padding (extent + 0 with the cp.async
kernel forced: 16-byte copies; + 4: 8-byte; + 2: 4-byte; + 1: 2-byte lines, the shifted window),
A and B are views with that leading dimension; C is contiguous. Every call is checked against an
FP32 reference (C poisoned with NaN first), then ours and torch's are timed interleaved
(bench/timing.py: L2 flushed by a read before every call, rounds in a rotating order, medians).
The aligned rows also time our default (TMA) dispatch; the padded rows time the default dispatch
(the packed path: the operands copied to aligned lines in the workspace, then the TMA kernel)
beside the cp.async kernel forced."""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/
from timing import interleaved_us  # noqa: E402
from fly_abi import gemm_caller, load, max_rel_err  # noqa: E402


def view(rows, cols, row_major, extra, dt):
    inner, outer = (cols, rows) if row_major else (rows, cols)
    ld = inner + extra
    store = torch.randn(outer * ld, device="cuda", dtype=dt)
    return store.as_strided((rows, cols), (ld, 1) if row_major else (1, ld), 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("-M", type=int, default=4096)
    ap.add_argument("-N", type=int, default=4096)
    ap.add_argument("-K", type=int, default=4096)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--layouts", default="nt,nn,tn,tt")
    args = ap.parse_args()
    lib = load(args.lib)
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    odd = f"gemm_odd_{args.dtype}_bn128_st6".encode()
    M, N, K = args.M, args.N, args.K
    print(f"{args.dtype} M={M} N={N} K={K}: ratio = torch us / ours us")
    for layout in args.layouts.split(","):
        for extra, label in ((0, "16B"), (4, "8B"), (2, "4B"), (1, "2B")):
            torch.manual_seed(extra)
            a = view(M, K, layout[0] == "n", extra, dt)
            b = view(K, N, layout[1] == "n", extra, dt)
            c = torch.empty(M, N, device="cuda", dtype=dt)
            ref = a.float() @ b.float()
            ours = gemm_caller(lib, a, b, c)

            def forced():
                lib.fly_force_variant(odd)
                ours()

            def default():
                lib.fly_force_variant(None)
                ours()
            # extra 0: the cp.async kernel forced vs the TMA kernel; otherwise the default dispatch
            # (the packed path: aligned copies in the workspace, then the TMA kernel) vs the
            # cp.async kernel forced.
            checks = [("odd", forced), ("packed" if extra else "tma", default)]
            errs, variants = {}, {}
            for name, fn in checks:
                c.fill_(float("nan"))
                fn()
                variants[name] = lib.fly_last_variant().decode() + " (" + lib.fly_last_decision().decode() + ")"
                errs[name] = max_rel_err(c, ref)
            fns = checks + [("torch", lambda: torch.mm(a, b))]
            med = interleaved_us(fns, 3, reps=20, warm_ms=20.0)
            lib.fly_force_variant(None)
            main_fn = "packed" if extra else "odd"
            tflops = 2.0 * M * N * K / med[main_fn] / 1e6
            line = (f"{layout} ld+{extra} {label:3} {main_fn:6} {med[main_fn]:8.1f} us ({tflops:5.0f} TFLOP/s) "
                    f"torch {med['torch']:8.1f} us {med['torch'] / med[main_fn]:6.3f}x {variants[main_fn]}")
            if extra:
                line += f" | cp.async {med['odd']:8.1f} us {med['torch'] / med['odd']:6.3f}x"
            else:
                line += f" | TMA {med['tma']:8.1f} us (odd/TMA {med['odd'] / med['tma']:.2f})"
            line += " | err " + " ".join(f"{k} {v:.1e}" for k, v in errs.items())
            print(line, flush=True)
            if any(math.isnan(e) or e > 2e-2 for e in errs.values()):
                print("  WRONG", flush=True)
            del a, b, c, ref


if __name__ == "__main__":
    main()
