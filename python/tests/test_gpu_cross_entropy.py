# SPDX-License-Identifier: Apache-2.0
"""The cross_entropy kernel from PyTorch on the GPU: flykernels::cross_entropy_* against the
composition, flykernels.linear_cross_entropy against F.linear + F.cross_entropy (loss, gradients,
peak memory at a 128k vocabulary) and a patched Hugging Face model (loss, gradients, peak memory).
Skipped without a CUDA device."""
import pytest
import torch
import torch.nn.functional as F

import flykernels
from flykernels import _lce

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available() or not flykernels.available,
                       reason=f"no CUDA device, or flykernels not available: {flykernels.reason}"),
    pytest.mark.skipif(not hasattr(torch.ops.flykernels, "cross_entropy_fwd_bwd_"),
                       reason="this build of the extension has no cross_entropy ops"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("V", [32000, 128256, 1001])
def test_op_on_the_kernel_matches_the_composition(dtype, V, fly):
    torch.manual_seed(0)
    x = (torch.randn(64, V, device="cuda") * 4).to(dtype)
    lab = torch.randint(0, V, (64,), device="cuda")
    lab[::5] = -100
    lab[3] = V + 4  # outside [0, V): NaN, no out-of-bounds read
    fly.reset_counts()
    loss, lse, g = torch.ops.flykernels.cross_entropy_fwd_bwd(x, lab, -100, 0.5)
    assert fly.dispatch_counts()["cross_entropy"] == (1, 0)
    rloss, rlse, rg = torch.ops.flykernels.cross_entropy_fwd_bwd(x.cpu(), lab.cpu(), -100, 0.5)
    ok = torch.ones(64, dtype=torch.bool)
    ok[3] = False
    assert torch.isnan(loss[3]) and torch.isnan(g[3]).all()
    torch.testing.assert_close(loss.cpu()[ok], rloss[ok], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(lse.cpu()[ok], rlse[ok], atol=1e-4, rtol=1e-5)
    tol = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(g.cpu()[ok].float(), rg[ok].float(), atol=1e-6, rtol=tol)
    y = x.clone()  # in place on the kernel: the same bits as out of place
    loss2, _ = torch.ops.flykernels.cross_entropy_fwd_bwd_(y, lab, -100, 0.5)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(y.view(bits), g.view(bits))  # bit for bit, the NaN row too
    assert torch.equal(loss2[ok.cuda()], loss[ok.cuda()])
    loss3, _ = torch.ops.flykernels.cross_entropy_loss(x, lab, -100)
    assert torch.equal(loss3[ok.cuda()], loss[ok.cuda()])


def test_op_against_torch_cross_entropy_with_a_row_stride(fly):
    torch.manual_seed(1)
    full = torch.randn(48, 4200, device="cuda", dtype=torch.bfloat16) * 3
    x = full[:, :4099]  # rows 4200 apart, V not a whole number of vectors
    lab = torch.randint(0, 4099, (48,), device="cuda")
    xf = x.float().requires_grad_()
    ref = F.cross_entropy(xf, lab, reduction="none")
    ref.sum().backward()
    loss, _, g = torch.ops.flykernels.cross_entropy_fwd_bwd(x, lab, -100, 1.0)
    torch.testing.assert_close(loss, ref.detach(), atol=2e-4, rtol=1e-5)
    torch.testing.assert_close(g.float(), xf.grad, atol=1e-6, rtol=1e-2)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_linear_cross_entropy_on_the_kernel(reduction, fly):
    torch.manual_seed(2)
    N, H, V = 1000, 256, 32000
    h = (torch.randn(N, H, device="cuda") * 0.5).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(V, H, device="cuda") * 0.05).to(torch.bfloat16).requires_grad_()
    lab = torch.randint(0, V, (N,), device="cuda")
    lab[:77] = -100
    fly.reset_counts()
    out = flykernels.linear_cross_entropy(h, w, lab, reduction=reduction, chunk_size=300)
    c = fly.dispatch_counts()  # one kernel per chunk ("none": the loss-only one, its gradient in backward)
    assert c["cross_entropy"][0] + c["cross_entropy_loss"][0] == 4 and c["cross_entropy"][1] == 0
    ref = _lce.reference_linear_cross_entropy(h, w, lab, reduction=reduction)
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)
    g = torch.rand_like(ref) if reduction == "none" else None
    gh, gw = torch.autograd.grad(out, (h, w), g)
    rh, rw = torch.autograd.grad(ref, (h, w), g)
    for a, r in ((gh, rh), (gw, rw)):
        assert ((a.float() - r.float()).norm() / r.float().norm()).item() < 2e-2


def _peak(fn):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def test_linear_cross_entropy_peak_memory_at_a_128k_vocabulary():
    """Llama 3's head (V = 128256, H = 4096) on 4096 tokens: the fused loss and its backward take
    less than half the memory of F.linear + F.cross_entropy in FP32 (Hugging Face's loss)."""
    torch.manual_seed(3)
    N, H, V = 4096, 4096, 128256
    h = (torch.randn(N, H, device="cuda") * 0.5).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(V, H, device="cuda") * 0.02).to(torch.bfloat16).requires_grad_()
    lab = torch.randint(0, V, (N,), device="cuda")
    res = {}

    def run(fn, key):
        def go():
            loss = fn()
            loss.backward()
            res[key] = loss.detach()
        return go
    stock = _peak(run(lambda: _lce.reference_linear_cross_entropy(h, w, lab), "stock"))
    sg = (h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None
    fused = _peak(run(lambda: flykernels.linear_cross_entropy(h, w, lab), "fused"))
    torch.testing.assert_close(res["fused"], res["stock"], atol=2e-3, rtol=2e-3)
    for a, r in zip((h.grad, w.grad), sg):
        assert ((a.float() - r.float()).norm() / r.float().norm()).item() < 2e-2
    print(f"peak over the inputs: stock {stock / 2**30:.2f} GiB, fused {fused / 2**30:.2f} GiB")
    assert fused < 0.5 * stock


def test_patched_hf_model_loss_gradients_and_memory():
    """A small Llama with Llama 3's vocabulary, BF16, training step with labels: the patched loss
    and gradients match stock's, no logits come back, and the step's peak memory is at least 30%
    lower."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
                                   num_key_value_heads=4, vocab_size=128256)
    torch.manual_seed(4)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to("cuda", torch.bfloat16)
    model.train()
    ids = torch.randint(0, 128256, (4, 1024), device="cuda")
    labels = ids.clone()
    labels[:, :10] = -100

    def step():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        step.out = out
    stock = _peak(step)
    ref_loss = step.out.loss.detach()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    report = flykernels.patch(model, rms_norm=False, glu=False, rope=False, linear_cross_entropy=True)
    assert report["patched"].get("LlamaForCausalLM") == 1, report
    fused = _peak(step)
    assert step.out.logits is None
    torch.testing.assert_close(step.out.loss.detach(), ref_loss, atol=5e-3, rtol=5e-3)
    for n, p in model.named_parameters():
        r = ref_grads[n].float()
        assert ((p.grad.float() - r).norm() / r.norm().clamp_min(1e-12)).item() < 5e-2, n
    print(f"training step peak: stock {stock / 2**30:.2f} GiB, patched {fused / 2**30:.2f} GiB")
    assert fused < 0.7 * stock
    flykernels.unpatch(model)
