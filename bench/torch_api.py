#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""FlyKernels through PyTorch's public API, beside the same calls with FlyKernels disabled, same run.

  python bench/torch_api.py [--suites rmsnorm,topk,gemm] [--gemm-full] [--gemm-budget-s 150] [--gemm-from I]
                            [--json bench/torch_api_latest.json] [--png bench/torch_api.png]

- rmsnorm (suites/rmsnorm.json): F.rms_norm(x, [N], w, 1e-5); topk (suites/topk.json):
  torch.topk(x, k), deterministic algorithms off and on. Each case is timed three ways, interleaved:
  `stock` (flykernels.torch.disabled()), `api` (the public call with our override) and `abi` (the
  packaged libflykernels called directly through ctypes with preallocated outputs: what flybench
  measures), so api/stock can be held against abi/stock. Times: bench/timing.py (CUDA events,
  L2 flushed by a read, median). `b2b` columns: microseconds per call of 200 back-to-back calls
  without flush or spin, which exposes the host cost of a call on small shapes.
- gemm (suites/gemm_bf16.json): x @ y under torch.compile(mode="max-autotune-no-cudagraphs")
  (the same autotuning as "max-autotune", without CUDA graphs copying the inputs), compiled once
  with FlyKernels' candidates and once without; also eager torch.mm (cuBLAS). By default a subset
  of shapes in all four layouts, stopping when --gemm-budget-s is spent; --gemm-full runs all 15.
Correctness: every api result is compared with the stock one (and a float64 reference for GEMM).
"""
import argparse
import ctypes
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fly_abi import FlyTensor, desc, load  # noqa: E402
from timing import interleaved_us  # noqa: E402

import flykernels  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GEMM_SUBSET = [(64, 4096, 4096), (512, 4096, 4096), (2048, 6144, 4096), (4096, 4096, 4096)]


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def rel_err(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def desc_i64(t):
    """fly_tensor of a contiguous int64 [R, k] tensor (fly_abi.desc covers float types only)."""
    d = FlyTensor()
    d.data, d.dtype, d.rank = t.data_ptr(), 6, 2  # FLY_I64
    d.sizes[0], d.sizes[1] = t.shape
    d.strides[0], d.strides[1] = t.stride()
    return d


def back_to_back_us(fn, n=200):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / n


def time_three(stock, api, abi, rounds=3):
    ctl = flykernels.torch

    def before(name):  # the stock contender runs with our overrides removed
        if name == "stock":
            ctl.disable(["rms_norm", "topk"])
        else:
            ctl.enable(["rms_norm", "topk"])

    t = interleaved_us([("stock", stock), ("api", api), ("abi", abi)], rounds, before=before, reps=50)
    ctl.enable(["rms_norm", "topk"])
    return t


def lib_handle():
    return load(os.path.join(os.path.dirname(flykernels.__file__), "libflykernels.so.0"))


def bench_rmsnorm(lib, out):
    suite = json.load(open(os.path.join(ROOT, "suites/rmsnorm.json")))
    ctl = flykernels.torch
    rows = []
    for c in suite["cases"]:
        M, N, dt = c["M"], c["N"], DT[c["dtype"]]
        x = torch.randn(M, N, device="cuda", dtype=dt)
        w = torch.randn(N, device="cuda", dtype=dt)
        y = torch.empty_like(x)
        rstd = torch.empty(M, device="cuda", dtype=torch.float32)
        xd, wd, yd, rd = desc(x), desc(w), desc(y), desc(rstd)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

        def abi():
            st = lib.fly_rms_norm_fwd(ctypes.byref(xd), ctypes.byref(wd), ctypes.c_double(1e-5), ctypes.byref(yd),
                                      ctypes.byref(rd), stream)
            if st:
                raise RuntimeError(lib.fly_get_last_error().decode())

        call = lambda: F.rms_norm(x, [N], w, 1e-5)  # noqa: E731
        ctl.reset_counts()
        got = call()
        assert ctl.dispatch_counts()["rms_norm"] == (1, 0), ("override not taken", c)
        with ctl.disabled():
            ref = call()
        err = rel_err(got, ref)
        assert err < (1e-5 if dt == torch.float32 else 1e-2), (c, err)
        t = time_three(call, call, abi)
        b2b = {}
        if M * N <= (1 << 20):  # host cost visible only where the kernel is short
            with ctl.disabled():
                b2b["stock"] = back_to_back_us(call)
            b2b["api"] = back_to_back_us(call)
            b2b["abi"] = back_to_back_us(abi)
        gb = (2 * M * N * x.element_size() + N * x.element_size() + 4 * M) / 1e9
        row = dict(dtype=c["dtype"], M=M, N=N, stock_us=t["stock"], api_us=t["api"], abi_us=t["abi"],
                   api_speedup=t["stock"] / t["api"], abi_speedup=t["stock"] / t["abi"],
                   api_tbps=gb / t["api"] * 1e6 / 1e3, rel_err_vs_stock=err, b2b_us=b2b)
        rows.append(row)
        print(f"rmsnorm {c['dtype']:5s} {M:6d}x{N:<6d} stock {t['stock']:8.1f} api {t['api']:8.1f} abi {t['abi']:8.1f} us"
              f"  api {row['api_speedup']:5.2f}x abi {row['abi_speedup']:5.2f}x"
              + (f"  b2b stock/api/abi {b2b['stock']:.1f}/{b2b['api']:.1f}/{b2b['abi']:.1f} us" if b2b else ""),
              flush=True)
    out["rmsnorm"] = summarize(rows)


def bench_topk(lib, out):
    suite = json.load(open(os.path.join(ROOT, "suites/topk.json")))
    ctl = flykernels.torch
    rows = []
    for c in suite["cases"]:
        R, C, k = c["R"], c["C"], c["k"]
        x = torch.rand(R, C, device="cuda") * 2 - 1
        for det in (False, True):
            torch.use_deterministic_algorithms(det)
            v = torch.empty(R, k, device="cuda")
            i = torch.empty(R, k, device="cuda", dtype=torch.int64)
            xd, vd, idd = desc(x), desc(v), desc_i64(i)
            nbytes = ctypes.c_size_t(0)
            lib.fly_topk_workspace_size(ctypes.byref(xd), ctypes.c_int64(k), 1, int(det), ctypes.byref(nbytes))
            ws = torch.empty(max(nbytes.value, 1), device="cuda", dtype=torch.uint8)
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

            def abi():
                st = lib.fly_topk(ctypes.byref(xd), ctypes.c_int64(k), 1, int(det), ctypes.byref(vd), ctypes.byref(idd),
                                  ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(nbytes.value), stream)
                if st:
                    raise RuntimeError(lib.fly_get_last_error().decode())

            call = lambda: torch.topk(x, k)  # noqa: E731
            ctl.reset_counts()
            gv, gi = call()
            assert ctl.dispatch_counts()["topk"] == (1, 0), ("override not taken", c)
            with ctl.disabled():
                sv, _ = call()
            assert torch.equal(gv, sv) and torch.equal(torch.gather(x, 1, gi), gv), c
            t = time_three(call, call, abi)
            b2b = {}
            if R * C <= (1 << 20):
                with ctl.disabled():
                    b2b["stock"] = back_to_back_us(call)
                b2b["api"] = back_to_back_us(call)
                b2b["abi"] = back_to_back_us(abi)
            row = dict(R=R, C=C, k=k, deterministic=det, stock_us=t["stock"], api_us=t["api"], abi_us=t["abi"],
                       api_speedup=t["stock"] / t["api"], abi_speedup=t["stock"] / t["abi"], b2b_us=b2b)
            rows.append(row)
            print(f"topk {R:6d}x{C:<8d} k={k:<5d} det={int(det)} stock {t['stock']:8.1f} api {t['api']:8.1f} "
                  f"abi {t['abi']:8.1f} us  api {row['api_speedup']:5.2f}x abi {row['abi_speedup']:5.2f}x", flush=True)
    torch.use_deterministic_algorithms(False)
    out["topk"] = summarize(rows)


def summarize(rows):
    g_api, g_abi = geomean([r["api_speedup"] for r in rows]), geomean([r["abi_speedup"] for r in rows])
    # the target: api keeps >= 90% of the abi geomean speedup; no abi win turned into an api loss
    flipped = [r for r in rows if r["abi_speedup"] > 1.0 and r["api_speedup"] < 1.0]
    return dict(cases=rows, geomean_api_speedup=g_api, geomean_abi_speedup=g_abi,
                api_fraction_of_abi=(g_api / g_abi if g_abi else float("nan")), wins_turned_losses=len(flipped))


def make_operand(rows, cols, transposed, dt):
    """[rows, cols] view: row-major, or the transpose of a row-major [cols, rows]."""
    if transposed:
        return torch.randn(cols, rows, device="cuda", dtype=dt).t()
    return torch.randn(rows, cols, device="cuda", dtype=dt)


def bench_gemm(out, full, budget_s, first=0):
    import torch._inductor.config as ic
    from torch._inductor.utils import run_and_get_code

    suite = json.load(open(os.path.join(ROOT, "suites/gemm_bf16.json")))
    cases = suite["cases"]
    if full and not 0 <= first < len(cases):
        raise SystemExit(f"--gemm-from {first}: the suite has {len(cases)} shapes (0..{len(cases) - 1}); "
                         "it counts shapes, each run in four layouts")
    shapes = [(c["M"], c["N"], c["K"]) for c in cases][first:] if full else GEMM_SUBSET
    ctl = flykernels.torch
    rows, skipped = [], []
    t_start = time.time()
    ic.fx_graph_cache = False  # the graph cache does not know our candidates are on or off
    for (M, N, K) in shapes:
        for layout in ("NT", "NN", "TN", "TT"):
            if time.time() - t_start > budget_s:
                skipped.append(f"{layout} {M}x{N}x{K}")
                continue
            a = make_operand(M, K, layout[0] == "T", torch.bfloat16)
            b = make_operand(K, N, layout[1] == "T", torch.bfloat16)  # NT: B stored [N, K]
            ref = a.double() @ b.double()
            # Two code objects, so dynamo keeps both compiled graphs (one with our candidates, one
            # without) and they can be timed interleaved, beside eager cuBLAS.
            fns = {True: lambda x, y: x @ y, False: lambda x, y: x @ y}  # noqa: E731
            torch._dynamo.reset()
            res, compiled = {}, {}
            for on in (True, False):
                if on:
                    ctl.enable(["gemm"])
                else:
                    ctl.disable(["gemm"])
                ctl.reset_counts()
                f = torch.compile(fns[on], mode="max-autotune-no-cudagraphs")
                t0 = time.time()
                got, code = run_and_get_code(f, a, b)
                compile_s = time.time() - t0
                err = rel_err(got, ref)
                assert err < 1e-2, (layout, M, N, K, on, err)
                compiled[on] = f
                res[on] = dict(ours_picked="flykernels_mm" in "\n".join(code), compile_s=compile_s, err=err)
            ctl.enable(["gemm"])
            times = interleaved_us([("on", lambda: compiled[True](a, b)), ("off", lambda: compiled[False](a, b)),
                                    ("eager", lambda: torch.mm(a, b))], rounds=5, reps=10, warm_ms=20)
            res[True]["us"], res[False]["us"], eager = times["on"], times["off"], times["eager"]
            tflops = 2 * M * N * K / 1e12
            row = dict(layout=layout, M=M, N=N, K=K, with_fly_us=res[True]["us"], without_fly_us=res[False]["us"],
                       eager_cublas_us=eager, speedup=res[False]["us"] / res[True]["us"],
                       ours_picked=res[True]["ours_picked"], tflops_with=tflops / res[True]["us"] * 1e6,
                       compile_s=res[True]["compile_s"] + res[False]["compile_s"], rel_err=res[True]["err"])
            rows.append(row)
            print(f"gemm {layout} {M:5d}x{N:<5d}x{K:<5d} inductor+fly {row['with_fly_us']:8.1f} inductor "
                  f"{row['without_fly_us']:8.1f} cublas {eager:8.1f} us  {row['speedup']:5.2f}x  "
                  f"ours picked: {row['ours_picked']}  (compile {row['compile_s']:.0f} s)", flush=True)
    ctl.enable()
    out["gemm"] = dict(cases=rows, skipped_for_budget=skipped, full_suite=full,
                       geomean_speedup=geomean([r["speedup"] for r in rows]),
                       picked=sum(r["ours_picked"] for r in rows))


def chart(out, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no chart")
        return
    panels = [k for k in ("rmsnorm", "topk", "gemm") if k in out]
    fig, axes = plt.subplots(len(panels), 1, figsize=(14, 4 * len(panels)), squeeze=False)
    for ax, key in zip(axes[:, 0], panels):
        rows = out[key]["cases"]
        if key == "rmsnorm":
            labels = [f"{r['dtype']} {r['M']}x{r['N']}" for r in rows]
            series = [("api / stock", [r["api_speedup"] for r in rows]), ("abi / stock", [r["abi_speedup"] for r in rows])]
        elif key == "topk":
            labels = [f"{r['R']}x{r['C']} k{r['k']}{' d' if r['deterministic'] else ''}" for r in rows]
            series = [("api / stock", [r["api_speedup"] for r in rows]), ("abi / stock", [r["abi_speedup"] for r in rows])]
        else:
            labels = [f"{r['layout']} {r['M']}x{r['N']}x{r['K']}" for r in rows]
            series = [("inductor+fly / inductor", [r["speedup"] for r in rows])]
        width = 0.8 / len(series)
        for j, (name, vals) in enumerate(series):
            ax.bar([i + j * width for i in range(len(vals))], vals, width, label=name)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))])
        ax.set_xticklabels(labels, rotation=75, fontsize=7)
        ax.set_ylabel("speedup over stock")
        ax.set_title(f"{key}: through the public torch API (H200)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("chart:", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--suites", default="rmsnorm,topk,gemm")
    ap.add_argument("--gemm-full", action="store_true", help="all 15 GEMM shapes (default: a 4-shape subset)")
    ap.add_argument("--gemm-budget-s", type=float, default=150.0, help="stop starting GEMM cases after this")
    ap.add_argument("--gemm-from", type=int, default=0,
                    help="with --gemm-full: start at this suite shape (0-based; a shape is four cases, one per layout),\n"
                         "to cover the suite over several runs")
    ap.add_argument("--json", default="bench/torch_api_latest.json")
    ap.add_argument("--png", default="bench/torch_api.png")
    args = ap.parse_args()
    if not flykernels.available:
        sys.exit(f"flykernels not available: {flykernels.reason}")
    torch.manual_seed(0)
    out = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               date=time.strftime("%Y-%m-%d %H:%M:%S"), command=" ".join(sys.argv))
    suites = args.suites.split(",")
    lib = lib_handle()
    if "rmsnorm" in suites:
        bench_rmsnorm(lib, out)
    if "topk" in suites:
        bench_topk(lib, out)
    if "gemm" in suites:
        bench_gemm(out, args.gemm_full, args.gemm_budget_s, args.gemm_from)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print("\nsummary")
    for key in ("rmsnorm", "topk"):
        if key in out:
            s = out[key]
            print(f"  {key}: geomean api {s['geomean_api_speedup']:.3f}x, abi {s['geomean_abi_speedup']:.3f}x, "
                  f"api/abi {s['api_fraction_of_abi']:.3f} (target >= 0.90), abi wins turned api losses: "
                  f"{s['wins_turned_losses']}")
    if "gemm" in out:
        g = out["gemm"]
        print(f"  gemm: {len(g['cases'])} cases, geomean inductor+fly / inductor {g['geomean_speedup']:.3f}x "
              f"(target >= 1.0), ours picked in {g['picked']}; skipped for budget: {len(g['skipped_for_budget'])}")
    chart(out, args.png)


if __name__ == "__main__":
    main()
