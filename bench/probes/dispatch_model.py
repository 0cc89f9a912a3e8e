#!/usr/bin/env python3
"""Leave-one-out study of the GEMM dispatch's profile vote with a shape-transfer model.

The vote (src/dispatch.cpp profile_vote) scores each bundled variant by its relative time on the 5
nearest profiled shapes. A neighbour can differ from the call in tile quantization and waves (a
narrow N that wastes half of a 256-wide tile, a tile count just over one wave) that the neighbour's
time says nothing about. The model variant rescales each neighbour's time by the work model
W(variant, shape) / W(variant, neighbour): W counts the waves of tiles (or of split-K / multicast
clusters, or stream-K's balanced share) times the tile's padded work, floored by the DRAM bytes
of the problem, as kernels/gemm/gemm_plan.h plans the launch. Prints the geomean regret (the
pick's time over the shape's best bundled time) for the plain vote and the model vote.

  python3 bench/probes/dispatch_model.py --times bench/logs/gemm-profile-train-times-2026-12-02e.tsv.gz
"""
import argparse
import math
import re
import sys
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_profile_rows import read_times, norm  # noqa: E402

SMS = 132
MAX_CLUSTERS = [0, 132, 66, 39, 30, 22, 17, 15, 15]  # kMaxClusters132 (gemm_plan.h)
TILE_FLOP_S = 989e12 / SMS  # one SM's dense 16-bit tensor rate
DRAM_BPS = 4.0e12


def parse(v):
    f = dict(bm=128, bn=0, sw=0, mc=1, mp=1, kb=1, sk=0)
    for k, n in re.findall(r"_(bm|bn|sw|mc|mp|kb|sk)(\d+)", v):
        f[k] = int(n)
    return f


def choose_split(tiles, steps):
    if tiles * 2 > SMS:
        return 1
    best = 1
    for s in range(2, 9):
        if tiles <= MAX_CLUSTERS[s] and steps >= 4 * s:
            best = s
    return best


def work(v, M, N, K):
    """Modelled seconds of variant v on M x N x K (up to the variant's own efficiency constant)."""
    f = parse(v)
    P, Q = (N, M) if f["sw"] else (M, N)
    tm, tn = -(-P // f["bm"]), -(-Q // f["bn"])
    tiles = tm * tn
    steps = -(-K // (64 * f["kb"]))
    tile_s = 2.0 * f["bm"] * f["bn"] * 64 * f["kb"] / TILE_FLOP_S  # one ring step of one tile
    if f["mc"] > 1 or f["mp"] > 1:
        cl = f["mc"] * f["mp"]
        supers = -(-tm // f["mc"]) * -(-tn // f["mp"])
        t = -(-supers // MAX_CLUSTERS[cl]) * steps * tile_s
    elif f["sk"] == 1:
        t = (tiles * steps / SMS + (1 if tiles % SMS else 0)) * tile_s  # balanced, plus a fixup
    else:
        split = f["sk"] if f["sk"] > 1 else (1 if f["bm"] != 128 or f["bn"] > 256 else choose_split(tiles, steps))
        if split > 1:
            t = -(-tiles // MAX_CLUSTERS[split]) * -(-steps // split) * tile_s
        else:
            t = -(-tiles // SMS) * steps * tile_s
    dram = 2.0 * (M * K + N * K + M * N) / DRAM_BPS
    return max(t, dram)


def vote(T, rel, avail, q, k, cap, penalty, model):
    _, lay, M, N, K = q
    l2 = lambda x: math.log2(max(x, 1))
    others = sorted((r for r in T if r != q), key=lambda r: abs(l2(r[3]) - l2(N)) + abs(l2(r[4]) - l2(K)) +
                    abs(l2(r[2]) - l2(M)) + (0 if r[1] == lay else penalty))[:k]
    names = {v for r in others for v, x in rel[r].items() if x <= cap}
    best, best_s = None, None
    for v in names:
        if v not in avail:
            continue  # not measured on the query (not bundled for it)
        s = 0.0
        for r in others:
            x = min(rel[r].get(v, cap), cap)
            if model:
                x *= work(v, M, N, K) / work(v, r[2], r[3], r[4])
            s += math.log(x)
        if best_s is None or s < best_s:
            best, best_s = v, s
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--times", required=True)
    ap.add_argument("--cap", type=float, default=1.3)
    ap.add_argument("--worst", type=int, default=0, help="list the N worst queries of the model vote")
    args = ap.parse_args()
    T = read_times(args.times)
    full = {q: {norm(v): t / min(tv.values()) for v, t in tv.items()} for q, tv in T.items()}
    capped = {q: {v: x for v, x in r.items() if x <= args.cap} for q, r in full.items()}
    for model in (False, True):
        for k in (5, 8, 12):
            reg = []
            for q in T:
                # the neighbours vote with their capped rows (as the DB holds them); the query's
                # full times only judge the pick
                v = vote(T, capped, full[q], q, k, args.cap, 1.0, model)
                if v is not None:
                    reg.append((full[q][v], q, v))
            g = math.exp(sum(math.log(x) for x, _, _ in reg) / len(reg))
            print(f"{'model' if model else 'plain'} vote, k={k:2d}: {g:.3f}x the best bundled (geomean over "
                  f"{len(reg)}), {sum(x > 1.1 for x, _, _ in reg)} above 1.1x, {sum(x > 1.3 for x, _, _ in reg)} "
                  f"above 1.3x, worst {max(x for x, _, _ in reg):.2f}x")
            if model and k == 5 and args.worst:
                for x, q, v in sorted(reg, reverse=True)[:args.worst]:
                    print(f"   {x:.2f}x {q} -> {v}")


if __name__ == "__main__":
    main()
