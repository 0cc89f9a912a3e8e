#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""FlyKernels TopK vs torch.topk, side by side on suites/topk.json.

Runs `flybench topk --json TMP` (our library's dispatch, deterministic off and on) as a
subprocess, then times torch.topk on the same cases in this process (median, L2 flushed, with
torch.use_deterministic_algorithms off and on), prints per-case speedups and geometric means per
k band (k <= 16, k > 16) for both modes, and saves a PNG bar chart.

usage: bench/topk_torch.py [build/flybench] [--suite suites/topk.json] [--png topk_vs_torch.png]
                           [--ours-json FILE (skip running flybench)] [--check]
                           [--long (suites/topk_long.json: R <= 16, C >= 2^18; bands k <= 64 / k > 64)]
                           [--largest 0 (the k smallest, both sides)]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import time_us  # noqa: E402


def time_torch(fn, reps=100):
    """Median time in microseconds (bench/timing.py: events, L2 flushed by a read)."""
    return time_us(fn, reps=reps)


def geomean(xs):
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("flybench_pos", nargs="?", default=None, metavar="flybench")
    ap.add_argument("--flybench", default="build/flybench")
    ap.add_argument("--json", default="bench/topk_latest.json", help="where to save the combined results")
    ap.add_argument("--suite", default="suites/topk.json")
    ap.add_argument("--png", default="bench/topk.png")
    ap.add_argument("--ours-json", default=None, help="results of an earlier flybench run")
    ap.add_argument("--check", action="store_true", help="also compare torch's values to a sort")
    ap.add_argument("--long", action="store_true", help="few long rows: suites/topk_long.json, bands k<=64 / k>64")
    ap.add_argument("--largest", type=int, default=1, help="0: the k smallest (flybench --largest 0 too)")
    args = ap.parse_args()
    if args.long:
        if args.suite == "suites/topk.json":
            args.suite = "suites/topk_long.json"
        if args.json == "bench/topk_latest.json":
            args.json = "bench/topk_long_latest.json"
        if args.png == "bench/topk.png":
            args.png = "bench/topk_long.png"
    split_k = 64 if args.long else 16
    largest = args.largest != 0
    if args.flybench_pos:
        args.flybench = args.flybench_pos

    import torch

    suite = json.load(open(args.suite))
    cases = [(c["R"], c["C"], c["k"]) for c in suite["cases"]]

    if args.ours_json:
        text = open(args.ours_json).read()
        try:
            ours_rows = json.loads(text)
        except json.JSONDecodeError:  # a run cut short: close the list
            ours_rows = json.loads(text.rstrip().rstrip(",") + "]")
    else:
        with tempfile.TemporaryDirectory() as td:
            out = os.path.join(td, "ours.json")
            cmd = [args.flybench, "topk", "--json", out, "--suite", args.suite, "--largest", str(int(largest))]
            print("running:", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
            ours_rows = json.load(open(out))
    if isinstance(ours_rows, dict):  # {"cases": [...]} form
        ours_rows = ours_rows.get("cases", [])
    ours = {(r["R"], r["C"], r["k"], bool(r["deterministic"])): r["us"] for r in ours_rows}

    torch.manual_seed(0)
    results = []  # (R, C, k, det, ours_us, torch_us)
    for (R, C, k) in cases:
        x = torch.rand(R, C, device="cuda") * 2 - 1
        for det in (False, True):
            torch.use_deterministic_algorithms(det)
            t = time_torch(lambda: torch.topk(x, k, dim=-1, largest=largest, sorted=True),
                           reps=30 if args.long else 100)
            if args.check:
                v, _ = torch.topk(x, k, dim=-1, largest=largest)
                ref = torch.sort(x, dim=-1, descending=largest).values[:, :k]
                assert torch.equal(v, ref), (R, C, k)
            results.append((R, C, k, det, ours.get((R, C, k, det)), t))
        del x
    torch.use_deterministic_algorithms(False)

    print(f"largest={largest}")
    print(f"{'R':>6} {'C':>8} {'k':>5} {'det':>3} {'ours us':>9} {'torch us':>9} {'speedup':>8}")
    for (R, C, k, det, o, t) in results:
        sp = t / o if o else float("nan")
        print(f"{R:6d} {C:8d} {k:5d} {int(det):3d} {o if o else float('nan'):9.1f} {t:9.1f} {sp:8.2f}x")
    print()
    bands = ((f"k<={split_k}", lambda k: k <= split_k), (f"k>{split_k}", lambda k: k > split_k))
    summary = {}
    for det in (False, True):
        for name, pred in bands:
            sps = [t / o for (R, C, k, d, o, t) in results if d == det and pred(k) and o]
            low = min(sps) if sps else float("nan")
            print(f"geomean speedup det={'on ' if det else 'off'} {name:6s}: {geomean(sps):6.2f}x "
                  f"over {len(sps)} cases, lowest {low:.2f}x")
            summary[f"det={'on' if det else 'off'} {name}"] = geomean(sps)
    with open(args.json, "w") as f:
        json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "largest": largest,
                   "geomeans": summary,
                   "cases": [dict(R=R, C=C, k=k, deterministic=d, us=o, torch_us=t) for (R, C, k, d, o, t) in results]},
                  f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        labels = [f"{R}x{C}\nk={k}" for (R, C, k) in cases]
        fig, ax = plt.subplots(figsize=(max(12, len(cases) * 0.55), 5))
        w = 0.4
        for j, det in enumerate((False, True)):
            sps = [t / o if o else 0 for (R, C, k, d, o, t) in results if d == det]
            ax.bar([i + (j - 0.5) * w for i in range(len(cases))], sps, w,
                   label=f"deterministic {'on' if det else 'off'}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_yscale("log")
        ax.set_ylabel("speedup over torch.topk")
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels(labels, rotation=90, fontsize=7)
        ax.set_title(f"FlyKernels topk vs torch.topk (FP32, {'largest' if largest else 'smallest'}, sorted)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print("saved", args.png)
    except ImportError as e:
        print("no matplotlib, no chart:", e, file=sys.stderr)


if __name__ == "__main__":
    main()
