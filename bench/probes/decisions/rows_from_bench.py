#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Decision rows (python/flykernels/_decisions.py) from the families' benchmark results already in
bench/*_latest.json: each of those runs timed our kernel and the stock PyTorch kernel in the same
process on the same card (bench/RESULTS.md gives the commands and dates), so each case is a
measured (ours, stock) pair. Used to seed the shipped decisions_sm_90a.sql where no
`python -m flykernels tune` run on that card exists yet; a tune run's --dump --merge replaces the
card's rows.

    python3 bench/probes/decisions/rows_from_bench.py [--out python/flykernels/decisions_sm_90a.sql]

Sources and keys (python/csrc/decisions.hpp):
- torch_api_latest.json: F.rms_norm (rms_norm, weight) and torch.topk (topk, largest, both
  deterministic modes) through the PyTorch API against the same calls with FlyKernels disabled;
- attention_latest.json, attention_d512_latest.json (forward) and attention_bwd_latest.json:
  flybench's forward / backward against SDPA's cuDNN, flash and memory-efficient ops (sdpa_cudnn,
  sdpa_flash, sdpa_efficient and their _bwd; a None baseline: that op does not take the shape);
- grouped_gemm_latest.json: fly_grouped_gemm against F.grouped_mm ('nt': B stored [G, N, K], b_nk).
"""
import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

DATES = {"torch_api": "2026-12-01", "attention": "2026-12-02", "attention_d512": "2026-12-02",
         "attention_bwd": "2026-12-01", "grouped_gemm": "2026-12-02"}


def _row(tag, op, dtype, layout, k, ours, stock, gpu, when):
    k = list(k) + [0] * (4 - len(k))
    win = ("ours", ours, "stock", stock) if ours < stock else ("stock", stock, "ours", ours)
    return (tag, "torch." + op, dtype, layout, *[int(v) for v in k], win[0], round(win[1], 3), win[2],
            round(win[3], 3), gpu, when)


def rows_from(bench):
    out = []
    api = json.loads((bench / "torch_api_latest.json").read_text())
    gpu = api["gpu"]
    tag = "sm_90a:" + gpu.split()[1]
    for c in api["rmsnorm"]["cases"]:
        out.append(_row(tag, "rms_norm", c["dtype"], "w", (c["N"], c["M"]), c["api_us"], c["stock_us"], gpu,
                        DATES["torch_api"]))
    for c in api["topk"]["cases"]:
        dt = "fp32_det" if c["deterministic"] else "fp32"
        out.append(_row(tag, "topk", dt, "largest", (c["C"], c["k"], c["R"]), c["api_us"], c["stock_us"], gpu,
                        DATES["torch_api"]))
    for name, suffix in (("attention", ""), ("attention_d512", ""), ("attention_bwd", "_bwd")):
        d = json.loads((bench / f"{name}_latest.json").read_text())
        assert d["gpu"] == gpu, (name, d["gpu"])
        for c in d["cases"]:
            key = (c["Sk"], c["Sq"], c["B"] * c["Hq"], c["D"])
            layout = "causal" if c["causal"] else "full"
            for base, op in (("cudnn", "sdpa_cudnn"), ("flash", "sdpa_flash"), ("efficient", "sdpa_efficient")):
                if suffix and base == "cudnn":
                    continue  # cuDNN's backward reads its own statistics: never ours to take
                stock = c.get(f"{base}_us")
                if stock:
                    out.append(_row(tag, op + suffix, c["dtype"], layout, key, c["us"], stock, gpu, DATES[name]))
    g = json.loads((bench / "grouped_gemm_latest.json").read_text())
    for r in g["rows"]:
        layout = {"nt": "b_nk", "nn": "b_kn"}[r["layout"]]
        out.append(_row(tag, "grouped_mm", "bf16", layout, (r["N"], r["K"], r["T"], r["G"]), r["fly_us"],
                        r["grouped_mm_us"], gpu, DATES["grouped_gemm"]))
    dedup = {}
    for r in out:
        dedup[r[:8]] = r
    return list(dedup.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default=str(ROOT / "bench"))
    ap.add_argument("--out", default=str(ROOT / "python" / "flykernels" / "decisions_sm_90a.sql"))
    args = ap.parse_args()
    rows = rows_from(Path(args.bench))
    # the dump's format (_decisions.dump_sql), written here without importing torch
    lit = lambda v: "'" + v + "'" if isinstance(v, str) else (f"{v:.3f}" if isinstance(v, float) else str(v))
    lines = ["-- FlyKernels decision rows: ours or stock per PyTorch call, both times (python -m flykernels tune "
             f"--dump; python/flykernels/_decisions.py). Rows of {rows[0][12]} from bench/*_latest.json "
             "(bench/probes/decisions/rows_from_bench.py)"]
    for r in sorted(rows, key=lambda r: tuple(str(x) for x in r[:8])):
        lines.append(f"INSERT OR REPLACE INTO tuning VALUES ({','.join(lit(v) for v in r)});")
    Path(args.out).write_text("\n".join(lines) + "\n")
    ours = sum(r[8] == "ours" for r in rows)
    print(f"{len(rows)} rows ({ours} ours) -> {args.out}")


if __name__ == "__main__":
    main()
