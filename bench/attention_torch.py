#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Attention forward: FlyKernels (through `flybench attention`) beside SDPA's cuDNN, flash (FA2)
and memory-efficient backends, same run, same timing (bench/timing.py: events, L2 read-flush,
median).

  python3 bench/attention_torch.py [--flybench build/flybench] [--suite suites/attention.json]
                                   [--dtype bf16] [--png bench/attention.png] [--json bench/attention_latest.json]

--bwd: the backward instead (`flybench attention --bwd`; SDPA's backward timed as
torch.autograd.grad of one forward's output, retain_graph), TFLOP/s at 2.5x the forward FLOPs.
--fwdbwd: forward + backward together, what a training step pays: ours is the sum of flybench's
forward and backward times per case (two runs, --no-decode), SDPA's one forward followed by its
autograd.grad, timed as one call; TFLOP/s at 3.5x the forward FLOPs.

Prints per case TFLOP/s (4 B Hq Sq Sk D, halved when causal) of ours and each backend that runs
it, the ratios, and geometric means per target group (D 64/128/256 vs cuDNN, vs flash, D 32 vs
flash, D 512 vs memory-efficient, decode vs reading K and V once); saves a bar chart.
"""
import argparse, json, math, os, subprocess, sys, tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import time_us  # noqa: E402

BACKENDS = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION)]


def sdpa_us(c, backend, reps, bwd=False, fwdbwd=False):
    dt = torch.bfloat16 if c["dtype"] == "bf16" else torch.float16
    B, Hq, Hkv, Sq, Sk, D = (c[k] for k in ("B", "Hq", "Hkv", "Sq", "Sk", "D"))
    grad = bwd or fwdbwd
    q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=dt, requires_grad=grad)
    k = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dt, requires_grad=grad)
    v = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dt, requires_grad=grad)
    gqa = Hq != Hkv
    try:
        with sdpa_kernel([backend]):
            if fwdbwd:
                dout = torch.randn_like(q)
                fn = lambda: torch.autograd.grad(
                    F.scaled_dot_product_attention(q, k, v, is_causal=c["causal"], enable_gqa=gqa), (q, k, v), dout)
            elif bwd:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=c["causal"], enable_gqa=gqa)
                dout = torch.randn_like(out)
                fn = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            else:
                fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=c["causal"], enable_gqa=gqa)
            fn()
            torch.cuda.synchronize()
            return time_us(fn, reps=reps, warm_ms=20)
    except RuntimeError:
        return None  # this backend does not run the case


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flybench", default="build/flybench")
    ap.add_argument("--suite", default="suites/attention.json")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--png", default="bench/attention.png")
    ap.add_argument("--json", default="bench/attention_latest.json")
    ap.add_argument("--bwd", action="store_true", help="the backward (default chart/json names get a _bwd suffix)")
    ap.add_argument("--fwdbwd", action="store_true", help="forward + backward together (see the docstring)")
    ap.add_argument("--no-decode", action="store_true", help="only the suite's cases (flybench --no-decode)")
    a = ap.parse_args()
    if a.fwdbwd:
        a.bwd, a.no_decode = False, True
    tag = "_bwd" if a.bwd else "_fwdbwd" if a.fwdbwd else ""
    if tag:
        a.png = a.png.replace(".png", tag + ".png") if a.png == "bench/attention.png" else a.png
        a.json = a.json.replace("_latest", tag + "_latest") if a.json == "bench/attention_latest.json" else a.json

    def flybench(extra):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            tmp = f.name
        cmd = [a.flybench, "attention", "--suite", a.suite, "--json", tmp, "--reps", str(a.reps)] + extra
        if a.dtype:
            cmd += ["--dtype", a.dtype]
        if a.no_decode:
            cmd += ["--no-decode"]
        subprocess.run(cmd, check=False)
        res = json.load(open(tmp))
        os.unlink(tmp)
        return res

    ours = flybench(["--bwd"] if a.bwd else [])
    if a.fwdbwd:  # ours = forward + backward per case, the cases both runs have
        key = lambda c: tuple(c[k] for k in ("dtype", "B", "Hq", "Hkv", "Sq", "Sk", "D", "causal"))
        bwd = {key(c): c for c in flybench(["--bwd"])["cases"]}
        both = []
        for c in ours["cases"]:
            b = bwd.get(key(c))
            if b:
                fwd_flops = c["tflops"] * c["us"]  # TFLOP/s x us of the forward alone
                c = dict(c, us=c["us"] + b["us"], fwd_us=c["us"], bwd_us=b["us"], variant_bwd=b["variant"])
                c["tflops"] = 3.5 * fwd_flops / c["us"]
                both.append(c)
        ours["cases"] = both

    rows = []
    hdr = f"{'case':<52} {'ours':>7} {'cudnn':>7} {'flash':>7} {'effic':>7}  {'x cudnn':>7} {'x flash':>7} {'x effic':>7}"
    print("\nTFLOP/s (decode rows: us, and the K/V read time at copy bandwidth)\n" + hdr)
    for c in ours["cases"]:
        r = dict(c)
        for name, be in BACKENDS:
            r[name + "_us"] = sdpa_us(c, be, a.reps, a.bwd, a.fwdbwd)
        tf = {n: (c["tflops"] * c["us"] / r[n + "_us"] if r[n + "_us"] else None) for n, _ in BACKENDS}
        ratio = {n: (r[n + "_us"] / c["us"] if r[n + "_us"] else None) for n, _ in BACKENDS}
        r["ratio"] = ratio
        rows.append(r)
        name = (f"{c['dtype']} B{c['B']} H{c['Hq']}/{c['Hkv']} S{c['Sq']}x{c['Sk']} D{c['D']}"
                + (" causal" if c["causal"] else ""))
        fmt = lambda x: f"{x:7.1f}" if x else "      -"
        fr = lambda x: f"{x:7.3f}" if x else "      -"
        if c["Sq"] <= 16:
            print(f"{name:<52} {c['us']:6.1f}u " + " ".join(f"{r[n + '_us']:6.1f}u" if r[n + "_us"] else "      -" for n, _ in BACKENDS)
                  + f"  {fr(ratio['cudnn'])} {fr(ratio['flash'])} {fr(ratio['efficient'])}  K/V read {c['kv_read_us']:.1f} us"
                  + f" (ours {c['us'] / c['kv_read_us']:.2f}x of it)")
        else:
            print(f"{name:<52} {c['tflops']:7.1f} {fmt(tf['cudnn'])} {fmt(tf['flash'])} {fmt(tf['efficient'])}"
                  f"  {fr(ratio['cudnn'])} {fr(ratio['flash'])} {fr(ratio['efficient'])}")

    long = [r for r in rows if r["Sq"] > 16]
    if a.fwdbwd:
        groups = [("fwd+bwd D 64/128/256 vs cuDNN", [r["ratio"]["cudnn"] for r in long if r["D"] in (64, 128, 256)]),
                  ("fwd+bwd D 64/128/256 vs flash", [r["ratio"]["flash"] for r in long if r["D"] in (64, 128, 256)]),
                  ("fwd+bwd all vs efficient", [r["ratio"]["efficient"] for r in long])]
    elif a.bwd:
        groups = [("bwd D 64/128/256 vs cuDNN (target >= 0.9)", [r["ratio"]["cudnn"] for r in long if r["D"] in (64, 128, 256)]),
                  ("bwd all vs cuDNN", [r["ratio"]["cudnn"] for r in long]),
                  ("bwd D 64/128/256 vs flash (target >= 1.6)", [r["ratio"]["flash"] for r in long if r["D"] in (64, 128, 256)]),
                  ("bwd all vs efficient", [r["ratio"]["efficient"] for r in long]),
                  ("bwd D 512 vs efficient (target >= 6)", [r["ratio"]["efficient"] for r in long if r["D"] == 512])]
    else:
        groups = [("D 64/128/256 vs cuDNN (target >= 1.0)", [r["ratio"]["cudnn"] for r in long if r["D"] in (64, 128, 256)]),
              ("all prefill vs cuDNN", [r["ratio"]["cudnn"] for r in long]),
              ("D 64/128/256 vs flash (target >= 1.8)", [r["ratio"]["flash"] for r in long if r["D"] in (64, 128, 256)]),
              ("D 32 vs flash (target >= 1.2)", [r["ratio"]["flash"] for r in long if r["D"] == 32]),
              ("D 512 vs efficient (target >= 3)", [r["ratio"]["efficient"] for r in long if r["D"] == 512])]
    print("\ngeometric means of (backend time / our time):")
    for label, xs in groups:
        print(f"  {label:<42} {geomean(xs):.3f} over {len([x for x in xs if x])} cases")
    with open(a.json, "w") as f:
        json.dump({"gpu": ours.get("gpu"), "torch": torch.__version__, "cases": rows}, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        labels = [f"{r['dtype']} D{r['D']} S{r['Sq']}x{r['Sk']}{' c' if r['causal'] else ''}" for r in rows]
        fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.35), 4))
        w = 0.27
        for i, (n, _) in enumerate(BACKENDS):
            ax.bar([x + (i - 1) * w for x in range(len(rows))], [r["ratio"][n] or 0 for r in rows], w, label=f"vs {n}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, rotation=90, fontsize=6)
        ax.set_ylabel("speedup (backend time / ours)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.png, dpi=120)
        print("chart:", a.png)
    except ImportError:
        print("matplotlib missing: no chart")


if __name__ == "__main__":
    main()
