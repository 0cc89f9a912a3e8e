#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where issue 25's slow random GEMM shapes lose: the dispatch's pick, or the bundled variants.

For the aligned (TMA-path) shapes of bench/gemm_random.py that ran below --below of cuBLAS in the
JSON given (default bench/gemm_random_latest.json, seeds 1-3), time every bundled GEMM variant of
the shape's dtype (forced through fly_force_variant, each call checked against an FP32 reference
first, output poisoned), then time the dispatch's pick, the fastest bundled variant and torch
(mm / addmm) interleaved in one process (bench/timing.py). Prints, per shape, torch over the pick
(the benchmark's ratio, re-measured), torch over the best bundled variant (the ceiling of this
build's variant set) and the pick's time over the best (the dispatch's regret), then geomeans and
how many shapes each would leave below --below.

  python3 bench/probes/gemm/gemm_ceiling.py --lib build/libflykernels.so [--json bench/gemm_random_latest.json]
      [--below 0.85] [--limit 80] [--out rows.json]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/
from timing import interleaved_us, time_us  # noqa: E402
from fly_abi import force_variant, gemm_caller, load, max_rel_err  # noqa: E402
from gemm_random import operands  # noqa: E402
from gemm_torch import geomean  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--json", default="bench/gemm_random_latest.json")
    ap.add_argument("--below", type=float, default=0.85)
    ap.add_argument("--limit", type=int, default=80, help="at most this many shapes, slowest first")
    ap.add_argument("--out")
    args = ap.parse_args()
    lib = load(args.lib)
    names = [lib.fly_variant_name(i).decode() for i in range(lib.fly_variant_count())]
    d = json.load(open(args.json))
    shapes = [r for rows in d["seeds"].values() for r in rows
              if r["status"] == "ok" and "packed" not in r["variant"] and r["ratio"] < args.below]
    shapes = sorted(shapes, key=lambda r: r["ratio"])[:args.limit]
    print(f"{len(shapes)} shapes below {args.below}x in {args.json}", flush=True)
    out = []
    for i, s in enumerate(shapes):
        torch.manual_seed(i)
        a, b, bias = operands(s)
        c = torch.empty(s["M"], s["N"], device="cuda", dtype=a.dtype)
        ref = a.float() @ b.float() + (bias.float() if bias is not None else 0.0)
        call = gemm_caller(lib, a, b, c, bias)
        force_variant(lib, None)
        call()
        pick = lib.fly_last_variant().decode()
        times = {}
        prefix = f"gemm_{s['dtype']}_"
        for v in names:
            if not v.startswith(prefix) or "_odd" in v or "_dec" in v:
                continue
            try:
                force_variant(lib, v)
                c.fill_(float("nan"))
                call()
            except RuntimeError:
                continue  # the variant does not take this shape or layout
            err = max_rel_err(c, ref)
            if not err < 2e-2:
                print(f"   {v}: WRONG (err {err})", flush=True)
                continue
            times[v] = time_us(call, reps=8, warmup=2)
        force_variant(lib, None)
        best = min(times, key=times.get)
        torch_fn = (lambda: torch.addmm(bias, a, b)) if bias is not None else (lambda: torch.mm(a, b))

        def forced(v):
            def f():
                force_variant(lib, v)
                call()
            return f
        med = interleaved_us([("pick", forced(None)), ("best", forced(best)), ("torch", torch_fn)], 3,
                             reps=10, warm_ms=20.0)
        force_variant(lib, None)
        row = dict(M=s["M"], N=s["N"], K=s["K"], dtype=s["dtype"], layout=s["layout"], bias=s["bias"],
                   pick=pick, best=best, pick_us=med["pick"], best_us=med["best"], torch_us=med["torch"],
                   variants=len(times), bench_ratio=s["ratio"])
        out.append(row)
        print(f"{i:3d} {s['layout']} {s['dtype']} {s['M']:6d}x{s['N']:6d}x{s['K']:6d}{' +bias' if s['bias'] else '      '} "
              f"pick {med['torch'] / med['pick']:.3f}x  best {med['torch'] / med['best']:.3f}x  regret "
              f"{med['pick'] / med['best']:.3f}  ({len(times)} variants; pick {pick[5:]}, best {best[5:]})", flush=True)
        del a, b, c, bias, ref
    if not out:
        return 0
    pk = [r["torch_us"] / r["pick_us"] for r in out]
    bs = [r["torch_us"] / r["best_us"] for r in out]
    rg = [r["pick_us"] / r["best_us"] for r in out]
    print(f"\n{len(out)} shapes: torch over the pick {geomean(pk):.3f}x ({sum(x < args.below for x in pk)} below "
          f"{args.below}x), over the best bundled variant {geomean(bs):.3f}x ({sum(x < args.below for x in bs)} below), "
          f"the pick's regret {geomean(rg):.3f}x (max {max(rg):.2f}x)")
    if args.out:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": out}, open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
