# SPDX-License-Identifier: Apache-2.0
"""Which cuBLAS kernel torch.mm runs on each GEMM suite shape, with its launch shape (grid, block,
shared memory, registers) from the profiler trace: what our variants are up against.
Usage: python3 bench/probes/gemm/cublas_kernels.py [--layouts nt,nn] [--suite suites/gemm_bf16.json]"""
import argparse
import json
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile


def operands(m, n, k, layout, dt):
    a = torch.randn(m, k, device="cuda", dtype=dt) if layout[0] == "n" else torch.randn(k, m, device="cuda", dtype=dt).t()
    b = torch.randn(k, n, device="cuda", dtype=dt) if layout[1] == "n" else torch.randn(n, k, device="cuda", dtype=dt).t()
    return a, b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="suites/gemm_bf16.json")
    ap.add_argument("--layouts", default="nt")
    args = ap.parse_args()
    cases = json.load(open(args.suite))["cases"]
    for layout in args.layouts.split(","):
        for c in cases:
            m, n, k = c["M"], c["N"], c["K"]
            a, b = operands(m, n, k, layout, torch.bfloat16)
            for _ in range(3):
                torch.mm(a, b)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                torch.mm(a, b)
                torch.cuda.synchronize()
            path = os.path.join(tempfile.mkdtemp(), "t.json")
            prof.export_chrome_trace(path)
            for ev in json.load(open(path))["traceEvents"]:
                if ev.get("cat") != "kernel":
                    continue
                g = ev.get("args", {})
                print(f"{layout} {m}x{n}x{k}: {ev['name'][:90]} grid={g.get('grid')} block={g.get('block')} "
                      f"smem={g.get('shared memory')} regs={g.get('registers per thread')} dur={ev.get('dur')}us",
                      flush=True)


if __name__ == "__main__":
    main()
