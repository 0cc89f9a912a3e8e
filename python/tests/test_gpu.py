# SPDX-License-Identifier: Apache-2.0
"""GPU tests of the eager overrides and the Inductor GEMM candidates (skipped without a GPU on
which FlyKernels can run). References: the stock kernels (inside flykernels.torch.disabled())
and float64 computations; fresh random inputs for every check."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import flykernels
from conftest import needs_gpu

pytestmark = needs_gpu
DEV = "cuda"
RMS_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def rel_err(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def rms_ref(x, shape, w, eps):
    dims = tuple(range(x.dim() - len(shape), x.dim()))
    xd = x.double()
    r = torch.rsqrt(xd.pow(2).mean(dims, keepdim=True) + eps)
    y = xd * r
    return (y * w.double() if w is not None else y), r


@pytest.fixture
def on(fly):
    fly.enable()
    fly.reset_counts()
    return fly


# ---- RMSNorm ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape,norm", [((64, 4096), [4096]), ((3, 77, 1000), [1000]), ((8, 4097), [4097]),
                                        ((4, 16, 256), [16, 256]), ((1, 128), [128])])
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_matches_reference_and_stock(on, dtype, shape, norm, weighted):
    x = torch.randn(shape, device=DEV, dtype=dtype) * 3
    w = torch.randn(norm, device=DEV, dtype=dtype) if weighted else None
    for eps in (1e-5, None):
        y, rstd = torch._fused_rms_norm(x, norm, w, eps)
        e = eps if eps is not None else torch.finfo(torch.float32).eps
        ref_y, ref_r = rms_ref(x, norm, w, e)
        assert rel_err(y, ref_y) < RMS_TOL[dtype]
        assert rel_err(rstd, ref_r) < 1e-5
        with on.disabled():
            sy, srstd = torch._fused_rms_norm(x, norm, w, eps)
        assert y.shape == sy.shape and y.dtype == sy.dtype and y.stride() == sy.stride()
        assert rstd.shape == srstd.shape and rstd.dtype == srstd.dtype
        assert rel_err(y, sy) < RMS_TOL[dtype] and rel_err(rstd, srstd) < 1e-5
        assert torch.equal(F.rms_norm(x, norm, w, eps), y)
    assert on.dispatch_counts()["rms_norm"] == (4, 0)  # 2 eps x (_fused_rms_norm, F.rms_norm)


def test_rms_norm_every_element_written(on):
    x = torch.randn(513, 777, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(777, device=DEV, dtype=torch.bfloat16)
    for _ in range(3):  # the caching allocator hands back poisoned blocks
        torch.full((513 * 777 * 2,), float("nan"), device=DEV).sum()
        y = F.rms_norm(x, [777], w, 1e-6)
        assert torch.isfinite(y).all()


@pytest.mark.parametrize("case", ["fp64", "noncontig", "cpu", "weight_dtype", "empty"])
def test_rms_norm_ineligible_reaches_stock(on, case):
    x = torch.randn(32, 256, device=DEV)
    w = torch.randn(256, device=DEV)
    if case == "fp64":
        x, w = x.double(), w.double()
    elif case == "noncontig":
        x = torch.randn(256, 32, device=DEV).t()
    elif case == "cpu":
        x, w = x.cpu(), w.cpu()
    elif case == "weight_dtype":
        x = x.bfloat16()
    elif case == "empty":
        x = x[:0]
    y = F.rms_norm(x, [256], w, 1e-5)
    with on.disabled():
        ref = F.rms_norm(x, [256], w, 1e-5)
    torch.testing.assert_close(y, ref)
    ours, stock = on.dispatch_counts()["rms_norm"]
    assert ours == 0
    if case in ("fp64", "noncontig"):
        assert stock == 1
    elif case in ("cpu", "weight_dtype"):  # mixed dtypes take F.rms_norm's composite path
        assert stock == 0
    else:
        assert stock <= 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rms_norm_gradients_match_stock(on, dtype):
    x0 = torch.randn(96, 1536, device=DEV, dtype=dtype)
    w0 = torch.randn(1536, device=DEV, dtype=dtype)
    g = torch.randn_like(x0)

    def grads():
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        F.rms_norm(x, [1536], w, 1e-5).backward(g)
        return x.grad, w.grad

    gx, gw = grads()
    assert on.dispatch_counts()["rms_norm"][0] == 1
    with on.disabled():
        sx, sw = grads()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_err(gx, sx) < tol and rel_err(gw, sw) < tol


def test_rms_norm_module(on):
    m = torch.nn.RMSNorm(512, device=DEV, dtype=torch.bfloat16)  # eps=None: the default epsilon
    x = torch.randn(4, 10, 512, device=DEV, dtype=torch.bfloat16)
    y = m(x)
    with on.disabled():
        ref = m(x)
    assert rel_err(y, ref) < 1e-2
    assert on.dispatch_counts()["rms_norm"][0] == 1


# ---- TopK --------------------------------------------------------------------------------------
def check_topk(x, k, largest, v, i):
    ref = torch.sort(x.double(), dim=-1, descending=largest).values[..., :k]
    assert torch.equal(v.double(), ref)
    assert i.dtype == torch.int64
    assert torch.equal(torch.gather(x, -1, i), v)


@pytest.mark.parametrize("shape,k", [((64, 4096), 8), ((4096, 128), 2), ((3, 5, 1000), 17), ((1000,), 100),
                                     ((16, 32000), 1024), ((2, 70000), 3000)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_sort_and_stock(on, shape, k, largest):
    x = torch.randn(shape, device=DEV)
    v, i = torch.topk(x, k, largest=largest)
    check_topk(x, k, largest, v, i)
    with on.disabled():
        sv, si = torch.topk(x, k, largest=largest)
    assert torch.equal(v, sv) and v.shape == sv.shape
    assert on.dispatch_counts()["topk"] == (1, 0)


def test_topk_out_variant(on):
    x = torch.randn(128, 5000, device=DEV)
    v = torch.empty(0, device=DEV)
    i = torch.empty(0, device=DEV, dtype=torch.int64)
    rv, ri = torch.topk(x, 40, out=(v, i))
    assert rv.data_ptr() == v.data_ptr() and v.shape == (128, 40)
    check_topk(x, 40, True, v, i)
    v2 = torch.full((128, 40), float("nan"), device=DEV)
    i2 = torch.full((128, 40), -1, device=DEV, dtype=torch.int64)
    torch.topk(x, 40, out=(v2, i2))
    check_topk(x, 40, True, v2, i2)
    assert on.dispatch_counts()["topk.values"] == (2, 0)
    bad = torch.empty(128, 40, device=DEV, dtype=torch.float64)  # stock raises its own error
    with pytest.raises(RuntimeError):
        torch.topk(x, 40, out=(bad, i2))
    assert on.dispatch_counts()["topk.values"][1] == 1


def test_topk_row_strided_and_nan(on):
    x = torch.randn(64, 2048, device=DEV)[:, :1000]
    x[3, 7] = float("nan")
    v, i = torch.topk(x, 10)
    with on.disabled():
        sv, si = torch.topk(x, 10)
    assert torch.equal(v.isnan(), sv.isnan()) and torch.equal(v.nan_to_num(), sv.nan_to_num())
    assert i[3, 0].item() == 7
    assert on.dispatch_counts()["topk"] == (1, 0)


def test_topk_deterministic_mode(on):
    x = torch.randint(0, 8, (256, 4096), device=DEV).float()  # many ties
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        v1, i1 = torch.topk(x, 64)
        v2, i2 = torch.topk(x, 64)
    finally:
        torch.use_deterministic_algorithms(prev)
    assert torch.equal(i1, i2) and torch.equal(v1, v2)
    check_topk(x, 64, True, v1, i1)
    # ties resolved lowest index first: within equal values, indices ascend
    same = v1[:, 1:] == v1[:, :-1]
    assert bool((i1[:, 1:] > i1[:, :-1])[same].all())
    assert on.dispatch_counts()["topk"][0] == 2


@pytest.mark.parametrize("case", ["fp16", "fp64", "dim0", "k0", "cpu", "noncontig3d"])
def test_topk_ineligible_reaches_stock(on, case):
    x = torch.randn(32, 300, device=DEV)
    k, dim = 5, -1
    if case == "fp16":
        x = x.half()
    elif case == "fp64":
        x = x.double()
    elif case == "dim0":
        dim = 0
    elif case == "k0":
        k = 0
    elif case == "cpu":
        x = x.cpu()
    elif case == "noncontig3d":
        x = torch.randn(2, 32, 600, device=DEV)[..., :300]
    v, i = torch.topk(x, k, dim=dim)
    with on.disabled():
        sv, si = torch.topk(x, k, dim=dim)
    assert torch.equal(v, sv)
    assert on.dispatch_counts()["topk"] == (0, 0 if case == "cpu" else 1)


def test_topk_bad_k_raises_torchs_error(on):
    x = torch.randn(4, 10, device=DEV)
    with pytest.raises(RuntimeError) as ours:
        torch.topk(x, 11)
    with on.disabled():
        with pytest.raises(RuntimeError) as stock:
            torch.topk(x, 11)
    assert str(ours.value) == str(stock.value)


def test_fallback_log_once_per_reason():
    code = textwrap.dedent("""
        import torch, flykernels
        x = torch.randn(8, 100, device="cuda", dtype=torch.half)
        for _ in range(3): torch.topk(x, 4)
        torch.topk(x.double(), 4)
        print("COUNTS", flykernels.torch.dispatch_counts()["topk"])
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, FLYKERNELS_LOG="info"), cwd="/")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("flykernels: topk")]
    assert len(lines) == 1 and "dtype not covered" in lines[0], r.stderr
    assert "COUNTS (0, 4)" in r.stdout


# ---- PyTorch's own OpInfo samples ----------------------------------------------------------------
def opinfo(name):
    # torch.testing's internals import expecttest, which a torch install need not have.
    pytest.importorskip("expecttest", reason="PyTorch's OpInfo database needs the expecttest package")
    from torch.testing._internal.common_methods_invocations import op_db
    return next(op for op in op_db if op.name == name)


def _tree_cmp(a, b, rtol, atol):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_opinfo_rms_norm(on, dtype):
    op = opinfo("nn.functional.rms_norm")
    n = 0
    for s in op.sample_inputs(DEV, dtype):
        out = op(s.input, *s.args, **s.kwargs)
        with on.disabled():
            ref = op(s.input, *s.args, **s.kwargs)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        _tree_cmp(out, ref, tol, tol)
        n += 1
    assert n > 0
    assert on.dispatch_counts()["rms_norm"][0] > 0


def test_opinfo_topk(on):
    op = opinfo("topk")
    n = 0
    for s in op.sample_inputs(DEV, torch.float32):
        v, i = op(s.input, *s.args, **s.kwargs)
        with on.disabled():
            sv, si = op(s.input, *s.args, **s.kwargs)
        sorted_ = s.kwargs.get("sorted", s.args[3] if len(s.args) > 3 else True)
        if not sorted_:  # order unspecified: compare as sets of values
            v, sv = v.sort(-1).values if v.dim() else v, sv.sort(-1).values if sv.dim() else sv
        torch.testing.assert_close(v, sv, equal_nan=True)
        dim = s.kwargs.get("dim", s.args[1] if len(s.args) > 1 else -1)
        if s.input.dim() > 0:
            got = torch.gather(s.input, dim, i)
            with on.disabled():
                exp = torch.gather(s.input, dim, si)
            torch.testing.assert_close(got.sort(dim).values, exp.sort(dim).values, equal_nan=True)
        n += 1
    assert n > 0
    assert on.dispatch_counts()["topk"][0] > 0


# ---- torch.compile: Inductor GEMM candidates -------------------------------------------------------
def _compile_code(fn, *args, **cfg):
    import torch._inductor.config as ic
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    with ic.patch(force_disable_caches=True, **cfg):
        out, codes = run_and_get_code(torch.compile(fn, mode="max-autotune"), *args)
    return out, "\n".join(codes)


@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
def test_compiled_mm_calls_ours_when_it_is_the_winner(on, layout):
    if on.why_not("gemm"):
        pytest.skip(on.why_not("gemm"))
    M, N, K = 256, 512, 1024
    a = torch.randn(M, K, device=DEV, dtype=torch.bfloat16) if layout[0] == "N" else \
        torch.randn(K, M, device=DEV, dtype=torch.bfloat16).t()
    b = torch.randn(K, N, device=DEV, dtype=torch.bfloat16) if layout[1] == "N" else \
        torch.randn(N, K, device=DEV, dtype=torch.bfloat16).t()
    # Only our candidate in the list (no ATen, no Triton): it must win and be what the code calls.
    out, code = _compile_code(lambda x, y: x @ y, a, b, max_autotune_gemm_backends="")
    assert "flykernels_mm" in code, code[-3000:]
    assert rel_err(out, a.double() @ b.double()) < 1e-2
    assert on.dispatch_counts()["mm"][0] > 0


def test_compiled_addmm_bias(on):
    if on.why_not("gemm"):
        pytest.skip(on.why_not("gemm"))
    x = torch.randn(128, 768, device=DEV, dtype=torch.float16)
    w = torch.randn(1024, 768, device=DEV, dtype=torch.float16)
    bias = torch.randn(1024, device=DEV, dtype=torch.float16)
    # addmm's candidate reads alpha/beta from ATen's own addmm choice, so ATen stays in the list.
    out, code = _compile_code(lambda x, w, b: F.linear(x, w, b), x, w, bias, max_autotune_gemm_backends="ATEN")
    counts = on.dispatch_counts()
    assert counts["addmm"][0] + counts["mm"][0] > 0, counts  # our candidate was benchmarked
    assert rel_err(out, x.double() @ w.double().t() + bias.double()) < 2e-3
    print("addmm winner is ours:", "flykernels_addmm" in code)


def test_compiled_mm_autotunes_beside_aten_and_is_right(on):
    if on.why_not("gemm"):
        pytest.skip(on.why_not("gemm"))
    a = torch.randn(512, 2048, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(2048, 1024, device=DEV, dtype=torch.bfloat16)
    out, code = _compile_code(lambda x, y: x @ y, a, b, max_autotune_gemm_backends="ATEN")
    assert on.dispatch_counts()["mm"][0] > 0  # our candidate was benchmarked
    assert rel_err(out, a.double() @ b.double()) < 1e-2
    with on.disabled():
        _, stock_code = _compile_code(lambda x, y: x @ y, a, b, max_autotune_gemm_backends="ATEN")
    assert "flykernels" not in stock_code


# ---- SDPA forward ------------------------------------------------------------------------------
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def attn_ref(q, k, v, causal, scale=None):
    """float64 attention with grouped-query heads expanded, top-left causal mask."""
    g = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = qd @ kd.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ vd


def attn_ref_grads(q, k, v, dout, causal):
    """dq, dk, dv of attn_ref in float64 (autograd through the upcast math)."""
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(attn_ref(qd, kd, vd, causal), (qd, kd, vd), dout.double())


def qkv(B, Hq, Hkv, Sq, Sk, D, dtype=torch.bfloat16, bshd=False, grad=False):
    def t(H, S):
        x = torch.randn(B, S, H, D, device=DEV, dtype=dtype).transpose(1, 2) if bshd else \
            torch.randn(B, H, S, D, device=DEV, dtype=dtype)
        return x.requires_grad_(grad)
    return t(Hq, Sq), t(Hkv, Sk), t(Hkv, Sk)


def test_plain_sdpa_reaches_ours_for_inference(on):
    q, k, v = qkv(2, 8, 8, 1000, 1000, 128)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # SDPA's own pick (cuDNN on H200)
    ours = sum(on.dispatch_counts()[n][0] for n in ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn"))
    assert ours == 1, on.dispatch_counts()
    assert rel_err(out, attn_ref(q, k, v, True)) < 1e-2


@pytest.mark.parametrize("backend,op", [(SDPBackend.FLASH_ATTENTION, "sdpa_flash"),
                                        (SDPBackend.EFFICIENT_ATTENTION, "sdpa_efficient")])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_training_step_matches_stock(on, backend, op, causal):
    """The default set (our forward and backward): output and gradients as stock's."""
    # Sq != Sk without causal (SDPA's flash rejects causal with Sq != Sk before any kernel)
    q, k, v = qkv(2, 4, 4, 300, 300 if causal else 417, 64, grad=True)
    dout = torch.randn(2, 4, 300, 64, device=DEV, dtype=torch.bfloat16)
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        assert on.dispatch_counts()[op][0] == 1, on.dispatch_counts()
        grads = torch.autograd.grad(out, (q, k, v), dout)
        with on.disabled():
            sout = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            sgrads = torch.autograd.grad(sout, (q, k, v), dout)
    assert out.shape == sout.shape and out.dtype == sout.dtype
    assert rel_err(out, attn_ref(q, k, v, causal)) < 1e-2
    for g, sg in zip(grads, sgrads):
        assert rel_err(g, sg) < 2e-2


def test_sdpa_training_loop_loss_curve_matches_stock(on):
    """A few Adam steps of a small causal self-attention model (bf16) under SDPA's flash backend,
    once through our forward and backward, once stock (FA2) from the same initial weights: the two
    loss curves agree within tolerance, and the loss goes down. (With gradients SDPA's default pick
    on the H200 is cuDNN, which keeps the call: see flykernels/_ops/attention.py.)"""
    def run():
        torch.manual_seed(1234)
        E, H, S, B = 256, 4, 128, 4
        embed = torch.nn.Embedding(512, E).to(DEV, torch.bfloat16)
        qkv_proj = torch.nn.Linear(E, 3 * E).to(DEV, torch.bfloat16)
        out_proj = torch.nn.Linear(E, 512).to(DEV, torch.bfloat16)
        params = [*embed.parameters(), *qkv_proj.parameters(), *out_proj.parameters()]
        opt = torch.optim.Adam(params, lr=5e-3)
        tokens = torch.randint(0, 512, (B, S + 1), device=DEV)
        losses = []
        for _ in range(8):
            x = embed(tokens[:, :-1])
            q, k, v = (t.view(B, S, H, E // H).transpose(1, 2) for t in qkv_proj(x).chunk(3, dim=-1))
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            a = a.transpose(1, 2).reshape(B, S, E)
            loss = F.cross_entropy(out_proj(a).float().view(-1, 512), tokens[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ours = run()
    counts = on.dispatch_counts()
    assert counts["sdpa_flash"][0] == 8 and counts["sdpa_flash_bwd"][0] == 8, counts
    with on.disabled():
        stock = run()
    assert ours[-1] < ours[0] - 0.3, ours  # it learns (memorizes the batch)
    for a, b in zip(ours, stock):
        assert abs(a - b) <= 2e-2 * abs(b) + 2e-2, (ours, stock)


@pytest.mark.parametrize("D", [32, 40, 64, 72, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sdpa_flash_head_dims_gqa_bshd(on, D, dtype):
    q, k, v = qkv(1, 8, 2, 77, 130, D, dtype=dtype, bshd=True)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=True, scale=0.3)
    assert on.dispatch_counts()["sdpa_flash"][0] == 1, on.dispatch_counts()
    assert rel_err(out, attn_ref(q, k, v, False, 0.3)) < 1e-2


def test_sdpa_decode_shape(on):
    q, k, v = qkv(2, 8, 8, 1, 8192, 128)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = F.scaled_dot_product_attention(q, k, v)
    assert on.dispatch_counts()["sdpa_flash"][0] == 1
    assert rel_err(out, attn_ref(q, k, v, False)) < 1e-2


@pytest.mark.parametrize("D,causal", [(512, False), (512, True), (320, True)])
def test_sdpa_wide_head_dims_reach_ours(on, D, causal):
    """D 257..512: SDPA's memory-efficient op (its only backend there) runs our wide-head forward;
    the stock backward on our output and log-sum-exp gives stock's gradients. (D a multiple of 8:
    SDPA itself sends D = 300 with gradients to its math backend, which no op of ours sees.)"""
    q, k, v = qkv(1, 4, 4, 200, 200, D, grad=True)
    dout = torch.randn(1, 4, 200, D, device=DEV, dtype=torch.bfloat16)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert on.dispatch_counts()["sdpa_efficient"][0] == 1, on.dispatch_counts()
    assert rel_err(out, attn_ref(q, k, v, causal)) < 1e-2
    grads = torch.autograd.grad(out, (q, k, v), dout)
    with on.disabled():
        sout = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        sgrads = torch.autograd.grad(sout, (q, k, v), dout)
    for g, sg in zip(grads, sgrads):
        assert rel_err(g, sg) < 2e-2


@pytest.mark.parametrize("case", ["dropout", "mask", "fp32", "d1024"])
def test_sdpa_ineligible_reaches_stock(on, case):
    D = 1024 if case == "d1024" else 64
    q, k, v = qkv(1, 2, 2, 64, 64, D, dtype=torch.float32 if case == "fp32" else torch.bfloat16)
    kw = {}
    if case == "dropout":
        kw["dropout_p"] = 0.5
    if case == "mask":
        kw["attn_mask"] = torch.randn(64, 64, device=DEV, dtype=torch.bfloat16)
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    counts = on.dispatch_counts()
    assert sum(counts[n][0] for n in ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")) == 0, counts
    assert out.shape == q.shape and torch.isfinite(out).all()
    if case in ("mask", "d1024"):
        mask = kw["attn_mask"].double() if case == "mask" else None
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
        assert rel_err(out, ref) < 2e-2


# ---- SDPA backward, F.grouped_mm --------------------------------------------------------------
@pytest.mark.parametrize("backend,op", [(SDPBackend.FLASH_ATTENTION, "sdpa_flash_bwd"),
                                        (SDPBackend.EFFICIENT_ATTENTION, "sdpa_efficient_bwd")])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128, 72])
def test_sdpa_backward_ours_matches_reference(fly, backend, op, causal, D):
    fly.enable()
    fly.enable(["sdpa_bwd"])
    fly.reset_counts()
    Hkv = 2 if backend == SDPBackend.FLASH_ATTENTION else 4  # memory-efficient takes no GQA
    q, k, v = qkv(2, 4, Hkv, 200, 200 if causal else 333, D, grad=True)
    dout = torch.randn(2, 4, 200, D, device=DEV, dtype=torch.bfloat16)
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hkv != 4)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    assert fly.dispatch_counts()[op][0] == 1, fly.dispatch_counts()
    rgrads = attn_ref_grads(q, k, v, dout, causal)
    for g, rg in zip(grads, rgrads):
        assert g.shape == rg.shape and rel_err(g, rg) < 2e-2


@pytest.mark.parametrize("D,causal", [(512, False), (512, True), (320, True)])
def test_sdpa_wide_head_backward_is_ours(fly, D, causal):
    """D 257..512 backward: SDPA's memory-efficient backward op runs our wide-head (hd 512) kernels,
    whose gradients match the FP64 reference."""
    fly.enable(["sdpa", "sdpa_bwd"])
    fly.reset_counts()
    q, k, v = qkv(1, 4, 4, 200, 150 if causal else 233, D, grad=True)
    dout = torch.randn(1, 4, 200, D, device=DEV, dtype=torch.bfloat16)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert fly.dispatch_counts()["sdpa_efficient_bwd"][0] == 1, fly.dispatch_counts()
    rgrads = attn_ref_grads(q, k, v, dout, causal)
    for g, rg in zip(grads, rgrads):
        assert g.shape == rg.shape and rel_err(g, rg) < 2e-2


def test_sdpa_backward_is_deterministic(fly):
    fly.enable(["sdpa", "sdpa_bwd"])
    q, k, v = qkv(1, 8, 2, 500, 500, 128, grad=True)
    dout = torch.randn_like(q)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        runs = [torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                                    (q, k, v), dout) for _ in range(3)]
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], r))


@pytest.mark.parametrize("sizes", [[64, 64, 64, 64], [0, 300, 1, 7], [0, 0, 0, 0], [513, 0, 0, 0]])
@pytest.mark.parametrize("k_contig", [False, True])
def test_grouped_mm_ours_matches_reference(fly, sizes, k_contig):
    fly.enable(["grouped_mm"])
    fly.reset_counts()
    G, K, N = len(sizes), 256, 384
    T = sum(sizes)
    a = torch.randn(T, K, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(G, N, K, device=DEV, dtype=torch.bfloat16).transpose(-2, -1) if k_contig else \
        torch.randn(G, K, N, device=DEV, dtype=torch.bfloat16)
    offs = torch.tensor(sizes, device=DEV, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    out = F.grouped_mm(a, w, offs=offs)
    assert fly.dispatch_counts()["grouped_mm"][0] == 1, fly.dispatch_counts()
    with fly.disabled():
        stock = F.grouped_mm(a, w, offs=offs)
    assert out.shape == stock.shape and out.stride() == stock.stride()
    ends = offs.tolist()
    for g in range(G):
        r0 = ends[g - 1] if g else 0
        if ends[g] > r0:
            ref = a[r0:ends[g]].double() @ w[g].double()
            assert rel_err(out[r0:ends[g]], ref) < 1e-2


@pytest.mark.parametrize("sizes", [[64, 64, 64, 64], [0, 300, 1, 7], [0, 0, 0, 0], [513, 0, 0, 0], [37, 5, 70, 129]])
@pytest.mark.parametrize("order", ["x.t,dc", "dc.t,x"])
def test_grouped_mm_ragged_k_ours_matches_reference(fly, sizes, order):
    """The 2-D x 2-D form (offsets along K): out[g] = a[:, k of g] @ b[k of g, :], zeros when empty."""
    fly.enable(["grouped_mm"])
    fly.reset_counts()
    G, K, N = len(sizes), 256, 384
    T = sum(sizes)
    x = torch.randn(T, K, device=DEV, dtype=torch.bfloat16)
    dc = torch.randn(T, N, device=DEV, dtype=torch.bfloat16)
    a, b = {"x.t,dc": (x.t(), dc), "dc.t,x": (dc.t(), x)}[order]  # the two dB calls autograd makes
    offs = torch.tensor(sizes, device=DEV, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    out = torch._grouped_mm(a, b, offs)
    assert fly.dispatch_counts()["grouped_mm"][0] == 1, fly.dispatch_counts()
    assert out.shape == (G, a.shape[0], b.shape[1]) and out.is_contiguous()  # as the stock op's (N % 8 == 0)
    ends = offs.tolist()
    for g in range(G):
        k0 = ends[g - 1] if g else 0
        if ends[g] > k0:
            assert rel_err(out[g], a[:, k0:ends[g]].double() @ b[k0:ends[g]].double()) < 1e-2
        else:
            assert bool((out[g] == 0).all())


@pytest.mark.parametrize("k_contig", [False, True])
def test_grouped_mm_autograd_runs_ours_in_both_passes(fly, k_contig):
    """Forward, dA (2-D x 3-D) and dB (2-D x 2-D ragged K) all from ours, matching stock."""
    fly.enable(["grouped_mm"])
    fly.reset_counts()
    a = torch.randn(300, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    w0 = torch.randn(3, 256, 128, device=DEV, dtype=torch.bfloat16) if k_contig else \
        torch.randn(3, 128, 256, device=DEV, dtype=torch.bfloat16)
    w = (w0.transpose(-2, -1) if k_contig else w0).detach().requires_grad_(True)
    offs = torch.tensor([100, 100, 300], device=DEV, dtype=torch.int32)  # group 1 empty: its dB is zeros
    dout = torch.randn(300, 256, device=DEV, dtype=torch.bfloat16)
    grads = torch.autograd.grad(F.grouped_mm(a, w, offs=offs), (a, w), dout)
    assert fly.dispatch_counts()["grouped_mm"] == (3, 0), fly.dispatch_counts()
    with fly.disabled():
        sgrads = torch.autograd.grad(F.grouped_mm(a, w, offs=offs), (a, w), dout)
    for g, sg in zip(grads, sgrads):
        assert g.shape == sg.shape and rel_err(g, sg) < 1e-2
    assert bool((grads[1][1] == 0).all())


def test_grouped_mm_autograd_runs_ours_forward_and_matches_stock(fly):
    fly.enable(["grouped_mm"])
    a = torch.randn(300, 128, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(3, 128, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    offs = torch.tensor([100, 100, 300], device=DEV, dtype=torch.int32)
    dout = torch.randn(300, 256, device=DEV, dtype=torch.bfloat16)
    grads = torch.autograd.grad(F.grouped_mm(a, w, offs=offs), (a, w), dout)
    assert fly.dispatch_counts()["grouped_mm"][0] >= 1
    with fly.disabled():
        sgrads = torch.autograd.grad(F.grouped_mm(a, w, offs=offs), (a, w), dout)
    for g, sg in zip(grads, sgrads):
        assert rel_err(g, sg) < 1e-2


# ---- MX F.scaled_mm (family scaled_mm, off until named) ---------------------------------------
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mx_dequant(q, scales):
    """The exact values of an MX operand: [rows, K] float64 from q and its [rows, K/32] E8M0 scales."""
    if q.dtype == torch.float4_e2m1fn_x2:
        b = q.view(torch.uint8).long()
        table = torch.tensor(E2M1_VALUES, device=q.device, dtype=torch.float64)
        vals = torch.stack([table[b & 0xF], table[b >> 4]], dim=-1).reshape(q.shape[0], -1)  # low nibble first
    else:
        vals = q.double()
    exp = scales.view(torch.uint8).double() - 127.0
    return vals * torch.pow(2.0, exp).repeat_interleave(32, dim=1)


def to_blocked(scales):
    """cuBLAS's SWIZZLE_32_4_4 layout of [rows, K/32] scales (padded to 128 x 4 tiles)."""
    rows, kb = scales.shape
    R, C = (rows + 127) // 128 * 128, (kb + 3) // 4 * 4
    padded = torch.zeros(R, C, dtype=torch.uint8, device=scales.device)
    padded[:rows, :kb] = scales.view(torch.uint8)
    blocked = padded.view(R // 128, 4, 32, C // 4, 4).permute(0, 3, 2, 1, 4).contiguous()
    return blocked.flatten().view(torch.float8_e8m0fnu)


def mx_case(M, N, K, fmt, spread=4.0):
    x = torch.randn(M, K, device=DEV) * torch.exp2(torch.randint(-int(spread), int(spread) + 1, (M, 1), device=DEV).float())
    w = torch.randn(N, K, device=DEV) * torch.exp2(torch.randint(-int(spread), int(spread) + 1, (1, K), device=DEV).float())
    qa, sa = flykernels.torch.mx_quantize(x.bfloat16(), fmt)
    qw, sw = flykernels.torch.mx_quantize(w.bfloat16(), fmt)
    return qa, sa, qw, sw


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("M,N,K", [(1, 512, 1024), (100, 200, 320), (256, 1024, 2048)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_scaled_mm_mx_matches_dequantized_reference(fly, fmt, M, N, K, out_dtype, bias):
    """The seed's call: F.scaled_mm(a, w.t(), sa, BlockWise1x32, sw, BlockWise1x32, NO_SWIZZLE, ...)."""
    from torch.nn.functional import ScalingType, SwizzleType
    fly.enable(["scaled_mm"])
    fly.reset_counts()
    qa, sa, qw, sw = mx_case(M, N, K, fmt)
    b = torch.randn(N, device=DEV, dtype=out_dtype) if bias else None
    out = F.scaled_mm(qa, qw.t(), sa, ScalingType.BlockWise1x32, sw, ScalingType.BlockWise1x32,
                      swizzle_a=SwizzleType.NO_SWIZZLE, swizzle_b=SwizzleType.NO_SWIZZLE, bias=b, output_dtype=out_dtype)
    assert fly.dispatch_counts()["scaled_mm"][0] == 1, fly.dispatch_counts()
    ref = mx_dequant(qa, sa) @ mx_dequant(qw, sw).t()
    if bias:
        ref = ref + b.double()
    assert out.shape == (M, N) and out.dtype == out_dtype
    assert rel_err(out, ref) < 5e-3


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_scaled_mm_swizzled_scales_and_v1_give_the_same(fly, fmt):
    from torch.nn.functional import ScalingType, SwizzleType
    fly.enable(["scaled_mm"])
    fly.reset_counts()
    qa, sa, qw, sw = mx_case(200, 384, 640, fmt)
    plain = F.scaled_mm(qa, qw.t(), sa, ScalingType.BlockWise1x32, sw, ScalingType.BlockWise1x32,
                        swizzle_a=SwizzleType.NO_SWIZZLE, swizzle_b=SwizzleType.NO_SWIZZLE, output_dtype=torch.bfloat16)
    swz = F.scaled_mm(qa, qw.t(), to_blocked(sa), ScalingType.BlockWise1x32, to_blocked(sw), ScalingType.BlockWise1x32,
                      swizzle_a=SwizzleType.SWIZZLE_32_4_4, swizzle_b=SwizzleType.SWIZZLE_32_4_4,
                      output_dtype=torch.bfloat16)
    assert torch.equal(plain, swz)
    assert fly.dispatch_counts()["scaled_mm"][0] == 2
    if fmt == "e4m3":  # torchao's MXFP8 path: v1 with blocked E8M0 scales
        v1 = torch._scaled_mm(qa, qw.t(), to_blocked(sa), to_blocked(sw), out_dtype=torch.bfloat16)
        assert torch.equal(plain, v1)
        assert fly.dispatch_counts()["scaled_mm_v1"][0] == 1


def test_scaled_mm_captured_in_a_cuda_graph(fly):
    """The extension's per-call workspace (split-K variants' partials, when bundled; csrc
    scaled_mm_run) is taken from the caching allocator during capture and freed inside it: the
    captured call replays to the eager result, bit for bit (the reduction's order is fixed)."""
    from torch.nn.functional import ScalingType, SwizzleType
    fly.enable(["scaled_mm"])
    qa, sa, qw, sw = mx_case(32, 1024, 2048, "e4m3")

    def f():
        return F.scaled_mm(qa, qw.t(), sa, ScalingType.BlockWise1x32, sw, ScalingType.BlockWise1x32,
                           swizzle_a=SwizzleType.NO_SWIZZLE, swizzle_b=SwizzleType.NO_SWIZZLE,
                           output_dtype=torch.bfloat16)

    eager = f()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        f()  # warm-up off the default stream, as torch.cuda.graph expects
    torch.cuda.current_stream().wait_stream(side)
    fly.reset_counts()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = f()
    assert fly.dispatch_counts()["scaled_mm"][0] == 1, fly.dispatch_counts()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_scaled_mm_under_torch_compile(fly):
    from torch.nn.functional import ScalingType, SwizzleType
    fly.enable(["scaled_mm"])
    qa, sa, qw, sw = mx_case(128, 256, 512, "e4m3")

    def f(a, w, s1, s2):
        return F.scaled_mm(a, w.t(), s1, ScalingType.BlockWise1x32, s2, ScalingType.BlockWise1x32,
                           swizzle_a=SwizzleType.NO_SWIZZLE, swizzle_b=SwizzleType.NO_SWIZZLE,
                           output_dtype=torch.bfloat16) * 2

    torch._dynamo.reset()
    fly.reset_counts()
    out = torch.compile(f)(qa, qw, sa, sw)
    assert fly.dispatch_counts()["scaled_mm"][0] >= 1
    assert rel_err(out, 2 * (mx_dequant(qa, sa) @ mx_dequant(qw, sw).t())) < 5e-3


def test_scaled_mm_other_recipes_reach_stock(fly):
    """FP8 tensorwise (cuBLAS runs it on sm_90) is not ours: the stock kernel, its result."""
    fly.enable(["scaled_mm"])
    fly.reset_counts()
    a = torch.randn(64, 128, device=DEV).to(torch.float8_e4m3fn)
    b = torch.randn(256, 128, device=DEV).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0, device=DEV)
    out = torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    assert fly.dispatch_counts()["scaled_mm_v1"] == (0, 1)
    assert rel_err(out, a.double() @ b.double()) < 1e-2


def test_mx_quantize_round_trip(fly):
    x = torch.randn(64, 256, device=DEV, dtype=torch.bfloat16)
    for fmt, tol in (("e4m3", 0.08), ("e2m1", 0.3)):
        q, s = flykernels.torch.mx_quantize(x, fmt)
        assert q.shape == ((64, 256) if fmt == "e4m3" else (64, 128)) and s.shape == (64, 8)
        assert s.dtype == torch.float8_e8m0fnu
        assert rel_err(mx_dequant(q, s), x) < tol


def test_compiled_grouped_mm_offers_ours_and_is_right(fly):
    """max-autotune benchmarks our grouped candidate beside ATen and Triton; whichever wins, the
    result is right, and when ours wins the generated code calls it."""
    from torch._inductor.utils import run_and_get_code
    fly.enable(["grouped_mm_compile"])
    a = torch.randn(512, 256, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(4, 256, 512, device=DEV, dtype=torch.bfloat16)
    offs = torch.tensor([64, 200, 200, 512], device=DEV, dtype=torch.int32)
    torch._dynamo.reset()
    f = torch.compile(lambda x, y, o: F.grouped_mm(x, y, offs=o), mode="max-autotune-no-cudagraphs")
    out, code = run_and_get_code(f, a, w, offs)
    ends = offs.tolist()
    for g in range(4):
        r0 = ends[g - 1] if g else 0
        if ends[g] > r0:
            assert rel_err(out[r0:ends[g]], a[r0:ends[g]].double() @ w[g].double()) < 1e-2
    if "flykernels_grouped_mm" in "\n".join(code):
        assert fly.dispatch_counts()["grouped_mm"][0] >= 1
    fly.disable(["grouped_mm_compile"])
