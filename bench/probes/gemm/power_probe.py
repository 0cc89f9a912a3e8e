#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Sustained GEMM: time per call, SM clock, board power and energy per call, for torch.mm and
chosen FlyKernels variants on one NT bf16 shape (a dev probe: do our kernels run at a lower clock
than cuBLAS's under the power limit, and why?).

  python3 bench/probes/gemm/power_probe.py --lib build/libflykernels.so -M 8192 -N 8192 -K 8192 VARIANT...

Each contender runs back-to-back (no flush: as a layer's GEMMs do) for --seconds after --cool
seconds idle, while `nvidia-smi` samples the SM clock, power and temperature every 50 ms; the
figures are over the second half of the window (the settled state).
"""
import argparse
import subprocess
import time

import torch

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/: fly_abi, timing
from fly_abi import add_nt_args, force_variant, gemm_caller, load, nt_problem  # noqa: E402

QUERY = "clocks.sm,power.draw,temperature.gpu"


def sustained(fn, seconds):
    """(us per call, [(clock MHz, power W, temp C)] over the second half) for fn run back-to-back."""
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
    t0 = time.perf_counter()
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    half = False
    calls = 0
    while True:
        for _ in range(8):
            fn()
        torch.cuda.synchronize()
        now = time.perf_counter() - t0
        if not half and now >= seconds / 2:
            half, calls = True, 0
            e0.record()
        elif half:
            calls += 8
        if now >= seconds:
            break
    e1.record()
    e1.synchronize()
    smi.terminate()
    out, _ = smi.communicate()
    rows = []
    for line in out.strip().splitlines():
        try:
            rows.append(tuple(float(x) for x in line.split(",")))
        except ValueError:
            pass
    rows = rows[len(rows) // 2:]
    return e0.elapsed_time(e1) * 1000.0 / max(calls, 1), rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_nt_args(ap)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--cool", type=float, default=3.0)
    ap.add_argument("--data", choices=("randn", "uniform"), default="randn",
                    help="operand values: torch.randn, or uniform(-1, 1) as flybench and flytune fill them")
    ap.add_argument("variants", nargs="+")
    a = ap.parse_args()
    lib = load(a.lib)
    x, w, c = nt_problem(a.M, a.N, a.K)
    if a.data == "uniform":
        x.uniform_(-1.0, 1.0)
        w.uniform_(-1.0, 1.0)
    b = w.t()
    fly = gemm_caller(lib, x, b, c)
    flop = 2.0 * a.M * a.N * a.K
    print(f"{a.M}x{a.N}x{a.K} NT bf16 ({a.data}), {a.seconds:.0f} s back-to-back each, settled half:")
    print(f"{'contender':44s} {'us/call':>9} {'TFLOP/s':>8} {'SM MHz':>7} {'W':>6} {'C':>4} {'mJ/call':>8}")
    for name in ["torch.mm"] + a.variants:
        try:
            force_variant(lib, None if name == "torch.mm" else name)
        except RuntimeError as e:
            print(f"{name:44s} not bundled: {e}")
            continue
        fn = (lambda: torch.mm(x, b)) if name == "torch.mm" else fly
        fn()
        torch.cuda.synchronize()
        time.sleep(a.cool)
        us, rows = sustained(fn, a.seconds)
        if not rows:
            print(f"{name:44s} {us:9.1f} (no nvidia-smi samples)")
            continue
        mhz, watts, temp = (sum(r[i] for r in rows) / len(rows) for i in range(3))
        print(f"{name:44s} {us:9.1f} {flop / us / 1e6:8.0f} {mhz:7.0f} {watts:6.0f} {temp:4.0f} {watts * us / 1e3:8.2f}",
              flush=True)
    force_variant(lib, None)


if __name__ == "__main__":
    main()
