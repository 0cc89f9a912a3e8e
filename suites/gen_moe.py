#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes suites/moe.json, the model-shape mixture-of-experts grouped GEMM suite (issue 49), from
the model table below and a fixed seed: rerunning it gives the same file byte for byte (plain
Python: only random.Random(seed).random(), whose sequence Python keeps stable across versions, and
math.log / cos / sin; no numpy or torch, so the ctest check runs anywhere).

  python3 suites/gen_moe.py            # (re)write suites/moe.json beside this script
  python3 suites/gen_moe.py --check    # regenerate in memory, compare with the committed file
  python3 suites/gen_moe.py --stats    # per model and token count: G, empty / one-row groups, max/mean load

Expert loads: a router's top-k on random logits. Per model, one per-expert bias b_e = SKEW x N(0, 1)
(drawn once: the model's favoured and neglected experts); per token, logits b_e + N(0, 1) and its
top-k experts (distinct). With SKEW 0.25 the busiest expert gets 1.35x (Mixtral's 8 experts) to 3x
(128 and 256 experts) the mean load in prefill and the idlest 0.1-0.6x: skewed, as trained routers
are despite their balancing losses, not the uniform split of suites/grouped_gemm.json. Decode at
16 tokens leaves many groups empty or with one row (DeepSeek-V3: 151 of 256 empty, 87 one-row). A phase's token
counts are prefixes of one routed batch per model (prefill: the first 4k / 8k / 16k of 32k
tokens; decode: the first 16 / 64 / 128 of 512), so a larger case holds the smaller one's rows.

Cases (suite format of suites/grouped_gemm.json: "M" the rows per group, "K", "N"; plus what the
case is and the layout, in the vocabulary of flybench / flytune grouped_gemm and the dispatch key):
  per model, phase, token count T and projection (gate_up: N = 2 x moe_intermediate, K = hidden;
  down: N = hidden, K = moe_intermediate), with M = the T x top-k routed rows per expert:
  fwd  Y = X @ W_g                 layout "nt": B [G, K, N] K-contiguous (nn.Linear-style [G, N, K]
                                   weights transposed, the layout F.grouped_mm's CUTLASS path takes)
  dA   dX = dY @ W_g^T             the forward form with K and N swapped, layout "nn": autograd's
                                   B = W.transpose(-2, -1) of the above is N-contiguous
  dB   dW_g = X_g^T @ dY_g         the ragged-K form (torch._grouped_mm 2-D x 2-D): "M" the group
                                   lengths along the reduction, "K" X's width, "N" dY's width,
                                   output [G, K, N]; layout "mn" (a = X.t() M-contiguous, b = dY
                                   N-contiguous: the mode-k key's layout), as bench/grouped_gemm_torch.py --dB
                                   reads a suite case
  prefill (prefill and training: 4k-32k tokens): fwd, dA and dB; decode (16-512 tokens): fwd only.
"""
import argparse
import heapq
import json
import math
import os
import random
import sys

SEED = 49  # issue 49
SKEW = 0.25
PREFILL_TOKENS = (4096, 8192, 16384, 32768)
DECODE_TOKENS = (16, 64, 128, 512)
# name, experts, top-k, hidden, moe_intermediate (the expert MLP's width), source
MODELS = (
    ("qwen3-30b-a3b", 128, 8, 2048, 768, "Qwen/Qwen3-30B-A3B config.json"),
    ("olmoe", 64, 8, 2048, 1024, "allenai/OLMoE-1B-7B config.json"),
    ("mixtral-8x7b", 8, 2, 4096, 14336, "mistralai/Mixtral-8x7B config.json"),
    ("deepseek-v3", 256, 8, 7168, 2048, "DeepSeek-V3 routed experts (no shared expert, no group-limited routing)"),
    ("gpt-oss-20b", 32, 4, 2880, 2880, "openai/gpt-oss-20b config.json"),
)
PROJECTIONS = ("gate_up", "down")
PASSES = {"prefill": ("fwd", "dA", "dB"), "decode": ("fwd",)}
LAYOUT = {"fwd": "nt", "dA": "nn", "dB": "mn"}


def route(tokens, experts, topk, rng, bias):
    """Rows per expert of each prefix in `tokens` (ascending) of one batch of max(tokens) tokens:
    each token's top-k of bias + N(0, 1) logits."""
    r, log, sqrt, cos, sin, tau = rng.random, math.log, math.sqrt, math.cos, math.sin, 2.0 * math.pi
    counts = [0] * experts
    out = {}
    ids = range(experts)
    half = (experts + 1) // 2
    for t in range(1, max(tokens) + 1):
        z = []
        for _ in range(half):  # Box-Muller: two normals from two uniforms
            rad, th = sqrt(-2.0 * log(1.0 - r())), tau * r()
            z.append(rad * cos(th))
            z.append(rad * sin(th))
        logits = [b + x for b, x in zip(bias, z)]
        for e in heapq.nlargest(topk, ids, key=logits.__getitem__):
            counts[e] += 1
        if t in tokens:
            out[t] = list(counts)
    return out


def model_loads(index, experts, topk):
    """{phase: {tokens: rows per expert}} for model `index`, from its own seeded generator."""
    rng = random.Random(SEED * 1000 + index)
    r = rng.random
    bias = [SKEW * math.sqrt(-2.0 * math.log(1.0 - r())) * math.cos(2.0 * math.pi * r()) for _ in range(experts)]
    return {"prefill": route(PREFILL_TOKENS, experts, topk, rng, bias),
            "decode": route(DECODE_TOKENS, experts, topk, rng, bias)}


def gemm_dims(proj, what, hidden, inter):
    """(K, N) of the case's GEMM in the suite's terms (see the docstring)."""
    k, n = (hidden, 2 * inter) if proj == "gate_up" else (inter, hidden)
    return (n, k) if what == "dA" else (k, n)


def build():
    cases = []
    models = {}
    for index, (name, experts, topk, hidden, inter, source) in enumerate(MODELS):
        models[name] = {"experts": experts, "topk": topk, "hidden": hidden, "moe_intermediate": inter,
                        "source": source}
        loads = model_loads(index, experts, topk)
        for phase in ("prefill", "decode"):
            for tokens, rows in sorted(loads[phase].items()):
                for proj in PROJECTIONS:
                    for what in PASSES[phase]:
                        K, N = gemm_dims(proj, what, hidden, inter)
                        cases.append({"model": name, "phase": phase, "tokens": tokens, "topk": topk, "proj": proj,
                                      "pass": what, "layout": LAYOUT[what], "kind": phase, "G": experts,
                                      "K": K, "N": N, "M": rows})
    return {
        "op": "grouped_gemm",
        "dtype": "bf16",
        "note": ("Model-shape MoE suite (issue 49), generated by suites/gen_moe.py (do not edit by hand). "
                 "Each case is one grouped GEMM of an expert MLP: M = routed rows per expert, K, N as in "
                 "suites/grouped_gemm.json; 'pass' fwd / dA run the row mode with B 'layout' nt (K-contiguous) "
                 "/ nn (N-contiguous); dB is the ragged-K weight gradient (layout mn: out [G, K, N] = "
                 "X_g^T [K, M_g] @ dY_g [M_g, N]), which flybench / flytune grouped_gemm skip."),
        "generator": {"script": "suites/gen_moe.py", "seed": SEED, "skew": SKEW,
                      "router": "per token top-k of b_e + N(0,1), b_e = skew x N(0,1) drawn once per model",
                      "prefill_tokens": list(PREFILL_TOKENS), "decode_tokens": list(DECODE_TOKENS)},
        "models": models,
        "baselines": ["torch F.grouped_mm (CUTLASS on sm_90)"],
        "cases": cases,
    }


def dumps(suite):
    """The file's text: the header keys indented, then one case per line (reviewable diffs)."""
    head = {k: v for k, v in suite.items() if k != "cases"}
    text = json.dumps(head, indent=1)[:-2]  # drop the closing "\n}"
    lines = [json.dumps(c, separators=(", ", ": ")) for c in suite["cases"]]
    return text + ',\n "cases": [\n  ' + ',\n  '.join(lines) + '\n ]\n}\n'


def stats(suite):
    seen = set()
    for c in suite["cases"]:
        key = (c["model"], c["phase"], c["tokens"])
        if key in seen:
            continue
        seen.add(key)
        m = c["M"]
        mean = sum(m) / len(m)
        print(f"{c['model']:<14} {c['phase']:<7} T {c['tokens']:>6}: G {len(m):>3}, rows {sum(m):>7}, "
              f"empty {sum(x == 0 for x in m):>3}, one-row {sum(x == 1 for x in m):>3}, "
              f"max/mean {max(m) / mean:.2f}, min/mean {min(m) / mean:.2f}")
    print(f"{len(suite['cases'])} cases")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(here, "moe.json"))
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it (exit 1 if they differ)")
    ap.add_argument("--stats", action="store_true", help="also print the loads per model and token count")
    args = ap.parse_args()
    suite = build()
    text = dumps(suite)
    if args.stats:
        stats(suite)
    if args.check:
        try:
            with open(args.out) as f:
                old = f.read()
        except OSError as e:
            print(f"gen_moe: cannot read {args.out}: {e}", file=sys.stderr)
            return 1
        if old != text:
            print(f"gen_moe: {args.out} differs from what suites/gen_moe.py generates: regenerate it "
                  f"(python3 suites/gen_moe.py) and commit both", file=sys.stderr)
            return 1
        print(f"gen_moe: {args.out} is up to date ({len(suite['cases'])} cases)")
        return 0
    with open(args.out, "w") as f:
        f.write(text)
    print(f"gen_moe: wrote {args.out} ({len(suite['cases'])} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
