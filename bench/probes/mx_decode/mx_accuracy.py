#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Is an MX model's disagreement with BF16 quantization error, or a kernel error?

A Llama-3.1-8B-shaped model with random weights (transformers), one forward over a random prompt,
hidden states after every decoder layer compared (cosine per token, mean over tokens) between:
  bf16   the model as built,
  mx     flykernels.quantize_(copy, fmt): MXLinear layers through the library's kernels
         (the prefill kernel at M = batch x prompt > 64, the decode kernels at M <= 64),
  deq    the BF16 model with every quantized weight replaced by MXLinear.dequantize(bf16): the
         values the MX kernels multiply (exactly, mx_prefill.h / mx_decode.h).
cos(mx, deq) is the kernels' own error (BF16 rounding of the outputs, summation order) and should
stay near 1 at every depth; cos(deq, bf16) is what quantization costs this (random) model.
Two input sizes: the prompt (prefill path) and its first 8 tokens of one sequence (decode path).

    python3 bench/probes/mx_decode/mx_accuracy.py [--layers 32] [--prompt 256] [--batch 1] [--formats mxfp8,mxfp4]
"""
import argparse
import copy
import sys

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--formats", default="mxfp8,mxfp4")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("mx_accuracy: needs a CUDA device")
    import flykernels
    from flykernels.nn import MXLinear
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                      num_hidden_layers=a.layers, vocab_size=128256, max_position_embeddings=8192,
                      rope_theta=500000.0)
    torch.manual_seed(a.seed)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    model.config._attn_implementation = "sdpa"
    g = torch.Generator(device="cuda").manual_seed(a.seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.prompt), device="cuda", generator=g)
    inputs = {"prefill": ids, "decode-size": ids[:1, :8]}

    def states(m):
        out = {}
        with torch.no_grad():
            for k, x in inputs.items():
                r = m(x, output_hidden_states=True)
                out[k] = [h.float() for h in r.hidden_states[1:]] + [r.logits.float()]
        return out

    def cos(x, y):
        return torch.nn.functional.cosine_similarity(x.flatten(0, -2), y.flatten(0, -2), dim=-1).mean().item()

    ref = states(model)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith(".weight")}
    picks = sorted({0, 1, a.layers // 4, a.layers // 2, a.layers - 1})
    print(f"# Llama-8B shape, {a.layers} layers, random weights; prompt {a.batch} x {a.prompt}; "
          f"device {torch.cuda.get_device_name()}; cosine of hidden states after layer i (mean over tokens)")
    for fmt in [f for f in a.formats.split(",") if f]:
        mx = flykernels.quantize_(copy.deepcopy(model), fmt, skip=["lm_head"])
        flykernels.torch.reset_counts()
        got = states(mx)
        counts = {k: list(v) for k, v in flykernels.torch.dispatch_counts().items() if k.startswith("mx_linear")}
        # the dequantized-BF16 twin: the same module tree, weights = the MX weights as BF16
        with torch.no_grad():
            mods = dict(model.named_modules())
            for name, mod in mx.named_modules():
                if isinstance(mod, MXLinear):
                    mods[name].weight.copy_(mod.dequantize(torch.bfloat16))
        deq = states(model)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in base:
                    p.copy_(base[n])
        del mx
        torch.cuda.empty_cache()
        print(f"\n{fmt}: MX GEMM calls (ours, stock) {counts}")
        print(f"{'input':12s} {'after':>7s} {'cos(mx,deq)':>12s} {'cos(deq,bf16)':>14s} {'cos(mx,bf16)':>13s}")
        for k in inputs:
            for i in picks + [len(ref[k]) - 1]:
                lab = "logits" if i == len(ref[k]) - 1 else f"L{i}"
                print(f"{k:12s} {lab:>7s} {cos(got[k][i], deq[k][i]):12.5f} {cos(deq[k][i], ref[k][i]):14.5f} "
                      f"{cos(got[k][i], ref[k][i]):13.5f}")


if __name__ == "__main__":
    main()
