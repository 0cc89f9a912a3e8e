#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How a GEMM's time moves over the first few hundred back-to-back calls (the GPU clock settling
under its power limit), per variant and for torch.mm, on one NT bf16 shape.

  python3 bench/probes/gemm/clock_probe.py --lib build/libflykernels.so -M 8192 -N 8192 -K 8192 VARIANT...

Each series starts after --cool seconds idle, then times --calls calls (L2 flushed by a read
before each, CUDA events) and prints the median of each window of calls: the first numbers are a
cold GPU's, the last a sustained run's. A second pass alternates the series without cooling.
"""
import argparse
import time

import torch

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/: fly_abi, timing
import timing  # noqa: E402
from fly_abi import add_nt_args, force_variant, gemm_caller, load, nt_problem  # noqa: E402

WINDOWS = [(0, 5), (5, 15), (15, 30), (30, 60), (60, 120), (120, 250), (250, 400)]


def series(fn, calls):
    ts = timing.timed_calls(fn, calls)
    out = []
    for a, b in WINDOWS:
        w = sorted(ts[a:min(b, calls)])
        if w:
            out.append(w[len(w) // 2])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_nt_args(ap)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--cool", type=float, default=2.0)
    ap.add_argument("variants", nargs="+")
    a = ap.parse_args()
    lib = load(a.lib)
    x, w, c = nt_problem(a.M, a.N, a.K)
    b = w.t()
    fly = gemm_caller(lib, x, b, c)

    def force(name):
        force_variant(lib, None if name == "torch.mm" else name)

    runs = [("torch.mm", lambda: torch.mm(x, b))] + [(v, fly) for v in a.variants]
    for name, fn in runs:  # load every module first
        force(name)
        fn()
    torch.cuda.synchronize()
    print(f"{a.M}x{a.N}x{a.K} NT bf16; window medians (us) over calls " + " ".join(f"{p}-{q}" for p, q in WINDOWS))
    for label, cool in (("cooled", a.cool), ("back-to-back", 0.0)):
        print(f"-- {label}")
        for name, fn in runs:
            force(name)
            time.sleep(cool)
            print(f"{name:44s} " + " ".join(f"{t:8.1f}" for t in series(fn, a.calls)), flush=True)
    force_variant(lib, None)


if __name__ == "__main__":
    main()
