#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Gated linear units through PyTorch: flykernels::glu (libflykernels' glu family) against the
unfused composition models run (act(gate) * up: two kernels forward, four backward), on the
shapes of the e2e models, in one process. Checked against FP64 before timing (outputs poisoned).

  python bench/glu_torch.py [--json FILE] [--reps 30] [--rounds 3]

Shapes: Llama-3.1-8B MLP (intermediate 14336) at 4096 prefill tokens and decode batches 1 / 64;
Gemma-7B GeGLU (24576) at 4096; Qwen3-MoE experts (768, top-8: 8 x tokens rows, gate and up as
the halves of one [rows, 1536] projection) at 8192 and 64 tokens. bf16. Forward (no grad) and
backward (the op's own backward against autograd through the composition). Reported: medians
(CUDA events, L2 flushed before each call, bench/timing.py), ratio = stock / ours, and the
fraction of HBM bandwidth ours reaches (bytes moved / time / --peak-tbs)."""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import hbm_peak_tbs, interleaved_us  # noqa: E402

CASES = [  # label, rows, N, act, halves
    ("llama mlp prefill 4096", 4096, 14336, 0, False),
    ("llama mlp decode 64", 64, 14336, 0, False),
    ("llama mlp decode 1", 1, 14336, 0, False),
    ("gemma geglu prefill 4096", 4096, 24576, 1, False),
    ("qwen3moe experts 8192 tok", 65536, 768, 0, True),
    ("qwen3moe experts 64 tok", 512, 768, 0, True),
]


def act_of(x, act):
    return F.silu(x) if act == 0 else F.gelu(x, approximate="tanh" if act == 1 else "none")


def operands(rows, n, halves, dtype=torch.bfloat16):
    if halves:
        gu = torch.randn(rows, 2 * n, device="cuda", dtype=dtype)
        return gu[:, :n], gu[:, n:]
    return torch.randn(rows, n, device="cuda", dtype=dtype), torch.randn(rows, n, device="cuda", dtype=dtype)


def check(rows, n, act, halves):
    g, u = operands(rows, n, halves)
    ref = act_of(g.double(), act) * u.double()
    got = torch.ops.flykernels.glu(g, u, act)
    err = ((got.double() - ref).norm() / ref.norm()).item()
    gr, ur = g.detach().double().requires_grad_(), u.detach().double().requires_grad_()
    dy = torch.randn_like(got)
    (act_of(gr, act) * ur).backward(dy.double())
    dg, du = torch.ops.flykernels.glu_backward(dy, g, u, act)
    err_b = max(((dg.double() - gr.grad).norm() / gr.grad.norm()).item(),
                ((du.double() - ur.grad).norm() / ur.grad.norm()).item())
    return err, err_b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peak-tbs", type=float, default=None, help="HBM peak in TB/s (default: by card name)")
    a = ap.parse_args()
    import flykernels  # noqa: F401  (registers flykernels::glu)
    name = torch.cuda.get_device_name()
    peak = hbm_peak_tbs(a.peak_tbs)
    rows_out = []
    print(f"{name}, torch {torch.__version__}, HBM peak taken as {peak} TB/s")
    print(f"{'case':28s} {'dir':4s} {'ours us':>9s} {'stock us':>9s} {'ratio':>7s} {'HBM':>5s} {'rel err':>8s}")
    for label, rows, n, act, halves in CASES:
        err_f, err_b = check(rows, n, act, halves)
        g, u = operands(rows, n, halves)
        dy = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        gs, us = g.detach().requires_grad_(), u.detach().requires_grad_()

        def stock_bwd():
            gs.grad = us.grad = None
            (act_of(gs, act) * us).backward(dy)

        # The stock backward above also runs its forward (autograd needs the graph): time its
        # forward alone and subtract, so both sides count the backward's kernels only.
        with torch.no_grad():
            fwd = interleaved_us([("ours", lambda: torch.ops.flykernels.glu(g, u, act)),
                                  ("stock", lambda: act_of(g, act) * u)], a.rounds, reps=a.reps)
        bwd = interleaved_us([("ours", lambda: torch.ops.flykernels.glu_backward(dy, g, u, act)),
                              ("stock", stock_bwd)], a.rounds, reps=a.reps)
        bwd_stock = max(bwd["stock"] - fwd["stock"], 1e-3)
        es = 2
        for d, t_ours, t_stock, nbytes, err in (
                ("fwd", fwd["ours"], fwd["stock"], 3 * rows * n * es, err_f),
                ("bwd", bwd["ours"], bwd_stock, 5 * rows * n * es, err_b)):
            bw = nbytes / (t_ours * 1e-6) / 1e12 / peak
            print(f"{label:28s} {d:4s} {t_ours:9.1f} {t_stock:9.1f} {t_stock / t_ours:6.2f}x {bw:5.0%} {err:8.1e}")
            rows_out.append(dict(case=label, dir=d, rows=rows, N=n, act=act, halves=halves, ours_us=t_ours,
                                 stock_us=t_stock, ratio=t_stock / t_ours, hbm_fraction=bw, rel_err=err))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=name, torch=torch.__version__, command=" ".join(sys.argv), rows=rows_out), f, indent=1)


if __name__ == "__main__":
    main()
