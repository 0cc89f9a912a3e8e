# SPDX-License-Identifier: Apache-2.0
"""flykernels.linear_cross_entropy: the cross-entropy of a linear layer's output (a language
model's head) without the [tokens, vocab] logits or their gradient in memory at once.

The tokens are taken in chunks. Per chunk, logits = F.linear(h_c, weight, bias) (cuBLAS), then one
fused kernel (flykernels::cross_entropy_fwd_bwd_, libflykernels' cross_entropy family) computes
every row's loss and writes the gradient of the summed loss over the logits, in place; two more
GEMMs take that gradient to the hidden states (grad_h_c = dlogits @ weight) and the weight
(grad_w += dlogits^T @ h_c), and the chunk's logits are freed. So the forward computes the
gradients too, for the summed loss; the backward only scales them by grad_output and the
reduction's denominator (a device tensor: the number of non-ignored labels for "mean", or
num_items_in_batch), which needs no host synchronization anywhere. reduction="none" cannot fold
a per-row grad_output into the forward: its backward computes the logits again, chunk by chunk.

Memory: one chunk's logits (default: at most 512 MiB, see default_chunk_rows) plus the gradients
the stock path also produces ([tokens, hidden] and [vocab, hidden], accumulated in the weight's
dtype: each chunk's GEMM adds in FP32 and rounds once). Numerics are those of Hugging Face's loss
(logits in the compute dtype, the loss in FP32): the same rounding of the logits, a different
summation order.
"""
import math

import torch
import torch.nn.functional as F

from . import _loader

# Bytes one chunk's logits may take (the default chunk size; chunk_size overrides it).
CHUNK_LOGITS_BYTES = 512 << 20
_REDUCTIONS = ("mean", "sum", "none")


def default_chunk_rows(vocab, itemsize, tokens=None):
    """Rows per chunk: as many as fit CHUNK_LOGITS_BYTES of logits, a multiple of 128 (GEMM tiles),
    at least 128; all the tokens when they fit."""
    rows = max(128, (CHUNK_LOGITS_BYTES // max(1, vocab * itemsize)) // 128 * 128)
    return rows if tokens is None else max(1, min(rows, tokens))


def have_fused():
    """Whether the extension's cross-entropy ops are there (else linear_cross_entropy composes
    F.linear and F.cross_entropy, materializing the logits)."""
    return _loader.ext is not None and hasattr(torch.ops.flykernels, "cross_entropy_fwd_bwd_")


def _compute_dtype(hidden, weight):
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev) and hidden.is_floating_point():
        return torch.get_autocast_dtype(dev)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _denominator(labels, ignore_index, reduction, num_items_in_batch):
    """What the summed loss is divided by (a device tensor or a number), None for a plain sum."""
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            return num_items_in_batch.to(labels.device)
        return num_items_in_batch
    if reduction == "mean":
        return (labels != ignore_index).sum()  # on the device: no synchronization
    return None


def _chunks(n, rows):
    for s in range(0, n, rows):
        yield s, min(n, s + rows)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, ignore_index, reduction, num_items_in_batch, rows):
        N, cd = hidden.shape[0], _compute_dtype(hidden, weight)
        dev = hidden.device.type
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        # The precomputed gradients are those of the summed loss: "none" gets them in backward.
        pre = (need_h or need_w or need_b) and reduction != "none"
        with torch.autocast(dev, enabled=False):
            h, w = hidden.to(cd), weight.to(cd)
            b = bias.to(cd) if bias is not None else None
            loss_rows = torch.empty(N, dtype=torch.promote_types(cd, torch.float32), device=hidden.device)
            gh = torch.empty_like(h) if pre and need_h else None
            gw = torch.zeros_like(w) if pre and need_w else None
            gb = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device) if pre and need_b else None
            for s, e in _chunks(N, rows):
                h_c, l_c = h[s:e], labels[s:e]
                logits = F.linear(h_c, w, b)
                if pre:
                    loss_c, _ = torch.ops.flykernels.cross_entropy_fwd_bwd_(logits, l_c, ignore_index, 1.0)
                    _grads_of_chunk(logits, h_c, w, gh, gw, gb, s, e)
                else:
                    loss_c, _ = torch.ops.flykernels.cross_entropy_loss(logits, l_c, ignore_index)
                loss_rows[s:e] = loss_c
                del logits
        denom = _denominator(labels, ignore_index, reduction, num_items_in_batch)
        ctx.reduction, ctx.ignore_index, ctx.rows, ctx.denom, ctx.cd = reduction, ignore_index, rows, denom, cd
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.consumed = False
        if reduction == "none":
            ctx.save_for_backward(hidden, weight, bias, labels)
            return loss_rows
        ctx.pre = (gh, gw, gb)
        loss = loss_rows.sum()
        return loss / denom if denom is not None else loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        if ctx.consumed:
            raise RuntimeError("flykernels.linear_cross_entropy: backward ran twice (retain_graph=True) - its "
                               "gradients are computed in the forward and scaled in place once")
        ctx.consumed = True
        if ctx.reduction == "none":
            gh, gw, gb = _backward_none(ctx, grad)
        else:
            gh, gw, gb = ctx.pre
            ctx.pre = None
            factor = grad.to(torch.float32)
            if ctx.denom is not None:
                factor = factor / ctx.denom
            for t in (gh, gw, gb):
                if t is not None:
                    t.mul_(factor)  # a 0-dim factor keeps t's dtype
        dh, dw, db = ctx.dtypes
        return (gh.to(dh) if gh is not None else None, gw.to(dw) if gw is not None else None,
                gb.to(db) if gb is not None else None, None, None, None, None, None)


def _grads_of_chunk(dlogits, h_c, w, gh, gw, gb, s, e):
    """The chunk's share of the gradients of the summed loss, from its logits' gradient."""
    if gh is not None:
        torch.mm(dlogits, w, out=gh[s:e])
    if gw is not None:
        gw.addmm_(dlogits.t(), h_c)
    if gb is not None:
        gb += dlogits.sum(0, dtype=torch.float32)


def _backward_none(ctx, grad):
    """reduction="none": the logits again per chunk, their gradient scaled per row by grad."""
    hidden, weight, bias, labels = ctx.saved_tensors
    cd, dev = ctx.cd, hidden.device.type
    need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_b = bias is not None and ctx.needs_input_grad[2]
    with torch.autocast(dev, enabled=False):
        h, w = hidden.to(cd), weight.to(cd)
        b = bias.to(cd) if bias is not None else None
        gh = torch.empty_like(h) if need_h else None
        gw = torch.zeros_like(w) if need_w else None
        gb = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device) if need_b else None
        g = grad.reshape(-1).to(torch.float32)
        for s, e in _chunks(h.shape[0], ctx.rows):
            logits = F.linear(h[s:e], w, b)
            torch.ops.flykernels.cross_entropy_fwd_bwd_(logits, labels[s:e], ctx.ignore_index, 1.0)
            logits.mul_(g[s:e, None])
            _grads_of_chunk(logits, h[s:e], w, gh, gw, gb, s, e)
            del logits
    return gh, gw, gb


def _check(hidden, weight, labels, bias, reduction, num_items_in_batch):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"linear_cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if num_items_in_batch is not None and reduction == "none":
        raise ValueError("linear_cross_entropy: num_items_in_batch divides a reduced loss; reduction='none' has none")
    if weight.dim() != 2 or hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)} do not "
                         "make hidden @ weight.T")
    if tuple(labels.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"linear_cross_entropy: labels {tuple(labels.shape)} do not match hidden's leading shape "
                         f"{tuple(hidden.shape[:-1])}")
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise ValueError(f"linear_cross_entropy: labels must be integers, got {labels.dtype}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(f"linear_cross_entropy: bias {tuple(bias.shape)} is not [{weight.shape[0]}]")


def reference_linear_cross_entropy(hidden, weight, labels, bias=None, ignore_index=-100, reduction="mean",
                                   num_items_in_batch=None):
    """The unfused composition linear_cross_entropy stands for (F.linear, then F.cross_entropy in
    FP32 as Hugging Face's loss computes it): it materializes the logits."""
    logits = F.linear(hidden, weight, bias).float()
    red = "sum" if num_items_in_batch is not None else reduction
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).to(logits.device),
                           ignore_index=ignore_index, reduction=red)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss.reshape(labels.shape) if reduction == "none" else loss


def linear_cross_entropy(hidden, weight, labels, bias=None, ignore_index=-100, reduction="mean",
                         num_items_in_batch=None, chunk_size=None):
    """cross_entropy(F.linear(hidden, weight, bias), labels) without materializing the logits.

    hidden [..., H]; weight [V, H]; labels [...] (integers; ignore_index marks tokens without a
    loss); bias [V] or None. reduction: "mean" (over the non-ignored labels: NaN when there are
    none, as torch), "sum" or "none" (FP32 per token, labels' shape, 0 where ignored).
    num_items_in_batch: the summed loss divided by it (a tensor or a number; Hugging Face's
    gradient-accumulation normalization), whatever reduction says (but "none"). chunk_size: tokens
    per chunk (default: default_chunk_rows, at most 512 MiB of logits). The loss is FP32 (FP64
    for FP64 inputs). A label outside [0, V) other than ignore_index gives that token a NaN loss and
    gradient (torch raises a device-side assert). Differentiable in hidden, weight and bias (once:
    no retain_graph). Where the extension is not loaded the unfused composition runs instead."""
    _check(hidden, weight, labels, bias, reduction, num_items_in_batch)
    if not have_fused():
        return reference_linear_cross_entropy(hidden, weight, labels, bias, ignore_index, reduction,
                                              num_items_in_batch)
    H, V = weight.shape[1], weight.shape[0]
    h2 = hidden.reshape(-1, H)
    lab = labels.reshape(-1).to(device=hidden.device, dtype=torch.long)
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"linear_cross_entropy: chunk_size must be a positive int, got {chunk_size!r}")
    cd = _compute_dtype(hidden, weight)
    rows = chunk_size or default_chunk_rows(V, torch.empty((), dtype=cd).element_size(), h2.shape[0])
    out = _LinearCrossEntropy.apply(h2, weight, bias, lab, int(ignore_index), reduction, num_items_in_batch, rows)
    return out.reshape(labels.shape) if reduction == "none" else out
