#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""RMSNorm: FlyKernels (through `flybench rmsnorm`) beside torch.nn.functional.rms_norm, same run.

  python3 bench/rmsnorm_torch.py [--flybench build/flybench] [--suite suites/rmsnorm.json]
                                 [--png bench/rmsnorm.png] [--json bench/rmsnorm_latest.json]

Prints, per suite case, both times, both bandwidths and the speedup, then the geometric mean,
the bf16 8192x4096 fraction of copy bandwidth, and the odd-N cases against their aligned
neighbours; saves a bar chart of the speedups.
"""
import argparse, json, math, os, subprocess, sys, tempfile

import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import time_us  # noqa: E402
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flybench", default="build/flybench")
    ap.add_argument("--suite", default="suites/rmsnorm.json")
    ap.add_argument("--png", default="bench/rmsnorm.png")
    ap.add_argument("--json", default="bench/rmsnorm_latest.json")
    a = ap.parse_args()

    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        tmp = f.name
    subprocess.run([a.flybench, "rmsnorm", "--suite", a.suite, "--json", tmp], check=True)
    ours = json.load(open(tmp))
    os.unlink(tmp)

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    rows = []
    for c in ours["cases"]:
        M, N, dt = c["M"], c["N"], dtypes[c["dtype"]]
        x = torch.randn(M, N, device="cuda", dtype=dt)
        w = torch.rand(N, device="cuda", dtype=dt) + 0.5
        fn = lambda: F.rms_norm(x, (N,), w, 1e-5)
        t_ms = time_us(fn, reps=100) * 1e-3
        es = x.element_size()
        nbytes = (2 * M * N + N) * es + M * 4
        rows.append(dict(c, torch_us=t_ms * 1e3, torch_tbps=nbytes / (t_ms * 1e-3) / 1e12,
                         speedup=t_ms * 1e3 / c["us"]))

    print(f"\nRMSNorm forward on {ours['gpu']} (copy {ours['copy_tbps']:.2f} TB/s), torch {torch.__version__}")
    print(f"{'dtype':5} {'M':>6} {'N':>6} {'fly us':>9} {'torch us':>9} {'fly TB/s':>9} {'torch TB/s':>10} {'speedup':>8}")
    for r in rows:
        print(f"{r['dtype']:5} {r['M']:6d} {r['N']:6d} {r['us']:9.2f} {r['torch_us']:9.2f} "
              f"{r['tbps']:9.3f} {r['torch_tbps']:10.3f} {r['speedup']:7.2f}x")
    gm = math.exp(sum(math.log(r["speedup"]) for r in rows) / len(rows))
    print(f"geometric mean speedup over F.rms_norm: {gm:.2f}x over {len(rows)} cases")
    key = {(r["dtype"], r["M"], r["N"]): r for r in rows}
    big = key.get(("bf16", 8192, 4096))
    if big:
        print(f"bf16 8192x4096: {big['tbps']:.3f} TB/s = {100 * big['copy_fraction']:.1f}% of copy bandwidth"
              + (f"; a cudaMemcpy of the same bytes takes {big['same_size_copy_us']:.2f} us"
                 f" ({100 * big['same_size_copy_us'] / big['us']:.1f}% of our time)" if 'same_size_copy_us' in big else ""))
    for (dt, M, N), r in sorted(key.items()):
        if N % 2 == 1 and N > 1000:
            nb = key.get((dt, M, N - 1))
            if nb:
                print(f"{dt} {M}x{N}: {r['tbps']:.3f} TB/s vs {M}x{N - 1}: {nb['tbps']:.3f} TB/s "
                      f"({100 * r['tbps'] / nb['tbps']:.1f}%)")
    json.dump({"gpu": ours["gpu"], "copy_tbps": ours["copy_tbps"], "torch": torch.__version__,
               "geomean_speedup": gm, "cases": rows}, open(a.json, "w"), indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(12, 4.5))
        labels = [f"{r['dtype']} {r['M']}x{r['N']}" for r in rows]
        ax.bar(range(len(rows)), [r["speedup"] for r in rows], color="#3b7dd8")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(gm, color="#d83b3b", ls="--", lw=1, label=f"geomean {gm:.2f}x")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("speedup over F.rms_norm")
        ax.set_title(f"FlyKernels RMSNorm forward vs torch {torch.__version__} ({ours['gpu']})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.png, dpi=110)
        print(f"chart: {a.png}")
    except Exception as e:  # the numbers above are the result; the chart is a convenience
        print(f"chart not written: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
