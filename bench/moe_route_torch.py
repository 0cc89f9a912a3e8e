#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""MoE routing glue through PyTorch: flykernels::moe_route / moe_permute / moe_unpermute
(libflykernels' moe_route family) against Hugging Face's composition (transformers 5.x: the
router's FP32 softmax + torch.topk + renorm + cast; grouped_mm_experts_forward's sort, gather,
histc + cumsum, weighted product, inverse permutation and sum over k), in one process. Checked
against the composition before timing.

  python bench/moe_route_torch.py [--json FILE] [--reps 30] [--rounds 3]

Shapes (bf16): Qwen3-30B-A3B (128 experts, top-8, hidden 2048, renormalized), OLMoE (64, top-8,
2048, not renormalized), Mixtral-8x7B (8, top-2, 4096, FP32 weights); tokens: 16384 (training
step B8 x 2048), 4096 (prefill) and 64 (decode). Parts timed: the router, the permute, the
unpermute, and the whole glue forward and forward+backward (the experts replaced by the identity,
so only the glue's kernels are timed; the backward reaches the logits and x). Reported: medians
(CUDA events, L2 flushed before each call, bench/timing.py) and ratio = stock / ours."""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import interleaved_us  # noqa: E402

MODELS = [  # label, experts, top-k, hidden, renormalize, weights cast to the logits' dtype
    ("qwen3-30b-a3b", 128, 8, 2048, True, True),
    ("olmoe", 64, 8, 2048, False, True),
    ("mixtral-8x7b", 8, 2, 4096, True, False),
]
TOKENS = [16384, 4096, 64]


def hf_router(logits, k, renorm, cast):
    probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    w, ids = torch.topk(probs, k, dim=-1)
    if renorm:
        w = w / w.sum(dim=-1, keepdim=True)
    return (w.to(logits.dtype) if cast else w), ids


def hf_permute(x, ids, E):
    k = ids.shape[1]
    flat = ids.reshape(-1)
    ids_g, perm = torch.sort(flat)
    x_g = x[perm // k]
    counts = torch.histc(ids_g.int() if ids_g.is_cuda else ids_g.float(), bins=E, min=0, max=E - 1)
    return x_g, torch.cumsum(counts, dim=0, dtype=torch.int32), perm


def hf_unpermute(out_g, w, perm, T, k):
    weighted = out_g * w.reshape(-1)[perm].unsqueeze(-1)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    return weighted[inv].view(T, k, -1).sum(dim=1).to(out_g.dtype)


def hf_glue(x, logits, k, E, renorm, cast):
    w, ids = hf_router(logits, k, renorm, cast)
    x_g, offs, perm = hf_permute(x, ids, E)
    return hf_unpermute(x_g, w, perm, x.shape[0], k)


def fly_glue(x, logits, k, E, renorm, cast):
    w, ids = torch.ops.flykernels.moe_route(logits, k, 0, 1 if renorm else 0, logits.dtype if cast else torch.float32)
    x_perm, offs, row_of, _ = torch.ops.flykernels.moe_permute(x, ids, E)
    return torch.ops.flykernels.moe_unpermute(x_perm, w, row_of, offs)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import flykernels  # noqa: F401  (registers flykernels::moe_*)
    name = torch.cuda.get_device_name()
    print(f"{name}, torch {torch.__version__}")
    print(f"{'model':15s} {'tokens':>6s} {'part':10s} {'ours us':>9s} {'stock us':>9s} {'ratio':>7s} {'rel err':>8s}")
    rows = []
    torch.manual_seed(0)
    for label, E, k, H, renorm, cast in MODELS:
        for T in TOKENS:
            x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
            logits = (torch.randn(T, E, device="cuda") * 1.5).to(torch.bfloat16)
            w, ids = torch.ops.flykernels.moe_route(logits, k, 0, 1 if renorm else 0,
                                                    logits.dtype if cast else torch.float32)
            hw, hids = hf_router(logits, k, renorm, cast)
            # (the weights in descending order: tied experts may be picked in another order than torch.topk's)
            err_route = rel(w.float().sort(-1, descending=True).values, hw.float().sort(-1, descending=True).values)
            x_perm, offs, row_of, pair_of = torch.ops.flykernels.moe_permute(x, ids, E)
            x_g, hoffs, perm = hf_permute(x, ids, E)
            assert torch.equal(offs, hoffs), "offsets differ from histc + cumsum"
            y = torch.ops.flykernels.moe_unpermute(x_perm, w, row_of, offs)
            err_glue = rel(y, hf_unpermute(x_g, w, perm, T, k))
            xs, ls = x.clone().requires_grad_(), logits.clone().requires_grad_()
            dy = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)

            def bwd(fn):
                def run():
                    xs.grad = ls.grad = None
                    fn(xs, ls, k, E, renorm, cast).backward(dy)
                return run
            wt = logits.dtype if cast else torch.float32
            parts = [
                ("router", lambda: torch.ops.flykernels.moe_route(logits, k, 0, int(renorm), wt),
                 lambda: hf_router(logits, k, renorm, cast), err_route),
                ("permute", lambda: torch.ops.flykernels.moe_permute(x, ids, E), lambda: hf_permute(x, ids, E), 0.0),
                ("unpermute", lambda: torch.ops.flykernels.moe_unpermute(x_perm, w, row_of, offs),
                 lambda: hf_unpermute(x_g, w, perm, T, k), err_glue),
                ("glue fwd", lambda: fly_glue(x, logits, k, E, renorm, cast),
                 lambda: hf_glue(x, logits, k, E, renorm, cast), err_glue),
                ("glue f+b", bwd(fly_glue), bwd(hf_glue), err_glue),
            ]
            for part, ours, stock, err in parts:
                if part != "glue f+b":
                    with torch.no_grad():
                        t = interleaved_us([("ours", ours), ("stock", stock)], a.rounds, reps=a.reps)
                else:
                    t = interleaved_us([("ours", ours), ("stock", stock)], a.rounds, reps=a.reps)
                ratio = t["stock"] / t["ours"]
                print(f"{label:15s} {T:6d} {part:10s} {t['ours']:9.1f} {t['stock']:9.1f} {ratio:6.2f}x {err:8.1e}")
                rows.append(dict(model=label, tokens=T, experts=E, top_k=k, hidden=H, part=part, ours_us=t["ours"],
                                 stock_us=t["stock"], ratio=ratio, rel_err=err))
    for part in ("router", "permute", "unpermute", "glue fwd", "glue f+b"):
        r = [x["ratio"] for x in rows if x["part"] == part]
        g = 1.0
        for v in r:
            g *= v
        print(f"geomean {part:10s} {g ** (1 / len(r)):6.2f}x (min {min(r):.2f}x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=name, torch=torch.__version__, command=" ".join(sys.argv), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
