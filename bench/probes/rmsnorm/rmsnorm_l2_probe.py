#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What the RMSNorm output's L2 policy does, measured several ways (bf16 8192x4096 by default).

Calls fly_rms_norm_fwd through the C ABI (ctypes) of the library given by --lib, so two builds
(for example the default, evict_last stores, and one configured with
-DFLY_NVCC_FLAGS=-DFLY_ST_EVICT_FIRST) can be compared by running this script on each, in turn.

Cases (CUDA events, median, bench/timing.py's read flush where it says "flush"):
  same      flush, then the call, always into the same x and y (flybench's method)
  rotated   flush, then the call on one of 4 (x, y) pairs in turn: the y lines left in L2 by the
            previous call are not this call's
  stream    20 back-to-back calls over 8 (x, y) pairs (1 GiB), no flush, one event pair: the
            write-back that one call leaves behind is paid by the next, so this is the sustained
            rate
  copy      y.copy_(x) (a cudaMemcpy-class copy of the same bytes), "same" and "stream" ways
  graph     the two "stream" cases captured in a CUDA graph (no host launch gaps)
  +mm       flush, then the norm and a GEMM that reads its output (y[M,N] @ W[N,N]^T, torch.mm):
            the time of the pair, and the GEMM's alone after the norm
  mm after  flush, the norm, then a GEMM on unrelated operands (4096^3): does the norm's
            output, kept in L2, slow the next kernel down?
"""
import argparse
import ctypes
import statistics

import torch

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/: fly_abi, timing
import timing  # noqa: E402
from fly_abi import desc, load  # noqa: E402

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="path to libflykernels.so")
    ap.add_argument("--label", default="")
    ap.add_argument("-M", type=int, default=8192)
    ap.add_argument("-N", type=int, default=4096)
    a = ap.parse_args()
    lib = load(a.lib)
    M, N = a.M, a.N
    dev = "cuda"
    torch.manual_seed(0)
    xs = [torch.randn(M, N, device=dev, dtype=torch.bfloat16) for _ in range(8)]
    ys = [torch.empty_like(xs[0]) for _ in range(8)]
    w = torch.randn(N, device=dev, dtype=torch.bfloat16)
    rstd = torch.empty(M, device=dev, dtype=torch.float32)
    wd, rd = desc(w), desc(rstd)
    xd = [desc(x) for x in xs]
    yd = [desc(y) for y in ys]
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def norm_on(i, st):
        r = lib.fly_rms_norm_fwd(ctypes.byref(xd[i]), ctypes.byref(wd), ctypes.c_double(1e-5),
                                 ctypes.byref(yd[i]), ctypes.byref(rd), st)
        if r != 0:
            raise RuntimeError(lib.fly_get_last_error().decode())

    def norm(i=0):
        norm_on(i, stream)

    # Correctness first, against an FP32 reference on these random inputs.
    norm(0)
    ref = torch.nn.functional.rms_norm(xs[0].float(), (N,), w.float(), 1e-5)
    err = (ys[0].float() - ref).abs().max().item()
    assert err < 0.05, f"max abs error {err}"

    bytes_moved = 2 * M * N * 2
    out = {}
    out["same"] = timing.time_us(lambda: norm(0), reps=60)
    k = [0]

    def rot():
        k[0] = (k[0] + 1) % 4
        norm(k[0])
    out["rotated"] = timing.time_us(rot, reps=60)

    # Per-call time of 20 calls issued back to back (run20 issues them), median of 15.
    def per_call(run20):
        s = []
        for _ in range(15):
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            run20()
            e1.record()
            e1.synchronize()
            s.append(e0.elapsed_time(e1) * 1000 / 20)
        return statistics.median(s)

    def back_to_back(fn):
        def run20():
            for i in range(20):
                fn(i % 8)
        return per_call(run20)
    out["stream"] = back_to_back(norm)
    # The same pattern for a device-to-device copy of the same bytes: the sustained baseline.
    out["copy same"] = timing.time_us(lambda: ys[0].copy_(xs[0]), reps=60)
    out["copy stream"] = back_to_back(lambda i: ys[i].copy_(xs[i]))

    # The back-to-back cases again from CUDA graphs of the 20 calls: no host launch gaps.
    def graph_of(fn):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            st = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            for i in range(20):
                fn(i % 8, st)
        return g

    for key, fn in (("stream graph", norm_on), ("copy stream graph", lambda i, st: ys[i].copy_(xs[i]))):
        try:
            g = graph_of(fn)
            g.replay()
            out[key] = per_call(g.replay)
        except Exception as e:  # capture is a measurement aid here, not a feature under test
            print(f"{key}: capture failed: {e}")

    W = torch.randn(N, N, device=dev, dtype=torch.bfloat16) / N ** 0.5
    out["norm+mm"] = timing.time_us(lambda: (norm(0), torch.mm(ys[0], W.t())), reps=40)

    def timed_after(pre, fn, reps=40):
        ts = []
        for _ in range(reps):
            timing.flush_l2()
            pre()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1000)
        return statistics.median(ts)
    out["mm(y) after norm"] = timed_after(lambda: norm(0), lambda: torch.mm(ys[0], W.t()))
    A = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    B = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    out["mm 4096^3 after norm"] = timed_after(lambda: norm(0), lambda: torch.mm(A, B))
    out["mm 4096^3 after flush"] = timed_after(lambda: None, lambda: torch.mm(A, B))
    out["F.rms_norm same"] = timing.time_us(
        lambda: torch.nn.functional.rms_norm(xs[0], (N,), w, 1e-5), reps=60)

    copy_bw = 4.23e12
    for key, us in out.items():
        tbs = bytes_moved / (us * 1e-6) / 1e12 if key in ("same", "rotated", "stream", "copy same", "copy stream", "stream graph", "copy stream graph") else None
        extra = f"  {tbs:.3f} TB/s = {100 * tbs * 1e12 / copy_bw:.1f}% of 4.23 TB/s" if tbs else ""
        print(f"{a.label:14s} {key:24s} {us:9.2f} us{extra}")


if __name__ == "__main__":
    main()
