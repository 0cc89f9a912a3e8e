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

--suite moe (suites/moe.json, issue 49: Qwen3-30B-A3B, OLMoE, Mixtral-8x7B, DeepSeek-V3, gpt-oss-20b
expert MLPs, router-skewed loads): each case carries its own pass and layout (fwd: B K-contiguous;
dA: dY @ W^T, B N-contiguous; dB: the ragged-K weight gradient as --dB), so --layout and --dB do
not apply. Ours beside F.grouped_mm (torch._grouped_mm for dB) interleaved as above; per case the
ratio, TFLOP/s of both and, for decode, the fraction of the HBM byte floor each reaches (bytes of
the non-empty experts' weights + A + C over the card's peak, timing.hbm_peak_tbs or --hbm-tbs);
geomeans per model, per phase (prefill/train vs decode), per pass, and the issue's targets.
Filters: --models, --phases, --passes, --projs, --tokens, --cases; --mm-loop adds the torch.mm loop.
All 160 cases: about 2-4 minutes on an H100 by an estimate from their work (not yet timed), most
of it the DeepSeek-V3 and Mixtral prefill; the DeepSeek-V3 gate_up dB cases hold ~45 GiB.

  python3 bench/grouped_gemm_torch.py --lib build/libflykernels.so --suite moe [--json moe.json]

--list (or --dry-run) prints the suite's cases (with their work and device memory) and exits: no
torch, GPU or library needed, as for --help. Without a CUDA device the script says so and exits 3.
"""
import argparse
import ctypes
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# torch, the timing helpers and the ctypes bindings are imported by _import_device_side() once the
# arguments are parsed, so --help and --list run where torch is not installed.
torch = compile_per_shape = interleaved_us = hbm_peak_tbs = FlyTensor = desc = load = None

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


def _import_device_side():
    """torch, bench/timing.py and bench/fly_abi.py into this module's globals; exits 3 with a
    message where torch is missing or sees no CUDA device."""
    global torch, compile_per_shape, interleaved_us, hbm_peak_tbs, FlyTensor, desc, load
    try:
        import torch
    except ImportError as e:
        print(f"grouped_gemm_torch.py: torch is needed to time anything ({e}); --help and --list run without it",
              file=sys.stderr)
        sys.exit(3)
    if not torch.cuda.is_available():
        print("grouped_gemm_torch.py: no CUDA device here: nothing to time (--list prints the cases)", file=sys.stderr)
        sys.exit(3)
    from timing import compile_per_shape, interleaved_us, hbm_peak_tbs
    from fly_abi import FlyTensor, desc, load


def suite_path(name):
    """--suite: a path, or the name of a file in suites/ ("moe" -> suites/moe.json)."""
    if os.path.exists(name) or os.sep in name or name.endswith(".json"):
        return name
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "suites", name + ".json")


def is_moe_suite(suite):
    """A suite whose cases carry their own pass (fwd / dA / dB) and layout: suites/moe.json."""
    return any("pass" in c for c in suite["cases"])


def csv_set(text, conv=str):
    return None if not text else {conv(x) for x in text.split(",") if x}


def moe_selected(args, suite):
    """[(index, case)] of the moe suite's cases that the filters keep."""
    cases = csv_set(args.cases, int)
    models, phases, passes = csv_set(args.models), csv_set(args.phases), csv_set(args.passes)
    projs, tokens = csv_set(args.projs), csv_set(args.tokens, int)
    out = []
    for i, c in enumerate(suite["cases"]):
        if cases is not None and i not in cases:
            continue
        if models is not None and not any(m in c["model"] for m in models):
            continue
        if ((phases is not None and c["phase"] not in phases) or (passes is not None and c["pass"] not in passes)
                or (projs is not None and c["proj"] not in projs) or (tokens is not None and c["tokens"] not in tokens)):
            continue
        out.append((i, c))
    return out


def moe_bytes(c):
    """(HBM byte floor, device bytes the benchmark holds) of a moe case, BF16: the floor reads the
    weights of the non-empty experts (row mode; dB reads X and dY and writes every expert's
    gradient), A and writes C; the held bytes add the reference and F.grouped_mm's output."""
    sizes, K, N = c["M"], c["K"], c["N"]
    T, G = sum(sizes), len(sizes)
    if c["pass"] == "dB":
        io = (T * K + T * N) * 2
        out = G * K * N * 2
        return io + out, io + 3 * out
    used = sum(1 for m in sizes if m > 0)
    floor = (used * K * N + T * K + T * N) * 2
    return floor, (G * K * N + T * K + 3 * T * N) * 2


def list_cases(args, suite):
    """--list: the cases this run would time (no torch needed)."""
    if not is_moe_suite(suite):
        sel = csv_set(args.cases, int)
        for idx, c in enumerate(suite["cases"]):
            if sel is None or idx in sel:
                print(f"{idx:>4} {c.get('kind', '-'):<10} G {len(c['M']):>4} T {sum(c['M']):>7} K {c['K']:>6} N {c['N']:>6}")
        return 0
    rows = moe_selected(args, suite)
    print(f"{'case':>4} {'model':<14} {'phase':<7} {'tokens':>6} {'proj':<7} {'pass':<4} {'lay':<3} {'G':>4} "
          f"{'rows':>7} {'K':>6} {'N':>6} {'empty':>5} {'one':>4} {'GFLOP':>9} {'floor MB':>9} {'held GiB':>8}")
    flop = 0.0
    for i, c in rows:
        sizes = c["M"]
        T = sum(sizes)
        f = 2.0 * T * c["K"] * c["N"]
        flop += f
        floor, held = moe_bytes(c)
        print(f"{i:>4} {c['model']:<14} {c['phase']:<7} {c['tokens']:>6} {c['proj']:<7} {c['pass']:<4} {c['layout']:<3} "
              f"{len(sizes):>4} {T:>7} {c['K']:>6} {c['N']:>6} {sum(m == 0 for m in sizes):>5} "
              f"{sum(m == 1 for m in sizes):>4} {f / 1e9:>9.1f} {floor / 1e6:>9.1f} {held / 2**30:>8.2f}")
    print(f"{len(rows)} of {len(suite['cases'])} cases, {flop / 1e12:.1f} TFLOP per pass over them")
    return 0


def rel_err_chunked(out, ref, chunk=1 << 26):
    """max |out - ref| / (|ref| + 1) over all elements, in FP32 chunks (a 15 GB output fits
    beside its reference); NaN anywhere in out gives NaN."""
    o, r = out.reshape(-1), ref.reshape(-1)
    worst = 0.0
    for s0 in range(0, o.numel(), chunk):
        a, b = o[s0:s0 + chunk].float(), r[s0:s0 + chunk].float()
        e = ((a - b).abs() / (b.abs() + 1.0)).max().item()
        if e != e:
            return float("nan")
        worst = max(worst, e)
    return worst


def moe_case_contenders(args, lib, c, grouped_mm):
    """(contenders, check) for one moe case: contenders [(name, fn)] (fly, grouped_mm, optionally
    mm_loop), check() -> (max relative error of ours against F.grouped_mm, variant)."""
    dtype = torch.bfloat16
    sizes, K, N = c["M"], c["K"], c["N"]
    G, T = len(sizes), sum(sizes)
    ends, run = [], 0
    for m in sizes:
        run += m
        ends.append(run)
    offs = torch.tensor(ends, device="cuda", dtype=torch.int32)
    bounds = list(zip([0] + ends[:-1], ends))
    if c["pass"] == "dB":
        x = torch.randn(T, K, device="cuda", dtype=dtype)
        dc = torch.randn(T, N, device="cuda", dtype=dtype)
        a = x.t()  # [K, T], M contiguous: what autograd passes
        out = torch.empty(G, K, N, device="cuda", dtype=dtype)
        fly = ragged_k_caller(lib, a, dc, offs, out)

        def stock():
            return torch._grouped_mm(a, dc, offs=offs)
        loop_out = (lambda: torch.empty(G, K, N, device="cuda", dtype=dtype)) if args.mm_loop else None

        def loop_fn(cl):
            for g, (s0, e) in enumerate(bounds):
                if e > s0:
                    torch.mm(a[:, s0:e], dc[s0:e], out=cl[g])
                else:
                    cl[g].zero_()
    else:
        a = torch.randn(T, K, device="cuda", dtype=dtype)
        if c["layout"] == "nt":
            b = torch.randn(G, N, K, device="cuda", dtype=dtype).transpose(-2, -1)
        else:
            b = torch.randn(G, K, N, device="cuda", dtype=dtype)
        out = torch.empty(T, N, device="cuda", dtype=dtype)
        fly = grouped_caller(lib, a, b, offs, out)

        def stock():
            return grouped_mm(a, b, offs=offs)
        loop_out = (lambda: torch.empty(T, N, device="cuda", dtype=dtype)) if args.mm_loop else None

        def loop_fn(cl):
            for g, (s0, e) in enumerate(bounds):
                if e > s0:
                    torch.mm(a[s0:e], b[g], out=cl[s0:e])

    def check():
        ref = stock()
        out.fill_(float("nan"))
        fly()
        torch.cuda.synchronize()
        variant = lib.fly_last_variant().decode()
        err = rel_err_chunked(out, ref)
        del ref
        return err, variant

    contenders = [("fly", fly), ("grouped_mm", stock)]
    if loop_out is not None:
        cl = loop_out()
        contenders.append(("mm_loop", lambda: loop_fn(cl)))
    return contenders, check


def moe_summary(rows):
    """The text of the geomeans per model, phase and pass and the issue's targets."""
    lines = []
    ok = [r for r in rows if r["status"] == "ok"]

    def line(label, sel):
        xs = [r["x_grouped_mm"] for r in sel]
        if not xs:
            return None
        d = {"cases": len(xs), "geomean": geomean(xs), "min": min(xs), "below_1": sum(x < 1.0 for x in xs)}
        lines.append(f"  {label:<34} {len(xs):>4} cases: x F.grouped_mm {d['geomean']:.3f} (min {d['min']:.3f}, "
                     f"{d['below_1']} below 1.0x)")
        return d

    summary = {"per_model_phase": {}, "per_phase": {}, "per_pass": {}}
    lines.append("geomean per model and phase (prefill = prefill and training: fwd, dA, dB):")
    for model in dict.fromkeys(r["model"] for r in ok):
        for phase in ("prefill", "decode"):
            d = line(f"{model} {phase}", [r for r in ok if r["model"] == model and r["phase"] == phase])
            if d:
                summary["per_model_phase"][f"{model} {phase}"] = d
    lines.append("geomean per phase and pass:")
    for phase in ("prefill", "decode"):
        d = line(phase, [r for r in ok if r["phase"] == phase])
        if d:
            summary["per_phase"][phase] = d
    for what in ("fwd", "dA", "dB"):
        d = line(f"{what} (all phases)", [r for r in ok if r["pass"] == what])
        if d:
            summary["per_pass"][what] = d
    d = line("all", ok)
    if d:
        summary["all"] = d
    dec = [r for r in ok if r["phase"] == "decode"]
    if dec:
        fl = [r["fly_floor_frac"] for r in dec]
        gl = [r["grouped_mm_floor_frac"] for r in dec]
        summary["decode_floor"] = {"fly_mean": sum(fl) / len(fl), "fly_min": min(fl),
                                   "grouped_mm_mean": sum(gl) / len(gl), "cases_at_80pct": sum(f >= 0.8 for f in fl)}
        lines.append(f"decode HBM byte floor (weights of non-empty experts + A + C at {dec[0]['hbm_tbs']} TB/s): "
                     f"ours {100 * summary['decode_floor']['fly_mean']:.0f}% mean (min {100 * min(fl):.0f}%), "
                     f"F.grouped_mm {100 * summary['decode_floor']['grouped_mm_mean']:.0f}% mean; "
                     f"{summary['decode_floor']['cases_at_80pct']} of {len(fl)} cases >= 80%")
    per_pass = summary["per_pass"]
    if ok:
        met = all(per_pass.get(p, {"geomean": 0})["geomean"] >= 1.15 for p in ("fwd", "dA", "dB") if p in per_pass)
        lines.append(f"targets (issue 49): fwd, dA and dB each >= 1.15x geomean: {'met' if met else 'NOT met'}; "
                     f"no case < 1.0x: {'met' if min(r['x_grouped_mm'] for r in ok) >= 1.0 else 'NOT met'}"
                     + (f"; decode >= 80% of the byte floor: "
                        f"{'met' if dec and min(r['fly_floor_frac'] for r in dec) >= 0.8 else 'NOT met'}" if dec else ""))
    bad = [r["case"] for r in rows if r["status"] != "ok"]
    if bad:
        lines.append(f"NOT OK (wrong, refused or baseline failed) in cases {bad}")
    return lines, summary


def main_moe(args, lib, suite):
    sel = moe_selected(args, suite)
    grouped_mm = getattr(torch.nn.functional, "grouped_mm", None) or torch._grouped_mm
    hbm = hbm_peak_tbs(args.hbm_tbs)
    print(f"MoE grouped GEMM suite ({args.suite}, {len(sel)} of {len(suite['cases'])} cases) on "
          f"{torch.cuda.get_device_name()} (torch {torch.__version__}), bf16, ours vs F.grouped_mm, {ROUNDS} "
          f"interleaved rounds, warm-up {WARM_MS} ms, L2 flushed, HBM peak {hbm} TB/s")
    print(f"{'case':>4} {'model':<14} {'phase':<7} {'tokens':>6} {'proj':<7} {'pass':<4} {'G':>4} {'rows':>7} {'K':>6} "
          f"{'N':>6} {'fly_us':>9} {'gmm_us':>9} {'fly TF/s':>8} {'gmm TF/s':>8} {'x gmm':>6} {'floor%':>11} "
          f"{'err':>8}  variant")
    rows = []
    for idx, c in sel:
        sizes, K, N = c["M"], c["K"], c["N"]
        G, T = len(sizes), sum(sizes)
        base = {"case": idx, "model": c["model"], "phase": c["phase"], "tokens": c["tokens"], "proj": c["proj"],
                "pass": c["pass"], "layout": c["layout"], "G": G, "T": T, "K": K, "N": N,
                "empty_groups": sum(m == 0 for m in sizes), "one_row_groups": sum(m == 1 for m in sizes)}
        torch.manual_seed(idx)
        try:
            contenders, check = moe_case_contenders(args, lib, c, grouped_mm)
            err, variant = check()
        except RuntimeError as e:  # ours refused, or the baseline failed: a row, not the end of the run
            rows.append(dict(base, status="error", why=str(e)[:300]))
            print(f"{idx:>4} {c['model']:<14} {c['phase']:<7} {c['tokens']:>6} {c['proj']:<7} {c['pass']:<4} {G:>4} "
                  f"{T:>7} {K:>6} {N:>6}  ERROR {str(e)[:150]}", flush=True)
            torch.cuda.empty_cache()
            continue
        flops = 2.0 * T * N * K
        reps = 10 if flops > 2e12 else 20
        t = interleaved_us(contenders, ROUNDS, reps=reps, warmup=3, warm_ms=WARM_MS)
        floor_bytes, _ = moe_bytes(c)
        floor_us = floor_bytes / (hbm * 1e12) * 1e6
        row = dict(base, status="ok" if err < 0.05 else "WRONG", fly_us=t["fly"], grouped_mm_us=t["grouped_mm"],
                   fly_tflops=flops / t["fly"] / 1e6, grouped_mm_tflops=flops / t["grouped_mm"] / 1e6,
                   x_grouped_mm=t["grouped_mm"] / t["fly"], floor_bytes=floor_bytes, floor_us=floor_us,
                   fly_floor_frac=floor_us / t["fly"], grouped_mm_floor_frac=floor_us / t["grouped_mm"],
                   hbm_tbs=hbm, err=err, variant=variant)
        if "mm_loop" in t:
            row["mm_loop_us"] = t["mm_loop"]
            row["x_mm_loop"] = t["mm_loop"] / t["fly"]
        rows.append(row)
        floor = (f"{100 * row['fly_floor_frac']:>4.0f}/{100 * row['grouped_mm_floor_frac']:<4.0f}%"
                 if c["phase"] == "decode" else "-")
        print(f"{idx:>4} {c['model']:<14} {c['phase']:<7} {c['tokens']:>6} {c['proj']:<7} {c['pass']:<4} {G:>4} "
              f"{T:>7} {K:>6} {N:>6} {t['fly']:>9.1f} {t['grouped_mm']:>9.1f} {row['fly_tflops']:>8.1f} "
              f"{row['grouped_mm_tflops']:>8.1f} {row['x_grouped_mm']:>6.3f} {floor:>11} {err:>8.2e}  {variant}"
              f"{'' if row['status'] == 'ok' else '  WRONG RESULT'}", flush=True)
        del contenders, check
        torch.cuda.empty_cache()
    print()
    lines, summary = moe_summary(rows)
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "suite": args.suite,
                       "hbm_tbs": hbm, "rounds": ROUNDS, "warm_ms": WARM_MS, "summary": summary, "rows": rows},
                      f, indent=1)
    return 1 if any(r["status"] == "WRONG" for r in rows) else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="path to libflykernels.so (needed unless --list)")
    ap.add_argument("--suite", default="grouped_gemm",
                    help="a suite file, or a name in suites/: grouped_gemm (default) or moe")
    ap.add_argument("--list", "--dry-run", dest="list", action="store_true",
                    help="print the cases (and the filters' choice) and exit; no torch or GPU needed")
    ap.add_argument("--layout", choices=["nt", "nn"], help="B's order (default nt; not for the moe suite)")
    ap.add_argument("--fly-json", help="flybench grouped_gemm --json output of this run (variants, spot checks)")
    ap.add_argument("--json")
    ap.add_argument("--png")
    ap.add_argument("--triton", action="store_true")
    ap.add_argument("--cases", help="comma-separated case indices (default all)")
    ap.add_argument("--dB", action="store_true", help="the ragged-K weight gradient (see the docstring)")
    ap.add_argument("--dB-variants", default="grouped_gemm_k_bf16_bm128_bn256_st4_e1,grouped_gemm_k_bf16_bm128_bn128_st5_e1",
                    help="mode-k variants also timed forced (comma-separated; '' for none)")
    moe = ap.add_argument_group("moe suite (cases with a pass and a layout)")
    moe.add_argument("--models", help="comma-separated model names or parts of them (e.g. qwen3,deepseek)")
    moe.add_argument("--phases", help="prefill,decode")
    moe.add_argument("--passes", help="fwd,dA,dB")
    moe.add_argument("--projs", help="gate_up,down")
    moe.add_argument("--tokens", help="comma-separated token counts")
    moe.add_argument("--mm-loop", action="store_true", help="also time a loop of torch.mm over the groups")
    moe.add_argument("--hbm-tbs", type=float, help="HBM peak in TB/s for the decode byte floor (default: H200 4.8, "
                                                   "else 3.35)")
    args = ap.parse_args()
    args.suite = suite_path(args.suite)
    try:
        with open(args.suite) as f:
            suite = json.load(f)
    except (OSError, ValueError) as e:
        ap.error(f"--suite {args.suite}: {e}")
    moe_suite = is_moe_suite(suite)
    if moe_suite and (args.dB or args.layout or args.triton):
        ap.error("the moe suite's cases carry their own pass and layout: --dB, --layout and --triton do not "
                 "apply (use --passes, --phases, ...)")
    if moe_suite and (args.png or args.fly_json):
        print("grouped_gemm_torch.py: --png and --fly-json are not used with the moe suite", file=sys.stderr)
    if args.list:
        return list_cases(args, suite)
    if not args.lib:
        ap.error("--lib is needed to time (only --list runs without it)")
    _import_device_side()
    lib = load(args.lib)
    if moe_suite:
        return main_moe(args, lib, suite)
    args.layout = args.layout or "nt"
    if args.dB:
        return main_db(args, lib)
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
    sys.exit(main())
