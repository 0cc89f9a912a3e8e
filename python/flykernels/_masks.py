# SPDX-License-Identifier: Apache-2.0
"""What an SDPA attention mask means for our kernel, from its values (issue 51).

Our attention takes no mask: `fly_attention_fwd` knows `causal` (top-left aligned, SDPA's
`is_causal`, also when Sq != Sk) and nothing else, no per-row key lengths. So of the masks Hugging
Face and others build, two are ours to run, as calls without a mask:
- "none": every query sees every key (a decode step's mask without padding) -> attn_mask=None;
- "causal": key j visible to query i iff j <= i -> is_causal=True. For Sq == Sk this is also the
  bottom-right mask transformers builds.
The rest stays stock: "causal_bottom_right" (j <= i + Sk - Sq with Sq != Sk: a prefill on a KV
cache; not our alignment), "padding" (keys masked at the end of each batch row, the same for every
query and head: would need per-row key lengths, which the library's attention does not take),
"other" (anything else, a bias with values besides 0 and -inf / the dtype's lowest, a mask that
requires grad, a dtype SDPA does not take), "unknown" (while tracing: the values do not exist yet).

Knowing a mask's kind means reading it: on a GPU that is one host synchronization (the checks are
reduced on the device and read back as one small tensor), which a decision in SDPA's hot path
must not pay (nor could a CUDA graph capture it, nor a trace see the values). So the override in
the extension leaves every masked call to stock, and the masks are kept from being built instead:
`flykernels.patch(model)` makes Hugging Face's models pass `is_causal` under torch.compile as in
eager (flykernels/_hf_masks.py). This classification is the diagnostic side: explain_sdpa(...,
attn_mask=) says which of these a mask is and what call would run ours.
"""
from typing import List, NamedTuple, Optional

import torch


class MaskKind(NamedTuple):
    kind: str  # "none", "causal", "causal_bottom_right", "padding", "other", "unknown"
    key_lengths: Optional[List[int]]  # "padding": the visible keys of each batch row
    why: str  # what decided it, in words


def _traced(t):
    if torch.compiler.is_compiling() or t.device.type == "meta":
        return True
    try:
        from torch._subclasses.fake_tensor import is_fake
    except ImportError:  # pragma: no cover (another torch)
        return False
    return is_fake(t)


def mask_meta(mask, q, k) -> str:
    """'' when `mask`'s values can be classified against q [B, Hq, Sq, D] and k [B, Hk, Sk, D],
    else why not; reads shapes and dtypes only (no device memory, fine on fake tensors)."""
    if not isinstance(mask, torch.Tensor):
        return "not a tensor"
    if mask.dtype != torch.bool and not mask.is_floating_point():
        return f"dtype {mask.dtype} (SDPA takes bool or floating masks)"
    if mask.requires_grad:
        return "requires grad (a learned bias)"
    if q.dim() != 4 or k.dim() != 4 or mask.dim() < 1 or mask.dim() > 4:
        return "not broadcastable to [B, H, Sq, Sk]"
    target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    for got, want in zip(reversed(mask.shape), reversed(target)):
        if got != 1 and got != want:
            return f"shape {tuple(mask.shape)} not broadcastable to [B, H, Sq, Sk] = {list(target)}"
    if mask.numel() == 0:
        return "empty"
    if _traced(mask):
        return "traced (its values are not known while tracing)"
    return ""


def classify(mask, q, k) -> MaskKind:
    """The kind of `mask` (see the module docstring) for SDPA on q, k. Reads the mask: one host
    synchronization on a GPU."""
    why = mask_meta(mask, q, k)
    if why:
        return MaskKind("unknown" if why.startswith("traced") else "other", None, why)
    Sq, Sk = q.shape[2], k.shape[2]
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    dev = m.device
    if m.dtype == torch.bool:
        attend, valid = m, torch.ones((), dtype=torch.bool, device=dev)
    else:
        attend = m == 0
        # masked: -inf (SDPA's own conversion of a boolean mask) or the dtype's lowest (Hugging
        # Face's eager masks); any other value is a bias, not a mask
        valid = (attend | (m <= torch.finfo(m.dtype).min)).all()
    i = torch.arange(Sq, device=dev).view(Sq, 1)
    j = torch.arange(Sk, device=dev).view(1, Sk)
    lens = attend[:, :, :1, :].sum(-1, keepdim=True)  # keys the first query sees, per (batch, head)
    padding = (attend == (j < lens)).all() & (lens > 0).all() & (lens == lens[:, :1]).all()
    flags = torch.stack([valid, attend.all(), (attend == (j <= i)).all(), (attend == (j <= i + (Sk - Sq))).all(),
                         padding])
    got = torch.cat([flags.long(), lens[:, 0, 0, 0].long()]).tolist()  # the one read back
    valid, everything, top_left, bottom_right, padding = (bool(x) for x in got[:5])
    if not valid:
        return MaskKind("other", None, "values other than 0 and -inf / the dtype's lowest (a bias)")
    if everything:
        return MaskKind("none", None, "masks nothing")
    if top_left:
        return MaskKind("causal", None, "causal (top-left, as is_causal)")
    if bottom_right:
        return MaskKind("causal_bottom_right", None, "causal aligned bottom-right with Sq != Sk")
    if padding:
        lengths = got[5:] if len(got[5:]) == q.shape[0] else got[5:] * q.shape[0]
        return MaskKind("padding", lengths, "padding (keys masked at the end of each batch row)")
    return MaskKind("other", None, "neither causal nor padding")


def as_sdpa_args(kind: MaskKind):
    """(attn_mask, is_causal) that compute the same as the mask and reach our kernel, or None where
    only a masked call computes it (stock)."""
    return {"none": (None, False), "causal": (None, True)}.get(kind.kind)


def explain(mask, q, k, is_causal=False) -> str:
    """Why a call with this mask runs stock, and which call would run ours (explain_sdpa)."""
    if is_causal:
        return "attention mask together with is_causal (SDPA raises)"
    kind = classify(mask, q, k)
    hint = {
        "none": "; attn_mask=None computes the same and can run ours",
        "causal": "; is_causal=True without the mask computes the same and can run ours",
        "causal_bottom_right": "; ours aligns causal top-left (SDPA's is_causal)",
        "padding": f" {kind.key_lengths}; the library's attention takes no per-row key lengths",
        "unknown": "; under torch.compile flykernels.patch(model) keeps Hugging Face from building causal masks",
    }.get(kind.kind, "")
    return f"attention mask, {kind.kind}: {kind.why}{hint}"
