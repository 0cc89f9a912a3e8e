# SPDX-License-Identifier: Apache-2.0
"""flykernels.patch(model): the unfused pieces of Hugging Face transformer blocks onto fused
kernels, in place, undoable.

    import flykernels
    flykernels.patch(model)        # every module it knows, in this model; returns a report
    flykernels.unpatch(model)      # the model's own forwards again
    with flykernels.patched(model): ...

What it replaces:
- the RMSNorm modules of the Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE, gpt-oss, Gemma-2
  and Gemma-3 families (their forward is six to eight separate elementwise and reduction ops in
  FP32; patched, it is one F.rms_norm call: our kernel where the decision rows say it is faster,
  PyTorch's fused kernel otherwise);
- their gated MLPs, down_proj(act(gate_proj(x)) * up_proj(x)), and the gate of transformers'
  fused experts (act(gate) * up over the halves of one projection): the activation and the
  product become one flykernels::glu call (SwiGLU or GeGLU, forward and backward fused, from
  libflykernels' glu family);
- the rotary embeddings of their attention (apply_rotary_pos_emb: q * cos + rotate_half(q) * sin
  and the same for k, ten elementwise ops): one flykernels::rope call for q and k, forward and
  backward (libflykernels' rope family);
- the post-attention residual add and post_attention_layernorm of their decoder layers (Llama,
  Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE, gpt-oss: `hidden = residual + hidden; residual = hidden;
  hidden = post_attention_layernorm(hidden)`, seven elementwise and reduction ops): one
  flykernels::add_rms_norm call returning both the normalized value and the new residual stream,
  forward and backward (libflykernels' add_rmsnorm family). The layer's forward is rebuilt around
  it (input_layernorm, self_attn with every argument the layer got, the fused add + norm, mlp, the
  last residual add), so its class's forward must have that shape: the probe below decides;
- the routing glue of the Qwen3-MoE, Mixtral and OLMoE sparse-MoE blocks (moe, on by default): the router's
  softmax, top-k and renormalization become one flykernels::moe_route call (the logits still come
  from the router's own F.linear and are returned, so router-logit recording and the auxiliary
  loss see them), and the experts' forward becomes flykernels::moe_permute (a device counting
  sort into expert order, with F.grouped_mm's offsets) + the grouped GEMM of gate_up_proj +
  flykernels::glu + the grouped GEMM of down_proj + flykernels::moe_unpermute (the weighted sum
  back per token in FP32), whatever `experts_implementation` the model was built with
  (libflykernels' moe_route family; each op differentiable).

- the loss of the Llama, Mistral, Mixtral, Qwen2, Qwen3 and Qwen3-MoE *ForCausalLM models
  (linear_cross_entropy=True, opt-in: the output then has no logits): when a forward gets labels
  with gradients enabled, the loss comes from flykernels.linear_cross_entropy over the final
  hidden states, lm_head's weight and the labels with Hugging Face's causal shift, ignore_index,
  shift_labels and num_items_in_batch (plus the router's auxiliary loss where the model adds it),
  so the [tokens, vocab] logits and their gradient never exist whole; the output's `logits` is
  None then (as Liger Kernel does). The model's own forward runs around it (with labels=None
  and logits_to_keep=1, the final hidden states taken by a forward hook on `model.model`);
  inference, no labels, logits_to_keep != 0, return_dict=False, a custom loss_function and a
  final_logit_softcapping config run the model's own forward unchanged;
- the causal-mask creation of their base models (LlamaModel, ...; causal_mask=True): under
  torch.compile an unpadded causal batch reaches SDPA as is_causal=True, as in eager, instead of
  as a materialized mask (flykernels/_hf_masks.py says how and what keeps its mask);

How: the module's `forward` (the experts' `_apply_gate`) becomes an instance attribute (the class
is untouched, so other models are not affected) that calls the fused op while the "patch" family
is active. Rotary embeddings are a function of the model's module (modeling_llama, ...), not a
method: it is replaced in that module while at least one patched model of the family is alive, so
it serves every model of that family in the process meanwhile (it computes the same thing), and is
restored when the last one is unpatched
(flykernels.torch.disabled() turns it off like every family, so one switch compares patched and
stock in one process) and the module's own forward otherwise, or where an input is outside what
the fused op matches exactly (a weight of another dtype than the input). Before a class is patched
the first time, its own forward and the fused one run on a small random input on the module's
device and must agree to within the input dtype's rounding, so a transformers release that
changes a module's meaning is left alone, with a message, rather than computed differently.
Works under torch.compile (F.rms_norm is traceable, flykernels::glu has shape functions) and in
CUDA graphs (no host synchronization).
"""
import copy
import inspect
import logging
import sys
import types
import weakref

import torch
import torch.nn.functional as F

from . import _hf_masks, _lce, _loader, _mx, _ops

_log = logging.getLogger("flykernels")

# Hugging Face RMSNorm classes by flavour: "scale" computes w * norm(x) (Llama's cast of the
# normalized value before the weight product, or gpt-oss's product in FP32: the same to within
# one rounding); "offset" computes norm(x) * (1 + w) in FP32 (Gemma's zero-centred weight).
RMS_NORM_CLASSES = {
    "LlamaRMSNorm": "scale",
    "MistralRMSNorm": "scale",
    "MixtralRMSNorm": "scale",
    "Qwen2RMSNorm": "scale",
    "Qwen3RMSNorm": "scale",
    "Qwen3MoeRMSNorm": "scale",
    "GptOssRMSNorm": "scale",
    "Gemma2RMSNorm": "offset",
    "Gemma3RMSNorm": "offset",
}

# Agreement the self-check asks (relative L2 over the probe input): two roundings to the input
# dtype apart at most.
_CHECK_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


_family = _ops.REGISTRY["patch"]
# module -> the attribute patch() set on it ("forward" or "_apply_gate"; the class's own before)
# What a plain patch(model) takes of the families below. add_rms_norm and moe are on: each passed
# its GPU tests, compute-sanitizer and the patched-model tests (H100, 2026-12-07).
# linear_cross_entropy is opt-in by design: a patched training forward returns no logits, which a
# caller may read.
SHIPPED_DEFAULTS = {"add_rms_norm": True, "moe": True, "linear_cross_entropy": False}
_defaults = dict(SHIPPED_DEFAULTS)
_patched = weakref.WeakKeyDictionary()
_checked = {}  # (class, flavour, dtype, device type) -> '' (agrees) or why not


def _eps(mod):
    eps = getattr(mod, "variance_epsilon", getattr(mod, "eps", None))
    return float(eps) if isinstance(eps, (int, float)) else None


def _rms_fused(mod, flavour, x):
    w = mod.weight
    if flavour == "offset":
        w = w + 1  # zero-centred weight: autograd reaches mod.weight through it
    return F.rms_norm(x, (x.shape[-1],), w, _eps(mod))


def _rms_forward(flavour):
    def forward(self, hidden_states, *args, **kwargs):
        own = type(self).forward
        if (not _family.on or args or kwargs or not isinstance(hidden_states, torch.Tensor)
                or hidden_states.dtype != self.weight.dtype or hidden_states.shape[-1] != self.weight.shape[0]):
            return own(self, hidden_states, *args, **kwargs)
        return _rms_fused(self, flavour, hidden_states)
    forward.__flykernels_patch__ = flavour
    return forward


# Hugging Face MLP classes computing down_proj(act_fn(gate_proj(x)) * up_proj(x)), and the
# activation modules whose function fly_glu_* computes (0 SiLU, 1 GELU tanh, 2 GELU erf).
MLP_CLASSES = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "Qwen3MoeMLP", "Gemma2MLP", "Gemma3MLP")
_ACTS = {"SiLUActivation": 0, "SiLU": 0, "GELUTanh": 1, "PytorchGELUTanh": 1, "NewGELUActivation": 1,
         "GELUActivation": 2}


def _act_code(act_fn):
    name = type(act_fn).__name__
    if name == "GELU":  # torch.nn.GELU
        return 1 if getattr(act_fn, "approximate", "none") == "tanh" else 2
    return _ACTS.get(name)


def _glu(gate, up, act):
    return torch.ops.flykernels.glu(gate, up, act)


def _mlp_fused(mod, act, x):
    return mod.down_proj(_glu(mod.gate_proj(x), mod.up_proj(x), act))


def _mlp_forward(act):
    def forward(self, x, *args, **kwargs):
        if not _family.on or args or kwargs or not isinstance(x, torch.Tensor) or x.dtype != self.gate_proj.weight.dtype:
            return type(self).forward(self, x, *args, **kwargs)
        return _mlp_fused(self, act, x)
    return forward


def _gate_fused(act, gate_up):
    gate, up = gate_up.chunk(2, dim=-1)  # the two halves: the kernel reads them in place
    return _glu(gate, up, act)


def _apply_gate(act):
    # transformers' experts (integrations/moe.py): gate and up come as one [S, 2 I] projection
    def apply_gate(self, gate_up_out):
        if not _family.on:
            return type(self)._apply_gate(self, gate_up_out)
        return _gate_fused(act, gate_up_out)
    return apply_gate


# Attention classes whose module's apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) is the
# rotate-half composition over q, k [B, H, S, D] and tables [B, S, W]: W = D (Hugging Face's
# cat(freqs, freqs)) or W = D / 2 (gpt-oss: one angle per pair). Which of the two a module's function
# takes, its probe finds out (the other shape raises there).
ROPE_ATTENTION_CLASSES = ("LlamaAttention", "MistralAttention", "MixtralAttention", "Qwen2Attention", "Qwen3Attention",
                          "Qwen3MoeAttention", "Gemma2Attention", "Gemma3Attention", "GptOssAttention")
_rope_state = {}  # modeling module -> [its own apply_rotary_pos_emb, WeakSet of the patched attention modules]
_rope_half = {}   # modeling module name -> True where its tables have one angle per pair (W = D / 2)


def _rope_fused(q, k, cos, sin, unsqueeze_dim):
    if unsqueeze_dim == 2:  # q, k as [B, S, H, D]: the op's [B, H, S, D] is a view of them
        qo, ko = torch.ops.flykernels.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin, q.shape[-1])
        return qo.transpose(1, 2), ko.transpose(1, 2)
    return torch.ops.flykernels.rope(q, k, cos, sin, q.shape[-1])


def _rope_takes(q, k, cos, sin, unsqueeze_dim, half):
    """Whether flykernels::rope computes what the rotate-half composition computes for these."""
    # (older transformers passed position_ids fifth: anything but the int 1 or 2 is not ours)
    if type(unsqueeze_dim) is not int or unsqueeze_dim not in (1, 2):
        return False
    if not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)) or not q.is_cuda:
        return False
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape:
        return False
    if not (q.dtype == k.dtype == cos.dtype == sin.dtype) or q.shape[-1] % 2:
        return False
    B, S, D = q.shape[0], q.shape[2 if unsqueeze_dim == 1 else 1], q.shape[-1]
    ks = k.shape[2 if unsqueeze_dim == 1 else 1]
    return (k.shape[0] == B and ks == S and k.shape[-1] == D and cos.shape[0] in (1, B) and cos.shape[1] == S
            and cos.shape[2] == (D // 2 if half else D))


def _rope_apply(own, half):
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, *args, **kwargs):
        if not _family.on or args or kwargs or not _rope_takes(q, k, cos, sin, unsqueeze_dim, half):
            return own(q, k, cos, sin, unsqueeze_dim, *args, **kwargs)
        return _rope_fused(q, k, cos, sin, unsqueeze_dim)
    apply_rotary_pos_emb.__flykernels_patch__ = "rope"
    apply_rotary_pos_emb.__wrapped__ = own
    return apply_rotary_pos_emb


def _rope_module(mod):
    return sys.modules.get(type(mod).__module__)


def _rope_own(m):
    """The modeling module's own apply_rotary_pos_emb (ours replaced it while a model is patched)."""
    st = _rope_state.get(m)
    return st[0] if st else getattr(m, "apply_rotary_pos_emb", None)


def _rope_attach(mod):
    m = _rope_module(mod)
    st = _rope_state.get(m)
    if st is None:
        own = m.apply_rotary_pos_emb
        st = _rope_state[m] = [own, weakref.WeakSet()]
        m.apply_rotary_pos_emb = _rope_apply(own, _rope_half.get(m.__name__, m.__name__.endswith("gpt_oss")))
    st[1].add(mod)


def _rope_detach(mod):
    m = _rope_module(mod)
    st = _rope_state.get(m)
    if st is None:
        return
    st[1].discard(mod)
    if not len(st[1]):
        m.apply_rotary_pos_emb = st[0]
        del _rope_state[m]


def _rope_check(mod):
    m = _rope_module(mod)
    own = _rope_own(m)
    p = next(mod.parameters(), None)
    if p is None or p.device.type == "meta":
        return "no parameters, or on the meta device: cannot check"
    gen = torch.Generator(device="cpu").manual_seed(0)

    def run():
        D = 64
        q = torch.randn(2, 3, 5, D, generator=gen).to(device=p.device, dtype=p.dtype)
        k = torch.randn(2, 1, 5, D, generator=gen).to(device=p.device, dtype=p.dtype)
        ang = (torch.randn(2, 5, D // 2, generator=gen) * 3).to(p.device)
        for half in (False, True):  # which table width the module's function takes
            t = ang if half else torch.cat((ang, ang), dim=-1)
            cos, sin = t.cos().to(p.dtype), t.sin().to(p.dtype)
            try:
                ref = own(q, k, cos, sin)
            except (RuntimeError, ValueError):
                continue
            _rope_half[m.__name__] = half
            got = _rope_fused(q, k, cos, sin, 1)
            return torch.cat([ref[0].flatten(), ref[1].flatten()]), torch.cat([got[0].flatten(), got[1].flatten()])
        raise RuntimeError("apply_rotary_pos_emb took neither table width")
    return _probe((m, "rope", p.dtype, p.device.type), p.dtype, run)


# Decoder layers whose forward(hidden_states, <named arguments>, **kwargs) is: residual = hidden;
# hidden = input_layernorm(hidden); hidden, _ = self_attn(hidden_states=hidden, <every argument by
# name>); hidden = residual + hidden; residual = hidden; hidden = post_attention_layernorm(hidden);
# hidden = mlp(hidden) (gpt-oss: a tuple, its first the output); return residual + hidden
# (transformers 5.17). Their post_attention_layernorm must be a "scale" RMSNorm class above.
DECODER_LAYER_CLASSES = ("LlamaDecoderLayer", "MistralDecoderLayer", "MixtralDecoderLayer", "Qwen2DecoderLayer",
                         "Qwen3DecoderLayer", "Qwen3MoeDecoderLayer", "GptOssDecoderLayer")


def _decoder_signature(mod):
    """The layer's forward signature when it has the shape the fused forward rebuilds, else None."""
    try:
        sig = inspect.signature(type(mod).forward)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if len(params) < 2 or params[0].name != "self" or params[1].name != "hidden_states":
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY) for p in params):
        return None
    return sig


def _decoder_spec(sig):
    """(positional names after hidden_states, defaults, every named parameter, takes **kwargs):
    what binding a call needs, as plain data (dict operations torch.compile traces without a
    graph break, where Signature.bind would not be)."""
    params = list(sig.parameters.values())[2:]
    positional = tuple(p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD)
    named = tuple(p.name for p in params if p.kind != p.VAR_KEYWORD)
    defaults = {p.name: p.default for p in params if p.kind != p.VAR_KEYWORD and p.default is not p.empty}
    return positional, defaults, named, any(p.kind == p.VAR_KEYWORD for p in params)


def _decoder_args(spec, args, kwargs):
    """Every argument of the layer's forward by name (defaults filled in, **kwargs merged) as the
    layer hands them to self_attn; None where the call does not bind (the layer's own forward then
    raises the caller's mistake)."""
    positional, defaults, named, var_kw = spec
    if len(args) > len(positional):
        return None
    out = dict(defaults)
    out.update(zip(positional, args))
    for k, v in kwargs.items():
        if k == "hidden_states" or k in positional[:len(args)] or (not var_kw and k not in named):
            return None
        out[k] = v
    if not all(k in out for k in named):
        return None
    return out


def _decoder_fused(mod, args):
    """The layer's forward with its post-attention residual add and norm fused; args: every
    argument of the layer's forward but hidden_states, by name (_decoder_args)."""
    residual = hidden = args.pop("hidden_states")
    hidden = mod.input_layernorm(hidden)
    hidden, _ = mod.self_attn(hidden_states=hidden, **args)
    norm = mod.post_attention_layernorm
    w = norm.weight
    if hidden.dtype == residual.dtype == w.dtype and hidden.shape == residual.shape:
        hidden, residual = torch.ops.flykernels.add_rms_norm(hidden, residual, w, _eps(norm))
    else:  # (autocast and mixed dtypes: the layer's own steps)
        residual = residual + hidden
        hidden = norm(residual)
    out = mod.mlp(hidden)
    if isinstance(out, tuple):  # gpt-oss's MLP returns (output, router scores)
        out = out[0]
    return residual + out


def _decoder_forward(sig):
    spec = _decoder_spec(sig)

    def forward(self, hidden_states, *args, **kwargs):
        own = type(self).forward
        w = self.post_attention_layernorm.weight
        if (not _family.on or not isinstance(hidden_states, torch.Tensor) or hidden_states.dtype != w.dtype
                or hidden_states.shape[-1] != w.shape[0]):
            return own(self, hidden_states, *args, **kwargs)
        bound = _decoder_args(spec, args, kwargs)
        if bound is None:
            return own(self, hidden_states, *args, **kwargs)
        bound["hidden_states"] = hidden_states
        return _decoder_fused(self, bound)
    forward.__flykernels_patch__ = "add_rms_norm"
    return forward


class _ProbeMLP(torch.nn.Module):
    """The layer's MLP in the probe: its own output structure (a tensor, or gpt-oss's tuple), the
    first tensor replaced by a smooth function of the input. A mixture-of-experts router would
    turn a last-bit difference of the normalized value into another expert choice; this keeps the
    comparison to what the patch changes."""

    def __init__(self, real):
        super().__init__()
        self.real = real

    def forward(self, x):
        out = self.real(x)
        sub = x * 0.75 + x.float().square().to(x.dtype) * 0.125
        return (sub,) + tuple(out[1:]) if isinstance(out, tuple) else sub


def _decoder_check(mod, sig):
    norm = mod.post_attention_layernorm
    w = norm.weight
    if w.device.type == "meta":
        return "weights on the meta device: cannot check"
    head_dim = getattr(mod.self_attn, "head_dim", None)
    if not isinstance(head_dim, int) or head_dim % 2:
        return "no even self_attn.head_dim (not the layout this patch knows)"
    n = w.shape[0]
    gen = torch.Generator(device="cpu").manual_seed(0)

    def run():
        x = torch.randn(1, 5, n, generator=gen).to(device=w.device, dtype=w.dtype)
        # A shallow copy of the layer: post_attention_layernorm's weight perturbed (a fresh model's
        # is all ones), the MLP a stand-in (_ProbeMLP); the layer itself is not touched.
        probe = copy.copy(mod)
        probe._modules = dict(mod._modules)
        pn = copy.copy(norm)
        pn._parameters = dict(norm._parameters)
        pn._parameters["weight"] = torch.nn.Parameter(
            w.detach() + 0.25 * torch.randn(n, generator=gen).to(device=w.device, dtype=w.dtype), requires_grad=False)
        probe._modules["post_attention_layernorm"] = pn
        probe._modules["mlp"] = _ProbeMLP(mod.mlp)
        ang = torch.randn(1, 5, head_dim // 2, generator=gen).to(w.device)
        names = sig.parameters
        kw = {k: v for k, v in (("attention_mask", None), ("position_ids", torch.arange(5, device=w.device)[None]),
                                ("past_key_values", None), ("use_cache", False)) if k in names}
        err = None
        for t in (torch.cat((ang, ang), dim=-1), ang):  # the table width its attention takes
            if "position_embeddings" in names:
                kw["position_embeddings"] = (t.cos().to(w.dtype), t.sin().to(w.dtype))
            try:
                ref = type(mod).forward(probe, x, **kw)
            except (RuntimeError, ValueError, TypeError) as e:
                err = e
                continue
            bound = _decoder_args(_decoder_spec(sig), (), kw)
            bound["hidden_states"] = x
            return ref, _decoder_fused(probe, bound)
        raise err
    modes = [(m, m.training) for m in mod.modules()]
    mod.eval()  # no dropout in the probe: both forwards must see the same attention
    try:
        return _probe((type(mod), "add_rms_norm", w.dtype, w.device.type), w.dtype, run)
    finally:
        for m, t in modes:
            m.training = t


# Hugging Face sparse-MoE routers (logits = F.linear(h, weight); softmax in FP32 over the experts,
# top-k, renormalized where the flavour says): class -> (renormalize: True or the attribute that
# says, weights cast to the logits' dtype as Qwen3-MoE / OLMoE do, else kept in FP32 as Mixtral).
MOE_ROUTER_CLASSES = {
    "Qwen3MoeTopKRouter": ("norm_topk_prob", True),
    "OlmoeTopKRouter": ("norm_topk_prob", True),
    "MixtralTopKRouter": (True, False),
}
# transformers' fused experts (3-D gate_up_proj [E, 2I, H] and down_proj [E, H, I], gate and up
# concatenated, no bias) whose forward(hidden_states, top_k_index, top_k_weights) is the sum over
# each token's k experts of weight * down(act(gate) * up).
MOE_EXPERTS_CLASSES = ("Qwen3MoeExperts", "MixtralExperts", "OlmoeExperts")


def _router_renorm(mod, renorm):
    return bool(getattr(mod, renorm, False)) if isinstance(renorm, str) else bool(renorm)


def _router_fused(mod, renorm, cast, hidden_states):
    h = hidden_states.reshape(-1, mod.hidden_dim)
    logits = F.linear(h, mod.weight)
    flags = 1 if _router_renorm(mod, renorm) else 0
    w, ids = torch.ops.flykernels.moe_route(logits, mod.top_k, 0, flags, logits.dtype if cast else torch.float32)
    return logits, w, ids


def _router_forward(renorm, cast):
    def forward(self, hidden_states, *args, **kwargs):
        if (not _family.on or args or kwargs or not isinstance(hidden_states, torch.Tensor)
                or hidden_states.dtype != self.weight.dtype):
            return type(self).forward(self, hidden_states, *args, **kwargs)
        return _router_fused(self, renorm, cast, hidden_states)
    forward.__flykernels_patch__ = "moe_router"
    return forward


def _grouped_linear(x, weight, offs):
    """x [S, in] @ weight[e].T per expert group of offs: transformers' own grouped GEMM helper
    (F.grouped_mm where it may run, its fallback op elsewhere), so numerics and device rules match."""
    try:
        from transformers.integrations.moe import _grouped_mm
    except ImportError:  # pragma: no cover (an older or newer transformers)
        return F.grouped_mm(x.to(weight.dtype), weight.transpose(-2, -1), offs=offs)
    return _grouped_mm(x, weight.transpose(-2, -1), offs=offs)


def _expert_linear(mod, name, x, offs):
    """_grouped_linear of mod.<name>; for MX-quantized experts (flykernels.nn.MXExperts: never
    transposed here, _moe_layout refuses that) the grouped MX GEMM hook first, else the weight
    dequantized (the property) through the same grouped GEMM."""
    if name in getattr(mod, "mx_weights", ()) and name not in mod._parameters:
        y = _mx.grouped_gemm_kernel(x, getattr(mod, f"{name}_qweight"), getattr(mod, f"{name}_scales"), mod.format,
                                    offs)
        if y is not None:
            return y
    return _grouped_linear(x, getattr(mod, name), offs)


def _experts_fused(mod, act, hidden_states, top_k_index, top_k_weights):
    x_perm, offs, row_of, _ = torch.ops.flykernels.moe_permute(hidden_states, top_k_index, mod.num_experts)
    gate_up = _expert_linear(mod, "gate_up_proj", x_perm, offs)
    half = gate_up.shape[-1] // 2
    h = _glu(gate_up[:, :half], gate_up[:, half:], act)
    out = _expert_linear(mod, "down_proj", h, offs)
    return torch.ops.flykernels.moe_unpermute(out, top_k_weights, row_of, offs).to(hidden_states.dtype)


def _experts_forward(act):
    def forward(self, hidden_states, top_k_index, top_k_weights, *args, **kwargs):
        if (not _family.on or args or kwargs or not all(isinstance(t, torch.Tensor)
                                                        for t in (hidden_states, top_k_index, top_k_weights))
                or hidden_states.dim() != 2 or top_k_index.shape != top_k_weights.shape or top_k_index.dim() != 2
                or top_k_index.is_floating_point()):
            return type(self).forward(self, hidden_states, top_k_index, top_k_weights, *args, **kwargs)
        return _experts_fused(self, act, hidden_states, top_k_index, top_k_weights)
    forward.__flykernels_patch__ = "moe_experts"
    return forward


def _is_3d_weight(mod, name):
    """Whether mod.<name> is a 3-D expert weight: a tensor, or MX-quantized (flykernels.nn.MXExperts:
    reading it would dequantize every expert just to see its shape; the patched forward reads it
    once per call, dense, as the module's own forward does)."""
    if name in getattr(mod, "mx_weights", ()):
        return True
    w = getattr(mod, name, None)
    return isinstance(w, torch.Tensor) and w.dim() == 3


def _moe_layout(mod):
    """'' when `mod` is laid out as MOE_EXPERTS_CLASSES expects, else why not."""
    if not getattr(mod, "has_gate", True) or getattr(mod, "has_bias", False) or getattr(mod, "is_transposed", False):
        return "gate-less, biased or transposed experts (not the layout this patch knows)"
    if not getattr(mod, "is_concatenated", True):
        return "interleaved gate/up weights (not the layout this patch knows)"
    if not all(_is_3d_weight(mod, n) for n in ("gate_up_proj", "down_proj")) or not isinstance(
            getattr(mod, "num_experts", None), int):
        return "no 3-D gate_up_proj / down_proj or no num_experts (not the layout this patch knows)"
    return ""


def _router_check(mod, renorm, cast):
    """A tiny random copy of the router on the CPU (FP32, hidden size 16): its forward and the fused
    one pick the same experts and agree on the logits and weights (and the weights' dtype)."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def run():
        H = 16
        probe = copy.copy(mod)
        probe._parameters = dict(mod._parameters)
        probe._parameters["weight"] = torch.nn.Parameter(torch.randn(mod.num_experts, H, generator=gen),
                                                         requires_grad=False)
        probe.hidden_dim = H
        x = torch.randn(3, 7, H, generator=gen)
        ref, got = type(mod).forward(probe, x), _router_fused(probe, renorm, cast, x)
        if not torch.equal(ref[2].long(), got[2]):
            raise RuntimeError("its forward selects other experts")
        if ref[1].dtype != got[1].dtype:
            raise RuntimeError(f"its weights are {ref[1].dtype}, the fused router's {got[1].dtype}")
        return (torch.cat([ref[0].flatten(), ref[1].float().flatten()]),
                torch.cat([got[0].flatten(), got[1].float().flatten()]))
    return _probe((type(mod), "moe_router", renorm, cast), torch.float32, run)


def _experts_check(mod, act):
    """A tiny random copy of the experts on the CPU (FP32; hidden 16, intermediate 8, the module's
    expert count): its forward and the fused composition agree on random tokens, ids and weights."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def run():
        E, H, inter, T = mod.num_experts, 16, 8, 9
        k = min(E, 3)
        probe = copy.copy(mod)
        probe._parameters = dict(mod._parameters)
        probe._parameters["gate_up_proj"] = torch.nn.Parameter(0.3 * torch.randn(E, 2 * inter, H, generator=gen),
                                                               requires_grad=False)
        probe._parameters["down_proj"] = torch.nn.Parameter(0.3 * torch.randn(E, H, inter, generator=gen),
                                                            requires_grad=False)
        probe.hidden_dim, probe.intermediate_dim = H, inter
        x = torch.randn(T, H, generator=gen)
        ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
        w = torch.rand(T, k, generator=gen)
        return type(mod).forward(probe, x, ids, w), _experts_fused(probe, act, x, ids, w)
    return _probe((type(mod), "moe_experts", act), torch.float32, run)


def _rel_err(got, ref):
    return ((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def _probe(key, dtype, run):
    """'' when run() -> (ref, got) agree to within dtype's tolerance, else why not; cached per key."""
    if key in _checked:
        return _checked[key]
    if dtype not in _CHECK_TOL:
        return f"{dtype}: cannot check"
    with torch.no_grad():
        try:
            ref, got = run()
        except Exception as e:  # noqa: BLE001  (any failure means: leave this class alone)
            why = f"probe failed: {type(e).__name__}: {e}"
        else:
            err = _rel_err(got, ref)
            why = "" if err <= _CHECK_TOL[dtype] else f"its forward disagrees with the fused op (rel. L2 {err:.2e})"
    _checked[key] = why
    return why


def _rms_check(mod, flavour):
    w = mod.weight
    if w.device.type == "meta":
        return "weight on the meta device: cannot check"
    n = w.shape[0]
    gen = torch.Generator(device="cpu").manual_seed(0)

    def run():
        x = torch.randn(4, n, generator=gen).to(device=w.device, dtype=w.dtype)
        # A shallow copy of the module with its weight perturbed (a fresh model's weight is all
        # ones or zeros and would not tell a dropped or mis-offset weight apart); the module itself
        # is not touched.
        probe = copy.copy(mod)
        probe._parameters = dict(mod._parameters)
        probe._parameters["weight"] = torch.nn.Parameter(
            w.detach() + 0.25 * torch.randn(n, generator=gen).to(device=w.device, dtype=w.dtype), requires_grad=False)
        return type(mod).forward(probe, x), _rms_fused(probe, flavour, x)
    return _probe((type(mod), flavour, w.dtype, w.device.type), w.dtype, run)


def _mlp_check(mod, act):
    w = mod.gate_proj.weight
    if w.device.type == "meta":
        return "weights on the meta device: cannot check"
    gen = torch.Generator(device="cpu").manual_seed(0)

    def run():
        x = torch.randn(4, w.shape[1], generator=gen).to(device=w.device, dtype=w.dtype)
        return type(mod).forward(mod, x), _mlp_fused(mod, act, x)
    return _probe((type(mod), act, w.dtype, w.device.type), w.dtype, run)


def _gate_check(mod, act, dtype, device):
    gen = torch.Generator(device="cpu").manual_seed(0)

    def run():
        x = torch.randn(4, 64, generator=gen).to(device=device, dtype=dtype)
        return type(mod)._apply_gate(mod, x), _gate_fused(act, x)
    return _probe((type(mod), "gate", act, dtype, device.type), dtype, run)


# Causal language models whose forward(self, input_ids, ..., labels, ..., logits_to_keep=0,
# **kwargs) runs self.model, lm_head over slice_logits_to_keep(last_hidden_state) and, given
# labels, self.loss_function (ForCausalLMLoss) plus, for the MoE ones, router_aux_loss_coef *
# aux_loss (transformers 5.17).
CAUSAL_LM_CLASSES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                     "Qwen3MoeForCausalLM", "MixtralForCausalLM")


def _causal_lm_signature(mod):
    """The forward's signature when it takes labels, logits_to_keep and **kwargs, else None."""
    try:
        sig = inspect.signature(type(mod).forward)
    except (TypeError, ValueError):
        return None
    params = sig.parameters
    if "labels" not in params or "logits_to_keep" not in params:
        return None
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    return sig


def _varkw_name(sig):
    return next(p.name for p in sig.parameters.values() if p.kind == p.VAR_KEYWORD)


def _lce_takes(mod):
    """Whether the model's loss is the one linear_cross_entropy computes (checked per call: these
    can change after patch())."""
    head = getattr(mod, "lm_head", None)
    if not isinstance(head, torch.nn.Linear) or not isinstance(getattr(mod, "model", None), torch.nn.Module):
        return False
    if getattr(getattr(mod, "config", None), "final_logit_softcapping", None):
        return False
    return getattr(mod.loss_function, "__name__", "") == "ForCausalLMLoss"


def _causal_lm_fused(mod, own, sig, bound):
    """The model's forward with its loss from linear_cross_entropy and no logits (see above)."""
    import dataclasses

    args = bound.arguments
    labels = args["labels"]
    kw = dict(args.get(_varkw_name(sig)) or {})
    num_items = kw.get("num_items_in_batch")
    ignore_index = kw.get("ignore_index", -100)
    shift_labels = kw.get("shift_labels")
    return_dict = kw.pop("return_dict", None)
    if return_dict is None:
        return_dict = getattr(mod.config, "return_dict", True)
    kw["return_dict"] = True
    args[_varkw_name(sig)] = kw
    args["labels"] = None
    args["logits_to_keep"] = 1  # lm_head over the last position only: [B, 1, V], discarded
    captured = []

    def grab(module, inputs, output):
        captured.append(output[0] if isinstance(output, tuple) else output.last_hidden_state)

    handle = mod.model.register_forward_hook(grab)
    try:
        out = own(*bound.args, **bound.kwargs)
    finally:
        handle.remove()
    if not captured:
        raise RuntimeError("flykernels.patch(linear_cross_entropy): the model's forward did not run model.model")
    hidden = captured[-1]
    if shift_labels is None:  # ForCausalLMLoss: token t predicts label t + 1, the last one nothing
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    shift_labels = shift_labels.to(hidden.device)
    head = mod.lm_head
    loss = _lce.linear_cross_entropy(hidden, head.weight, shift_labels, bias=head.bias, ignore_index=ignore_index,
                                     reduction="sum" if num_items is not None else "mean",
                                     num_items_in_batch=num_items)
    aux = getattr(out, "aux_loss", None)
    if aux is not None and hasattr(mod, "router_aux_loss_coef"):
        loss = loss + mod.router_aux_loss_coef * aux.to(loss.device)
    vals = {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}
    vals.update(loss=loss, logits=None)
    out = type(out)(**vals)
    return out if return_dict else out.to_tuple()


def _causal_lm_forward(sig):
    def forward(self, *args, **kwargs):
        own = type(self).forward
        if not _family.on or not torch.is_grad_enabled():
            return own(self, *args, **kwargs)
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError:
            return own(self, *args, **kwargs)  # (the model's own forward raises the caller's mistake)
        a = bound.arguments
        keep = a.get("logits_to_keep", 0)
        if (a.get("labels") is None or not isinstance(a["labels"], torch.Tensor) or type(keep) is not int or keep != 0
                or not _lce_takes(self)):
            return own(self, *args, **kwargs)
        return _causal_lm_fused(self, own, sig, bound)
    forward.__flykernels_patch__ = "linear_cross_entropy"
    return forward


def _causal_lm_check(mod, sig):
    """The model's own loss and the fused one on a few random tokens (eval mode, no gradients:
    the loss-only path of the same ops) agree, logits aside."""
    head = getattr(mod, "lm_head", None)
    w = getattr(head, "weight", None)
    if not isinstance(w, torch.Tensor) or w.device.type == "meta":
        return "lm_head weight missing or on the meta device: cannot check"
    if not _lce_takes(mod):
        return "its lm_head, loss_function or config is not what linear_cross_entropy computes"
    gen = torch.Generator(device="cpu").manual_seed(0)

    def run():
        V = w.shape[0]
        ids = torch.randint(0, V, (2, 7), generator=gen).to(w.device)
        labels = ids.clone()
        labels[0, :2] = -100
        own = type(mod).forward
        ref = own(mod, input_ids=ids, labels=labels)
        bound = sig.bind(mod, input_ids=ids, labels=labels)
        got = _causal_lm_fused(mod, own, sig, bound)
        if got.logits is not None or got.loss is None:
            raise RuntimeError("the fused forward returned logits or no loss")
        return ref.loss.reshape(1), got.loss.reshape(1)
    modes = [(m, m.training) for m in mod.modules()]
    mod.eval()  # no dropout: both forwards must see the same hidden states
    try:
        return _probe((type(mod), "linear_cross_entropy", w.dtype, w.device.type), w.dtype, run)
    finally:
        for m, t in modes:
            m.training = t


def _candidates(mod, rms_norm, glu, rope, add_rms_norm=False, moe=False, linear_cross_entropy=False,
                causal_mask=False):
    """(attribute, replacement factory, check) for a module patch() knows, or a skip reason, or None."""
    # MX-quantized experts (flykernels.quantize_) are a subclass MX<Name> of their own class: the
    # class they came from decides, as its weights read dense
    cls = getattr(type(mod), "_flykernels_base", type(mod)).__name__
    if causal_mask and cls in _hf_masks.MASK_MODEL_CLASSES:
        sig = _hf_masks.signature(mod)
        if sig is None or _hf_masks.masking_module(mod) is None:
            return ("its forward takes no position_ids or builds no mask with transformers' masking_utils "
                    "(not the layout this patch knows)")
        return "causal_mask", lambda: _hf_masks.forward(sig, _family), lambda: _hf_masks.check(mod)
    if linear_cross_entropy and cls in CAUSAL_LM_CLASSES:
        sig = _causal_lm_signature(mod)
        if sig is None:
            return "its forward takes no labels, logits_to_keep or **kwargs (not the layout this patch knows)"
        if not isinstance(getattr(mod, "lm_head", None), torch.nn.Linear):
            return "no nn.Linear lm_head (not the layout this patch knows)"
        return "forward", lambda: _causal_lm_forward(sig), lambda: _causal_lm_check(mod, sig)
    if add_rms_norm and cls in DECODER_LAYER_CLASSES:
        norm = getattr(mod, "post_attention_layernorm", None)
        w = getattr(norm, "weight", None)
        sig = _decoder_signature(mod)
        if (RMS_NORM_CLASSES.get(type(norm).__name__) != "scale" or not isinstance(w, torch.Tensor) or w.dim() != 1
                or _eps(norm) is None or not all(hasattr(mod, a) for a in ("input_layernorm", "self_attn", "mlp"))):
            return "no post_attention_layernorm RMSNorm, input_layernorm, self_attn or mlp (not the layout this patch knows)"
        if sig is None:
            return "its forward is not forward(self, hidden_states, <named arguments>) (not the layout this patch knows)"
        return "forward", lambda: _decoder_forward(sig), lambda: _decoder_check(mod, sig)
    if moe and cls in MOE_ROUTER_CLASSES:
        renorm, cast = MOE_ROUTER_CLASSES[cls]
        w = getattr(mod, "weight", None)
        if (not isinstance(w, torch.Tensor) or w.dim() != 2 or getattr(mod, "bias", None) is not None
                or not all(isinstance(getattr(mod, n, None), int) for n in ("top_k", "num_experts", "hidden_dim"))):
            return "no 2-D weight or no top_k / num_experts / hidden_dim (not the layout this patch knows)"
        return "forward", lambda: _router_forward(renorm, cast), lambda: _router_check(mod, renorm, cast)
    if moe and cls in MOE_EXPERTS_CLASSES and not _moe_layout(mod):
        act = _act_code(getattr(mod, "act_fn", None))
        if act is not None:
            return "forward", lambda: _experts_forward(act), lambda: _experts_check(mod, act)
    if rope and cls in ROPE_ATTENTION_CLASSES:
        if not callable(getattr(_rope_module(mod), "apply_rotary_pos_emb", None)):
            return "no apply_rotary_pos_emb in its module (not the layout this patch knows)"
        return "rope", None, lambda: _rope_check(mod)
    if rms_norm and cls in RMS_NORM_CLASSES:
        flavour = RMS_NORM_CLASSES[cls]
        w = getattr(mod, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 1 or _eps(mod) is None:
            return "no 1-D weight or no eps attribute (not the layout this patch knows)"
        return "forward", lambda: _rms_forward(flavour), lambda: _rms_check(mod, flavour)
    if not glu:
        return None
    if cls in MLP_CLASSES:
        act = _act_code(getattr(mod, "act_fn", None))
        if act is None or not all(isinstance(getattr(mod, n, None), torch.nn.Linear)
                                  for n in ("gate_proj", "up_proj", "down_proj")):
            return f"activation {type(getattr(mod, 'act_fn', None)).__name__} or projections not the ones fused"
        return "forward", lambda: _mlp_forward(act), lambda: _mlp_check(mod, act)
    gate = getattr(type(mod), "_apply_gate", None)
    if getattr(gate, "__name__", "") == "_default_apply_gate" and hasattr(mod, "act_fn"):
        act = _act_code(mod.act_fn)
        # the weights' dtype and device: a parameter's, or for MX experts (buffers only) the dense
        # dtype their floating-point tag buffer carries
        params = ([p for p in mod.parameters(recurse=False)]
                  or [b for b in mod.buffers(recurse=False) if b.is_floating_point()])
        if act is None or not params:
            return f"activation {type(mod.act_fn).__name__} not one the fused op computes"
        return ("_apply_gate", lambda: _apply_gate(act),
                lambda: _gate_check(mod, act, params[0].dtype, params[0].device))
    return None


def patch(model, *, rms_norm=True, glu=True, rope=True, add_rms_norm=None, moe=None, linear_cross_entropy=None,
          causal_mask=True, check=True):
    """Patches the modules of `model` (an nn.Module: a whole model or one block) that FlyKernels
    knows, in place; returns {"patched": {class: count}, "skipped": {class: reason}}. rms_norm:
    the RMSNorm modules; glu: the gated MLPs (SwiGLU / GeGLU) and the gate of transformers' fused
    experts, onto flykernels::glu; rope: the rotary embeddings of the attention modules, onto
    flykernels::rope; add_rms_norm: the decoder layers' post-attention residual add and norm, onto
    flykernels::add_rms_norm; moe: the routers and fused experts of the Qwen3-MoE, Mixtral and OLMoE
    sparse-MoE blocks, onto flykernels::moe_route / moe_permute / moe_unpermute around the grouped GEMMs
    (the experts' activation through flykernels::glu); linear_cross_entropy: the training loss of
    the *ForCausalLM models, onto flykernels.linear_cross_entropy (no logits in the output then);
    causal_mask: the base models' mask creation, so that under torch.compile an unpadded causal
    batch reaches SDPA as is_causal=True (our kernel, or stock's fused ones) as it does in eager,
    instead of as a materialized mask (flykernels/_hf_masks.py; needs no extension).
    None takes SHIPPED_DEFAULTS: add_rms_norm and moe on; linear_cross_entropy off (it drops the
    logits of a training forward). Patching a patched module
    again does nothing.
    `check=False` skips the probe
    of each class (see above)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"flykernels.patch: model must be a torch.nn.Module, not {type(model).__name__}")
    add_rms_norm = _defaults["add_rms_norm"] if add_rms_norm is None else add_rms_norm
    moe = _defaults["moe"] if moe is None else moe
    if linear_cross_entropy is None:
        linear_cross_entropy = _defaults.get("linear_cross_entropy", False)
    report = {"patched": {}, "skipped": {}}
    have_glu = glu and _loader.ext is not None and hasattr(torch.ops.flykernels, "glu")
    have_rope = rope and _loader.ext is not None and hasattr(torch.ops.flykernels, "rope")
    have_add_norm = add_rms_norm and _loader.ext is not None and hasattr(torch.ops.flykernels, "add_rms_norm")
    have_moe = (moe and _loader.ext is not None and hasattr(torch.ops.flykernels, "moe_route")
                and hasattr(torch.ops.flykernels, "glu"))
    have_lce = linear_cross_entropy and _lce.have_fused()
    for mod in model.modules():
        if mod in _patched:
            continue
        cand = _candidates(mod, rms_norm, glu, rope, add_rms_norm, moe, linear_cross_entropy, causal_mask)
        if cand is None:
            continue
        cls = type(mod).__name__  # the report's name (MX<Name> for MX-quantized experts)
        known = getattr(type(mod), "_flykernels_base", type(mod)).__name__  # the class the tables name
        if isinstance(cand, str):
            report["skipped"][cls] = cand
            continue
        attr, make, check_fn = cand
        why = ""
        moe_cls = known in MOE_ROUTER_CLASSES or known in MOE_EXPERTS_CLASSES and attr == "forward"
        if (moe_cls and not have_moe or known in DECODER_LAYER_CLASSES and not have_add_norm
                or known in CAUSAL_LM_CLASSES and not have_lce
                or not moe_cls and ((attr == "_apply_gate" or known in MLP_CLASSES) and not have_glu
                                    or attr == "rope" and not have_rope)):
            why = f"the flykernels extension is not loaded ({_loader.reason or 'unknown'})"
        elif (inst := "forward" if attr == "causal_mask" else attr) in mod.__dict__:
            why = (f"its {inst} is wrapped already (an instance-level attribute, e.g. a device-placement hook), "
                   "which the fused op would bypass")
        elif check:
            why = check_fn()
        if why:
            report["skipped"][cls] = why
            continue
        _patched[mod] = attr
        if attr == "rope":
            _rope_attach(mod)
        elif attr == "causal_mask":
            mod.forward = types.MethodType(make(), mod)
            _hf_masks.attach(mod)
        else:
            setattr(mod, attr, types.MethodType(make(), mod))
        report["patched"][cls] = report["patched"].get(cls, 0) + 1
    for cls, why in report["skipped"].items():
        _log.warning("flykernels.patch: %s left as it is: %s", cls, why)
    if report["patched"]:
        _log.info("flykernels.patch: %s", ", ".join(f"{n} x{c}" for c, n in report["patched"].items()))
    return report


def unpatch(model):
    """Restores what patch() replaced in `model`; returns how many modules it restored."""
    n = 0
    for mod in model.modules():
        attr = _patched.pop(mod, None)
        if attr is None:
            continue
        if attr == "rope":
            _rope_detach(mod)
        elif attr == "causal_mask":
            mod.__dict__.pop("forward", None)
            _hf_masks.detach(mod)
        else:
            mod.__dict__.pop(attr, None)
        n += 1
    return n


def is_patched(module):
    """Whether patch() replaced this module's forward (or, for attention, its rotary embeddings)."""
    return module in _patched


class patched:
    """with flykernels.patched(model): ... patches on entry and restores on exit (only what this
    entry patched)."""

    def __init__(self, model, **kw):
        self.model, self.kw, self.report, self._mods = model, kw, None, []

    def __enter__(self):
        before = {m for m in self.model.modules() if m in _patched}
        self.report = patch(self.model, **self.kw)
        self._mods = [m for m in self.model.modules() if m in _patched and m not in before]
        return self.report

    def __exit__(self, *exc):
        for m in self._mods:
            unpatch(m)
        return False
