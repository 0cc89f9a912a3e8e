# SPDX-License-Identifier: Apache-2.0
"""patch(model, causal_mask=True): a Hugging Face decoder's causal mask becomes SDPA's `is_causal`
under torch.compile where it already does in eager (issue 51).

In eager, transformers' `masking_utils` builds no mask for an unpadded causal batch: SDPA gets
`attn_mask=None, is_causal=True` (a decode step `None, False`), which the fused kernels (ours, and
stock's flash / cuDNN) take. Compiled, it materializes a `[B, 1, Sq, Sk]` boolean mask instead, so
the call goes to a masked stock kernel. Two of its checks are why, both unable to decide while
tracing:
- `find_packed_sequence_indices(position_ids)` (no attention mask, no cache: training) reads the
  positions to see whether several sequences are packed in a row; traced, it cannot, keeps a
  packed-sequence mask and turns the skip off;
- `_ignore_causal_mask_sdpa` returns False whenever it traces: transformers 5.17 asks
  `is_tracing()`, 5.25 `torch.compiler.is_exporting()`, which dynamo folds to True under a plain
  torch.compile before torch 2.14 (pytorch#176499).

What this replaces, while the patched model's forward runs (and the "patch" family is on):
- the packed-sequence check returns None (not packed) when the caller passed no `position_ids`:
  the model then made them itself, `arange(S) + past`, one sequence per row. That is what the
  check computes in eager too, so eager loses only its host synchronization (it reads the
  positions back);
- under torch.compile (not export: `torch.compiler._is_exporting_flag`, which dynamo reads as it
  is), with no padding mask, a query offset that is no tensor (a static cache's is) and the window
  (if any) longer than the keys, the skip answers what it answers in eager for those arguments: True when Sq == 1,
  Sq == Sk or the query offset is 0. The graph is specialized on those sizes (dynamo guards on
  them), so unlike an exported graph it never runs a shape the answer was not made for.
Everything else goes to transformers' own functions: padding masks (their values decide, which
a trace cannot read), export, jit tracing, CUDA-graph capture, static caches (tensor offsets),
other models in the process.

How: the base model's `forward` becomes an instance attribute (the class is untouched) that marks
the scope; the two functions are replaced in `transformers.masking_utils` while at least one
patched model is alive and restored when the last is unpatched, as the rotary embeddings are
(outside a patched model's forward they call the originals unchanged).
"""
import inspect
import sys
import threading
import weakref

import torch

# Base models whose forward makes position_ids = arange(S) + past when none are passed and builds
# its masks with masking_utils' create_causal_mask / create_sliding_window_causal_mask
# (transformers 5.17 and 5.25).
# (Gemma-2 runs with SDPA in 5.17, not in 5.25; gpt-oss in neither.)
MASK_MODEL_CLASSES = ("LlamaModel", "MistralModel", "MixtralModel", "Qwen2Model", "Qwen3Model", "Qwen3MoeModel",
                      "Gemma2Model", "Gemma3TextModel", "OlmoeModel")
_MASK_BUILDERS = ("create_causal_mask", "create_sliding_window_causal_mask")
_REPLACED = ("find_packed_sequence_indices", "_ignore_causal_mask_sdpa")


class _Scope(threading.local):
    """Set while a patched model's forward runs: `depth` (inside one), `own_positions` (inside one
    that made its position_ids itself). Per thread: another thread's model, patched or not, keeps
    its own answers (caller-given packed positions there must keep their mask). Dynamo traces the
    updates as side effects (fullgraph works)."""
    depth = 0
    own_positions = 0


_scope = _Scope()
_state = {}  # masking module -> [{name: its own function}, WeakSet of the patched models]


def _exporting():
    # Missing flag (another torch): assume export, i.e. leave transformers' answer alone.
    return bool(getattr(torch.compiler, "_is_exporting_flag", True))


def _packed_fn(own):
    def find_packed_sequence_indices(position_ids, *args, **kwargs):
        if _scope.own_positions and not args and not kwargs:
            return None
        return own(position_ids, *args, **kwargs)
    find_packed_sequence_indices.__wrapped__ = own
    find_packed_sequence_indices.__flykernels_patch__ = "causal_mask"
    return find_packed_sequence_indices


def _skip_fn(own):
    def _ignore_causal_mask_sdpa(padding_mask, q_length, kv_length, q_offset, kv_offset,
                                 local_attention_size=None, *args, **kwargs):
        if (_scope.depth and padding_mask is None and not args and not kwargs and torch.compiler.is_compiling()
                and not _exporting() and not isinstance(q_offset, torch.Tensor)
                and (local_attention_size is None or kv_length < local_attention_size)
                and (q_length == 1 or kv_length == q_length or q_offset == 0)):
            return True
        return own(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size, *args, **kwargs)
    _ignore_causal_mask_sdpa.__wrapped__ = own
    _ignore_causal_mask_sdpa.__flykernels_patch__ = "causal_mask"
    return _ignore_causal_mask_sdpa


_FACTORIES = {"find_packed_sequence_indices": _packed_fn, "_ignore_causal_mask_sdpa": _skip_fn}


def masking_module(mod):
    """transformers' masking module the model's forward builds its masks with, or None."""
    fwd = getattr(type(mod), "forward", None)
    try:
        inner = inspect.unwrap(fwd)
        code, glb = inner.__code__, inner.__globals__
    except (AttributeError, ValueError, TypeError):
        return None
    for name in _MASK_BUILDERS:
        fn = glb.get(name) if name in code.co_names else None
        m = sys.modules.get(getattr(fn, "__module__", None) or "")
        if m is not None and m.__name__.startswith("transformers") and all(callable(getattr(m, n, None))
                                                                        for n in _REPLACED):
            return m
    return None


def signature(mod):
    """The forward's signature when it takes position_ids (by name), else None."""
    try:
        sig = inspect.signature(type(mod).forward)
    except (TypeError, ValueError):
        return None
    p = sig.parameters.get("position_ids")
    return sig if p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) else None


def _own(m, name):
    st = _state.get(m)
    return st[0][name] if st else getattr(m, name)


def check(mod):
    """'' when this transformers' functions behave as the replacements assume, else why not: the
    model's own positions (an arange row) are unpacked, and the skip answers True for an unpadded
    causal prefill in eager."""
    m = masking_module(mod)
    try:
        packed = _own(m, "find_packed_sequence_indices")(torch.arange(5)[None])
        skip = _own(m, "_ignore_causal_mask_sdpa")(None, 5, 5, 0, 0)
    except Exception as e:  # noqa: BLE001 (a release with other arguments: not ours to patch)
        return f"masking_utils' functions take other arguments ({type(e).__name__}: {e})"
    if packed is not None or skip is not True:
        return "masking_utils' packed-sequence check or causal skip answers otherwise than this patch assumes"
    return ""


def forward(sig, family):
    """The base model's forward inside the scope (see the module docstring)."""
    names = list(sig.parameters)
    pos_index = names.index("position_ids") - 1  # among the positional arguments after self

    def fwd(self, *args, **kwargs):
        own = type(self).forward
        if not family.on:
            return own(self, *args, **kwargs)
        given = kwargs.get("position_ids") is not None or (len(args) > pos_index and args[pos_index] is not None)
        # set, not added: a model nested in another one answers for its own positions
        outer = _scope.own_positions
        _scope.depth += 1
        _scope.own_positions = 0 if given else 1
        try:
            return own(self, *args, **kwargs)
        finally:
            _scope.depth -= 1
            _scope.own_positions = outer
    fwd.__flykernels_patch__ = "causal_mask"
    return fwd


def attach(mod):
    m = masking_module(mod)
    st = _state.get(m)
    if st is None:
        own = {n: getattr(m, n) for n in _REPLACED}
        st = _state[m] = [own, weakref.WeakSet()]
        for n in _REPLACED:
            setattr(m, n, _FACTORIES[n](own[n]))
    st[1].add(mod)


def detach(mod):
    for m, st in list(_state.items()):
        st[1].discard(mod)
        if not len(st[1]):
            for n, fn in st[0].items():
                # (a function someone set over ours since stays: theirs to undo)
                if getattr(getattr(m, n, None), "__flykernels_patch__", None) == "causal_mask":
                    setattr(m, n, fn)
            del _state[m]
