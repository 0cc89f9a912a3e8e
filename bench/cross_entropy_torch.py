#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Cross-entropy through PyTorch: libflykernels' cross_entropy kernel and
flykernels.linear_cross_entropy against what training runs today, in one process.

  python bench/cross_entropy_torch.py [--json FILE] [--reps 20] [--rounds 3] [--quick]

1. The kernel on logits [M, V] (BF16; V = 32000, 128256, 151936; M = 4096, 8192): one call of
   flykernels::cross_entropy_fwd_bwd_ (loss + gradient, in place) against torch's
   F.cross_entropy forward + backward on the same logits (BF16 logits as they come out of the
   head; "torch" computes in BF16 storage, "torch_fp32" as Hugging Face's loss does: logits
   .float() first). Reported: medians (CUDA events, L2 flushed before each call,
   bench/timing.py), ratio = torch / ours, and ours as a fraction of HBM bandwidth (the minimal
   traffic: the logits read once and the gradient written once, over the time and --peak-tbs).
2. The whole head: flykernels.linear_cross_entropy(hidden, weight, labels) forward + backward
   against F.linear + F.cross_entropy in FP32 (Hugging Face's composition) + backward, Llama 3's
   head (V = 128256, H = 4096, BF16) on 8192 tokens: time and peak memory over the inputs.
Checked against torch before timing (losses, gradients)."""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import hbm_peak_tbs, interleaved_us  # noqa: E402

import flykernels  # noqa: E402
from flykernels import _lce  # noqa: E402

KERNEL_CASES = [(M, V) for V in (32000, 128256, 151936) for M in (4096, 8192)]
HEAD = dict(tokens=8192, hidden=4096, vocab=128256)


def kernel_cases(args, out):
    rows = []
    for M, V in (KERNEL_CASES[:2] if args.quick else KERNEL_CASES):
        torch.manual_seed(0)
        x = (torch.randn(M, V, device="cuda") * 2).to(torch.bfloat16)
        lab = torch.randint(0, V, (M,), device="cuda")
        work = x.clone()
        # check first: loss and gradient against torch in FP32
        xf = x.float().requires_grad_()
        ref = F.cross_entropy(xf, lab, reduction="none")
        ref.sum().backward()
        loss, _ = torch.ops.flykernels.cross_entropy_fwd_bwd_(work, lab, -100, 1.0)
        assert torch.allclose(loss, ref.detach(), atol=1e-3, rtol=1e-4), "loss differs from torch"
        err = ((work.float() - xf.grad).norm() / xf.grad.norm()).item()
        assert err < 1e-2, f"gradient differs from torch (rel. L2 {err:.2e})"
        del xf, ref

        def ours():  # in place over the scratch copy (its values after the first call do not matter: the time
            # does not depend on them)
            torch.ops.flykernels.cross_entropy_fwd_bwd_(work, lab, -100, 1.0)

        xt = x.clone().requires_grad_()

        def stock():
            F.cross_entropy(xt, lab).backward()
            xt.grad = None

        xt32 = x.clone().requires_grad_()

        def stock_fp32():
            F.cross_entropy(xt32.float(), lab).backward()
            xt32.grad = None

        t = interleaved_us([("ours", ours), ("torch", stock), ("torch_fp32", stock_fp32)], args.rounds,
                           reps=args.reps)
        moved = M * V * 2 * 2 + M * (8 + 4 + 4)
        row = dict(M=M, V=V, dtype="bf16", us=t,
                   ratio_torch=t["torch"] / t["ours"], ratio_torch_fp32=t["torch_fp32"] / t["ours"],
                   TBps=moved / t["ours"] * 1e-6, hbm=moved / t["ours"] * 1e-6 / args.peak)
        rows.append(row)
        print(f"M {M:5d} V {V:6d}: ours {t['ours']:8.1f} us ({row['TBps']:.2f} TB/s, {row['hbm']:.0%} of HBM), "
              f"torch {t['torch']:8.1f} us (x{row['ratio_torch']:.2f}), "
              f"torch fp32 {t['torch_fp32']:8.1f} us (x{row['ratio_torch_fp32']:.2f})", flush=True)
        del x, work, xt, xt32
        torch.cuda.empty_cache()
    out["kernel"] = rows


def head_case(args, out):
    N, H, V = HEAD["tokens"], HEAD["hidden"], HEAD["vocab"]
    if args.quick:
        N = 2048
    torch.manual_seed(1)
    h = (torch.randn(N, H, device="cuda") * 0.5).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(V, H, device="cuda") * 0.02).to(torch.bfloat16).requires_grad_()
    lab = torch.randint(0, V, (N,), device="cuda")
    lab[:N // 50] = -100

    def fused():
        flykernels.linear_cross_entropy(h, w, lab).backward()

    def stock():
        _lce.reference_linear_cross_entropy(h, w, lab).backward()

    # check: loss and gradients
    for fn in (stock, fused):
        h.grad = w.grad = None
        fn()
        if fn is stock:
            ref = (h.grad.clone(), w.grad.clone())
    for a, r in zip((h.grad, w.grad), ref):
        e = ((a.float() - r.float()).norm() / r.float().norm()).item()
        assert e < 2e-2, f"linear_cross_entropy gradient differs (rel. L2 {e:.2e})"
    del ref

    def peak(fn):
        h.grad = w.grad = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**30

    mem = {"stock": peak(stock), "fused": peak(fused)}

    def clear():
        h.grad = w.grad = None

    t = interleaved_us([("fused", lambda: (clear(), fused())), ("stock", lambda: (clear(), stock()))],
                       args.rounds, reps=max(3, args.reps // 4))
    row = dict(tokens=N, hidden=H, vocab=V, dtype="bf16", chunk_rows=_lce.default_chunk_rows(V, 2, N),
               us=t, ratio=t["stock"] / t["fused"], peak_GiB=mem,
               memory_saving=1 - mem["fused"] / mem["stock"])
    print(f"head {N}x{H} -> {V}: fused {t['fused'] / 1e3:.2f} ms, F.linear + F.cross_entropy (fp32) "
          f"{t['stock'] / 1e3:.2f} ms (x{row['ratio']:.2f}); peak over the inputs {mem['fused']:.2f} GiB vs "
          f"{mem['stock']:.2f} GiB ({row['memory_saving']:.0%} less)", flush=True)
    out["head"] = row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peak-tbs", dest="peak", type=float, default=None, help="HBM peak, TB/s (default: per card)")
    ap.add_argument("--quick", action="store_true", help="two kernel shapes and 2048 head tokens")
    args = ap.parse_args()
    if not torch.cuda.is_available() or not flykernels.available:
        print(f"needs a CUDA device flykernels runs on ({flykernels.reason})")
        return 2
    args.peak = hbm_peak_tbs(args.peak)
    out = dict(device=torch.cuda.get_device_name(), peak_tbs=args.peak, torch=torch.__version__)
    with flykernels.torch.forced("ours"):
        kernel_cases(args, out)
        head_case(args, out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
