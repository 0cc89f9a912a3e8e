#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Profile rows for the GEMM dispatch's vote (src/dispatch.cpp profile_vote) from flytune --times
output: for every shape, each variant within --cap of the shape's best time, as a row of the
`profile` table (db/schema.sql) for op "gemm" whose rel_time is the variant's time over that best.

  python3 bench/probes/gemm/gemm_profile_rows.py --times bench/logs/gemm-profile-train-times-2026-12-02e.tsv.gz \\
      --out db/sm_90a_gemm_profile.sql [--cap 1.3] [--gpu "NVIDIA H200"] [--date 2026-12-02]

The times come from `bench/probes/gemm/gemm_densify_device.sh` (flytune gemm --quick --times on the
shapes of bench/probes/gemm/gemm_train_shapes.py: gemm_random.py's distribution on seeds 101-108, never
the benchmark's). --loo prints the leave-one-out check instead: each shape voted on by the others.
"""
import argparse
import collections
import gzip
import math


def read_times(path):
    T = collections.defaultdict(dict)  # (dtype, layout, M, N, K) -> {variant: us}
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) < 3:
                continue
            h = p[0].split()
            kv = dict(x.split("=") for x in h[2:5])
            key = (h[0], h[1], int(kv["M"]), int(kv["N"]), int(kv["K"]))
            us = float(p[2])
            if p[1] not in T[key] or us < T[key][p[1]]:
                T[key][p[1]] = us
    return T


def norm(v):
    return v.replace("_bf16_", "_X_").replace("_fp16_", "_X_")


def vote_regrets(T, cap, k=5, penalty=1.0, scale=None):
    """The vote as src/dispatch.cpp runs it, each shape against the others: (regret, shape, pick) per
    shape, regret = the pick's time over the shape's best. scale(variant, query, neighbour), when
    given, multiplies each neighbour's (capped) relative time before it votes (dispatch_model.py)."""
    rel = {q: {norm(v): t / min(tv.values()) for v, t in tv.items()} for q, tv in T.items()}
    l2 = lambda x: math.log2(max(x, 1))
    out = []
    for q in T:
        _, lay, M, N, K = q
        others = sorted((r for r in T if r != q), key=lambda r: abs(l2(r[3]) - l2(N)) + abs(l2(r[4]) - l2(K)) +
                        abs(l2(r[2]) - l2(M)) + (0 if r[1] == lay else penalty))[:k]
        names = {v for r in others for v, x in rel[r].items() if x <= cap}
        score = {v: sum(math.log(min(rel[r].get(v, cap), cap) * (scale(v, q, r) if scale else 1.0)) for r in others)
                 for v in names if v in rel[q]}
        if score:
            pick = min(score, key=score.get)
            out.append((rel[q][pick], q, pick))
    return out


def loo(T, cap, k=5, penalty=1.0):
    """vote_regrets' geomean and tail, printed."""
    regrets = [x for x, _, _ in vote_regrets(T, cap, k, penalty)]
    g = math.exp(sum(map(math.log, regrets)) / len(regrets))
    print(f"leave-one-out over {len(regrets)} shapes: the vote's pick at {g:.3f}x the best bundled variant "
          f"(geomean), {sum(x > 1.1 for x in regrets)} above 1.1x, {sum(x > 1.3 for x in regrets)} above 1.3x")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--times", required=True)
    ap.add_argument("--out")
    ap.add_argument("--cap", type=float, default=1.3)
    ap.add_argument("--gpu", default="NVIDIA H200")
    ap.add_argument("--date", default="2026-12-02")
    ap.add_argument("--loo", action="store_true")
    args = ap.parse_args()
    T = read_times(args.times)
    if args.loo:
        loo(T, args.cap)
        return
    lines = [f"-- GEMM profile rows (table profile, op gemm; src/dispatch.cpp profile_vote): {len(T)} shapes timed with",
             "-- every bundled variant; rel_time = the variant's time over the shape's best, variants within "
             f"{args.cap}x of it.",
             f"-- Written by bench/probes/gemm/gemm_profile_rows.py --times {args.times} --cap {args.cap}"]
    n = 0
    for (dt, lay, M, N, K), tv in sorted(T.items()):
        best = min(tv.values())
        # Rows in (shape, variant) order: the vote reads a shape's rows in the file's order.
        for v, t in sorted((v, t) for v, t in tv.items() if t <= best * args.cap):
            lines.append(f"INSERT OR REPLACE INTO profile VALUES ('sm_90a','gemm','{dt}','{lay}',{N},{K},{M},"
                         f"'{v}',{t / best:.4f},'{args.gpu}','{args.date}');")
            n += 1
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{args.out}: {n} rows over {len(T)} shapes")


if __name__ == "__main__":
    main()
