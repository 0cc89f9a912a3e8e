#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How far issue 27's grouped-GEMM target is from the physical floor: CPU only, from measured times.

  python3 bench/probes/grouped_gemm/grouped_roofline.py [--json bench/grouped_gemm_latest.json]
      [--triton-log bench/logs/grouped-triton-2026-12-02d.log] [--tflops 760] [--tbps 4.3]

Per case of suites/grouped_gemm.json, the floor is the larger of the math at the dense GEMM's
sustained rate (--tflops: our TMA kernel at 4096^3 BF16 on this H200, 180.8 us = 760 TFLOP/s,
bench/RESULTS.md "GEMM odd strides") and the bytes every kernel must move (A, each non-empty
group's B, C, once) at the read rate of HBM (--tbps: 4.31 TB/s measured for the attention decode
read, 4.16-4.31 across runs). Headroom = the best baseline's time / the floor: the most any kernel
could win over it. Where the headroom is below 1.15, issue 27's 1.15x cannot be met on that case
by any kernel; the geomean of the headroom bounds the suite's geomean.
"""
import argparse
import json
import math
import re


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="bench/grouped_gemm_latest.json")
    ap.add_argument("--triton-log", default="bench/logs/grouped-triton-2026-12-02d.log")
    ap.add_argument("--tflops", type=float, default=760.0)
    ap.add_argument("--tbps", type=float, default=4.3)
    args = ap.parse_args()
    rows = json.load(open(args.json))["rows"]
    triton, triton_fly = {}, {}
    try:
        for line in open(args.triton_log):
            m = re.match(r"\s*(\d+) (uniform|projection|ragged)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+"
                         r"([\d.]+)\s+([\d.]+)", line)
            if m:
                triton[int(m.group(1))] = float(m.group(10))
                triton_fly[int(m.group(1))] = float(m.group(7))
    except FileNotFoundError:
        pass
    print(f"floor = max(FLOP / {args.tflops:.0f} TFLOP/s, bytes / {args.tbps} TB/s); headroom = best baseline / floor")
    print(f"{'case':>4} {'kind':10} {'G':>4} {'T':>6} {'K':>6} {'N':>6} {'floor':>8} {'bound':5} {'ours':>8} "
          f"{'best':>8} {'of':7} {'ours/floor':>10} {'headroom':>8}")
    head, eff, bound_cases = [], [], 0
    for r in rows:
        G, T, K, N = r["G"], r["T"], r["K"], r["N"]
        groups = sum(1 for m in r["M"] if m > 0)
        flop = 2.0 * T * K * N
        nbytes = 2.0 * (T * K + groups * K * N + T * N)
        t_math, t_mem = flop / (args.tflops * 1e6), nbytes / (args.tbps * 1e6)
        floor = max(t_math, t_mem)
        bound = "math" if t_math >= t_mem else "HBM"
        base = {"grouped_mm": r["grouped_mm_us"]}
        if r["case"] in triton:  # the Triton run's own F.grouped_mm column is not parsed: use its ours too
            base["triton"] = triton[r["case"]]
        best_name = min(base, key=base.get)
        best = base[best_name]
        h = best / floor
        head.append(h)
        eff.append(floor / r["fly_us"])
        bound_cases += h < 1.15
        print(f"{r['case']:4d} {r['kind']:10} {G:4d} {T:6d} {K:6d} {N:6d} {floor:8.1f} {bound:5} {r['fly_us']:8.1f} "
              f"{best:8.1f} {best_name:7} {floor / r['fly_us']:10.2f} {h:8.2f}")
    print(f"\n{len(rows)} cases: headroom geomean {geomean(head):.3f}x (the most any kernel could reach over the best "
          f"baseline), {bound_cases} cases below 1.15x; ours at {geomean(eff):.2f} of the floor (geomean)")


if __name__ == "__main__":
    main()
