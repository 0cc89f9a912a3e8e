#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""MX GEMM side by side: `flybench mxfp --json` (FlyKernels fly_scaled_gemm, MXFP8 and MXFP4, from
quantized operands) and, in the same run on the same GPU, the torch baselines on the same shapes:
  deq+cuBLAS  dequantize the MX operands to BF16 (codes -> bf16, times the E8M0 scale) + matmul,
              timed from the quantized operands (what a Hopper user can do today)
  cuBLAS bf16 matmul on pre-dequantized BF16 operands
  fp8 rowwise torch._scaled_mm E4M3 with FP32 row/column scales (the FP8 roof, coarser scales)
Usage: python3 bench/mxfp_torch.py --flybench build/flybench [--json out.json] [--variant NAME ...]
--variant (repeatable) also times each named mxfp variant forced (flybench mxfp --variant, e.g.
mxfp_wgmma_n128_f0 of a -DFLY_ALL_VARIANTS=ON build) beside the default dispatch: one column each.
"""
import argparse, json, math, os, subprocess, sys, tempfile

import torch

p = argparse.ArgumentParser()
p.add_argument("--flybench", default="build/flybench")
p.add_argument("--suite", default=os.path.join(os.path.dirname(__file__), "..", "suites", "mxfp.json"))
p.add_argument("--json", default="")
p.add_argument("--reps", type=int, default=15)
p.add_argument("--variant", action="append", default=[])
args = p.parse_args()

variants = [""] + args.variant  # "" = the library's own dispatch
fly_us, vs_default = {}, {}
for v in variants:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        fly_json = f.name
    cmd = [args.flybench, "mxfp", "--suite", args.suite, "--json", fly_json] + (["--variant", v] if v else [])
    subprocess.run(cmd, check=True)
    for c in json.load(open(fly_json))["cases"]:
        fly_us[(v, c["format"], c["M"], c["N"], c["K"])] = c["us"]
        vs_default[(v, c["format"], c["M"], c["N"], c["K"])] = c.get("vs_default", -1)

dev = "cuda"
flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)


def timed(fn):
    for _ in range(3):
        fn()
    times = []
    for _ in range(args.reps):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    times.sort()
    return times[len(times) // 2]


E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.bfloat16, device=dev)


def deq_fp8(q, s):  # q float8_e4m3fn [R,K], s uint8 [R,K/32]
    sc = torch.exp2(s.to(torch.float32) - 127).to(torch.bfloat16)
    R, K = q.shape
    return (q.to(torch.bfloat16).view(R, K // 32, 32) * sc.unsqueeze(-1)).view(R, K)


def deq_fp4(q, s):  # q uint8 [R,K/2] packed, low nibble first
    R, K2 = q.shape
    v = torch.stack((E2M1[(q & 0xF).long()], E2M1[(q >> 4).long()]), dim=-1).view(R, K2 * 2)
    sc = torch.exp2(s.to(torch.float32) - 127).to(torch.bfloat16)
    return (v.view(R, K2 * 2 // 32, 32) * sc.unsqueeze(-1)).view(R, K2 * 2)


rows = []
print(f"{'fmt':5} {'M':>6} {'N':>6} {'K':>6} {'fly_us':>9} {'deq+cuBLAS':>11} {'bf16':>9} {'fp8row':>9}"
      f" {'x deq':>7} {'x bf16':>7} {'x fp8':>7}" + "".join(f" {v[-16:]:>16} {'x bf16':>7}" for v in variants[1:]))
for c in json.load(open(args.suite))["cases"]:
    M, N, K = c["M"], c["N"], c["K"]
    a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    b = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
    bf16_us = timed(lambda: a @ b.t())
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    sa_r = torch.ones(M, 1, device=dev); sb_r = torch.ones(1, N, device=dev)
    try:
        fp8_us = timed(lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa_r, scale_b=sb_r, out_dtype=torch.bfloat16))
    except Exception as ex:  # noqa
        fp8_us = float("nan")
    sa = torch.randint(120, 130, (M, K // 32), dtype=torch.uint8, device=dev)
    sb = torch.randint(120, 130, (N, K // 32), dtype=torch.uint8, device=dev)
    for fmt in ("mxfp8", "mxfp4"):
        if fmt == "mxfp8":
            deq_us = timed(lambda: deq_fp8(a8, sa) @ deq_fp8(b8, sb).t())
        else:
            qa = torch.randint(0, 256, (M, K // 2), dtype=torch.uint8, device=dev)
            qb = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=dev)
            deq_us = timed(lambda: deq_fp4(qa, sa) @ deq_fp4(qb, sb).t())
        f_us = fly_us.get(("", fmt, M, N, K), float("nan"))
        r = dict(format=fmt, M=M, N=N, K=K, fly_us=f_us, deq_cublas_us=deq_us, cublas_bf16_us=bf16_us,
                 fp8_rowwise_us=fp8_us, x_deq=deq_us / f_us, x_bf16=bf16_us / f_us, x_fp8=fp8_us / f_us)
        extra = ""
        for v in variants[1:]:
            v_us = fly_us.get((v, fmt, M, N, K), float("nan"))
            r.setdefault("forced", {})[v] = dict(us=v_us, x_deq=deq_us / v_us, x_bf16=bf16_us / v_us,
                                                 x_fp8=fp8_us / v_us, vs_default=vs_default.get((v, fmt, M, N, K)))
            extra += f" {v_us:16.1f} {bf16_us / v_us:7.2f}"
        rows.append(r)
        print(f"{fmt:5} {M:6} {N:6} {K:6} {f_us:9.1f} {deq_us:11.1f} {bf16_us:9.1f} {fp8_us:9.1f}"
              f" {r['x_deq']:7.2f} {r['x_bf16']:7.2f} {r['x_fp8']:7.2f}" + extra)


def geo(xs):
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


for fmt in ("mxfp8", "mxfp4"):
    rs = [r for r in rows if r["format"] == fmt]
    print(f"{fmt}: geomean speedup over deq+cuBLAS {geo([r['x_deq'] for r in rs]):.2f}x, over cuBLAS bf16 "
          f"{geo([r['x_bf16'] for r in rs]):.2f}x, over fp8 rowwise {geo([r['x_fp8'] for r in rs]):.2f}x")
    for v in variants[1:]:
        fs = [r["forced"][v] for r in rs]
        print(f"{fmt} forced {v}: geomean over deq+cuBLAS {geo([x['x_deq'] for x in fs]):.2f}x, over cuBLAS bf16 "
              f"{geo([x['x_bf16'] for x in fs]):.2f}x, over fp8 rowwise {geo([x['x_fp8'] for x in fs]):.2f}x")
if args.json:
    json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(args.json, "w"), indent=1)
