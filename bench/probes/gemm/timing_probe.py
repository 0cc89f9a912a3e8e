#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where a GEMM's event-timed microseconds go, FlyKernels (C ABI, ctypes) beside torch.mm, NT bf16:
the CUDA-event median as bench/timing.py takes it, the kernels' own durations from the profiler
(summed per call, the flush excluded), and the host time of one call; with torch.randn operands
and with uniform(-1, 1) ones (flybench's).

  python3 bench/probes/gemm/timing_probe.py --lib build/libflykernels.so 64x4096x4096 2048x14336x4096
"""
import argparse
import time

import torch

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/: fly_abi, timing
import timing  # noqa: E402
from fly_abi import gemm_caller, load  # noqa: E402


def kernel_us(fn, calls=30):
    per = {}
    for _, us, name in timing.profiled_kernels(fn, calls):
        per.setdefault(name, []).append(us)
    total = sum(sum(v) for v in per.values()) / calls
    names = ", ".join(f"{n[:40]} x{len(v) / calls:.0f}" for n, v in per.items())
    return total, names


def host_us(fn, calls=200):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("shapes", nargs="+")
    a = ap.parse_args()
    lib = load(a.lib)
    for shape in a.shapes:
        M, N, K = (int(x) for x in shape.split("x"))
        for data in ("randn", "uniform"):
            torch.manual_seed(0)
            if data == "randn":
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
            else:
                x = torch.rand(M, K, device="cuda", dtype=torch.bfloat16) * 2 - 1
                w = torch.rand(N, K, device="cuda", dtype=torch.bfloat16) * 2 - 1
            b = w.t()
            c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            fly = gemm_caller(lib, x, b, c)

            for name, fn in (("fly", fly), ("torch.mm", lambda: torch.mm(x, b))):
                fn()
                ev = timing.time_us(fn, 30)
                ev_warm = timing.time_us(fn, 30, warm_ms=30)
                k, names = kernel_us(fn)
                h = host_us(fn)
                print(f"{shape:16s} {data:7s} {name:8s} events {ev:8.1f}  events+warm {ev_warm:8.1f}  kernels {k:8.1f}"
                      f"  host/call {h:6.1f} us   [{names}]", flush=True)
            print(f"{'':16s} fly variant: {lib.fly_last_variant().decode()}")


if __name__ == "__main__":
    main()
