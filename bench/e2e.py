#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end: Hugging Face transformers models, FlyKernels on against off, same run (issue 45).

  python bench/e2e.py [--models llama,qwen3moe,wide,wide512 | all] [--modes prefill,decode,train]
                      [--compile | --no-compile] [--eager | --no-eager] [--layers 2] [--reps N] [--rounds N]
                      [--quick] [--smoke] [--device cuda|cpu] [--json FILE] [--png FILE] [--budget-s S] [--opt-in]

Models, built from configs with random weights (nothing is downloaded), `--layers` decoder layers
(default 2) at full width, bf16, attn_implementation="sdpa":
- llama:    Llama-3.1-8B-shaped (hidden 4096, 32 / 8 KV heads, head dim 128, MLP 14336, vocab 128256);
- qwen3moe: Qwen3-MoE-shaped (hidden 2048, 32 / 4 KV heads, head dim 128, 64 experts, top-8, expert
            MLP 768, vocab 151936), experts_implementation="grouped_mm" (F.grouped_mm);
- wide:     Gemma-7B-shaped (hidden 3072, 16 heads (MHA), head dim 256, MLP 24576, vocab 256000);
- wide512:  the same with 8 heads of head dim 512 (SDPA's only backend there is memory-efficient);
and, by name or with --models all (not in the default set):
- qwen3:    Qwen3-8B-shaped (hidden 4096, 32 / 8 KV heads, head dim 128, q/k norms, MLP 12288,
            vocab 151936);
- mixtral:  Mixtral-8x7B-shaped (hidden 4096, 32 / 8 KV heads, 8 experts, top-2, expert MLP 14336,
            vocab 32000), experts_implementation="grouped_mm";
- gemma3:   Gemma-3-12B-shaped (hidden 3840, 16 / 8 KV heads, head dim 256, GeGLU MLP 15360,
            sliding-window and global layers, vocab 262208).
`--vocab N` replaces every model's vocabulary (smaller: less memory, a smaller lm_head share).

Modes: prefill (no_grad forward of batch 1 x --seq tokens, no cache); decode (a --prompt token
prompt run once into the model's DynamicCache, then single-token steps at each --batches size: the
cache is put back to the prompt state before every step, so each timed step sees the same cache
length, and a compiled step compiles once); train (forward + backward, cross-entropy on random
labels over batch 1 x --train-seq tokens, grads set to None before each step).
Each in eager mode and under torch.compile(mode="max-autotune-no-cudagraphs", dynamic=False): the
compiled "on" and "off" callables are separate compiles (distinct code objects and module objects
sharing the same weights) made with FlyKernels on and off, each from a cold cache (Inductor's FX
graph, autotune and AOTAutograd caches off, a fresh Inductor / Triton cache folder per compile);
the first call is the compile time, reported on and off.

The "on" state is `import flykernels` plus `flykernels.patch(model)` (--no-patch: the import
alone); the "off" state is flykernels.torch.disabled(), which also returns patched modules to their
own forwards: stock PyTorch and the model's own code.

Timing: blocks of --reps calls in the order on, off, off, on (x --rounds), one untimed call after
each switch; "off" blocks run inside flykernels.torch.disabled(). CUDA events per call as in
bench/timing.py (timed_calls: L2 flushed, a spin so the host is ahead). Reported: medians over all
calls of a state, ratio = stock / ours (> 1: FlyKernels faster), and the noise floor: the largest
spread between two adjacent blocks of the same state (off-off and on-on); a ratio within it is '~'.
--breakdown: one profiled call per state more, GPU kernel time by class (GEMM, attention, grouped
GEMM, the glue: everything else), stock against FlyKernels.
Also: dispatch counts per op over one "on" call (flykernels.torch.dispatch_counts), the FlyKernels
candidates in the compiled code, and outputs on against off (logits; loss and gradients for train),
beside stock against stock (the numerical floor of the stock kernels themselves).
With torch < 2.14, transformers passes SDPA an explicit causal mask under torch.compile (eager
passes is_causal / no mask); flykernels.patch (causal_mask, issue 51) drops it in the "on" state
only, so the compiled "off" rows run stock's masked attention; --compile-no-mask drops it in both
states (the kernels alone compared).
--quick: every eager configuration with fewer reps, then compiles in the order QUICK_COMPILE_FIRST,
within about 7 minutes on one H100 (--budget-s 390 stops starting configurations that would not
fit). --smoke: tiny configs (hidden 64) for checking the script itself, on CPU (--device cpu: the
compile path in Inductor's default mode, first model only, about 2 minutes on 2 cores; --no-compile:
seconds) or GPU. Without the flykernels package the smoke run is stock-only.

generate (a subcommand: `python bench/e2e.py generate --help`): greedy generation on the llama
config at full depth with a static KV cache and the decode step in a CUDA graph, BF16 against
flykernels.quantize_ MXFP8 / MXFP4 (weight-only and MX activations): decode tokens/s, time to
first token, weight memory, agreement with BF16 (issue 48).
bench/e2e.md: how to run and read it.
"""
import argparse
import contextlib
import copy
import gc
import inspect
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
T0 = time.time()
MODEL_KEYS = ("llama", "qwen3moe", "wide", "wide512")  # the default set
MORE_MODEL_KEYS = ("qwen3", "mixtral", "gemma3")       # by name, or --models all
MOE_KEYS = ("qwen3moe", "mixtral")  # built with experts_implementation="grouped_mm"
MODE_KEYS = ("prefill", "decode", "train")
COMPILE_MODE = "max-autotune-no-cudagraphs"
OOM = tuple(c for c in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if c)


def log(msg):
    print(f"[{time.time() - T0:7.1f} s] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------
# FlyKernels control (a stand-in when the package is missing: both states are then stock)

class Fly:
    def __init__(self, ops):
        self.ctl, self.error, self.version = None, None, None
        try:
            import flykernels
        except Exception as e:  # noqa: BLE001  (a missing or broken build: report, go on stock-only)
            self.error = f"{type(e).__name__}: {e}"
            return
        self.ctl, self.version = flykernels.torch, getattr(flykernels, "__version__", None)
        self.available = bool(getattr(self.ctl, "available", False))
        self.reason = getattr(self.ctl, "reason", "")
        self.ops = ops
        self.ctl.enable(ops)  # the "on" state: these families (None: the default set)
        self.active = list(self.ctl.active())

    @property
    def present(self):
        return self.ctl is not None

    def state(self, st):
        """Context of state 'on' (as enabled at start) or 'off' (flykernels.torch.disabled())."""
        if st == "off" and self.ctl is not None:
            return self.ctl.disabled()
        return contextlib.nullcontext()

    def reset_counts(self):
        if self.ctl is not None:
            self.ctl.reset_counts()

    def counts(self):
        if self.ctl is None:
            return {}
        return {k: list(v) for k, v in sorted(self.ctl.dispatch_counts().items()) if any(v)}

    def restore(self):
        if self.ctl is not None:
            self.ctl.enable(self.ops)


# ----------------------------------------------------------------------------------------------
# Models

def make_config(key, a):
    import transformers as tf
    L = a.layers
    if a.smoke:
        small = dict(hidden_size=64, num_attention_heads=2, num_hidden_layers=L, vocab_size=a.vocab or 512,
                     max_position_embeddings=4096)
        if key == "llama":
            return tf.LlamaConfig(**small, num_key_value_heads=1, head_dim=32, intermediate_size=128)
        if key == "qwen3moe":
            return tf.Qwen3MoeConfig(**small, num_key_value_heads=1, head_dim=32, intermediate_size=128,
                                     num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                     norm_topk_prob=True)
        if key == "qwen3":
            return tf.Qwen3Config(**small, num_key_value_heads=1, head_dim=32, intermediate_size=128)
        if key == "mixtral":
            return tf.MixtralConfig(**small, num_key_value_heads=1, head_dim=32, intermediate_size=128,
                                    num_local_experts=4, num_experts_per_tok=2)
        if key == "gemma3":
            return tf.Gemma3TextConfig(**small, num_key_value_heads=1, head_dim=32, intermediate_size=128,
                                       sliding_window=16)
        return tf.GemmaConfig(**small, num_key_value_heads=2, head_dim=64 if key == "wide" else 128,
                              intermediate_size=128)
    if key == "llama":
        return tf.LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                              intermediate_size=14336, vocab_size=a.vocab or 128256, num_hidden_layers=L,
                              max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False)
    if key == "qwen3moe":
        return tf.Qwen3MoeConfig(hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                                 intermediate_size=6144, num_experts=64, num_experts_per_tok=8,
                                 moe_intermediate_size=768, norm_topk_prob=True, vocab_size=a.vocab or 151936,
                                 num_hidden_layers=L, max_position_embeddings=8192)
    if key == "qwen3":
        return tf.Qwen3Config(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                              intermediate_size=12288, vocab_size=a.vocab or 151936, num_hidden_layers=L,
                              max_position_embeddings=8192, tie_word_embeddings=False)
    if key == "mixtral":
        return tf.MixtralConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
                                vocab_size=a.vocab or 32000, num_hidden_layers=L, max_position_embeddings=8192)
    if key == "gemma3":
        return tf.Gemma3TextConfig(hidden_size=3840, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                                   intermediate_size=15360, vocab_size=a.vocab or 262208, num_hidden_layers=L,
                                   max_position_embeddings=8192, sliding_window=1024)
    heads, d = (16, 256) if key == "wide" else (8, 512)
    return tf.GemmaConfig(hidden_size=3072, num_attention_heads=heads, num_key_value_heads=heads, head_dim=d,
                          intermediate_size=24576, vocab_size=a.vocab or 256000, num_hidden_layers=L,
                          max_position_embeddings=8192)


def build_model(key, a, dev):
    """(model, info): the config's model with random weights on dev in bf16, and what was asked
    against what transformers did (experts implementation, attention implementation)."""
    from transformers import AutoModelForCausalLM
    cfg = make_config(key, a)
    if key == "qwen3moe" and getattr(cfg, "head_dim", None) != (32 if a.smoke else 128):
        cfg.head_dim = 32 if a.smoke else 128  # older configs keep unknown kwargs only as attributes
    info = {"class": type(cfg).__name__, "experts_implementation_requested": None}
    kw = dict(attn_implementation="sdpa")
    if key in MOE_KEYS:
        kw["experts_implementation"] = "grouped_mm"
        info["experts_implementation_requested"] = "grouped_mm"
    torch.manual_seed(a.seed)
    model, last = None, None
    for dkw in ({"dtype": torch.bfloat16}, {"torch_dtype": torch.bfloat16}):
        for drop in ((), ("experts_implementation",)):
            k2 = {k: v for k, v in {**kw, **dkw}.items() if k not in drop}
            if drop and "experts_implementation" not in kw:
                continue
            try:
                with torch.device(dev):
                    model = AutoModelForCausalLM.from_config(cfg, **k2)
                if drop:
                    info["experts_implementation_note"] = (
                        f"this transformers rejected experts_implementation ({last}): the MoE runs its default experts code")
                    log(f"WARNING {key}: {info['experts_implementation_note']}")
                break
            except (TypeError, ValueError) as e:
                last = f"{type(e).__name__}: {e}"
                model = None
        if model is not None:
            break
    if model is None:
        raise RuntimeError(f"could not build {key}: {last}")
    model.to(device=dev, dtype=torch.bfloat16)
    c = model.config
    info["experts_implementation"] = getattr(c, "_experts_implementation", None)
    if key in MOE_KEYS and info["experts_implementation"] != "grouped_mm":
        log(f"WARNING {key}: experts implementation is {info['experts_implementation']!r}, not 'grouped_mm' "
            "(this transformers has no experts_implementation switch, or it fell back)")
    info["attn_implementation"] = getattr(c, "_attn_implementation", None)
    with torch.no_grad():  # a zero-initialised 2-D weight (e.g. an MoE router) would route every token alike
        for n, p in model.named_parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.02)
                log(f"  {key}: {n} was all zeros; initialised N(0, 0.02)")
    fields = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
              "moe_intermediate_size", "num_experts", "num_experts_per_tok", "vocab_size", "num_hidden_layers")
    info["config"] = {f: getattr(c, f) for f in fields if getattr(c, f, None) is not None}
    info["params"] = sum(p.numel() for p in model.parameters())
    info["cache_kw"] = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    if getattr(a, "fp32_ref", False):  # before patch(): the reference runs the stock modules
        REF32[id(model)] = copy.deepcopy(model).float()
    if a.patch:
        try:
            import flykernels
        except ImportError:
            info["patch"] = None
        else:  # patched modules run their own forward in the "off" state (the controller's "patch" family)
            info["patch"] = flykernels.patch(model, **({"add_rms_norm": True, "moe": True} if a.opt_in else {}))
            log(f"  {key}: flykernels.patch: {info['patch']['patched'] or 'nothing'}"
                + (f", skipped {info['patch']['skipped']}" if info["patch"]["skipped"] else ""))
    return model, info


def clone_modules(model):
    """A second module tree sharing every parameter and buffer: dynamo keys compiled frames on module
    objects, so the "on" and "off" compiles never share a cache entry, even across graph breaks."""
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return copy.deepcopy(model, memo)


def step_source(kind, cache_kw):
    body = {
        "prefill": "    return model(input_ids=ids, use_cache=False).logits\n",
        "decode": f"    return model(input_ids=ids, use_cache=True, {cache_kw}=cache).logits\n",
        "train": "    logits = model(input_ids=ids, use_cache=False).logits\n"
                 "    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())\n",
    }[kind]
    return f"def step(model, ids, labels=None, cache=None):\n{body}"


def fresh_step(kind, cache_kw, tag):
    """A new function object with its own code object (dynamo caches compiled code per code object)."""
    ns = {"F": F}
    exec(compile(step_source(kind, cache_kw), f"<e2e-{kind}-{tag}>", "exec"), ns)  # noqa: S102
    return ns["step"]


def snapshot_cache(cache):
    """The cache's state as plain references (no copies), for restore_cache."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return ("layers", [dict(layer.__dict__) for layer in layers])
    return ("dict", {k: (list(v) if isinstance(v, list) else v) for k, v in cache.__dict__.items()})


def restore_cache(cache, snap):
    """Back to the prompt state: the same tensors as after the prompt (DynamicLayer.update
    concatenates into new tensors, so the prompt's are never written). Host-only, no kernels."""
    kind, s = snap
    if kind == "layers":
        for layer, d in zip(cache.layers, s):
            layer.__dict__.clear()
            layer.__dict__.update(d)
    else:
        for k, v in s.items():
            setattr(cache, k, list(v) if isinstance(v, list) else v)


# ----------------------------------------------------------------------------------------------
# Timing, comparison

def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def time_calls_ms(fn, n, dev):
    if dev.type == "cuda":
        from timing import timed_calls
        return [t / 1000.0 for t in timed_calls(fn, n)]
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return ts


def median(xs):
    s = sorted(xs)
    n = len(s)
    return (s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])) if n else float("nan")


def quantile(xs, q):
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def abba(fly, fns, rounds, reps, dev):
    """Blocks on, off, off, on (x rounds) of `reps` timed calls, one untimed call after each switch."""
    blocks = []
    for _ in range(rounds):
        for st in ("on", "off", "off", "on"):
            with fly.state(st):
                fns[st]()
                sync(dev)
                blocks.append((st, time_calls_ms(fns[st], reps, dev)))
    return blocks


def summarize_times(blocks):
    allt = {st: [t for s, ts in blocks if s == st for t in ts] for st in ("on", "off")}
    med = {st: median(v) for st, v in allt.items()}
    bmed = [(s, median(ts)) for s, ts in blocks]
    pairs = [abs(b1 / b2 - 1.0) for (s1, b1), (s2, b2) in zip(bmed, bmed[1:]) if s1 == s2 and b2 > 0]
    iqr = {st: (quantile(v, 0.75) - quantile(v, 0.25)) / med[st] if med[st] > 0 else float("nan")
           for st, v in allt.items()}
    noise = max(pairs) if pairs else max(iqr.values())
    ratio = med["off"] / med["on"] if med["on"] > 0 else float("nan")
    verdict = "~" if abs(ratio - 1.0) <= noise else ("faster" if ratio > 1.0 else "SLOWER")
    return dict(ours_ms=med["on"], stock_ms=med["off"], ratio=ratio, noise=noise, verdict=verdict,
                same_state_block_spreads=pairs, iqr_rel=iqr, block_medians_ms=bmed,
                samples_ms={st: v for st, v in allt.items()})


def diff_stats(x, ref, chunk=1 << 24):
    """max |x - ref|, max |ref| and ||x - ref|| / ||ref|| in float64 accumulation, chunked."""
    x, ref = x.detach().reshape(-1), ref.detach().reshape(-1)
    mx = mref = 0.0
    num = den = 0.0
    for i in range(0, x.numel(), chunk):
        a, b = x[i:i + chunk].double(), ref[i:i + chunk].double()
        d = a - b
        mx = max(mx, d.abs().max().item())
        mref = max(mref, b.abs().max().item())
        num += (d * d).sum().item()
        den += (b * b).sum().item()
    return dict(max_abs=mx, max_rel=mx / mref if mref else float("nan"),
                rel_l2=math.sqrt(num / den) if den else math.sqrt(num))


def grads_of(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def grads_diff(g, ref):
    num = den = mx = 0.0
    for n, r in ref.items():
        if n not in g:
            return dict(max_abs=float("inf"), rel_l2=float("inf"), missing=n)
        d = diff_stats(g[n], r)
        nr = r.double().norm().item()
        num += (d["rel_l2"] * nr) ** 2 if nr else 0.0
        den += nr * nr
        mx = max(mx, d["max_abs"])
    return dict(max_abs=mx, rel_l2=math.sqrt(num / den) if den else 0.0)


def judge(on_off, off_off, tol):
    """ok unless on-vs-off is above the tolerance and above 4x stock's own run-to-run difference."""
    floor = 4.0 * off_off.get("rel_l2", 0.0) if off_off else 0.0
    return bool(on_off["rel_l2"] <= max(tol, floor))


# ----------------------------------------------------------------------------------------------
# One configuration

class Workload:
    """Inputs and the step function of one (model, mode, config); call(fn_step) runs one step."""

    def __init__(self, model, info, mode, a, dev, fly, batch=1):
        self.model, self.mode, self.dev = model, mode, dev
        self.cache_kw = info["cache_kw"]
        V = model.config.vocab_size
        g = torch.Generator(device="cpu").manual_seed(a.seed + 1)
        self.labels, self.cache, self.snap = None, None, None
        if mode == "prefill":
            self.ids = torch.randint(0, V, (1, a.seq), generator=g).to(dev)
            self.label = f"1x{a.seq}"
        elif mode == "train":
            self.ids = torch.randint(0, V, (1, a.train_seq), generator=g).to(dev)
            self.labels = torch.randint(0, V, (1, a.train_seq), generator=g).to(dev)
            self.label = f"1x{a.train_seq}"
        else:
            prompt = torch.randint(0, V, (batch, a.prompt), generator=g).to(dev)
            self.prompt = prompt  # for an FP32 reference's own cache (--fp32-ref)
            self.ids = torch.randint(0, V, (batch, 1), generator=g).to(dev)
            self.label = f"b{batch} kv{a.prompt}"
            with torch.no_grad(), fly.state("off"):  # the prompt: stock, shared by both states
                out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
            self.cache = out["cache"] if "cache" in out else out["past_key_values"]
            self.snap = snapshot_cache(self.cache)
            del out
        model.train(mode == "train")

    def runner(self, step, model=None):
        """A no-argument callable running one step of `step` (eager or compiled) on `model`."""
        m = model if model is not None else self.model
        if self.mode == "train":
            def run():
                for p in m.parameters():
                    p.grad = None
                loss = step(m, self.ids, self.labels)
                loss.backward()
                return loss.detach()
        elif self.mode == "decode":
            def run():
                restore_cache(self.cache, self.snap)
                with torch.no_grad():
                    return step(m, self.ids, cache=self.cache)
        else:
            def run():
                with torch.no_grad():
                    return step(m, self.ids)
        return run

    def outputs(self, run):
        out = run()
        sync(self.dev)
        g = grads_of(self.model) if self.mode == "train" else None
        if self.mode == "train":
            for p in self.model.parameters():
                p.grad = None
        return out.detach().clone(), g


# GPU time by class (issue 47's method): every kernel of one call, by name. Attention first (cuDNN's
# SDPA kernels carry "sdpa", FlashAttention's "flash"/"fmha", ours "attn"/"attention"), then
# grouped GEMM, then dense GEMM (cuBLAS's nvjet / sm90_xmma, CUTLASS, ours "gemm"); the rest is the
# glue: elementwise, reductions, copies, norms, softmax, top-k, gathers.
KERNEL_CLASSES = ("gemm", "attention", "grouped_gemm", "glue")


def kernel_class(name):
    n = name.lower()
    if any(t in n for t in ("sdpa", "flash", "fmha", "attn", "attention")):
        return "attention"
    if "grouped" in n:
        return "grouped_gemm"
    if any(t in n for t in ("gemm", "nvjet", "xmma", "cutlass", "cublas", "matmul", "wgmma", "mma_", "mxfp_")):
        return "gemm"
    return "glue"


def gpu_breakdown(run, dev):
    """{class: ms} of the GPU kernels of one run() (torch.profiler, CUDA activity); {} off CUDA."""
    if dev.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile
    run()  # warm: lazy loads and caching allocations out of the profile
    sync(dev)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        sync(dev)
    out = dict.fromkeys(KERNEL_CLASSES, 0.0)
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type):
            t = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)  # us
            if t:
                out[kernel_class(e.name)] += t / 1000.0
    return out


def fmt_breakdown(b):
    tot = sum(b.values()) or 1.0
    return ", ".join(f"{k} {100 * b[k] / tot:.0f}%" for k in KERNEL_CLASSES) + f" ({tot:.2f} ms)"


# id(bf16 model) -> its FP32 copy (--fp32-ref): the prefill logits' reference for both states
REF32 = {}


def fp32_outputs(wl, fly, m32):
    """(out, grads) of the workload's step on the FP32 copy, stock: prefill logits; decode logits
    after the same prompt in its own FP32 cache; train the loss and the gradients."""
    m32.train(wl.mode == "train")
    with fly.state("off"):
        if wl.mode == "prefill":
            with torch.no_grad():
                return fresh_step("prefill", wl.cache_kw, "fp32")(m32, wl.ids), None
        if wl.mode == "decode":
            with torch.no_grad():
                out = m32(input_ids=wl.prompt, use_cache=True, logits_to_keep=1)
                cache = out["cache"] if "cache" in out else out["past_key_values"]
                del out
                return fresh_step("decode", wl.cache_kw, "fp32")(m32, wl.ids, cache=cache), None
        for p in m32.parameters():
            p.grad = None
        loss = fresh_step("train", wl.cache_kw, "fp32")(m32, wl.ids, wl.labels)
        loss.backward()
        g = grads_of(m32)
        for p in m32.parameters():
            p.grad = None
        return loss.detach(), g


def fp32_verdict(wl, fly, m32, got, ref, g, gref, res):
    """Both states against the FP32 copy (--fp32-ref): True where ours is as close to it as stock
    is (within 10%, or 1e-3 absolute), for the outputs and, in training, the gradients."""
    o32, g32 = fp32_outputs(wl, fly, m32)
    res["out_on_vs_fp32"] = diff_stats(got.float(), o32.float())
    res["out_off_vs_fp32"] = diff_stats(ref.float(), o32.float())
    close = lambda on, off: on["rel_l2"] <= max(1.1 * off["rel_l2"], off["rel_l2"] + 1e-3)
    ok = close(res["out_on_vs_fp32"], res["out_off_vs_fp32"])
    if g32 is not None:
        res["grads_on_vs_fp32"] = grads_diff({n: t.float() for n, t in g.items()}, g32)
        res["grads_off_vs_fp32"] = grads_diff({n: t.float() for n, t in gref.items()}, g32)
        ok = ok and close(res["grads_on_vs_fp32"], res["grads_off_vs_fp32"])
    del o32, g32
    return ok


def compare(wl, fly, fns, tol):
    """Outputs of one call per state (and a second stock call): on against off, off against off.
    With an FP32 copy of the model (--fp32-ref), both states also against it (outputs, and in
    training the gradients): a BF16 MoE model can route a token to another expert on a last-bit
    difference (the router's top-k), so on against off may exceed the tolerance while ours is as
    close to the FP32 model as stock is; then it is no mismatch."""
    res = {}
    m32 = REF32.get(id(wl.model))
    with fly.state("off"):
        ref, gref = wl.outputs(fns["off"])
        ref2, gref2 = wl.outputs(fns["off"])
    fly.reset_counts()
    got, g = wl.outputs(fns["on"])
    res["counts"] = fly.counts()  # one "on" call
    res["out_on_vs_off"] = diff_stats(got, ref)
    res["out_off_vs_off"] = diff_stats(ref2, ref)
    ok = judge(res["out_on_vs_off"], res["out_off_vs_off"], tol)
    if wl.mode == "train":
        res["loss_on"], res["loss_off"] = got.item(), ref.item()
        res["grads_on_vs_off"] = grads_diff(g, gref)
        res["grads_off_vs_off"] = grads_diff(gref2, gref)
        ok = ok and judge(res["grads_on_vs_off"], res["grads_off_vs_off"], 2 * tol)
    if m32 is not None:
        ok = fp32_verdict(wl, fly, m32, got, ref, g, gref, res) or ok
    res["ok"] = ok
    del ref, ref2, got, g, gref, gref2
    return res


def dynamo_counters():
    try:
        from torch._dynamo.utils import counters
        return (sum(counters["graph_break"].values()), counters["stats"].get("unique_graphs", 0))
    except Exception:  # noqa: BLE001
        return (0, 0)


def compile_cold(step, mode):
    """torch.compile(step) with the recompile limits raised (bench/timing.compile_per_shape)."""
    import torch._dynamo.config as dcfg
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dcfg, name):
            setattr(dcfg, name, 1024)
    if hasattr(dcfg, "accumulated_recompile_limit"):
        dcfg.accumulated_recompile_limit = max(dcfg.accumulated_recompile_limit, 4096)
    return torch.compile(step, mode=mode, dynamic=False)


def cold_caches_off():
    """Compile times honest: no FX graph, autotune or AOTAutograd cache (local or remote)."""
    import torch._inductor.config as ic
    for name in ("fx_graph_cache", "fx_graph_remote_cache", "autotune_local_cache", "autotune_remote_cache",
                 "bundled_autotune_remote_cache"):
        if hasattr(ic, name):
            setattr(ic, name, False)
    try:
        import torch._functorch.config as fc
        for name in ("enable_autograd_cache", "enable_remote_autograd_cache"):
            if hasattr(fc, name):
                setattr(fc, name, False)
    except ImportError:
        pass


@contextlib.contextmanager
def capture_code(sink):
    """Collects the code Inductor generates inside (what run_and_get_code does, without its
    torch._dynamo.reset(), which would drop the other state's compiled callable)."""
    try:
        from torch._inductor.graph import GraphLowering
    except ImportError:
        yield
        return
    old = GraphLowering.__dict__.get("save_output_code")
    GraphLowering.save_output_code = staticmethod(sink.append)
    try:
        yield
    finally:
        GraphLowering.save_output_code = old


def hf_mask_skip_under_compile():
    """--compile-no-mask: let transformers drop the all-true causal mask under torch.compile as it does
    in eager (with torch < 2.14 it materialises it there: torch.compiler.is_exporting() reads True
    while dynamo traces, and the packed-sequence check of position_ids cannot be evaluated), so SDPA
    gets is_causal / no mask in both modes. Only valid for these inputs: no padding, one sequence a row."""
    try:
        import transformers.masking_utils as mu
    except ImportError:
        return "transformers.masking_utils missing: nothing patched"
    done = []
    if hasattr(mu, "is_torchdynamo_exporting"):
        mu.is_torchdynamo_exporting = lambda: False
        done.append("is_torchdynamo_exporting")
    if hasattr(mu, "find_packed_sequence_indices"):
        mu.find_packed_sequence_indices = lambda position_ids: None
        done.append("find_packed_sequence_indices")
    return "patched transformers.masking_utils." + ", ".join(done) if done else "nothing to patch in masking_utils"


@contextlib.contextmanager
def fresh_inductor_dirs(tmp_dirs):
    """A new Inductor / Triton cache folder (kept until the configuration ends: compiled modules load from it)."""
    import torch._inductor.utils as iu
    fc = getattr(iu, "fresh_cache", None) or getattr(iu, "fresh_inductor_cache", None)
    d = tempfile.mkdtemp(prefix="e2e_inductor_")
    tmp_dirs.append(d)
    if fc is None:
        yield
        return
    try:
        cm = fc(dir=d, delete=False)
    except TypeError:
        cm = fc()
    with cm:
        yield


def run_config(model, info, key, mode, batch, compiled, a, dev, fly):
    wl = Workload(model, info, mode, a, dev, fly, batch)
    row = dict(model=key, mode=mode, config=wl.label, kind="compiled" if compiled else "eager", batch=batch)
    rounds, reps = a.rounds, a.reps
    tmp_dirs = []
    try:
        if not compiled:
            step = fresh_step(mode, wl.cache_kw, "eager")
            fns = {"on": wl.runner(step), "off": wl.runner(step)}
        else:
            import torch._dynamo
            torch._dynamo.reset()
            fns, row["compile_s"], row["compiled_picks"], row["graph_breaks"] = {}, {}, {}, {}
            order = ("off", "on") if a._compile_index % 2 == 0 else ("on", "off")
            a._compile_index += 1
            row["compile_order"] = list(order)
            for st in order:
                with fly.state(st):
                    m = clone_modules(model)
                    fn = wl.runner(compile_cold(fresh_step(mode, wl.cache_kw, st), a.compile_mode), m)
                    gb0, _ = dynamo_counters()
                    code = []
                    with fresh_inductor_dirs(tmp_dirs), capture_code(code):
                        t0 = time.time()
                        fn()
                        sync(dev)
                        row["compile_s"][st] = time.time() - t0
                    src = "\n".join(code)
                    row["compiled_picks"][st] = {n: src.count(n + "(") for n in
                                                 ("flykernels_mm", "flykernels_addmm", "flykernels_grouped_mm")
                                                 if src.count(n + "(")}
                    row["graph_breaks"][st] = dynamo_counters()[0] - gb0
                    fns[st] = fn
                log(f"  compiled {st}: first call (compile) {row['compile_s'][st]:.1f} s, graph breaks "
                    f"{row['graph_breaks'][st]}, FlyKernels picks in the code {row['compiled_picks'][st] or '-'}")
            row["compile_ratio"] = row["compile_s"]["on"] / row["compile_s"]["off"]
        g0 = dynamo_counters()[1]
        row.update(compare(wl, fly, fns, a.tol))
        for st in ("on", "off"):  # warm-up beyond the compare calls
            with fly.state(st):
                for _ in range(a.warmup):
                    fns[st]()
                sync(dev)
        row.update(summarize_times(abba(fly, fns, rounds, reps, dev)))
        if a.breakdown:
            row["breakdown"] = {}
            for st in ("off", "on"):
                with fly.state(st):
                    row["breakdown"][st] = gpu_breakdown(fns[st], dev)
                if row["breakdown"][st]:
                    log(f"  GPU time by class, {'stock' if st == 'off' else 'FlyKernels'}: "
                        f"{fmt_breakdown(row['breakdown'][st])}")
        row["recompiles_after_first_call"] = dynamo_counters()[1] - g0
        if compiled and row["recompiles_after_first_call"]:
            log(f"  WARNING: {row['recompiles_after_first_call']} graphs compiled after the first calls "
                "(comparison or timing ran a recompiled graph)")
    finally:
        fly.restore()
        del wl
        if compiled:
            import torch._dynamo
            torch._dynamo.reset()
        for d in tmp_dirs:
            shutil.rmtree(d, ignore_errors=True)
    return row


def free(dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def guarded(label, fn, dev, results, skipped):
    """Runs fn() -> row; an OOM or another error skips the configuration with a message."""
    t0 = time.time()
    err = None
    try:
        row = fn()
    except OOM as e:
        err = f"out of memory: {str(e).splitlines()[0][:200]}"
    except Exception as e:  # noqa: BLE001  (keep the other configurations' results)
        err = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        traceback.print_exc(limit=6)
    if err is not None:
        free(dev)
        log(f"SKIP {label}: {err}")
        skipped.append(dict(config=label, reason=err))
        return None
    row["elapsed_s"] = time.time() - t0
    results.append(row)
    log(f"  {fmt_row(row)}  ({row['elapsed_s']:.1f} s)")
    return row


# ----------------------------------------------------------------------------------------------
# Output

def counts_summary(c):
    return ", ".join(f"{op} {o}/{s}" for op, (o, s) in c.items()) or "-"


def fmt_row(r):
    err = r.get("out_on_vs_off", {}).get("rel_l2", float("nan"))
    s = (f"{r['model']:9s} {r['mode']:8s} {r['config']:11s} {r['kind']:8s} ours {r['ours_ms']:9.3f} ms  "
         f"stock {r['stock_ms']:9.3f} ms  {r['ratio']:6.3f}x  noise {100 * r['noise']:4.1f}% {r['verdict']:6s} "
         f"err {err:.1e}{'' if r.get('ok', True) else ' MISMATCH'}")
    if "out_on_vs_fp32" in r:
        s += f" (vs FP32: ours {r['out_on_vs_fp32']['rel_l2']:.1e}, stock {r['out_off_vs_fp32']['rel_l2']:.1e}"
        if "grads_on_vs_fp32" in r:
            s += f"; grads ours {r['grads_on_vs_fp32']['rel_l2']:.1e}, stock {r['grads_off_vs_fp32']['rel_l2']:.1e}"
        s += ")"
    if "compile_s" in r:
        s += f"  compile {r['compile_s']['on']:.1f}/{r['compile_s']['off']:.1f} s ({r['compile_ratio']:.2f}x)"
    return s


def table(results):
    head = (f"{'model':9s} {'mode':8s} {'config':11s} {'kind':8s} {'ours ms':>9s} {'stock ms':>9s} {'ratio':>7s} "
            f"{'noise':>6s} {'':6s} {'rel err':>8s} {'compile on/off s':>19s}  dispatch counts (ours/stock, one on-call)")
    lines = [head, "-" * len(head)]
    for r in results:
        err = r.get("out_on_vs_off", {}).get("rel_l2", float("nan"))
        comp = (f"{r['compile_s']['on']:6.1f}/{r['compile_s']['off']:<6.1f}({r['compile_ratio']:.2f}x)"
                if "compile_s" in r else "")
        picks = r.get("compiled_picks", {}).get("on")
        lines.append(f"{r['model']:9s} {r['mode']:8s} {r['config']:11s} {r['kind']:8s} {r['ours_ms']:9.3f} "
                     f"{r['stock_ms']:9.3f} {r['ratio']:6.3f}x {100 * r['noise']:5.1f}% {r['verdict']:6s} "
                     f"{err:8.1e}{'!' if not r.get('ok', True) else ' '}{comp:>19s}  {counts_summary(r.get('counts', {}))}"
                     + (f"; compiled picks {picks}" if picks else ""))
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (said) where matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no chart (pip install matplotlib)", flush=True)
        return None
    return plt


def chart(out, path):
    plt = pyplot()
    if plt is None:
        return
    rows = out["results"]
    if not rows:
        print("no results: no chart", flush=True)
        return
    comp = [r for r in rows if "compile_s" in r]
    fig, axes = plt.subplots(1, 2 if comp else 1, figsize=(15 if comp else 10, 0.32 * len(rows) + 2.0),
                             squeeze=False, gridspec_kw={"width_ratios": [3, 1]} if comp else None)
    ax = axes[0, 0]
    labels = [f"{r['model']} {r['mode']} {r['config']} {r['kind']}" for r in rows]
    ys = list(range(len(rows)))[::-1]
    colors = ["tab:blue" if r["kind"] == "eager" else "tab:orange" for r in rows]
    lo = max(0.2, min(0.9, min(r["ratio"] for r in rows) * 0.95))
    hi = min(5.0, max(1.1, max(r["ratio"] for r in rows) * 1.05))
    clip = [min(max(r["ratio"], lo), hi) for r in rows]
    ax.barh(ys, [c - 1.0 for c in clip], left=1.0, color=colors)  # from 1.0: right faster, left slower
    for y, r, c in zip(ys, rows, clip):  # the noise floor as a band around the ratio
        ax.plot([max(lo, c / (1 + r["noise"])), min(hi, c * (1 + r["noise"]))], [y, y], color="gray", lw=1)
        ax.text(c, y, f" {r['ratio']:.3f}" + ("  output mismatch" if not r.get("ok", True) else ""),
                va="center", fontsize=6, color="red" if not r.get("ok", True) else "black")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlim(lo, hi * 1.15)
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter
    ticks = (0.25, 0.5, 0.8, 1.0, 1.25, 2, 4) if hi / lo > 2.5 else (0.5, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2)
    ax.xaxis.set_major_locator(FixedLocator([t for t in ticks if lo <= t <= hi * 1.15]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xlabel("stock / ours time (> 1: FlyKernels faster; log scale); gray: the noise floor; "
                  "blue eager, orange compiled", fontsize=8)
    ax.set_title(f"end to end, FlyKernels on vs off ({out['meta'].get('device_name', '')})", fontsize=9)
    if comp:
        ax2 = axes[0, 1]
        cl = [f"{r['model']} {r['mode']} {r['config']}" for r in comp]
        cy = list(range(len(comp)))[::-1]
        ax2.barh(cy, [r["compile_ratio"] for r in comp], color="tab:purple")
        ax2.axvline(1.0, color="k", lw=0.8)
        ax2.axvline(1.3, color="r", lw=0.8, ls="--")
        ax2.set_yticks(cy)
        ax2.set_yticklabels(cl, fontsize=7)
        ax2.set_xlim(0, max(1.45, max(r["compile_ratio"] for r in comp) * 1.1))
        ax2.set_xlabel("compile time on / off (target <= 1.3)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("chart:", path, flush=True)


def jsonable(o):
    if isinstance(o, dict):
        return {str(k): jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [jsonable(v) for v in o]
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, (str, int, float, bool)) or o is None:
        return o
    return str(o)


# ----------------------------------------------------------------------------------------------

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODEL_KEYS),
                    help=f"comma list of {', '.join(MODEL_KEYS + MORE_MODEL_KEYS)}, or all (default: the first four)")
    ap.add_argument("--modes", default=",".join(MODE_KEYS), help="comma list of prefill, decode, train")
    ap.add_argument("--compile", dest="compile", action=argparse.BooleanOptionalAction, default=True,
                    help="also under torch.compile (default on)")
    ap.add_argument("--eager", dest="eager", action=argparse.BooleanOptionalAction, default=True,
                    help="eager mode (default on)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary size for every model (default: each model's own)")
    ap.add_argument("--seq", type=int, default=None, help="prefill tokens (default 2048)")
    ap.add_argument("--train-seq", type=int, default=None, help="training tokens (default 2048)")
    ap.add_argument("--prompt", type=int, default=None, help="decode: prompt length in the cache (default 512)")
    ap.add_argument("--batches", default=None, help="decode batch sizes (default 1,8,64)")
    ap.add_argument("--compile-batches", default=None,
                    help="decode batch sizes under compile (default: --batches; --quick: 8)")
    ap.add_argument("--compile-modes", default=None,
                    help="modes under compile (default: --modes; --quick: the budget decides, in the order "
                         "prefill, decode, train)")
    ap.add_argument("--reps", type=int, default=None, help="timed calls per block (default 10; --quick 5)")
    ap.add_argument("--rounds", type=int, default=None, help="ABBA groups (default 3; --quick 2)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls per state before timing")
    ap.add_argument("--tol", type=float, default=2e-2, help="relative L2 tolerance, logits (grads: 2x)")
    ap.add_argument("--fp32-ref", action="store_true",
                    help="also compare both states against an FP32 copy of the model (prefill and decode logits, "
                         "the training loss and gradients): an on/off difference is no mismatch where ours is as "
                         "close to FP32 as stock")
    ap.add_argument("--compile-models", default=None,
                    help="models under compile (default: --models; --smoke: the first of them)")
    ap.add_argument("--compile-mode", default=None,
                    help=f"torch.compile mode (default {COMPILE_MODE}; --smoke --device cpu: default, since\n"
                         "max-autotune on 2 CPU cores takes minutes per graph)")
    ap.add_argument("--compile-no-mask", action="store_true",
                    help="under compile, let transformers skip the all-true causal mask as in eager\n"
                         "(by default, with torch < 2.14, it passes SDPA an explicit mask there, which keeps SDPA stock)")
    ap.add_argument("--patch", dest="patch", action=argparse.BooleanOptionalAction, default=True,
                    help="flykernels.patch(model) in the on state (default; --no-patch: the import alone)")
    ap.add_argument("--opt-in", action="store_true",
                    help="patch() with add_rms_norm and moe forced on (the shipped defaults since 2026-12-07; for a "
                         "package that ships either off)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also profile one call per state and report GPU time by kernel class (GEMM, attention, "
                         "grouped GEMM, glue)")
    ap.add_argument("--fly-ops", default=None, help="FlyKernels families in the on state (default: the default set)")
    ap.add_argument("--sdpa-backend", default="default", choices=("default", "flash", "efficient", "cudnn", "math"),
                    help="run every call under torch.nn.attention.sdpa_kernel(this) (both states)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting configurations that would end past this many seconds (--quick: 390)")
    ap.add_argument("--quick", action="store_true", help="fewer reps and a compile subset: about 7 min on one H100")
    ap.add_argument("--smoke", action="store_true", help="tiny configs, for checking the script (CPU or GPU)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None)
    a = ap.parse_args()
    sm, q = a.smoke, a.quick
    a.seq = a.seq or (32 if sm else 2048)
    a.train_seq = a.train_seq or (32 if sm else 2048)
    a.prompt = a.prompt or (16 if sm else 512)
    a.batches = [int(b) for b in (a.batches or ("1,2" if sm else "1,8,64")).split(",")]
    a.compile_batches = [int(b) for b in (a.compile_batches or ("2" if sm else "8" if q else
                                                                ",".join(map(str, a.batches)))).split(",")]
    a.reps = a.reps or (3 if sm else 5 if q else 10)
    a.rounds = a.rounds or (1 if sm else 2 if q else 3)
    a.budget_s = a.budget_s if a.budget_s is not None else (390.0 if q and not sm else None)
    a.models = list(MODEL_KEYS + MORE_MODEL_KEYS) if a.models == "all" else [m for m in a.models.split(",") if m]
    a.modes = [m for m in a.modes.split(",") if m]
    a.compile_modes = [m for m in a.compile_modes.split(",") if m] if a.compile_modes else list(a.modes)
    a.compile_models = ([m for m in a.compile_models.split(",") if m] if a.compile_models
                        else a.models[:1] if sm else list(a.models))
    for m in a.models + a.compile_models:
        if m not in MODEL_KEYS + MORE_MODEL_KEYS:
            ap.error(f"unknown model {m!r}: {', '.join(MODEL_KEYS + MORE_MODEL_KEYS)}")
    for m in a.modes + a.compile_modes:
        if m not in MODE_KEYS:
            ap.error(f"unknown mode {m!r}: {', '.join(MODE_KEYS)}")
    a.fly_ops = a.fly_ops.split(",") if a.fly_ops else None
    a.compile_mode = a.compile_mode or ("default" if sm and a.device == "cpu" else COMPILE_MODE)
    a._compile_index = 0
    return a


# Rough cost of one compiled configuration (both compiles plus timing) on an H100 before any was seen,
# in seconds; then the largest seen of that mode is used. --quick's budget check only.
COMPILE_EST_S = {"prefill": 110.0, "decode": 80.0, "train": 240.0}


# --quick compiles these first (the budget drops the tail): the issue's two Llama data points, then
# the MoE (grouped GEMM candidates) and the wide-head prefills.
QUICK_COMPILE_FIRST = [("llama", "prefill"), ("llama", "decode"), ("qwen3moe", "prefill"), ("wide", "prefill"),
                       ("wide512", "prefill"), ("qwen3moe", "decode")]


def sdpa_context(name):
    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([{"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                         "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]])


def main():
    a = parse_args()
    warnings.filterwarnings("ignore", message=".*functools.lru_cache.*")  # dynamo on transformers' version checks
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: use --device cpu (with --smoke)")
    if dev.type == "cpu" and not a.smoke:
        log("WARNING: full-size models on the CPU will take very long (use --smoke)")
    try:
        import transformers
    except ImportError as e:
        sys.exit(f"transformers is needed: {e}")
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, python {sys.version.split()[0]}")
    fly = Fly(a.fly_ops)
    if not fly.present:
        if not a.smoke:
            sys.exit(f"import flykernels failed ({fly.error}): install the package (docs/pytorch.md)")
        log(f"import flykernels failed ({fly.error}): smoke run stock-only (on == off), checking the plumbing")
    else:
        log(f"flykernels {fly.version}: available={fly.available}"
            + (f" ({fly.reason})" if not fly.available else "") + f", on-state families {fly.active}")
        if not fly.available and not a.smoke:
            sys.exit(f"flykernels cannot run here ({fly.reason}): both states would be stock")
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M:%S"), command=" ".join(sys.argv), torch=torch.__version__,
                transformers=transformers.__version__, device=str(dev),
                device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                flykernels=dict(version=fly.version, import_error=fly.error,
                                available=getattr(fly, "available", False), reason=getattr(fly, "reason", None),
                                on_families=getattr(fly, "active", [])),
                args={k: v for k, v in vars(a).items() if not k.startswith("_")}, compile_mode=a.compile_mode,
                timing="ABBA blocks (on, off, off, on) x rounds, reps timed calls per block, CUDA events "
                       "(bench/timing.timed_calls), medians; noise = largest spread of adjacent same-state blocks")
    if dev.type == "cuda":
        log(f"device {meta['device_name']}")
    results, skipped, models_info = [], [], {}
    budget_note = f", budget {a.budget_s:.0f} s" if a.budget_s else ""
    log(f"models {a.models}, modes {a.modes}, eager {a.eager}, compile {a.compile} (models {a.compile_models}, "
        f"modes {a.compile_modes}, decode batches {a.compile_batches}), layers {a.layers}, "
        f"reps {a.reps} x rounds {a.rounds}{budget_note}")

    def over_budget(est):
        return a.budget_s is not None and time.time() - T0 + est > a.budget_s

    def configs(modes, batches):
        for mode in modes:
            for b in (batches if mode == "decode" else [1]):
                yield mode, b

    def with_model(key, body):
        """Builds model `key`, runs body(model, info), frees it; a failure to build skips the model."""
        t0 = time.time()
        try:
            model, info = build_model(key, a, dev)
        except Exception as e:  # noqa: BLE001  (OOM, or a config this transformers cannot build)
            free(dev)
            log(f"SKIP model {key}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            skipped.append(dict(config=key, reason=str(e)[:300]))
            return
        models_info[key] = info
        log(f"{key}: built in {time.time() - t0:.1f} s, {info['params'] / 1e6:.0f} M parameters, {info['config']}, "
            f"attention {info['attn_implementation']}"
            + (f", experts {info['experts_implementation']}" if info.get("experts_implementation_requested") else ""))
        try:
            body(model, info)
        finally:
            REF32.pop(id(model), None)
            del model
            free(dev)

    with sdpa_context(a.sdpa_backend):
        if a.eager:
            log("== eager")
            for key in a.models:
                def eager_body(model, info, key=key):
                    for mode, b in configs(a.modes, a.batches):
                        label = f"{key} {mode} b{b} eager"
                        if over_budget(5.0):
                            log(f"SKIP {label}: budget")
                            skipped.append(dict(config=label, reason="budget"))
                            continue
                        log(f"{label} ...")
                        guarded(label, lambda: run_config(model, info, key, mode, b, False, a, dev, fly),
                                dev, results, skipped)
                if not over_budget(5.0):
                    with_model(key, eager_body)
        if a.compile:
            log(f"== compiled (torch.compile mode={a.compile_mode}, dynamic=False, cold caches)")
            cold_caches_off()
            if a.compile_no_mask:
                log("--compile-no-mask: " + hf_mask_skip_under_compile())
            else:
                log("note: with torch < 2.14 transformers passes SDPA an explicit causal mask under torch.compile; "
                    "flykernels.patch drops it in the on state only (--compile-no-mask: in both, as in eager)")
            plan = [(key, mode, b) for key in a.compile_models
                    for mode, b in configs(a.compile_modes, a.compile_batches)]
            if a.quick:  # the budget drops the tail: QUICK_COMPILE_FIRST, then the rest by mode, then model
                def prio(p):
                    first = [i for i, (k, m) in enumerate(QUICK_COMPILE_FIRST) if (k, m) == p[:2]]
                    return (first[0] if first else len(QUICK_COMPILE_FIRST), MODE_KEYS.index(p[1]),
                            a.compile_models.index(p[0]), p[2])
                plan.sort(key=prio)
            log("compile plan: " + ", ".join(f"{k} {m} b{b}" for k, m, b in plan))
            seen_cost = {}
            if plan and not over_budget(COMPILE_EST_S[plan[0][1]]):
                t0 = time.time()
                try:  # import Inductor and start its workers outside any measured compile
                    w = torch.randn(64, 64, device=dev, dtype=torch.bfloat16)
                    with fly.state("off"):
                        compile_cold(lambda x: F.silu(x @ w), a.compile_mode)(w)
                    torch._dynamo.reset()
                except Exception as e:  # noqa: BLE001
                    log(f"compile warm-up failed: {type(e).__name__}: {e}")
                log(f"compile warm-up (Inductor import, workers) {time.time() - t0:.1f} s")
            current = [None, None, None]  # key, model, info
            for key, mode, b in plan:
                label = f"{key} {mode} b{b} compiled"
                est = seen_cost.get(mode, COMPILE_EST_S[mode] * (0.02 if a.smoke else 1.0))
                if over_budget(est):
                    log(f"SKIP {label}: would not fit the budget (estimated {est:.0f} s, "
                        f"{a.budget_s - (time.time() - T0):.0f} s left)")
                    skipped.append(dict(config=label, reason=f"budget (estimated {est:.0f} s)"))
                    continue
                if current[0] != key:
                    current[1] = current[2] = None
                    free(dev)
                    try:
                        current[1], current[2] = build_model(key, a, dev)
                        current[0] = key
                        models_info[key] = current[2]
                    except Exception as e:  # noqa: BLE001
                        free(dev)
                        log(f"SKIP {label}: building {key}: {type(e).__name__}: {e}")
                        skipped.append(dict(config=label, reason=f"build: {str(e)[:200]}"))
                        current[0] = None
                        continue
                log(f"{label} ...")
                t0 = time.time()
                row = guarded(label, lambda: run_config(current[1], current[2], key, mode, b, True, a, dev, fly),
                              dev, results, skipped)
                if row is not None:
                    seen_cost[mode] = max(seen_cost.get(mode, 0.0), (time.time() - t0) * 1.15)
            current[1] = current[2] = None
            free(dev)

    out = dict(meta=meta, models=models_info, results=results, skipped=skipped, elapsed_s=time.time() - T0)
    print("\n" + table(results), flush=True)
    if skipped:
        print("\nskipped: " + "; ".join(f"{s['config']} ({s['reason'][:80]})" for s in skipped))
    bad = [r for r in results if not r.get("ok", True)]
    slower = [r for r in results if r["verdict"] == "SLOWER"]
    comp = [r["compile_ratio"] for r in results if "compile_ratio" in r]
    print(f"\n{len(results)} configurations, {len(skipped)} skipped; slower beyond noise: {len(slower)}; "
          f"output mismatches: {len(bad)}"
          + (f"; compile time on/off {min(comp):.2f}x-{max(comp):.2f}x" if comp else "")
          + f"; total {time.time() - T0:.0f} s", flush=True)
    if not fly.present or not getattr(fly, "available", False):
        print("(FlyKernels not active here: on and off both ran stock PyTorch)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(jsonable(out), f, indent=1)
        print("json:", a.json, flush=True)
    if a.png:
        chart(out, a.png)


# ----------------------------------------------------------------------------------------------
# generate: greedy generation with a static KV cache and CUDA graphs, BF16 against MX (issue 48)
#
#   python bench/e2e.py generate [--configs bf16,mxfp8-bf16,mxfp8-mx,mxfp4-bf16,mxfp4-mx] [--layers 32]
#                                [--batches 1,8,32] [--prompt 256] [--gen 512] [--reps 2]
#                                [--graph cuda|compile|eager] [--smoke] [--device cuda|cpu] [--json F] [--png F]
#
# One Llama-3.1-8B-shaped model (make_config("llama"), random weights, seed --seed) per configuration,
# built, quantized (flykernels.quantize_(model, fmt, activations=..., skip=--skip)), run and freed
# before the next; the BF16 reference is kept only as token ids and first-step logits (CPU).
# Per batch size: a StaticCache of prompt + gen positions; the prompt's prefill runs eagerly
# (time to first token: prefill + argmax, CUDA events); the decode step (one token: forward, argmax,
# the token written into the output buffer and fed back) is captured once in a CUDA graph and
# replayed gen - 1 times back to back (--graph cuda), or compiled with
# torch.compile(mode="reduce-overhead") (--graph compile), or run eagerly (--graph eager; the CPU).
# bench/e2e.md, "generate", has how to run and read it.

GEN_CONFIGS = {  # name -> (format, activations); None: BF16 stock
    "bf16": (None, None),
    "mxfp8-bf16": ("mxfp8", "bf16"),
    "mxfp8-mx": ("mxfp8", "mx"),
    "mxfp4-bf16": ("mxfp4", "bf16"),
    "mxfp4-mx": ("mxfp4", "mx"),
}
GEN_MX_OPS = ("mx_linear", "mx_linear_mx")


def weight_bytes(model):
    """Bytes of the model's parameters and buffers, each storage once (tied weights, shared layers)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.device.type == "meta":
            continue
        try:
            key = (t.device, t.untyped_storage().data_ptr())
            size = t.untyped_storage().nbytes()
        except Exception:  # noqa: BLE001
            key, size = (t.device, t.data_ptr()), t.numel() * t.element_size()
        if key in seen:
            continue
        seen.add(key)
        total += size
    return total


def weights_fingerprint(model):
    """A few sums of the BF16 weights before quantization: the same seed must give the same model
    in every configuration (the agreement figures compare against the BF16 run's tokens)."""
    sd = dict(model.named_parameters())
    names = [n for n in sd if n.endswith("embed_tokens.weight") or n.endswith("layers.0.self_attn.q_proj.weight")
             or n.endswith("lm_head.weight")][:3]
    return {n: float(sd[n].detach().float().sum().item()) for n in names}


def make_static_cache(model, batch, max_len, dev):
    """transformers' StaticCache for `batch` rows of `max_len` positions, with the arguments this
    version takes (5.x: config and max_cache_len, lazily allocated on the first update; 4.x also
    batch size, device and dtype)."""
    from transformers import StaticCache
    params = inspect.signature(StaticCache.__init__).parameters
    kw = dict(config=model.config, max_cache_len=max_len, max_batch_size=batch, batch_size=batch, device=dev,
              dtype=torch.bfloat16)
    return StaticCache(**{k: v for k, v in kw.items() if k in params})


def cache_rewind(cache):
    """Back to an empty cache, the same tensors (their addresses are in the captured graph): the
    static layers' position counters to 0 (transformers 5.x; older versions take the positions
    from cache_position and keep none). The keys and values are not zeroed: the prefill overwrites
    the prompt's positions and the causal mask hides every later one until a step writes it."""
    for layer in getattr(cache, "layers", None) or []:
        n = getattr(layer, "cumulative_length", None)
        if isinstance(n, torch.Tensor):
            n.zero_()
        elif isinstance(n, int):
            layer.cumulative_length = 0


class GenRunner:
    """Greedy generation of `gen` tokens from `prompt` [B, P] on one model with a StaticCache:
    prefill() (eager: the prompt into the cache, the first token and its logits), then the decode
    steps by `graph` mode. All decode state lives in static tensors: ids [B, 1] (the token fed
    next), out [B, gen] (the tokens), t (a device counter: the next column of out) and, for
    transformers that take it, cache_position [1]."""

    def __init__(self, model, cache_kw, prompt, gen, graph, dev):
        self.model, self.cache_kw, self.prompt = model, cache_kw, prompt
        self.gen, self.graph, self.dev = gen, graph, dev
        B, P = prompt.shape
        self.cache = make_static_cache(model, B, P + gen, dev)
        fwd = inspect.signature(model.forward).parameters
        self.use_cache_position = "cache_position" in fwd
        self.ids = torch.zeros(B, 1, dtype=torch.long, device=dev)
        self.out = torch.zeros(B, gen, dtype=torch.long, device=dev)
        self.t = torch.zeros(1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.cuda_graph = None
        self.compiled = None
        self.graph_used = graph
        self.graph_note = None

    def _forward(self, ids, **kw):
        kw[self.cache_kw] = self.cache
        return self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **kw).logits

    def prefill(self):
        """The prompt into the cache (rewind() first); the first token into out[:, 0] and ids;
        returns the first-step logits [B, V] (the prompt's last position)."""
        B, P = self.prompt.shape
        kw = {}
        if self.use_cache_position:
            kw["cache_position"] = torch.arange(P, device=self.dev)
        with torch.no_grad():
            logits = self._forward(self.prompt, **kw)[:, -1]
            nxt = logits.argmax(-1)
            self.out[:, 0].copy_(nxt)
            self.ids.copy_(nxt.unsqueeze(1))
            self.t.fill_(1)
            self.pos.fill_(P)
        return logits

    def rewind(self):
        cache_rewind(self.cache)

    def step(self):
        """One decode step on the static tensors (what the CUDA graph captures)."""
        kw = {"cache_position": self.pos} if self.use_cache_position else {}
        logits = self._forward(self.ids, **kw)
        nxt = logits[:, -1].argmax(-1)
        self.out.index_copy_(1, self.t, nxt.unsqueeze(1))
        self.ids.copy_(nxt.unsqueeze(1))
        self.t.add_(1)
        self.pos.add_(1)

    def _compiled_fn(self):
        model, cache_kw, cache = self.model, self.cache_kw, self.cache
        use_cp = self.use_cache_position

        def fwd(ids, pos):
            kw = {cache_kw: cache}
            if use_cp:
                kw["cache_position"] = pos
            return model(input_ids=ids, use_cache=True, logits_to_keep=1, **kw).logits[:, -1].argmax(-1)
        import torch._dynamo
        import torch._dynamo.config as dcfg
        torch._dynamo.reset()  # one (configuration, batch) at a time: no other model's graphs kept
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dcfg, name):
                setattr(dcfg, name, max(getattr(dcfg, name), 64))
        return torch.compile(fwd, mode="reduce-overhead", fullgraph=False, dynamic=False)

    def _step_compiled(self):
        if hasattr(torch.compiler, "cudagraph_mark_step_begin"):
            torch.compiler.cudagraph_mark_step_begin()
        nxt = self.compiled(self.ids, self.pos)
        self.out.index_copy_(1, self.t, nxt.unsqueeze(1))
        self.ids.copy_(nxt.unsqueeze(1))
        self.t.add_(1)
        self.pos.add_(1)

    def prepare(self, warm_steps=3):
        """After a prefill: warm-up steps (eager; for a CUDA graph on a side stream, then the
        capture). Returns the warm-up's tokens (out[:, :1 + warm_steps]) to check the graph
        against. A capture or compile that fails falls back to eager steps, noted in graph_note."""
        warm_steps = max(1, min(warm_steps, self.gen - 1))
        self.rewind()
        self.prefill()
        with torch.no_grad():
            if self.graph == "cuda" and self.dev.type == "cuda":
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(warm_steps):
                        self.step()
                torch.cuda.current_stream().wait_stream(s)
                torch.cuda.synchronize()
                ref = self.out[:, :1 + warm_steps].clone()
                try:
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        self.step()
                    torch.cuda.synchronize()
                    self.cuda_graph = g
                except Exception as e:  # noqa: BLE001  (a host sync or an op capture refuses)
                    torch.cuda.synchronize()
                    self.graph_used = "eager"
                    self.graph_note = f"CUDA graph capture failed ({type(e).__name__}: {str(e)[:200]}): eager steps"
                    log(f"  WARNING {self.graph_note}")
                return ref
            if self.graph == "compile":
                try:
                    self.compiled = self._compiled_fn()
                    for _ in range(warm_steps):
                        self._step_compiled()
                    sync(self.dev)
                    return self.out[:, :1 + warm_steps].clone()
                except Exception as e:  # noqa: BLE001
                    self.compiled = None
                    self.graph_used = "eager"
                    self.graph_note = f"torch.compile failed ({type(e).__name__}: {str(e)[:200]}): eager steps"
                    log(f"  WARNING {self.graph_note}")
                    self.rewind()
                    self.prefill()
            else:
                self.graph_used = "eager"
            for _ in range(warm_steps):
                self.step()
            sync(self.dev)
            return self.out[:, :1 + warm_steps].clone()

    def decode(self):
        """gen - 1 decode steps after a prefill (the tokens land in out)."""
        with torch.no_grad():
            if self.cuda_graph is not None:
                for _ in range(self.gen - 1):
                    self.cuda_graph.replay()
            elif self.compiled is not None:
                for _ in range(self.gen - 1):
                    self._step_compiled()
            else:
                for _ in range(self.gen - 1):
                    self.step()

    def timed(self, fn):
        """(ms, result) of fn(), CUDA events on CUDA, wall clock elsewhere."""
        if self.dev.type == "cuda":
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            r = fn()
            e1.record()
            torch.cuda.synchronize()
            return e0.elapsed_time(e1), r
        t0 = time.perf_counter()
        r = fn()
        return (time.perf_counter() - t0) * 1e3, r

    def close(self):
        self.cuda_graph = None
        if self.compiled is not None:
            import torch._dynamo
            self.compiled = None
            torch._dynamo.reset()  # frees the cudagraph trees and the compiled code holding the model
        self.cache = None


def mx_counts(fly_mod):
    """{op: [ours, stock]} of the MX ops since the last reset (None: this extension counts none)."""
    if fly_mod is None:
        return None
    c = fly_mod.torch.dispatch_counts()
    got = {k: list(c[k]) for k in GEN_MX_OPS if k in c}
    return got or None


def mx_note(fly_mod, dev):
    """Why the MX layers would not run the FlyKernels GEMM here (None: they can)."""
    if fly_mod is None:
        return "flykernels not importable"
    if dev.type != "cuda":
        return ("no CUDA device: MXLinear runs its exact torch emulation (dequantize + F.linear in FP32), "
                "not the FlyKernels GEMM")
    from flykernels import _loader
    if not getattr(fly_mod.torch, "available", False):
        return f"library unavailable ({getattr(fly_mod.torch, 'reason', '')}): dequantize + F.linear"
    if _loader.ext is None or not hasattr(_loader.ext, "mx_linear_run"):
        return "the extension has no mx_linear_run (built before it): dequantize + F.linear"
    return None


def cosine_rows(a, b):
    a, b = a.double(), b.double()
    return F.cosine_similarity(a, b, dim=-1)


def gen_one_batch(model, info, b, prompts, a, dev, fly_mod, ref, is_ref=False):
    """Timing and outputs of one configuration at batch b. is_ref: this is the BF16 run (its tokens
    and first-step logits are returned in the row, to keep); otherwise ref is the BF16 run's
    {tokens, first_logits} at this batch, or None where that run failed."""
    prompt = prompts[:b].to(dev)
    run = GenRunner(model, info["cache_kw"], prompt, a.gen, a.graph, dev)
    row = {"batch": b}
    try:
        if fly_mod is not None:
            fly_mod.torch.reset_counts()
        t0 = time.time()
        run.rewind()
        logits0 = run.prefill()
        sync(dev)
        row["counts_prefill"] = mx_counts(fly_mod)
        first_logits = logits0.float().cpu()
        del logits0
        if fly_mod is not None:
            fly_mod.torch.reset_counts()
        with torch.no_grad():
            run.step()  # one eager decode step: its MX dispatch counts
        sync(dev)
        row["counts_decode_step"] = mx_counts(fly_mod)
        fell = {k: v for k, v in (row["counts_decode_step"] or {}).items() if v[1]}
        if fell and dev.type == "cuda":
            row["mx_fallback_note"] = "; ".join(f"{k}: {s_} of {o + s_} decode calls declined by the library "
                                                "(dequantize + F.linear / emulation)" for k, (o, s_) in fell.items())
            log(f"  NOTE b{b}: {row['mx_fallback_note']} (FLYKERNELS_LOG=info prints why)")
        warm = run.prepare(a.warm_steps)
        row["graph"] = run.graph_used
        if run.graph_note:
            row["graph_note"] = run.graph_note
        row["setup_s"] = time.time() - t0
        ttft, dec, tokens = [], [], None
        for rep in range(a.reps + 1):  # the first: untimed warm-up of the whole generation
            run.rewind()
            ms_p, _ = run.timed(run.prefill)
            ms_d, _ = run.timed(run.decode)
            toks = run.out.cpu()
            if rep == 0:
                row["graph_matches_warmup"] = bool(torch.equal(toks[:, :warm.shape[1]], warm.cpu()))
                tokens = toks
                continue
            ttft.append(ms_p)
            dec.append(ms_d)
            row.setdefault("repeat_identical", True)
            row["repeat_identical"] = row["repeat_identical"] and bool(torch.equal(toks, tokens))
        for _ in range(a.ttft_reps):  # more prefill samples
            run.rewind()
            ms_p, _ = run.timed(run.prefill)
            ttft.append(ms_p)
        steps = a.gen - 1
        row.update(ttft_ms=median(ttft), ttft_samples_ms=ttft, decode_ms=median(dec), decode_samples_ms=dec,
                   decode_steps=steps, ms_per_step=median(dec) / steps if steps else float("nan"))
        row["decode_tok_s"] = b * steps / (row["decode_ms"] / 1e3) if row["decode_ms"] > 0 else float("nan")
        row["decode_spread"] = (max(dec) / min(dec) - 1.0) if dec and min(dec) > 0 else float("nan")
        if is_ref:
            row["tokens"], row["first_logits"] = tokens, first_logits
        elif ref is None:
            row["agreement_note"] = "no BF16 reference at this batch (its run failed)"
        else:
            rt, rl = ref["tokens"], ref["first_logits"]
            same = tokens == rt
            row["token_agreement"] = float(same.float().mean().item())
            # the identical prefix per sequence (greedy outputs diverge for good after one differing token)
            first_diff = torch.where(same.all(1), torch.full((b,), a.gen), (~same).float().argmax(1))
            row["prefix_agreement"] = float(first_diff.float().mean().item() / a.gen)
            row["first_token_agreement"] = float(same[:, 0].float().mean().item())
            cos = cosine_rows(first_logits, rl)
            row["logits_cos_mean"], row["logits_cos_min"] = float(cos.mean().item()), float(cos.min().item())
        if dev.type == "cuda":
            row["peak_mem_gib"] = torch.cuda.max_memory_allocated(dev) / 2 ** 30
    finally:
        run.close()
        del run
        free(dev)
    return row


def gen_build(name, a, dev, fly_mod):
    """The configuration's model: BF16 from the seed, then quantize_ for the MX ones."""
    fmt, acts = GEN_CONFIGS[name]
    t0 = time.time()
    model, info = build_model("llama", a, dev)
    model.eval()
    info = dict(info, build_s=time.time() - t0, fingerprint=weights_fingerprint(model))
    if fmt is not None:
        t1 = time.time()
        fly_mod.quantize_(model, fmt, activations=acts, skip=a.skip)
        sync(dev)
        info["quantize_s"] = time.time() - t1
        info["mx_layers"] = sum(1 for m in model.modules() if type(m).__name__ == "MXLinear")
    free(dev)
    info["weight_bytes"] = weight_bytes(model)
    return model, info


def gen_table(cfgs):
    head = (f"{'config':11s} {'batch':>5s} {'graph':6s} {'decode tok/s':>12s} {'x bf16':>7s} {'ms/step':>8s} "
            f"{'TTFT ms':>9s} {'weights GiB':>11s} {'x smaller':>9s} {'tokens =':>8s} {'prefix =':>8s} "
            f"{'cos mean':>8s} {'cos min':>8s}  MX GEMM decode (ours/stock)")
    lines = [head, "-" * len(head)]
    bf = next((c for c in cfgs if c["name"] == "bf16" and c.get("status") == "ok"), None)
    for c in cfgs:
        if c.get("status") != "ok":
            lines.append(f"{c['name']:11s} skipped: {c.get('reason', '')}")
            continue
        for r in c["batches"]:
            if "error" in r:
                lines.append(f"{c['name']:11s} {r['batch']:5d} skipped: {r['error']}")
                continue
            ref = (next((x for x in bf["batches"] if x["batch"] == r["batch"] and "decode_tok_s" in x), None)
                   if bf else None)
            sp = r["decode_tok_s"] / ref["decode_tok_s"] if ref and c["name"] != "bf16" else None
            wsm = bf["weight_bytes"] / c["weight_bytes"] if bf and c["name"] != "bf16" else None

            def f(v, spec):
                return format(v, spec) if isinstance(v, (int, float)) else "-"
            cnt = r.get("counts_decode_step")
            cnt = ", ".join(f"{k} {o}/{s}" for k, (o, s) in cnt.items() if o or s) if cnt else "-"
            lines.append(f"{c['name']:11s} {r['batch']:5d} {r.get('graph', '-'):6s} {f(r['decode_tok_s'], '12.1f')} "
                         f"{f(sp, '6.2f') + 'x' if sp else '      -'} {f(r['ms_per_step'], '8.3f')} "
                         f"{f(r['ttft_ms'], '9.2f')} {f(c['weight_bytes'] / 2 ** 30, '11.2f')} "
                         f"{f(wsm, '8.2f') + 'x' if wsm else '        -'} {f(r.get('token_agreement'), '8.3f')} "
                         f"{f(r.get('prefix_agreement'), '8.3f')} {f(r.get('logits_cos_mean'), '8.5f')} "
                         f"{f(r.get('logits_cos_min'), '8.5f')}  {cnt}")
    return "\n".join(lines)


def gen_chart(out, path):
    plt = pyplot()
    if plt is None:
        return False
    cfgs = [c for c in out["configs"] if c.get("status") == "ok"]
    batches = out["settings"]["batches"]
    if not cfgs:
        print("no results: no chart", flush=True)
        return False
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    w = 0.8 / len(cfgs)
    for i, c in enumerate(cfgs):
        by_b = {r["batch"]: r for r in c["batches"] if "decode_tok_s" in r}
        xs = [j + (i - (len(cfgs) - 1) / 2) * w for j in range(len(batches))]
        for ax, key in ((axes[0], "decode_tok_s"), (axes[1], "ttft_ms")):
            vals = [by_b[b][key] if b in by_b else 0.0 for b in batches]
            bars = ax.bar(xs, vals, w, label=c["name"])
            if key == "decode_tok_s":
                for x, b, bar in zip(xs, batches, bars):
                    r = by_b.get(b)
                    if r and "token_agreement" in r:
                        ax.text(x, bar.get_height(), f"{100 * r['token_agreement']:.0f}%", ha="center",
                                va="bottom", fontsize=6, rotation=90)
    for ax, t in ((axes[0], "decode tokens/s (label: generated tokens identical to BF16's)"),
                  (axes[1], "time to first token, ms (prefill of the prompt)")):
        ax.set_xticks(range(len(batches)))
        ax.set_xticklabels([f"batch {b}" for b in batches])
        ax.set_title(t, fontsize=9)
        ax.legend(fontsize=7)
    for ax in axes[:2]:
        ax.set_ylim(0, ax.get_ylim()[1] * 1.12)  # room for the labels
    names = [c["name"] for c in cfgs]
    gib = [c["weight_bytes"] / 2 ** 30 for c in cfgs]
    ys = list(range(len(cfgs)))[::-1]
    axes[2].barh(ys, gib, color=[f"C{i}" for i in range(len(cfgs))])
    for y, g_, c in zip(ys, gib, cfgs):
        x = cfgs[0]["weight_bytes"] / c["weight_bytes"] if cfgs[0]["name"] == "bf16" else None
        axes[2].text(g_, y, f" {g_:.3g}" + (f" ({x:.2f}x smaller)" if x and c is not cfgs[0] else ""),
                     va="center", fontsize=7)
    axes[2].set_xlim(0, max(gib) * 1.45)
    from matplotlib.ticker import MaxNLocator
    axes[2].xaxis.set_major_locator(MaxNLocator(5))
    axes[2].set_yticks(range(len(cfgs))[::-1])
    axes[2].set_yticklabels(names, fontsize=8)
    axes[2].set_title("weight memory, GiB (parameters + buffers)", fontsize=9)
    s = out["settings"]
    fig.suptitle(f"generate: Llama-3.1-8B-shaped, {s['layers']} layers, random weights, prompt {s['prompt']}, "
                 f"{s['gen']} tokens greedy, graph {s['graph']} ({out['meta'].get('device_name', '')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("chart:", path, flush=True)
    return True


def parse_generate_args(argv):
    ap = argparse.ArgumentParser(prog="e2e.py generate", description=(
        "Greedy generation, BF16 against MX weights (flykernels.quantize_), static KV cache, decode in a CUDA "
        "graph (bench/e2e.md, 'generate')."), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(GEN_CONFIGS),
                    help=f"comma list of {', '.join(GEN_CONFIGS)} (default: all; bf16 is always run first, it is "
                         "the reference of the agreement figures)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 32: full depth; --smoke 2)")
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary size (default Llama-3.1's 128256)")
    ap.add_argument("--batches", default=None, help="batch sizes (default 1,8,32; --smoke 1,2)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 256; --smoke 16)")
    ap.add_argument("--gen", type=int, default=None, help="generated tokens, greedy (default 512; --smoke 8)")
    ap.add_argument("--reps", type=int, default=2, help="timed generations per batch after an untimed one")
    ap.add_argument("--ttft-reps", type=int, default=3, help="extra prefill-only samples of the time to first token")
    ap.add_argument("--warm-steps", type=int, default=3, help="eager decode steps before the CUDA graph capture")
    ap.add_argument("--graph", default=None, choices=("cuda", "compile", "eager"),
                    help="decode step: cuda (captured in a CUDA graph, default on CUDA), compile "
                         "(torch.compile mode=reduce-overhead), eager (default on the CPU)")
    ap.add_argument("--skip", default="lm_head", help="quantize_'s skip patterns, comma list (default lm_head)")
    ap.add_argument("--with-fly-ops", action="store_true",
                    help="leave FlyKernels' PyTorch overrides on (the default families) in every configuration; "
                         "default: flykernels.torch.disabled() around all, so only the linear layers differ")
    ap.add_argument("--smoke", action="store_true", help="tiny config (hidden 64), for checking the script")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None)
    a = ap.parse_args(argv)
    sm = a.smoke
    a.layers = a.layers or (2 if sm else 32)
    a.batches = [int(b) for b in (a.batches or ("1,2" if sm else "1,8,32")).split(",")]
    a.prompt = a.prompt or (16 if sm else 256)
    a.gen = a.gen or (8 if sm else 512)
    if a.gen < 2:
        ap.error("--gen must be >= 2 (the first token comes from the prefill)")
    a.graph = a.graph or ("cuda" if a.device.startswith("cuda") else "eager")
    a.skip = [s for s in a.skip.split(",") if s]
    names = [c for c in a.configs.split(",") if c]
    for c in names:
        if c not in GEN_CONFIGS:
            ap.error(f"unknown config {c!r}: {', '.join(GEN_CONFIGS)}")
    a.configs = ["bf16"] + [c for c in names if c != "bf16"]  # the reference first, always
    # what build_model reads
    a.patch, a.opt_in, a.fp32_ref = False, False, False
    return a


def main_generate(argv):
    a = parse_generate_args(argv)
    warnings.filterwarnings("ignore", message=".*functools.lru_cache.*")
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: use --device cpu (with --smoke)")
    if dev.type == "cpu" and not a.smoke:
        log("WARNING: an 8B-shaped model on the CPU will take very long (use --smoke)")
    try:
        import transformers
    except ImportError as e:
        sys.exit(f"transformers is needed: {e}")
    try:
        import flykernels as fly_mod
        fly_err = None
    except Exception as e:  # noqa: BLE001
        fly_mod, fly_err = None, f"{type(e).__name__}: {e}"
    mx_missing = (f"flykernels not importable ({fly_err})" if fly_mod is None else
                  f"flykernels {getattr(fly_mod, '__version__', '?')} has no quantize_ (built before issue 48's "
                  "MX layers)" if not hasattr(fly_mod, "quantize_") else None)
    note = mx_missing or mx_note(fly_mod, dev)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, flykernels "
        f"{getattr(fly_mod, '__version__', None)}" + (f"; MX: {note}" if note else "; MX: the FlyKernels GEMM"))
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M:%S"), command=" ".join(["bench/e2e.py", "generate"] + list(argv)),
                torch=torch.__version__, transformers=transformers.__version__, device=str(dev),
                device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                flykernels=dict(version=getattr(fly_mod, "__version__", None), import_error=fly_err,
                                available=bool(getattr(getattr(fly_mod, "torch", None), "available", False)),
                                mx_note=note))
    settings = dict(model="llama (Llama-3.1-8B-shaped, random weights)", layers=a.layers, vocab=a.vocab,
                    batches=a.batches, prompt=a.prompt, gen=a.gen, reps=a.reps, ttft_reps=a.ttft_reps,
                    graph=a.graph, skip=a.skip, seed=a.seed, smoke=a.smoke, configs=a.configs,
                    fly_ops="on (default families)" if a.with_fly_ops else "off (flykernels.torch.disabled())",
                    timing="per batch: one untimed generation, then --reps timed: prefill (TTFT: prefill + argmax) "
                           "and gen - 1 decode steps back to back, CUDA events; medians. decode tok/s = "
                           "batch x (gen - 1) / decode time")
    ctx = (fly_mod.torch.disabled() if fly_mod is not None and not a.with_fly_ops else contextlib.nullcontext())
    V = a.vocab or (512 if a.smoke else 128256)
    g = torch.Generator(device="cpu").manual_seed(a.seed + 1)
    prompts = torch.randint(0, V, (max(a.batches), a.prompt), generator=g)
    cfgs, ref = [], None
    with ctx:
        for name in a.configs:
            fmt, acts = GEN_CONFIGS[name]
            c = dict(name=name, format=fmt or "bf16", activations=acts or "bf16")
            cfgs.append(c)
            if fmt is not None and mx_missing:
                c.update(status="skipped", reason=mx_missing)
                log(f"SKIP {name}: {c['reason']}")
                continue
            if fmt is not None and ref is None:
                c.update(status="skipped", reason="no BF16 reference (its run failed)")
                log(f"SKIP {name}: {c['reason']}")
                continue
            if fmt is not None and note:
                c["mx_note"] = note
                log(f"{name}: NOTE {note}")
            log(f"== {name}: building ({a.layers} layers)")
            model = None
            try:
                if dev.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(dev)
                model, info = gen_build(name, a, dev, fly_mod)
                c.update(status="ok", weight_bytes=info["weight_bytes"], build_s=info["build_s"],
                         quantize_s=info.get("quantize_s"), mx_layers=info.get("mx_layers"),
                         params=info["params"], config=info["config"], attn_implementation=info["attn_implementation"])
                if ref is not None and info["fingerprint"] != ref["fingerprint"]:
                    c["weights_differ_from_bf16"] = True
                    log(f"WARNING {name}: its BF16 weights differ from the reference run's (seeded init not "
                        "reproducible here): the agreement figures compare different models")
                log(f"{name}: built in {info['build_s']:.1f} s"
                    + (f", quantized in {info['quantize_s']:.1f} s ({info['mx_layers']} MXLinear)" if fmt else "")
                    + f", weights {info['weight_bytes'] / 2 ** 30:.2f} GiB")
                c["batches"] = []
                for b in a.batches:
                    t0 = time.time()
                    try:
                        r = gen_one_batch(model, info, b, prompts, a, dev, fly_mod,
                                          None if ref is None else ref["batches"].get(b), is_ref=name == "bf16")
                    except Exception as e:  # noqa: BLE001  (OOM or other: this batch skipped, the rest go on)
                        free(dev)
                        err = (f"out of memory: {str(e).splitlines()[0][:200]}" if isinstance(e, OOM) else
                               f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
                        if not isinstance(e, OOM):
                            traceback.print_exc(limit=6)
                        log(f"SKIP {name} b{b}: {err}")
                        c["batches"].append(dict(batch=b, error=err))
                        continue
                    r["elapsed_s"] = time.time() - t0
                    if name == "bf16":
                        ref = ref or dict(fingerprint=info["fingerprint"], batches={})
                        ref["batches"][b] = dict(tokens=r.pop("tokens"), first_logits=r.pop("first_logits"))
                    c["batches"].append(r)
                    agree = (f", tokens = bf16 {100 * r['token_agreement']:.1f}%, prefix "
                             f"{100 * r['prefix_agreement']:.1f}%, first logits cos {r['logits_cos_mean']:.5f} "
                             f"(min {r['logits_cos_min']:.5f})" if "token_agreement" in r else "")
                    log(f"  {name} b{b} [{r['graph']}]: decode {r['decode_tok_s']:.1f} tok/s ({r['ms_per_step']:.3f} "
                        f"ms/step, spread {100 * r['decode_spread']:.1f}%), TTFT {r['ttft_ms']:.2f} ms{agree}, "
                        f"MX decode counts {r.get('counts_decode_step')}  ({r['elapsed_s']:.1f} s)")
                if name == "bf16" and ref is None:
                    raise RuntimeError("no batch size ran")
            except Exception as e:  # noqa: BLE001  (the build, or the reference: skip, go on)
                err = (f"out of memory: {str(e).splitlines()[0][:200]}" if isinstance(e, OOM) else
                       f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
                if not isinstance(e, OOM):
                    traceback.print_exc(limit=6)
                c.update(status="skipped", reason=err)
                log(f"SKIP {name}: {err}")
            finally:
                del model
                free(dev)
    out = dict(meta=meta, mode="generate", settings=settings, configs=cfgs, elapsed_s=time.time() - T0)
    bf = next((c for c in cfgs if c["name"] == "bf16" and c.get("status") == "ok"), None)
    summary = {}
    for c in cfgs:  # ratios against BF16, per batch
        if c.get("status") != "ok" or bf is None or c["name"] == "bf16":
            continue
        s = {"weights_smaller_x": bf["weight_bytes"] / c["weight_bytes"], "decode_x": {}, "ttft_x": {}}
        for r in c["batches"]:
            rb = next((x for x in bf["batches"] if x["batch"] == r["batch"] and "decode_tok_s" in x), None)
            if rb and "decode_tok_s" in r:
                s["decode_x"][r["batch"]] = r["decode_tok_s"] / rb["decode_tok_s"]
                s["ttft_x"][r["batch"]] = rb["ttft_ms"] / r["ttft_ms"]
        summary[c["name"]] = s
    out["summary"] = summary
    print("\n" + gen_table(cfgs), flush=True)
    for name, s in summary.items():
        print(f"{name}: weights {s['weights_smaller_x']:.2f}x smaller; decode "
              + ", ".join(f"b{b} {x:.2f}x" for b, x in s["decode_x"].items()) + " of BF16's tokens/s; TTFT "
              + ", ".join(f"b{b} {x:.2f}x" for b, x in s["ttft_x"].items()) + " (> 1: faster)")
    targets = {"mxfp4-bf16": (2.5, 3.7), "mxfp8-bf16": (1.6, 1.9)}  # issue 48, batch 1 and 8
    for name, (tx, wx) in targets.items():
        if name in summary:
            s = summary[name]
            got = [s["decode_x"].get(b) for b in (1, 8) if b in s["decode_x"]]
            ok = got and all(x >= tx for x in got) and s["weights_smaller_x"] >= wx
            print(f"target (issue 48) {name}: decode >= {tx}x at batch 1 and 8, weights >= {wx}x smaller: "
                  + ("met" if ok else "NOT met") + (" (smoke: tiny model, not a measurement)" if a.smoke else ""))
    if note:
        print(f"MX note: {note}")
    print(f"total {time.time() - T0:.0f} s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(jsonable(out), f, indent=1)
        print("json:", a.json, flush=True)
    if a.png:
        gen_chart(out, a.png)
    return 0 if bf is not None else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["generate"]:
        sys.exit(main_generate(sys.argv[2:]))
    main()
