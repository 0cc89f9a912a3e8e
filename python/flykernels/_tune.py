# SPDX-License-Identifier: Apache-2.0
"""`python -m flykernels tune`: times our kernel and the stock one beside each other, through the
same PyTorch calls models make, and writes the decision rows (_decisions.py) with both times.

    python -m flykernels tune [--ops rms_norm,topk,...] [--suite DIR] [--no-models]
                              [--random N] [--db FILE] [--dump FILE.sql [--merge]] [--quick]
    python -m flykernels tune --check [...]   # the rows' choice against stock, nothing written

Cases: the families' suites (suites/*.json of the repository, or --suite DIR; --suite /dev/null: none), shapes of the model
families the end-to-end benchmark runs (Llama-3.1-8B, Qwen3-MoE, a wide-head model: prefill,
decode, training), and --random N random eligible shapes per op. Each case is timed ours against
stock interleaved with the L2 flushed (time_pair); the key is the one the override computes for
that call, so the row is found again at run time. Rows go to --db (default: the cache folder's
tuned file, which `import flykernels` reads) and, with --dump, to a reviewable .sql dump (what
the shipped decisions_sm_90a.sql is)."""
import argparse
import os
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import _decisions, _loader

OPS = ("rms_norm", "topk", "sdpa", "sdpa_bwd", "grouped_mm", "mm")
_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Case:
    """One call to time. `fn` runs it through the public API (our override decides, so time_pair's
    forced() picks the side); for the compile-time GEMM candidate `ours`/`stock` are separate."""

    def __init__(self, label, key, fn=None, ours=None, stock=None):
        self.label, self.key, self.fn, self.ours, self.stock = label, key, fn, ours, stock


def _repo_suites():
    here = Path(__file__).resolve()
    for p in (here.parents[2] / "suites", Path.cwd() / "suites"):
        if (p / "rmsnorm.json").exists():
            return p
    return None


def _suite(dirpath, name):
    if dirpath is None:
        return []
    p = Path(dirpath) / name
    return json.loads(p.read_text())["cases"] if p.exists() else []


# ---- model shapes (the e2e benchmark's models) --------------------------------------------------
LLAMA = dict(hidden=4096, heads=32, kv=8, d=128, mlp=14336)
QWEN3MOE = dict(hidden=2048, heads=32, kv=4, d=128, experts=64, topk=8, moe=768)
WIDE = dict(hidden=2048, heads=8, kv=1, d=256, mlp=16384)
TOKENS_PREFILL = (2048, 4096)
DECODE_BATCH = (1, 8, 64)
DECODE_CTX = (512, 2048)


def _rms_cases(ext, suite_dir, models, rnd):
    shapes = [(c["dtype"], c["M"], c["N"]) for c in _suite(suite_dir, "rmsnorm.json")]
    if models:
        for m in (LLAMA, QWEN3MOE, WIDE):
            for t in TOKENS_PREFILL + DECODE_BATCH:
                shapes.append(("bf16", t, m["hidden"]))
                shapes.append(("bf16", t * m["heads"], m["d"]))  # q/k norms over the head dim
    shapes += [("bf16", rnd.choice([1, 8, 64, 512, 2048, 8192]) * rnd.randint(1, 4), rnd.choice([128, 256, 1024, 2048, 4096, 5120, 8192]))
               for _ in range(_random_n)]
    out = []
    for dt, M, N in dict.fromkeys(shapes):
        x = torch.randn(M, N, dtype=_DT[dt], device="cuda")
        w = torch.randn(N, dtype=_DT[dt], device="cuda")
        key = ext.key_rms_norm(x, [N], w, 1e-6)
        if key is not None:
            out.append(Case(f"rms_norm {dt} {M}x{N}", key, fn=lambda x=x, w=w, N=N: F.rms_norm(x, [N], w, 1e-6)))
    return out


def _topk_cases(ext, suite_dir, models, rnd):
    shapes = [(c["R"], c["C"], c["k"]) for c in _suite(suite_dir, "topk.json")]
    if models:  # MoE routing: softmax of router logits in fp32, then top-k over the experts
        for t in TOKENS_PREFILL + DECODE_BATCH:
            shapes += [(t, QWEN3MOE["experts"], QWEN3MOE["topk"]), (t, 128, 8)]
    shapes += [(rnd.choice([1, 16, 256, 4096]), rnd.choice([64, 128, 1000, 32000, 131072]), rnd.choice([1, 8, 50, 100]))
               for _ in range(_random_n)]
    out = []
    for R, C, k in dict.fromkeys(shapes):
        if k > C:
            continue
        x = torch.randn(R, C, device="cuda")
        for det in (False, True):
            def fn(x=x, k=k, det=det):
                prev = torch.are_deterministic_algorithms_enabled()
                torch.use_deterministic_algorithms(det, warn_only=True)
                try:
                    return torch.topk(x, k)
                finally:
                    torch.use_deterministic_algorithms(prev, warn_only=True)
            torch.use_deterministic_algorithms(det, warn_only=True)
            key = ext.key_topk(x, k, -1, True)
            torch.use_deterministic_algorithms(False)
            if key is not None:
                out.append(Case(f"topk {R}x{C} k={k} det={int(det)}", key, fn=fn))
    return out


def _attn_shapes(suite_dir, models, rnd):
    shapes = [(c["B"], c["Hq"], c["Hkv"], c["Sq"], c["Sk"], c["D"], c["causal"], dt)
              for c in _suite(suite_dir, "attention.json") for dt in ("bf16",)]
    if models:
        for m in (LLAMA, QWEN3MOE, WIDE):
            for t in TOKENS_PREFILL:
                shapes.append((1, m["heads"], m["kv"], t, t, m["d"], True, "bf16"))
            for b in DECODE_BATCH:
                for ctx in DECODE_CTX:
                    shapes.append((b, m["heads"], m["kv"], 1, ctx, m["d"], False, "bf16"))
        shapes.append((1, 8, 8, 2048, 2048, 512, True, "bf16"))
    for _ in range(_random_n):
        d = rnd.choice([64, 80, 96, 128, 192, 256])
        s = rnd.choice([128, 512, 1000, 2048, 4096])
        shapes.append((rnd.choice([1, 2, 4]), 16, rnd.choice([16, 4]), s, s, d, rnd.random() < 0.5, "bf16"))
    return list(dict.fromkeys(shapes))


def _sdpa_cases(ext, suite_dir, models, rnd, backward):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
                "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
    out = []
    for B, Hq, Hkv, Sq, Sk, D, causal, dt in _attn_shapes(suite_dir, models, rnd):
        if causal and Sq > Sk:
            continue
        q = torch.randn(B, Hq, Sq, D, dtype=_DT[dt], device="cuda")
        k = torch.randn(B, Hkv, Sk, D, dtype=_DT[dt], device="cuda")
        v = torch.randn(B, Hkv, Sk, D, dtype=_DT[dt], device="cuda")
        gqa = Hq != Hkv
        for op, be in backends.items():
            if backward and op == "sdpa_cudnn":
                continue  # cuDNN's backward reads its own statistics: not ours to take
            keyop = op + ("_bwd" if backward else "")
            key = ext.key_sdpa(keyop, q, k, v, causal)
            if key is None:
                continue
            label = f"{keyop} B{B} H{Hq}/{Hkv} S{Sq}x{Sk} D{D} {'causal' if causal else 'full'}"
            try:
                if not backward:
                    def fn(q=q, k=k, v=v, be=be, causal=causal, gqa=gqa):
                        with sdpa_kernel([be]), torch.no_grad():
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
                    fn()  # the backend takes this shape (else SDPA raises: no case)
                else:
                    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                    with sdpa_kernel([be]):
                        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=gqa)
                    do = torch.randn_like(o)

                    def fn(o=o, qg=qg, kg=kg, vg=vg, do=do):
                        return torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
                    fn()
            except RuntimeError:
                continue
            out.append(Case(label, key, fn=fn))
    return out


def _router_offsets(T, G, topk, rnd, skew=1.0):
    """Cumulative rows per expert from a router's top-k on random logits (skewed loads)."""
    g = torch.Generator().manual_seed(rnd.randint(0, 1 << 30))
    logits = torch.randn(T, G, generator=g) + skew * torch.randn(G, generator=g)
    idx = logits.topk(topk, dim=-1).indices.flatten()
    counts = torch.bincount(idx, minlength=G)
    return torch.cumsum(counts, 0).to(torch.int32).cuda(), int(counts.sum())


def _grouped_cases(ext, suite_dir, models, rnd):
    shapes = []  # (rows per group list or (T, G, topk), K, N)
    for c in _suite(suite_dir, "grouped_gemm.json"):
        shapes.append((tuple(c["M"]), c["K"], c["N"]))
    if models:
        m = QWEN3MOE
        for t in TOKENS_PREFILL + DECODE_BATCH:
            shapes.append((("router", t, m["experts"], m["topk"]), m["hidden"], 2 * m["moe"]))  # gate+up
            shapes.append((("router", t, m["experts"], m["topk"]), m["moe"], m["hidden"]))  # down
    for _ in range(_random_n):
        shapes.append((("router", rnd.choice([16, 256, 2048, 8192]), rnd.choice([8, 32, 64, 128]), rnd.choice([2, 4, 8])),
                       rnd.choice([768, 1024, 2048, 4096]), rnd.choice([768, 1536, 2048, 2880, 4096])))
    out = []
    for rows, K, N in dict.fromkeys(shapes):
        if rows and rows[0] == "router":
            offs, T = _router_offsets(rows[1], rows[2], rows[3], rnd)
            G = rows[2]
        else:
            offs = torch.tensor(list(_cumsum(rows)), dtype=torch.int32, device="cuda")
            T, G = sum(rows), len(rows)
        a = torch.randn(T, K, dtype=torch.bfloat16, device="cuda")
        b_kn = torch.randn(G, K, N, dtype=torch.bfloat16, device="cuda")
        b_nk = torch.randn(G, N, K, dtype=torch.bfloat16, device="cuda").transpose(1, 2)  # nn.Linear weights
        dc = torch.randn(T, N, dtype=torch.bfloat16, device="cuda")
        calls = [("fwd b_kn", a, b_kn), ("fwd b_nk", a, b_nk),
                 ("dA", dc, b_nk.transpose(1, 2)),  # dC @ B^T
                 ("dB", a.t(), dc)]  # X^T dC, ragged along K
        for what, x, y in calls:
            key = ext.key_grouped_mm(x, y, offs)
            if key is None:
                continue
            out.append(Case(f"grouped_mm {what} T{T} G{G} K{K} N{N}", key,
                            fn=lambda x=x, y=y, offs=offs: torch._grouped_mm(x, y, offs)))
    return out


def _cumsum(v):
    s = 0
    for x in v:
        s += x
        yield s


def _mm_cases(ext, suite_dir, models, rnd):
    from ._ops.gemm import gemm_key
    shapes = [(c["M"], c["N"], c["K"]) for c in _suite(suite_dir, "gemm_bf16.json")]
    if models:
        for m in (LLAMA, QWEN3MOE, WIDE):
            h, d = m["hidden"], m["d"]
            nk = [((m["heads"] + 2 * m["kv"]) * d, h), (h, m["heads"] * d)]
            if "mlp" in m:
                nk += [(m["mlp"], h), (h, m["mlp"])]
            for t in TOKENS_PREFILL + DECODE_BATCH:
                shapes += [(t, n, k) for n, k in nk]
    shapes += [(rnd.choice([1, 16, 128, 1000, 2048, 8192]), rnd.choice([768, 2048, 4096, 6144, 14336]),
                rnd.choice([768, 2048, 4096, 14336])) for _ in range(_random_n)]
    out = []
    for M, N, K in dict.fromkeys(shapes):
        x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(N, K, dtype=torch.bfloat16, device="cuda")
        dy = torch.randn(M, N, dtype=torch.bfloat16, device="cuda")
        for what, a, b in (("fwd", x, w.t()), ("dX", dy, w), ("dW", dy.t(), x)):
            c = torch.empty(a.shape[0], b.shape[1], dtype=torch.bfloat16, device="cuda")
            key = gemm_key(a.dtype, a.shape, a.stride(), b.shape, b.stride())
            if key is None:
                continue
            out.append(Case(f"mm {what} {a.shape[0]}x{b.shape[1]}x{a.shape[1]}", ("mm",) + key,
                            ours=lambda a=a, b=b, c=c: ext.mm_out(a, b, c, None),
                            stock=lambda a=a, b=b, c=c: torch.mm(a, b, out=c)))
    return out


_random_n = 0


def _context_lost(e):
    """Whether an error leaves this process's CUDA context unusable (sticky: a device-side assert,
    an illegal address), so no later case can run."""
    text = str(e)
    return any(s in text for s in ("device-side assert", "illegal memory access", "illegal instruction",
                                    "unspecified launch failure", "CUDA_ERROR_ASSERT", "CUDA_ERROR_ILLEGAL_ADDRESS"))


def _time_case(case, reps, check=False):
    """(ours_us, stock_us); with check, (as the rows decide, stock)."""
    modes = (None, "stock") if check else ("ours", "stock")
    if case.fn is not None:
        return _decisions.time_pair(case.fn, reps=reps, modes=modes)
    if check:  # the compile-time candidate: the rows say whether Inductor is offered ours at all
        kop, *key = case.key
        calls = {0: case.ours if _decisions.decide(kop, *key)[0] else case.stock, 1: case.ours, 2: case.stock}
    else:
        calls = {1: case.ours, 2: case.stock}
    return _decisions.time_pair(lambda: calls[_loader.ext.forced()](), reps=reps, modes=modes)


def _check_report(results):
    """The --check summary: per op the geomean and minimum of stock / (the rows' choice)."""
    print(f"{'op':22s} {'cases':>5s} {'geomean':>8s} {'min':>6s}  worst")
    by_op = {}
    for label, kop, ratio, rule in results:
        by_op.setdefault(kop, []).append((ratio, label, rule))
    worst_all = 1e9
    for kop, v in sorted(by_op.items()):
        g = math.exp(sum(math.log(r) for r, _, _ in v) / len(v))
        r, label, rule = min(v)
        worst_all = min(worst_all, r)
        print(f"{kop:22s} {len(v):5d} {g:8.3f} {r:6.3f}  {label} ({rule})")
    print(f"lowest ratio over every case: {worst_all:.3f} (target >= 0.98)")


def main(argv=None):
    global _random_n
    p = argparse.ArgumentParser(prog="python -m flykernels tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--suite", default=None, help="folder of suite JSON files (default: the repository's suites/)")
    p.add_argument("--no-models", action="store_true", help="skip the model-family shapes")
    p.add_argument("--random", type=int, default=0, help="random eligible shapes per op (seeded by --seed)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--db", default=None, help="tuning database to write (default: the cache folder's tuned file)")
    p.add_argument("--dump", default=None, help="also write the rows as a .sql dump (the shipped file's format)")
    p.add_argument("--merge", action="store_true", help="with --dump: keep the dump's rows of other cards")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (7 instead of 15)")
    p.add_argument("--check", action="store_true",
                   help="time what the rows choose against stock on the same cases; writes nothing")
    args = p.parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        print(f"flykernels tune: unknown op(s) {unknown}; known: {','.join(OPS)}", file=sys.stderr)
        return 2
    if args.suite and args.suite != os.devnull and not (Path(args.suite) / "rmsnorm.json").exists():
        print(f"flykernels tune: --suite {args.suite}: not a suites folder (no rmsnorm.json there)", file=sys.stderr)
        return 2
    suite_dir = (None if args.suite == os.devnull else Path(args.suite)) if args.suite else _repo_suites()
    if suite_dir is None and args.no_models and not args.random:
        print("flykernels tune: nothing to time: no suites folder found (pass --suite DIR), --no-models and no "
              "--random shapes", file=sys.stderr)
        return 2
    if suite_dir is None:
        print("flykernels tune: no suites folder found (--suite DIR): model shapes only", file=sys.stderr)
    ext = _loader.ext
    if ext is None or not _loader.available:
        print(f"flykernels tune: our kernels cannot run here ({_loader.reason})", file=sys.stderr)
        return 2
    _random_n = args.random
    rnd = random.Random(args.seed)
    from . import torch as ctl
    ctl.enable()
    models = not args.no_models
    builders = {"rms_norm": lambda: _rms_cases(ext, suite_dir, models, rnd),
                "topk": lambda: _topk_cases(ext, suite_dir, models, rnd),
                "sdpa": lambda: _sdpa_cases(ext, suite_dir, models, rnd, False),
                "sdpa_bwd": lambda: _sdpa_cases(ext, suite_dir, models, rnd, True),
                "grouped_mm": lambda: _grouped_cases(ext, suite_dir, models, rnd),
                "mm": lambda: _mm_cases(ext, suite_dir, models, rnd)}
    tag, gpu = _decisions.device_tag(), torch.cuda.get_device_name()
    reps = 7 if args.quick else 15
    rows, results, t0 = {}, [], time.time()
    broken = None  # the first case after which CUDA errors out (a device-side assert poisons the context)
    for op in ops:
        if broken:
            break
        cases = builders[op]()
        for i, case in enumerate(cases):
            try:
                ours, stock = _time_case(case, reps, args.check)
            except (RuntimeError, torch.OutOfMemoryError) as e:
                msg = str(e).splitlines()[0][:120]
                print(f"\n  {case.label}: skipped ({msg})", file=sys.stderr)
                if _context_lost(e):
                    broken = (case.label, msg)
                    break
                continue
            kop, dt, layout, *k = case.key
            if args.check:
                results.append((case.label, kop, stock / ours, _decisions.decide(*case.key)[1]))
            row = _decisions.db_row(tag, kop, dt, layout, k, ours, stock, gpu)
            rows[row[:8]] = row
            bar = "#" * int(30 * (i + 1) / max(1, len(cases)))
            sys.stderr.write(f"\r{op:10s} [{bar:30s}] {i + 1}/{len(cases)} {time.time() - t0:6.0f}s  "
                             f"{case.label[:48]:48s} {stock / ours:5.2f}x")
            sys.stderr.flush()
        sys.stderr.write("\n")
        if not broken:
            torch.cuda.empty_cache()
        if not args.check:  # what is measured so far is kept, whatever happens to a later op
            _decisions.write_rows(Path(args.db) if args.db else _decisions.tuned_path(), list(rows.values()))
    if broken:
        print(f"flykernels tune: stopped at {broken[0]}: {broken[1]}; CUDA cannot go on in this process. "
              f"The rows measured before it are kept. Rerun with CUDA_LAUNCH_BLOCKING=1 to name the call that "
              f"failed exactly, and --ops without its op to tune the rest", file=sys.stderr)
    if args.check:
        _check_report(results)
        return 0
    rows = list(rows.values())
    db = Path(args.db) if args.db else _decisions.tuned_path()
    _decisions.write_rows(db, rows)
    print(f"flykernels tune: {len(rows)} decision rows ({sum(r[8] == 'ours' for r in rows)} ours) on {gpu} "
          f"in {time.time() - t0:.0f} s -> {db}")
    if args.dump:
        keep = []
        if args.merge and Path(args.dump).exists():
            con = __import__("sqlite3").connect(":memory:")
            con.executescript(_decisions.SCHEMA)
            con.executescript(Path(args.dump).read_text())
            keep = [r for r in con.execute("SELECT * FROM tuning WHERE arch != ?", (tag,)).fetchall()]
            con.close()
        _decisions.dump_sql(args.dump, keep + rows,
                            "FlyKernels decision rows: ours or stock per PyTorch call, both times "
                            "(python -m flykernels tune --dump; python/flykernels/_decisions.py)")
        print(f"flykernels tune: dump -> {args.dump}")
    for r in sorted(rows, key=lambda r: r[1:8]):
        ours = r[9] if r[8] == "ours" else r[11]
        stock = r[11] if r[8] == "ours" else r[9]
        print(f"  {r[1]:22s} {r[2]:8s} {r[3]:8s} {str(r[4:8]):28s} ours {ours:9.1f} us  stock {stock:9.1f} us  "
              f"{stock / ours:5.2f}x -> {r[8]}")
    _decisions.load()
    return 1 if broken else 0
