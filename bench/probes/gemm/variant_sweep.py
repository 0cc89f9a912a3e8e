#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Ranks every bundled GEMM variant on suite shapes in the benchmark's own timing regime (this
process, torch's stream, bench/timing.py: L2 flushed by a read and a ~100 us spin before every
call), and says where the database's pick loses to another bundled variant.

  python3 bench/probes/gemm/variant_sweep.py --lib build/libflykernels.so [--suite suites/gemm_bf16.json]
      [--layouts nt,nn,tn,tt] [--min-m 1] [--max-m 512] [--top 4] [--rounds 5] [--sql db/sm_90a.sql]
      [--sql-out sweep.sql] [--min-gain 0.02]

Per shape and layout:
1. every bundled variant of the dtype runs once with its output poisoned (NaN) and is checked
   against an FP32 reference; refusals (a variant that cannot take the shape) are skipped;
2. a quick pass times each (median of 10 calls);
3. the `--top` fastest, the database's pick and torch.mm are timed INTERLEAVED (`--rounds`
   rounds, rotating order, ~30 ms of back-to-back calls before each timing, median of 30 calls),
   which is how bench/gemm_torch.py compares us with cuBLAS.
With --sql-out, the database rows (`--sql`, flytune's text form) of keys whose interleaved winner
beats the pick by more than --min-gain are rewritten with the winner and the runner-up and their
times; every other row is copied unchanged. Review the diff before committing it.
"""
import argparse
import datetime
import os
import re
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # bench/: fly_abi, timing
import timing  # noqa: E402
from fly_abi import add_suite_args, force_variant, gemm_caller, load, poisoned_err, suite_cases  # noqa: E402
from gemm_torch import make_operands  # noqa: E402

WARM_MS = 30.0
TOL = 2e-2  # bf16 output, fp32 accumulation: |err| / (|ref| + 1)


def bundled(lib, dtype):
    names = (lib.fly_variant_name(i) for i in range(lib.fly_variant_count()))
    return sorted(n.decode() for n in names if n and n.decode().startswith(f"gemm_{dtype}_"))


def db_pick(lib, call):
    force_variant(lib, None)
    call()
    return lib.fly_last_variant().decode()


def sweep_shape(lib, layout, M, N, K, names, a):
    x, b = make_operands(M, N, K, layout, torch.bfloat16)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ b.float()
    call = gemm_caller(lib, x, b, c)
    pick = db_pick(lib, call)
    quick = {}
    for v in names:
        force_variant(lib, v)
        try:
            err = poisoned_err(call, c, ref)
        except RuntimeError:
            continue  # cannot take this shape or layout
        if not err <= TOL:
            raise SystemExit(f"{layout} {M}x{N}x{K} {v}: max rel err {err} (> {TOL}): WRONG RESULT")
        quick[v] = timing.time_us(call, reps=10, warmup=2)
    ranked = sorted(quick, key=quick.get)
    finalists = list(dict.fromkeys(ranked[:a.top] + [pick]))

    contenders = [(v, call) for v in finalists] + [("torch.mm", lambda: torch.mm(x, b, out=c))]
    med = timing.interleaved_us(contenders, a.rounds, before=lambda name: force_variant(
        lib, None if name == "torch.mm" else name), reps=30, warm_ms=WARM_MS)
    force_variant(lib, None)
    return pick, quick, med


def rewrite_sql(path_in, path_out, changes):
    """changes: {(layout, N, K, M): (best, t_best, second, t_second)}; returns rows rewritten."""
    row = re.compile(r"^INSERT OR REPLACE INTO tuning VALUES \('sm_90a','gemm','bf16','(\w+)',(\d+),(\d+),(\d+),"
                     r"'[^']*',[\d.]+,'[^']*',[\d.]+,('[^']*'),'[^']*'\);$")
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    done, out = 0, []
    with open(path_in) as f:
        for line in f:
            m = row.match(line.rstrip("\n"))
            key = m and (m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)))
            if m and key in changes:
                best, tb, second, ts = changes[key]
                line = (f"INSERT OR REPLACE INTO tuning VALUES ('sm_90a','gemm','bf16','{key[0]}',{key[1]},"
                        f"{key[2]},{key[3]},'{best}',{tb:.3f},'{second}',{ts:.3f},{m.group(5)},"
                        f"'{today}');\n")
                done += 1
            out.append(line)
    with open(path_out, "w") as f:
        f.writelines(out)
    return done


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_suite_args(ap, "nt,nn,tn,tt", 512)
    ap.add_argument("--top", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sql", default="db/sm_90a.sql")
    ap.add_argument("--sql-out", default="")
    ap.add_argument("--min-gain", type=float, default=0.02)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("variant_sweep: no CUDA device")
    lib = load(a.lib)
    cases = suite_cases(a)
    names = bundled(lib, "bf16")
    print(f"{len(names)} bundled bf16 variants; {len(cases)} shapes x {a.layouts}; top {a.top} + the pick, "
          f"{a.rounds} interleaved rounds beside torch.mm", flush=True)
    changes = {}
    for layout in a.layouts.split(","):
        for M, N, K in cases:
            pick, quick, med = sweep_shape(lib, layout, M, N, K, names, a)
            ours = sorted((v for v in med if v != "torch.mm"), key=med.get)
            best = ours[0]
            gain = med[pick] / med[best]
            print(f"{layout} {M}x{N}x{K}: {len(quick)} variants ran; torch.mm {med['torch.mm']:.2f} us; "
                  f"pick {pick} {med[pick]:.2f} us ({med['torch.mm'] / med[pick]:.3f}x)", flush=True)
            for v in ours:
                print(f"    {v:44s} {med[v]:9.2f} us  quick {quick.get(v, float('nan')):9.2f}  "
                      f"{med['torch.mm'] / med[v]:.3f}x torch.mm{'  <- pick' if v == pick else ''}")
            if best != pick and gain > 1 + a.min_gain:
                second = ours[1]
                changes[(layout, N, K, M)] = (best, med[best], second, med[second])
                print(f"    => {best} beats the pick by {100 * (gain - 1):.1f}%")
    print(f"{len(changes)} keys where another variant beats the pick by more than {100 * a.min_gain:.0f}%")
    if a.sql_out:
        n = rewrite_sql(a.sql, a.sql_out, changes)
        print(f"wrote {a.sql_out}: {n} rows rewritten")


if __name__ == "__main__":
    main()
