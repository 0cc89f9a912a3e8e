#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""FlyKernels grouped GEMM vs F.grouped_mm (torch._grouped_mm: CUTLASS on sm_90) and a loop of
torch.mm (cuBLAS, one call per group) on the grouped_gemm suite, in the same process.

Per case: A [T, K] bf16, B [G, K, N] (nt: K contiguous, B = w.transpose(-2, -1) of w [G, N, K],
the layout the F.grouped_mm (CUTLASS) baseline figures are measured in; nn: N contiguous),
offs = cumulative int32 group ends on the device. FlyKernels runs through the C ABI (ctypes). Each
contender's output is checked against F.grouped_mm's (ours poisoned with NaN first), then all are
timed INTERLEAVED (bench/timing.py: ROUNDS rounds in rotating order, each after ~WARM_MS of
back-to-back calls, L2 flushed by a 256 MiB read before every timed call, median). Prints per-case
times, the ratios FlyKernels / F.grouped_mm and FlyKernels / faster baseline (speedup: > 1 is
faster), geomeans per kind and overall, and the issue's targets; --json writes the rows, --png a
bar chart (when matplotlib is there). --triton adds Inductor's grouped GEMM under
torch.compile(mode="max-autotune-no-cudagraphs") (slow to compile: off by default).

  python3 bench/grouped_gemm_torch.py --lib build/libflykernels.so [--suite suites/grouped_gemm.json]
        [--layout nt] [--fly-json flybench.json] [--json out.json] [--png grouped.png] [--triton]

--dB: the weight gradient of the same cases instead (F.grouped_mm's backward for B, the ragged-K
2-D x 2-D form): out[g] = X[rows of g].t() @ dC[rows of g] for X [T, K], dC [T, N], i.e.
torch._grouped_mm(X.t(), dC, offs) -> [G, K, N], beside that stock call and a loop of torch.mm
over the groups; ours also with each mode-k default variant forced (--dB-variants). --cases picks
the cases (default for --dB: 0,3,6,7,8,16,19,21,23).
"""
import argparse
import ctypes
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import compile_per_shape, interleaved_us  # noqa: E402
from fly_abi import FlyTensor, desc, load  # noqa: E402

WARM_MS = 30.0
ROUNDS = 3
FLY_I32 = 5


def desc_i32(t):
    d = FlyTensor()
    d.data = t.data_ptr()
    d.dtype = FLY_I32
    d.rank = 1
    d.sizes[0] = t.shape[0]
    d.strides[0] = t.stride(0)
    return d


def grouped_caller(lib, a, b, offs, c):
    ad, bd, od, cd = desc(a), desc(b), desc_i32(offs), desc(c)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def call():
        if lib.fly_grouped_gemm(ctypes.byref(ad), ctypes.byref(bd), ctypes.byref(od), None, ctypes.byref(cd),
                                None, ctypes.c_size_t(0), stream):
            raise RuntimeError(lib.fly_get_last_error().decode())
    return call


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def ragged_k_caller(lib, a, b, offs, c, force=None):
    """fly_grouped_gemm in the ragged-K mode (a [M, Kt], b [Kt, N], offs along K, c [G, M, N]) with
    its workspace (G x 256 bytes), optionally with a variant forced around each call."""
    ad, bd, od, cd = desc(a), desc(b), desc_i32(offs), desc(c)
    nbytes = ctypes.c_size_t(0)
    if lib.fly_grouped_gemm_workspace_size(ctypes.byref(ad), ctypes.byref(bd), ctypes.byref(od), ctypes.byref(cd),
                                           ctypes.byref(nbytes)):
        raise RuntimeError(lib.fly_get_last_error().decode())
    ws = torch.empty(max(nbytes.value, 256), device="cuda", dtype=torch.uint8)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    fname = force.encode() if force else None

    def call():
        if fname:
            lib.fly_force_variant(fname)
        st = lib.fly_grouped_gemm(ctypes.byref(ad), ctypes.byref(bd), ctypes.byref(od), None, ctypes.byref(cd),
                                  ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(nbytes.value), stream)
        if fname:
            lib.fly_force_variant(None)
        if st:
            raise RuntimeError(lib.fly_get_last_error().decode())
    call.workspace = ws
    return call


def main_db(args, lib):
    suite = json.load(open(args.suite))
    dtype = torch.bfloat16
    sel = [int(x) for x in (args.cases or "0,3,6,7,8,16,19,21,23").split(",")]
    forced = [v for v in args.dB_variants.split(",") if v]
    print(f"grouped GEMM weight gradient (ragged K) on {torch.cuda.get_device_name()} (torch {torch.__version__}), "
          f"bf16, a = X.t() (M contiguous), b = dC (N contiguous), {ROUNDS} interleaved rounds, warm-up {WARM_MS} ms, "
          f"L2 flushed")
    print(f"{'case':>4} {'kind':<10} {'G':>4} {'T':>6} {'K':>6} {'N':>6} {'fly_us':>9} {'gmm_us':>9} {'mmloop_us':>9} "
          f"{'fly TF/s':>8} {'x gmm':>6} {'x loop':>6} {'err':>8}  variant; forced variants (us)")
    rows = []
    lib.fly_force_variant.argtypes = [ctypes.c_char_p]
    for idx in sel:
        case = suite["cases"][idx]
        sizes, K, N = case["M"], case["K"], case["N"]
        G, T = len(sizes), sum(sizes)
        torch.manual_seed(idx)
        x = torch.randn(T, K, device="cuda", dtype=dtype)
        dc = torch.randn(T, N, device="cuda", dtype=dtype)
        ends, run = [], 0
        for m in sizes:
            run += m
            ends.append(run)
        offs = torch.tensor(ends, device="cuda", dtype=torch.int32)
        a = x.t()  # [K, T], M contiguous: what autograd passes
        ref = torch._grouped_mm(a, dc, offs=offs)
        out = torch.empty(G, K, N, device="cuda", dtype=dtype)
        out.fill_(float("nan"))
        fly = ragged_k_caller(lib, a, dc, offs, out)
        fly()
        torch.cuda.synchronize()
        variant = lib.fly_last_variant().decode()
        reff = ref.float()
        err = ((out.float() - reff).abs() / (reff.abs() + 1.0)).max().item()
        empty_ok = all(bool((out[g] == 0).all()) for g in range(G) if sizes[g] == 0)
        del reff
        bounds = list(zip([0] + ends[:-1], ends))
        cl = torch.empty(G, K, N, device="cuda", dtype=dtype)

        def mm_loop():
            for g, (s0, e) in enumerate(bounds):
                if e > s0:
                    torch.mm(a[:, s0:e], dc[s0:e], out=cl[g])
                else:
                    cl[g].zero_()

        contenders = [("fly", fly), ("grouped_mm", lambda: torch._grouped_mm(a, dc, offs=offs)), ("mm_loop", mm_loop)]
        for v in forced:
            contenders.append((v, ragged_k_caller(lib, a, dc, offs, cl, force=v)))
        t = interleaved_us(contenders, ROUNDS, reps=10, warmup=2, warm_ms=WARM_MS)
        flops = 2.0 * T * N * K
        row = {"case": idx, "kind": case.get("kind", "-"), "G": G, "T": T, "K": K, "N": N, "M": sizes, "mode": "dB",
               "fly_us": t["fly"], "grouped_mm_us": t["grouped_mm"], "mm_loop_us": t["mm_loop"],
               "fly_tflops": flops / t["fly"] / 1e6, "x_grouped_mm": t["grouped_mm"] / t["fly"],
               "x_mm_loop": t["mm_loop"] / t["fly"], "err": err, "empty_groups_zero": empty_ok, "variant": variant,
               "forced_us": {v: t[v] for v in forced}}
        rows.append(row)
        fv = " ".join(f"{v.replace('grouped_gemm_k_bf16_', '')}={t[v]:.1f}" for v in forced)
        print(f"{idx:>4} {row['kind']:<10} {G:>4} {T:>6} {K:>6} {N:>6} {t['fly']:>9.1f} {t['grouped_mm']:>9.1f} "
              f"{t['mm_loop']:>9.1f} {row['fly_tflops']:>8.1f} {row['x_grouped_mm']:>6.3f} {row['x_mm_loop']:>6.3f} "
              f"{err:>8.2e}  {variant}{'' if empty_ok else ' EMPTY GROUPS NOT ZERO'}; {fv}", flush=True)
        del x, dc, out, cl, ref, contenders, fly
        torch.cuda.empty_cache()
    if rows:
        print(f"geomean ({len(rows)} cases): x F.grouped_mm {geomean([r['x_grouped_mm'] for r in rows]):.3f} "
              f"(min {min(r['x_grouped_mm'] for r in rows):.3f}), x mm loop {geomean([r['x_mm_loop'] for r in rows]):.3f}")
        bad = [r["case"] for r in rows if not (r["err"] < 0.05) or not r["empty_groups_zero"]]
        if bad:
            print(f"WRONG RESULTS in cases {bad}")
    if args.json:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "mode": "dB", "rows": rows},
                  open(args.json, "w"), indent=1)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--suite", default=os.path.join(here, "..", "suites", "grouped_gemm.json"))
    ap.add_argument("--layout", default="nt", choices=["nt", "nn"])
    ap.add_argument("--fly-json", help="flybench grouped_gemm --json output of this run (variants, spot checks)")
    ap.add_argument("--json")
    ap.add_argument("--png")
    ap.add_argument("--triton", action="store_true")
    ap.add_argument("--cases", help="comma-separated case indices (default all)")
    ap.add_argument("--dB", action="store_true", help="the ragged-K weight gradient (see the docstring)")
    ap.add_argument("--dB-variants", default="grouped_gemm_k_bf16_bm128_bn256_st4_e1,grouped_gemm_k_bf16_bm128_bn128_st5_e1",
                    help="mode-k variants also timed forced (comma-separated; '' for none)")
    args = ap.parse_args()
    lib = load(args.lib)
    if args.dB:
        return main_db(args, lib)
    suite = json.load(open(args.suite))
    fly_rows = {}
    if args.fly_json and os.path.exists(args.fly_json):
        for r in json.load(open(args.fly_json)):
            if r["layout"] == args.layout:
                fly_rows[r["case"]] = r
    dtype = torch.bfloat16
    grouped_mm = getattr(torch.nn.functional, "grouped_mm", None) or torch._grouped_mm
    triton_fn = None
    if args.triton:
        # Inductor's Triton grouped-GEMM templates only (no ATen choice): the kernel Inductor would
        # generate; a shape none of its templates takes is reported as "-" for that case.
        triton_fn = compile_per_shape(lambda a, b, o: torch._grouped_mm(a, b, offs=o), backends="TRITON")
    print(f"grouped GEMM on {torch.cuda.get_device_name()} (torch {torch.__version__}), layout {args.layout}, "
          f"bf16, {ROUNDS} interleaved rounds, warm-up {WARM_MS} ms, L2 flushed")
    hdr = (f"{'case':>4} {'kind':<10} {'G':>4} {'T':>6} {'K':>6} {'N':>6} {'fly_us':>9} {'gmm_us':>9} "
           f"{'mmloop_us':>9}" + (f" {'triton_us':>9}" if triton_fn else "") +
           f" {'fly TF/s':>8} {'x gmm':>6} {'x best':>6} {'err':>8}  variant")
    print(hdr)
    rows = []
    sel = None if not args.cases else {int(x) for x in args.cases.split(",")}
    for idx, case in enumerate(suite["cases"]):
        if sel is not None and idx not in sel:
            continue
        sizes, K, N = case["M"], case["K"], case["N"]
        G, T = len(sizes), sum(sizes)
        torch.manual_seed(idx)
        a = torch.randn(T, K, device="cuda", dtype=dtype)
        if args.layout == "nt":
            b = torch.randn(G, N, K, device="cuda", dtype=dtype).transpose(-2, -1)
        else:
            b = torch.randn(G, K, N, device="cuda", dtype=dtype)
        ends, run = [], 0
        for m in sizes:
            run += m
            ends.append(run)
        offs = torch.tensor(ends, device="cuda", dtype=torch.int32)
        c = torch.empty(T, N, device="cuda", dtype=dtype)
        ref = grouped_mm(a, b, offs=offs).float()
        fly = grouped_caller(lib, a, b, offs, c)
        c.fill_(float("nan"))
        fly()
        err = ((c.float() - ref).abs() / (ref.abs() + 1.0)).max().item()
        lib.fly_last_variant.restype = ctypes.c_char_p
        variant = lib.fly_last_variant().decode()
        bounds = list(zip([0] + ends[:-1], ends))
        cl = torch.empty(T, N, device="cuda", dtype=dtype)

        def mm_loop():
            for g, (s, e) in enumerate(bounds):
                if e > s:
                    torch.mm(a[s:e], b[g], out=cl[s:e])

        contenders = [("fly", fly), ("grouped_mm", lambda: grouped_mm(a, b, offs=offs)), ("mm_loop", mm_loop)]
        if triton_fn is not None:
            try:
                ct = triton_fn(a, b, offs)  # compile and autotune outside the timing
                terr = (ct.float() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
                if not terr < 2e-2:
                    raise RuntimeError(f"relative error {terr:.3g}")
                contenders.append(("triton", lambda: triton_fn(a, b, offs)))
            except Exception as e:  # noqa: BLE001 - a benchmark row, not a failure of ours
                print(f"case {idx}: Inductor's Triton grouped GEMM not timed ({type(e).__name__}: {str(e)[:120]})")
        t = interleaved_us(contenders, ROUNDS, reps=20, warmup=3, warm_ms=WARM_MS)
        best = min(v for k, v in t.items() if k in ("grouped_mm", "triton"))
        flops = 2.0 * T * N * K
        row = {"case": idx, "kind": case.get("kind", "-"), "G": G, "T": T, "K": K, "N": N, "M": sizes,
               "layout": args.layout, "fly_us": t["fly"], "grouped_mm_us": t["grouped_mm"], "mm_loop_us": t["mm_loop"],
               "triton_us": t.get("triton"), "fly_tflops": flops / t["fly"] / 1e6,
               "x_grouped_mm": t["grouped_mm"] / t["fly"], "x_best": best / t["fly"],
               "x_mm_loop": t["mm_loop"] / t["fly"], "err": err, "variant": variant,
               "x_triton": t["triton"] / t["fly"] if "triton" in t else None}
        if idx in fly_rows:
            row["flybench_us"] = fly_rows[idx]["us"]
        rows.append(row)
        print(f"{idx:>4} {row['kind']:<10} {G:>4} {T:>6} {K:>6} {N:>6} {t['fly']:>9.1f} {t['grouped_mm']:>9.1f} "
              f"{t['mm_loop']:>9.1f}" + ((f" {t['triton']:>9.1f}" if "triton" in t else f" {'-':>9}") if triton_fn else "") +
              f" {row['fly_tflops']:>8.1f} {row['x_grouped_mm']:>6.3f} {row['x_best']:>6.3f} {err:>8.2e}  {variant}",
              flush=True)
        del a, b, c, cl, ref
        torch.cuda.empty_cache()
    print()
    for kind in ["uniform", "projection", "ragged"]:
        xs = [r["x_best"] for r in rows if r["kind"] == kind]
        ms = [r["x_mm_loop"] for r in rows if r["kind"] == kind]
        if xs:
            print(f"geomean {kind:<10} ({len(xs):>2} cases): x best baseline {geomean(xs):.3f} "
                  f"(min {min(xs):.3f}), x mm loop {geomean(ms):.3f}")
    tx = [r["x_triton"] for r in rows if r.get("x_triton")]
    if tx:
        print(f"geomean vs Inductor's Triton grouped GEMM ({len(tx)} cases): {geomean(tx):.3f} (min {min(tx):.3f})")
    allx = [r["x_best"] for r in rows]
    if allx:
        print(f"geomean all        ({len(allx):>2} cases): x best baseline {geomean(allx):.3f} (min {min(allx):.3f})")
        rag = [r["x_best"] for r in rows if r["kind"] == "ragged"]
        print(f"targets (issue 27): geomean >= 1.15x: {'met' if geomean(allx) >= 1.15 else 'NOT met'}; "
              f"every ragged >= 1.0x: {'met' if rag and min(rag) >= 1.0 else 'NOT met'}; "
              f"no case < 0.95x: {'met' if min(allx) >= 0.95 else 'NOT met'}")
        bad = [r for r in rows if not (r["err"] < 0.05)]
        if bad:
            print(f"WRONG RESULTS in {len(bad)} cases: {[r['case'] for r in bad]}")
    if args.json:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                  open(args.json, "w"), indent=1)
    if args.png and rows:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(figsize=(14, 4.5))
            xs = range(len(rows))
            ax.bar([x - 0.2 for x in xs], [r["x_grouped_mm"] for r in rows], 0.4, label="vs F.grouped_mm")
            ax.bar([x + 0.2 for x in xs], [r["x_mm_loop"] for r in rows], 0.4, label="vs torch.mm loop")
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_xticks(list(xs))
            ax.set_xticklabels([f"{r['kind'][:4]} G{r['G']}\n{r['T']}x{r['K']}x{r['N']}" for r in rows],
                               fontsize=6, rotation=90)
            ax.set_ylabel("speedup of FlyKernels")
            ax.legend()
            fig.tight_layout()
            fig.savefig(args.png, dpi=110)
        except ImportError:
            print("(no matplotlib: no chart)")


if __name__ == "__main__":
    main()
