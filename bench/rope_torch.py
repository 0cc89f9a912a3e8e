#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Rotary embeddings through PyTorch: flykernels::rope (libflykernels' rope family) against the
composition Hugging Face models run (apply_rotary_pos_emb: q * cos + rotate_half(q) * sin and the
same for k, ten kernels forward), on the shapes of the e2e models, in one process. Checked
against FP64 before timing (forward and backward).

  python bench/rope_torch.py [--json FILE] [--reps 30] [--rounds 3]

Layout as Hugging Face hands it over: q and k are [B, S, H, D] projections seen as [B, H, S, D]
(transpose(1, 2)), cos and sin [B, S, D] (gpt-oss: [B, S, D / 2], an angle per pair). bf16.
Reported: medians (CUDA events, L2 flushed before each call, bench/timing.py), ratio = stock /
ours, and the fraction of HBM bandwidth ours reaches (q and k read and written once)."""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import hbm_peak_tbs, interleaved_us  # noqa: E402

CASES = [  # label, B, S, Hq, Hk, D, half tables
    ("llama prefill 4096", 1, 4096, 32, 8, 128, False),
    ("llama decode 64", 64, 1, 32, 8, 128, False),
    ("qwen3moe prefill 4x2048", 4, 2048, 32, 4, 128, False),
    ("gemma3 prefill 4096 (D 256)", 1, 4096, 16, 8, 256, False),
    ("gpt-oss prefill 4096 (pairs)", 1, 4096, 64, 8, 64, True),
]


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def composition(q, k, cos, sin):
    if cos.shape[-1] * 2 == q.shape[-1]:
        cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def operands(B, S, Hq, Hk, D, half, dtype=torch.bfloat16):
    q = torch.randn(B, S, Hq, D, device="cuda", dtype=dtype).transpose(1, 2)
    k = torch.randn(B, S, Hk, D, device="cuda", dtype=dtype).transpose(1, 2)
    pos = torch.arange(S, device="cuda", dtype=torch.float32)[None, :, None] + 17 * torch.arange(B, device="cuda")[:, None, None]
    W = D // 2 if half else D
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D))
    ang = pos * (inv if half else torch.cat((inv, inv)))[None, None, :W]
    return q, k, ang.cos().to(dtype), ang.sin().to(dtype)


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def check(q, k, cos, sin):
    D = q.shape[-1]
    qo, ko = torch.ops.flykernels.rope(q, k, cos, sin, D)
    rq, rk = composition(q.double(), k.double(), cos.double(), sin.double())
    err = max(rel(qo, rq), rel(ko, rk))
    qd, kd = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    torch.autograd.backward(composition(qd, kd, cos.double(), sin.double()), (gq.double(), gk.double()))
    dq, dk = torch.ops.flykernels.rope_backward(gq, gk, cos, sin, D)
    return err, max(rel(dq, qd.grad), rel(dk, kd.grad))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peak-tbs", type=float, default=None, help="HBM peak in TB/s (default: by card name)")
    a = ap.parse_args()
    import flykernels  # noqa: F401  (registers flykernels::rope)
    name = torch.cuda.get_device_name()
    peak = hbm_peak_tbs(a.peak_tbs)
    rows_out = []
    print(f"{name}, torch {torch.__version__}, HBM peak taken as {peak} TB/s")
    print(f"{'case':30s} {'dir':4s} {'ours us':>9s} {'stock us':>9s} {'ratio':>7s} {'HBM':>5s} {'rel err':>8s}")
    for label, B, S, Hq, Hk, D, half in CASES:
        q, k, cos, sin = operands(B, S, Hq, Hk, D, half)
        err_f, err_b = check(q, k, cos, sin)
        gq, gk = torch.randn_like(q), torch.randn_like(k)
        qs, ks = q.detach().requires_grad_(), k.detach().requires_grad_()

        def stock_bwd():
            qs.grad = ks.grad = None
            torch.autograd.backward(composition(qs, ks, cos, sin), (gq, gk))

        with torch.no_grad():
            fwd = interleaved_us([("ours", lambda: torch.ops.flykernels.rope(q, k, cos, sin, D)),
                                  ("stock", lambda: composition(q, k, cos, sin))], a.rounds, reps=a.reps)
        bwd = interleaved_us([("ours", lambda: torch.ops.flykernels.rope_backward(gq, gk, cos, sin, D)),
                              ("stock", stock_bwd)], a.rounds, reps=a.reps)
        bwd_stock = max(bwd["stock"] - fwd["stock"], 1e-3)  # its forward ran too: counted out
        nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        for d, t_ours, t_stock, err in (("fwd", fwd["ours"], fwd["stock"], err_f),
                                        ("bwd", bwd["ours"], bwd_stock, err_b)):
            bw = nbytes / (t_ours * 1e-6) / 1e12 / peak
            print(f"{label:30s} {d:4s} {t_ours:9.1f} {t_stock:9.1f} {t_stock / t_ours:6.2f}x {bw:5.0%} {err:8.1e}")
            rows_out.append(dict(case=label, dir=d, B=B, S=S, Hq=Hq, Hk=Hk, D=D, half_tables=half, ours_us=t_ours,
                                 stock_us=t_stock, ratio=t_stock / t_ours, hbm_fraction=bw, rel_err=err))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=name, torch=torch.__version__, command=" ".join(sys.argv), rows=rows_out), f, indent=1)


if __name__ == "__main__":
    main()
