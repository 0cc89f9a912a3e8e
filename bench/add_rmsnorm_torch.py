#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""RMSNorm with a fused residual add through PyTorch: flykernels::add_rms_norm (libflykernels'
add_rmsnorm family) against what models run, on the shapes of the e2e models, in one process.
Checked against FP64 before timing.

  python bench/add_rmsnorm_torch.py [--json FILE] [--reps 30] [--rounds 3]

Contenders, forward: "hf" is Hugging Face's decoder-layer composition (h = residual + x, then
LlamaRMSNorm as separate FP32 ops: cast, pow, mean, add, rsqrt, mul, cast, weight mul), "torch"
the add and PyTorch's fused F.rms_norm (two kernels). Backward: the fused op's own backward
(dx and dweight from dy, dh, h, rstd) against autograd through each composition (its forward
timed alone and subtracted, so both sides count the backward's kernels only).
Shapes: Llama-3.1-8B (hidden 4096) at 4096 prefill / training tokens and decode batch 32;
Qwen3-30B-A3B (hidden 2048) at 8192 tokens; Llama-3.1-70B (hidden 8192) at 4096 tokens. bf16.
Reported: medians (CUDA events, L2 flushed before each call, bench/timing.py), ratio = stock /
ours, and the fraction of HBM bandwidth ours reaches (bytes moved / time / --peak-tbs): forward
reads x, residual and writes h, y (4 M N elements); backward reads dy, dh, h and writes dx."""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import hbm_peak_tbs, interleaved_us  # noqa: E402

CASES = [  # label, rows, N
    ("llama8b prefill 4096", 4096, 4096),
    ("llama8b train 2x2048", 4096, 4096),
    ("llama8b decode 32", 32, 4096),
    ("qwen3moe prefill 4x2048", 8192, 2048),
    ("llama70b prefill 4096", 4096, 8192),
]
EPS = 1e-5


def hf(x, r, w):
    h = r + x
    hf32 = h.to(torch.float32)
    y = hf32 * torch.rsqrt(hf32.pow(2).mean(-1, keepdim=True) + EPS)
    return w * y.to(h.dtype), h


def torch_ops(x, r, w):
    h = x + r
    return F.rms_norm(h, (h.shape[-1],), w, EPS), h


def check(rows, n):
    x, r = (torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = (torch.rand(n, device="cuda") + 0.5).to(torch.bfloat16)
    h64 = x.double() + r.double()
    y64 = h64 * torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + EPS) * w.double()
    y, h = torch.ops.flykernels.add_rms_norm(x, r, w, EPS)
    err = max(((y.double() - y64).norm() / y64.norm()).item(), ((h.double() - h64).norm() / h64.norm()).item())
    xg, rg, wg = (t.detach().double().requires_grad_() for t in (x, r, w))
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    hh = xg + rg
    yy = hh * torch.rsqrt(hh.pow(2).mean(-1, keepdim=True) + EPS) * wg
    torch.autograd.backward((yy, hh), (dy.double(), dh.double()))
    _, _, rstd = torch.ops.flykernels.add_rms_norm_train(x, r, w, EPS)
    dx, dw = torch.ops.flykernels.add_rms_norm_backward(dy, dh, h, w, rstd)
    err_b = max(((dx.double() - xg.grad).norm() / xg.grad.norm()).item(),
                ((dw.double() - wg.grad).norm() / wg.grad.norm()).item())
    return err, err_b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peak-tbs", type=float, default=None, help="HBM peak in TB/s (default: by card name)")
    a = ap.parse_args()
    import flykernels  # noqa: F401  (registers flykernels::add_rms_norm)
    name = torch.cuda.get_device_name()
    peak = hbm_peak_tbs(a.peak_tbs)
    rows_out = []
    print(f"{name}, torch {torch.__version__}, HBM peak taken as {peak} TB/s")
    print(f"{'case':26s} {'dir':4s} {'ours us':>9s} {'hf us':>9s} {'torch us':>9s} {'vs hf':>7s} {'vs torch':>8s} "
          f"{'HBM':>5s} {'rel err':>8s}")
    for label, rows, n in CASES:
        err_f, err_b = check(rows, n)
        x, r = (torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w = (torch.rand(n, device="cuda") + 0.5).to(torch.bfloat16)
        dy, dh = (torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        _, h, rstd = torch.ops.flykernels.add_rms_norm_train(x, r, w, EPS)
        xs, rs, ws = (t.detach().requires_grad_() for t in (x, r, w))

        def stock_bwd(fn):
            def run():
                xs.grad = rs.grad = ws.grad = None
                torch.autograd.backward(fn(xs, rs, ws), (dy, dh))
            return run

        with torch.no_grad():
            fwd = interleaved_us([("ours", lambda: torch.ops.flykernels.add_rms_norm(x, r, w, EPS)),
                                  ("hf", lambda: hf(x, r, w)), ("torch", lambda: torch_ops(x, r, w))],
                                 a.rounds, reps=a.reps)
        bwd = interleaved_us([("ours", lambda: torch.ops.flykernels.add_rms_norm_backward(dy, dh, h, w, rstd)),
                              ("hf", stock_bwd(hf)), ("torch", stock_bwd(torch_ops))], a.rounds, reps=a.reps)
        bwd_hf = max(bwd["hf"] - fwd["hf"], 1e-3)
        bwd_torch = max(bwd["torch"] - fwd["torch"], 1e-3)
        es = 2
        for d, t_ours, t_hf, t_torch, nbytes, err in (
                ("fwd", fwd["ours"], fwd["hf"], fwd["torch"], 4 * rows * n * es, err_f),
                ("bwd", bwd["ours"], bwd_hf, bwd_torch, 4 * rows * n * es, err_b)):
            bw = nbytes / (t_ours * 1e-6) / 1e12 / peak
            print(f"{label:26s} {d:4s} {t_ours:9.1f} {t_hf:9.1f} {t_torch:9.1f} {t_hf / t_ours:6.2f}x "
                  f"{t_torch / t_ours:7.2f}x {bw:5.0%} {err:8.1e}")
            rows_out.append(dict(case=label, dir=d, rows=rows, N=n, ours_us=t_ours, hf_us=t_hf, torch_us=t_torch,
                                 ratio_hf=t_hf / t_ours, ratio_torch=t_torch / t_ours, hbm_fraction=bw, rel_err=err))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=name, torch=torch.__version__, command=" ".join(sys.argv), rows=rows_out), f, indent=1)


if __name__ == "__main__":
    main()
