#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Leave-one-out study of the GEMM dispatch's profile vote with a shape-transfer model.

The vote (src/dispatch.cpp profile_vote) scores each bundled variant by its relative time on the 5
nearest profiled shapes. A neighbour can differ from the call in tile quantization and waves (a
narrow N that wastes half of a 256-wide tile, a tile count just over one wave) that the neighbour's
time says nothing about. The model variant rescales each neighbour's time by the work model
W(variant, shape) / W(variant, neighbour): W counts the waves of tiles (or of split-K / multicast
clusters, or stream-K's balanced share) times the tile's padded work, floored by the DRAM bytes
of the problem, as kernels/gemm/gemm_plan.h plans the launch. Prints the geomean regret (the
pick's time over the shape's best bundled time) for the plain vote, the model vote (full and
damped by an exponent) and the tile-padding part of the model alone.

  python3 bench/probes/gemm/dispatch_model.py --times bench/logs/gemm-profile-train-times-2026-12-02e.tsv.gz
"""
import argparse
import math
import re
import sys
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_profile_rows import read_times, vote_regrets  # noqa: E402

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


def padding(v, M, N, K):
    """The tile-padding part of the model alone: padded tile area over the output's."""
    f = parse(v)
    P, Q = (N, M) if f["sw"] else (M, N)
    return -(-P // f["bm"]) * f["bm"] * -(-Q // f["bn"]) * f["bn"] / (P * Q)


def transfer(model, alpha):
    """(model(variant, query) / model(variant, neighbour)) ** alpha: the neighbour's time carried to
    the query's shape, damped by alpha."""
    return lambda v, q, r: (model(v, q[2], q[3], q[4]) / model(v, r[2], r[3], r[4])) ** alpha


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--times", required=True)
    ap.add_argument("--cap", type=float, default=1.3)
    ap.add_argument("--worst", type=int, default=0, help="list the N worst queries of the model vote")
    args = ap.parse_args()
    T = read_times(args.times)
    # (label, k, scale): the vote of gemm_profile_rows.py (as src/dispatch.cpp runs it), the model's
    # rescale added in full, damped, and its tile-padding part alone
    runs = [("plain vote", k, None) for k in (5, 8, 12)]
    runs += [("model vote", k, transfer(work, 1.0)) for k in (5, 8, 12)]
    runs += [(f"model^{a} vote", 5, transfer(work, a)) for a in (0.25, 0.5)]
    runs += [("padding^0.5 vote", 5, transfer(padding, 0.5))]
    for label, k, scale in runs:
        reg = vote_regrets(T, args.cap, k, scale=scale)
        g = math.exp(sum(math.log(x) for x, _, _ in reg) / len(reg))
        print(f"{label}, k={k:2d}: {g:.3f}x the best bundled (geomean over {len(reg)}), "
              f"{sum(x > 1.1 for x, _, _ in reg)} above 1.1x, {sum(x > 1.3 for x, _, _ in reg)} above 1.3x, "
              f"worst {max(x for x, _, _ in reg):.2f}x")
        if label == "model vote" and k == 5 and args.worst:
            for x, q, v in sorted(reg, reverse=True)[:args.worst]:
                print(f"   {x:.2f}x {q} -> {v}")


if __name__ == "__main__":
    main()
