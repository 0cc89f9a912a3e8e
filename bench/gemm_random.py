#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GEMM off the tuned keys: random shapes through the C ABI beside torch.mm / torch.addmm.

  python3 bench/gemm_random.py --lib build/libflykernels.so --seed 1 --count 60 [--json out.json]
  python3 bench/gemm_random.py --lib build/libflykernels.so --seed 1 --count 12 --odd --max-tflop 2

The distribution (documented so that runs with different seeds are comparable):
  M  log-uniform in 1..16384 (rounded down to an integer)
  N, K  multiples of 8, log-uniform in 256..32768
  dtype  FP16 or BF16, layout NN / NT / TN / TT, bias on half the shapes: each uniform
Shapes whose operands would exceed --max-gib of device memory (or --max-tflop of work) are redrawn.

--odd (the strides TMA cannot take, docs/gemm.md): the same shapes, but A and B
are views into larger buffers whose leading dimension is the contiguous extent + 1 or + 3 elements
and whose base is 0-3 elements into the buffer (uniform, from a second generator seeded by the
seed), so every call has an operand TMA cannot address. torch.mm / addmm run on the same views. C
is contiguous for both. With the queried workspace such calls take the packed path (the operand
copied to aligned lines in the workspace, then the TMA kernel); --no-workspace passes none, so
they take the cp.async kernel.

Each shape is first checked against an FP32 reference (our output poisoned with NaN beforehand),
then ours and torch's (mm, or addmm with the bias) are timed interleaved in one process
(bench/timing.py: L2 flushed by a read before every call, rounds in a rotating order, medians).
Calls we refuse (FLY_ERROR_UNSUPPORTED) are listed as such.
Prints a table sorted by ratio (torch time / ours: > 1 means we are faster) and the geomean, then
the same per stride class (issue 50): "odd" where TMA cannot address A or B (the library took its
packed path or the cp.async kernel: TN / TT with M not a multiple of 8, every --odd shape), else
"aligned"; per class the geomean, the count below 0.85x, the worst WORST shapes and issue 50's
aligned target (geomean >= 1.0x, none below 0.85x). --json writes the rows (each with its "class")
and the per-class summary ("classes").
"""
import argparse
import json
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import interleaved_us  # noqa: E402
from fly_abi import gemm_caller, load, max_rel_err  # noqa: E402
from gemm_torch import geomean, make_operands  # noqa: E402

ROUNDS = 3
WARM_MS = 20.0


def log_uniform_int(rng, lo, hi):
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))


def draw_shapes(seed, count, max_gib, max_tflop=None):
    rng = random.Random(seed)
    shapes = []
    while len(shapes) < count:
        M = min(16384, max(1, log_uniform_int(rng, 1, 16384)))
        N = min(32768, max(256, log_uniform_int(rng, 256, 32768) // 8 * 8))
        K = min(32768, max(256, log_uniform_int(rng, 256, 32768) // 8 * 8))
        dtype = rng.choice(["bf16", "fp16"])
        layout = rng.choice(["nn", "nt", "tn", "tt"])
        bias = rng.random() < 0.5
        if (M * K + K * N + 2 * M * N) * 2 > max_gib * (1 << 30):
            continue
        if max_tflop is not None and 2.0 * M * N * K > max_tflop * 1e12:
            continue
        shapes.append({"M": M, "N": N, "K": K, "dtype": dtype, "layout": layout, "bias": bias})
    return shapes


def stride_class(s, decision=None, variant=None):
    """'odd' where TMA cannot address A or B, else 'aligned'. From the library's own routing when
    the call ran (its packed path, ':packed' in the decision, or a gemm_odd_ cp.async variant: what
    gemm_odd_plan.h needs_odd_path decides), else from TMA's rule on the operands as drawn (leading
    dimensions multiples of 8 elements, bases 16-byte aligned)."""
    if decision is not None or variant is not None:
        return "odd" if ":packed" in (decision or "") or (variant or "").startswith("gemm_odd") else "aligned"
    ld_a = (s["K"] if s["layout"][0] == "n" else s["M"]) + s.get("lda_extra", 0)
    ld_b = (s["N"] if s["layout"][1] == "n" else s["K"]) + s.get("ldb_extra", 0)
    bad = ld_a % 8 or ld_b % 8 or s.get("a_off", 0) % 8 or s.get("b_off", 0) % 8
    return "odd" if bad else "aligned"


def class_summary(rows, worst=5):
    """{class: {shapes, geomean, min, below_0.85, worst: [rows]}} over the rows that ran, and the
    lines that print it."""
    out, lines = {}, []
    for cls in ("aligned", "odd"):
        sel = sorted((r for r in rows if r.get("class") == cls and "ratio" in r), key=lambda r: r["ratio"])
        if not sel:
            continue
        xs = [r["ratio"] for r in sel]
        d = {"shapes": len(xs), "geomean": geomean(xs), "min": min(xs), "below_0.85": sum(x < 0.85 for x in xs),
             "worst": [{k: r[k] for k in ("M", "N", "K", "dtype", "layout", "bias", "ratio", "fly_us", "torch_us",
                                          "variant")} for r in sel[:worst]]}
        out[cls] = d
        lines.append(f"{cls:<7} {len(xs):3d} shapes: geomean {d['geomean']:.3f}x, min {d['min']:.3f}x, "
                     f"{d['below_0.85']} below 0.85x; worst: " +
                     ", ".join(f"{r['layout']} {r['dtype']} {r['M']}x{r['N']}x{r['K']}{' +bias' if r['bias'] else ''} "
                               f"{r['ratio']:.3f}x" for r in sel[:worst]))
    if "aligned" in out:
        a = out["aligned"]
        lines.append(f"target (issue 50, aligned shapes): geomean >= 1.0x: {'met' if a['geomean'] >= 1.0 else 'NOT met'}; "
                     f"none below 0.85x: {'met' if a['below_0.85'] == 0 else 'NOT met'}")
    return out, lines


def odd_view(rows, cols, row_major, extra, off, dt):
    """A [rows, cols] view with leading dimension = the contiguous extent + extra, off elements into
    its buffer."""
    inner, outer = (cols, rows) if row_major else (rows, cols)
    ld = inner + extra
    store = torch.randn(outer * ld + off, device="cuda", dtype=dt)
    return store.as_strided((rows, cols), (ld, 1) if row_major else (1, ld), off)


def operands(s, odd_rng=None):
    dt = torch.bfloat16 if s["dtype"] == "bf16" else torch.float16
    if odd_rng is None:
        a, b = make_operands(s["M"], s["N"], s["K"], s["layout"], dt)
    else:
        ea, eb = odd_rng.choice([1, 3]), odd_rng.choice([1, 3])
        oa, ob = odd_rng.randrange(4), odd_rng.randrange(4)
        s.update(lda_extra=ea, ldb_extra=eb, a_off=oa, b_off=ob)
        a = odd_view(s["M"], s["K"], s["layout"][0] == "n", ea, oa, dt)
        b = odd_view(s["K"], s["N"], s["layout"][1] == "n", eb, ob, dt)
    bias = torch.randn(s["N"], device="cuda", dtype=dt) if s["bias"] else None
    return a, b, bias


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="path to libflykernels.so")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=60)
    ap.add_argument("--max-gib", type=float, default=8.0, help="redraw shapes larger than this")
    ap.add_argument("--max-tflop", type=float, help="redraw shapes of more than this much work (2MNK / 1e12)")
    ap.add_argument("--odd", action="store_true", help="leading dimensions extent + 1 / + 3, bases 0-3 elements in")
    ap.add_argument("--no-workspace", action="store_true", help="call fly_gemm with no workspace (NULL, 0)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--worst", type=int, default=5, help="worst shapes listed per stride class")
    args = ap.parse_args()
    lib = load(args.lib)
    rows = []
    odd_rng = random.Random(args.seed * 7919 + 1) if args.odd else None
    for i, s in enumerate(draw_shapes(args.seed, args.count, args.max_gib, args.max_tflop)):
        torch.manual_seed(args.seed * 1000 + i)
        a, b, bias = operands(s, odd_rng)
        c = torch.empty(s["M"], s["N"], device="cuda", dtype=a.dtype)
        ref = a.float() @ b.float() + (bias.float() if bias is not None else 0.0)
        tag = f"{s['layout']} {s['dtype']} {s['M']}x{s['N']}x{s['K']}{' +bias' if bias is not None else ''}"
        if args.odd:
            tag += f" ld+{s['lda_extra']}/+{s['ldb_extra']} off {s['a_off']}/{s['b_off']}"
        try:
            ours = gemm_caller(lib, a, b, c, bias, workspace=not args.no_workspace)
            c.fill_(float("nan"))
            ours()
        except RuntimeError as e:
            rows.append(dict(s, status="refused", why=str(e), **{"class": stride_class(s)}))
            print(f"{i:3d} {tag:36} refused: {e}", flush=True)
            continue
        variant = lib.fly_last_variant().decode()
        decision = lib.fly_last_decision().decode()
        cls = stride_class(s, decision, variant)
        if ":packed" in decision:
            variant += " (packed)"
        err = max_rel_err(c, ref)
        del ref
        ok = not math.isnan(err) and err < 2e-2
        torch_fn = (lambda: torch.addmm(bias, a, b)) if bias is not None else (lambda: torch.mm(a, b))
        reps = 10 if s["M"] * s["N"] * s["K"] > 2e11 else 30
        med = interleaved_us([("fly", ours), ("torch", torch_fn)], ROUNDS, reps=reps, warm_ms=WARM_MS)
        ratio = med["torch"] / med["fly"]
        rows.append(dict(s, status="ok" if ok else "WRONG", err=err, fly_us=med["fly"], torch_us=med["torch"],
                         ratio=ratio, variant=variant, **{"class": cls}))
        print(f"{i:3d} {tag:36} err {err:.1e} ours {med['fly']:9.1f} us torch {med['torch']:9.1f} us "
              f"{ratio:6.3f}x {variant}", flush=True)
        del a, b, c, bias
    ran = [r for r in rows if r["status"] != "refused"]
    print(f"\n{'odd strides, ' if args.odd else ''}seed {args.seed}: {len(rows)} shapes, {len(ran)} ran, {len(rows) - len(ran)} refused, "
          f"{sum(r['status'] == 'WRONG' for r in ran)} wrong")
    print(f"{'ratio':>7} {'layout':6} {'dtype':5} {'M':>6} {'N':>6} {'K':>6} bias {'class':7} {'ours us':>9} "
          f"{'torch us':>9}  variant")
    for r in sorted(ran, key=lambda r: r["ratio"]):
        print(f"{r['ratio']:6.3f}x {r['layout']:6} {r['dtype']:5} {r['M']:6d} {r['N']:6d} {r['K']:6d} "
              f"{'yes ' if r['bias'] else 'no  '} {r['class']:7} {r['fly_us']:9.1f} {r['torch_us']:9.1f}  {r['variant']}")
    ratios = [r["ratio"] for r in ran]
    if ratios:
        print(f"geomean over torch: {geomean(ratios):.3f}x, min {min(ratios):.3f}x, "
              f"{sum(x < 0.85 for x in ratios)} of {len(ratios)} below 0.85x")
    classes, lines = class_summary(ran, args.worst)
    if lines:
        print("per stride class (odd: TMA cannot address A or B; the packed path or the cp.async kernel ran):")
        print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": args.seed, "odd": args.odd, "classes": classes, "rows": rows}, f, indent=1)
    return 1 if any(r["status"] == "WRONG" for r in ran) else 0


if __name__ == "__main__":
    sys.exit(main())
