#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Times chosen GEMM variants on one shape through the library's C ABI (forced with
fly_force_variant), beside torch.mm, after checking each against an FP32 reference.

  python3 bench/probes/gemm/gemm_probe.py --lib build-tune/libflykernels.so -M 128 -N 6144 -K 4096 \
      gemm_bf16_bn64_st7_sw0_mc1_e1 gemm_bf16_bn64_st7_sw0_mc1_e1_sk1

NT layout (A[M,K] row-major, B = W^T with W[N,K] row-major), bf16. Timing: bench/timing.py (L2
flushed by a read before every call, CUDA events, median). fly_gemm gets a zero-filled workspace of
fly_gemm_workspace_size bytes (stream-K variants use it). --profile R: after the timing, R more
calls of each variant with no flush, for ncu (--kernel-name fly_gemm_sm90); --no-time skips
the timing then. The name `torch.mm` among the variants runs cuBLAS the same way (writing
c), for an ncu comparison in one process; `db` runs the database's choice.
"""
import argparse

import torch

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/: fly_abi, timing
import timing  # noqa: E402
from fly_abi import add_nt_args, force_variant, gemm_caller, load, nt_problem, poisoned_err  # noqa: E402

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_nt_args(ap)
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--no-time", action="store_true", help="skip the timing (with --profile, for ncu)")
    ap.add_argument("variants", nargs="+")
    a = ap.parse_args()
    lib = load(a.lib)
    x, w, c = nt_problem(a.M, a.N, a.K)
    b = w.t()  # [K, N], column-major: NT
    ref = (x.float() @ w.float().t())
    call = gemm_caller(lib, x, b, c)

    floor_us = a.N * a.K * 2 / 4.2e6
    base = float("nan") if a.no_time else timing.time_us(lambda: torch.mm(x, b))
    print(f"{a.M}x{a.N}x{a.K}  torch.mm {base:8.2f} us   (weights at 4.2 TB/s: {floor_us:.2f} us)")
    for v in a.variants:
        try:
            force_variant(lib, None if v in ("torch.mm", "db") else v)
        except RuntimeError as e:
            print(f"{v:44s} not bundled: {e}")
            continue
        fn = (lambda: torch.mm(x, b, out=c)) if v == "torch.mm" else call
        try:
            err = poisoned_err(fn, c, ref)
            t = float("nan") if a.no_time else timing.time_us(fn)
            if v == "db":
                v = "db " + lib.fly_last_variant().decode()
            print(f"{v:44s} {t:8.2f} us  {base / t:6.3f}x torch.mm  max rel err {err:.2e}")
            for _ in range(a.profile):
                fn()
            torch.cuda.synchronize()
        except RuntimeError as e:
            print(f"{v:44s} refused: {e}")
    force_variant(lib, None)


if __name__ == "__main__":
    main()
