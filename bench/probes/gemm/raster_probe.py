#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The database's GEMM variant per suite shape against its raster siblings (launch axis gm: the
strip height of the tile order, `_g8` = the height that was fixed before raster_group chose it, `_g16`,
`_g32`; the plain name now takes raster_group's choice) and torch.mm, timed interleaved.

  python3 bench/probes/gemm/raster_probe.py --lib build/libflykernels.so [--suite suites/gemm_bf16.json]
                                [--min-m 512] [--heights 8,16,32] [--rounds 5] [--picks F]

A/B of two databases: `FLYKERNELS_TUNING_DB=new.sqlite python3 bench/probes/gemm/raster_probe.py --lib L
--list-picks > picks.json` records the new database's variant per shape; `--picks picks.json
--heights ''` then times it (as "alt") beside the shipped database's variant and torch.mm.

NT layout, bf16. Each contender is checked against an FP32 reference, then timed ROUNDS times in a
rotating order (bench/timing.py time_us: ~30 ms warm-up, L2 flushed by a read before every call);
its time is the median over the rounds. A sibling that is not bundled is skipped (build with
-DFLY_ALL_VARIANTS=ON -DFLY_VARIANT_MATCH='...(_g(8|16|32))?(_sk1)?$').
"""
import argparse
import json
import math
import os
import re
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/: fly_abi, timing
import timing  # noqa: E402
from fly_abi import force_variant, gemm_caller, load, nt_problem, poisoned_err  # noqa: E402


def sibling(name, height):
    """`name` with raster height `height`: the _g suffix goes before any _sk (axes in order)."""
    base = re.sub(r"_g\d+", "", name)
    m = re.search(r"(_sk\d+)$", base)
    return base[:m.start()] + f"_g{height}" + m.group(1) if m else base + f"_g{height}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--lib", required=True)
    ap.add_argument("--suite", default=os.path.join(here, "..", "..", "..", "suites", "gemm_bf16.json"))
    ap.add_argument("--min-m", type=int, default=512)
    ap.add_argument("--heights", default="8,16,32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--picks", help="JSON {\"MxNxK\": variant}: one more contender per shape (alt)")
    ap.add_argument("--list-picks", action="store_true", help="print this process's database picks as JSON and stop")
    a = ap.parse_args()
    lib = load(a.lib)
    heights = [int(h) for h in a.heights.split(",") if h]
    cases = [c for c in json.load(open(a.suite))["cases"] if c["M"] >= a.min_m]
    picks = json.load(open(a.picks)) if a.picks else {}
    if a.list_picks:
        out = {}
        for c in cases:
            M, N, K = c["M"], c["N"], c["K"]
            x, w, y = nt_problem(M, N, K)
            gemm_caller(lib, x, w.t(), y)()
            out[f"{M}x{N}x{K}"] = lib.fly_last_variant().decode()
        print(json.dumps(out, indent=1))
        return
    print(f"NT bf16, {a.rounds} rounds interleaved, ~30 ms warm-up, read flush; time in us (ratio: torch.mm / it)")
    ratios = {}
    for c in cases:
        M, N, K = c["M"], c["N"], c["K"]
        x, w, y = nt_problem(M, N, K)
        b = w.t()
        ref = x.float() @ w.float().t()
        call = gemm_caller(lib, x, b, y)
        force_variant(lib, None)
        call()
        db = lib.fly_last_variant().decode()
        names = [db] + [sibling(db, h) for h in heights]
        alt = picks.get(f"{M}x{N}x{K}")
        if alt and alt not in names:
            names.append(alt)
        contenders = [("torch.mm", lambda: torch.mm(x, b, out=y))]
        for n in names:
            try:
                force_variant(lib, n)
            except RuntimeError:
                if n == alt:
                    print(f"{M}x{N}x{K}: alt {alt} not bundled")
                    alt = None
                continue
            err = poisoned_err(call, y, ref)
            if not err < 2e-2:
                print(f"{M}x{N}x{K} {n}: WRONG (max rel err {err:.3g})")
                continue
            contenders.append((n, call))
        # Every FlyKernels contender is the same call under its own forced variant.
        med = timing.interleaved_us(contenders, a.rounds, warm_ms=30.0,
                                    before=lambda n: force_variant(lib, None if n == "torch.mm" else n))
        force_variant(lib, None)
        base = med["torch.mm"]
        label = {db: "db ", alt: "alt "}
        cells = "  ".join(f"{label.get(k, '')}{k}: {t:8.1f} ({base / t:.3f}x)" for k, t in med.items())
        print(f"{M:5d}x{N:5d}x{K:5d}  {cells}", flush=True)
        for k, t in med.items():
            if k == "torch.mm":
                continue
            if k == db:
                ratios.setdefault("db", []).append(base / t)
            if k == alt or (k == db and alt == db):  # the same pick counts for both databases
                ratios.setdefault("alt", []).append(base / t)
            if k not in (db, alt):
                ratios.setdefault(re.search(r"_g(\d+)", k).group(0), []).append(base / t)
    for tag, rs in ratios.items():
        print(f"{tag:5s} geomean vs torch.mm {math.exp(sum(map(math.log, rs)) / len(rs)):.3f}x over {len(rs)} shapes")


if __name__ == "__main__":
    main()
