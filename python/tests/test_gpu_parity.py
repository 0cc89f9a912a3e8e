# SPDX-License-Identifier: Apache-2.0
"""GPU parity tests (issue 46; skipped without a GPU on which FlyKernels can run): where the stock
op rejects an input, the call with FlyKernels on raises the same exception type and message as
stock, and MX F.scaled_mm raises ValueError where upstream's contract does (stock PyTorch cannot
run MX on sm_90 and crashes on some of these). Eligible calls run ours here (conftest forces it)."""
import re

import pytest
import torch
import torch.nn.functional as F

from conftest import needs_gpu

pytestmark = needs_gpu
DEV = "cuda"
aten = torch.ops.aten


@pytest.fixture
def on(fly):
    fly.enable()
    fly.reset_counts()
    return fly


def outcome(fn):
    """('ok', result) or (exception type, message) of fn()."""
    try:
        r = fn()
        torch.cuda.synchronize()
        return "ok", r
    except Exception as e:  # noqa: BLE001 - the point is to compare whatever is raised
        return type(e), str(e)


def assert_stock_error(on, fn, exc=RuntimeError):
    """fn raises stock (an exc), and with FlyKernels on exactly the same (type and message)."""
    ours = outcome(fn)
    with on.disabled():
        stock = outcome(fn)
    assert stock[0] != "ok", f"stock did not raise: {stock}"
    assert issubclass(stock[0], exc), stock
    assert ours == stock


def assert_same_outcome(on, fn):
    """Whatever stock does with fn (raise, or return), FlyKernels on does the same: the same
    exception type and message, or a result where stock returns one."""
    ours = outcome(fn)
    with on.disabled():
        stock = outcome(fn)
    assert ours[0] == stock[0], (ours, stock)
    if stock[0] != "ok":
        assert ours[1] == stock[1]


# ---- SDPA -----------------------------------------------------------------------------------------
def qkv(B, Hq, Hkv, Sq, Sk, D, dtype=torch.bfloat16):
    return (torch.randn(B, Hq, Sq, D, device=DEV, dtype=dtype), torch.randn(B, Hkv, Sk, D, device=DEV, dtype=dtype),
            torch.randn(B, Hkv, Sk, D, device=DEV, dtype=dtype))


def test_efficient_backward_bias_grad_without_bias_raises_as_stock(on):
    """upstream test_mem_eff_attention_backward_requires_bias_when_bias_grad."""
    q, k, v = qkv(1, 4, 4, 64, 64, 64)
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, False)
    dout = torch.randn_like(q)
    msg = "bias_requires_grad is true but no bias was provided"

    def call():
        return aten._scaled_dot_product_efficient_attention_backward(dout, q, k, v, None, out, lse, seed, offset, 0.0,
                                                                     [True, True, True, True], False)

    with pytest.raises(RuntimeError, match=re.escape(msg)) as ours:
        call()
    assert type(ours.value) is RuntimeError
    assert on.dispatch_counts()["sdpa_efficient_bwd"][0] == 0
    assert_stock_error(on, call)
    # without the bias gradient: ours, as before
    on.reset_counts()
    aten._scaled_dot_product_efficient_attention_backward(dout, q, k, v, None, out, lse, seed, offset, 0.0,
                                                          [True, True, True, False], False)
    assert on.dispatch_counts()["sdpa_efficient_bwd"][0] == 1, on.dispatch_counts()


@pytest.mark.parametrize("D", [36, 320])
def test_flash_ops_head_dims_the_stock_op_rejects(on, D):
    """The flash op takes head dims that are multiples of 8 up to 256 (SDPA pads before calling it):
    a direct call outside that raises stock's error, forward and backward."""
    q, k, v = qkv(1, 2, 2, 64, 64, D)
    assert_stock_error(on, lambda: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False))
    assert on.dispatch_counts()["sdpa_flash"][0] == 0


def test_cudnn_op_head_dim_above_256(on):
    q, k, v = qkv(1, 2, 2, 64, 64, 320)
    assert_same_outcome(on, lambda: aten._scaled_dot_product_cudnn_attention(q, k, v, None, False, 0.0, False, False))
    assert on.dispatch_counts()["sdpa_cudnn"][0] == 0  # whatever cuDNN does with it is stock's


def test_efficient_op_grouped_query_heads(on):
    """The memory-efficient op has no grouped-query heads (SDPA never sends them to it)."""
    q, k, v = qkv(1, 8, 2, 64, 64, 64)
    assert_same_outcome(on, lambda: aten._scaled_dot_product_efficient_attention(q, k, v, None, False, 0.0, False))
    assert on.dispatch_counts()["sdpa_efficient"][0] == 0


def test_sdpa_empty_batch_is_stock(on):
    q, k, v = qkv(0, 2, 2, 64, 64, 64)
    assert_same_outcome(on, lambda: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False))
    assert on.dispatch_counts()["sdpa_flash"][0] == 0


# ---- TopK, RMSNorm, grouped GEMM -------------------------------------------------------------------
def test_topk_bad_arguments_raise_as_stock(on):
    x = torch.randn(8, 100, device=DEV)
    assert_stock_error(on, lambda: torch.topk(x, 101))
    assert_stock_error(on, lambda: torch.topk(x, -1))
    assert_stock_error(on, lambda: torch.topk(x, 3, dim=2), IndexError)
    v, i = torch.empty(0, device=DEV, dtype=torch.float64), torch.empty(0, device=DEV, dtype=torch.int64)
    assert_stock_error(on, lambda: torch.topk(x, 3, out=(v, i)))
    assert on.dispatch_counts()["topk"][0] == 0 and on.dispatch_counts()["topk.values"][0] == 0


def test_rms_norm_bad_arguments_raise_as_stock(on):
    x = torch.randn(8, 64, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(32, device=DEV, dtype=torch.bfloat16)
    assert_same_outcome(on, lambda: aten._fused_rms_norm(x, [64], w, 1e-5))
    assert_same_outcome(on, lambda: aten._fused_rms_norm(x, [32], None, 1e-5))
    assert_same_outcome(on, lambda: aten._fused_rms_norm(x, [], None, 1e-5))
    assert_stock_error(on, lambda: F.rms_norm(x, [32], None, 1e-5))
    assert on.dispatch_counts()["rms_norm"][0] == 0


def test_grouped_mm_bad_arguments_raise_as_stock(on):
    a = torch.randn(100, 64, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(4, 64, 128, device=DEV, dtype=torch.bfloat16)
    offs = torch.tensor([10, 10, 60, 100], device=DEV, dtype=torch.int32)
    assert_stock_error(on, lambda: F.grouped_mm(a[:, :32], w, offs=offs))
    assert_stock_error(on, lambda: F.grouped_mm(a, w, offs=offs.long()))
    assert_stock_error(on, lambda: F.grouped_mm(a, w, offs=offs[:3]))
    assert on.dispatch_counts()["grouped_mm"][0] == 0


# ---- MX F.scaled_mm ---------------------------------------------------------------------------------
def mx_operands(M, N, K, fmt="e4m3"):
    dt = torch.float8_e4m3fn if fmt == "e4m3" else torch.float4_e2m1fn_x2
    kb = K if fmt == "e4m3" else K // 2
    a = torch.randint(0, 255, (M, kb), device=DEV, dtype=torch.uint8).view(dt) if fmt == "e2m1" else \
        torch.randn(M, K, device=DEV).to(dt)
    b = (torch.randint(0, 255, (N, kb), device=DEV, dtype=torch.uint8).view(dt) if fmt == "e2m1" else
         torch.randn(N, K, device=DEV).to(dt)).t()
    return a, b


def scales(count):
    return torch.full((count,), 1.0, device=DEV, dtype=torch.float8_e8m0fnu)


def padded(rows, K):
    return (rows + 127) // 128 * 128 * ((K // 32 + 3) // 4 * 4)


def test_scaled_mm_passed_swizzle_arrays(on):
    """upstream test_passed_swizzle_arrays (MXFP8 part): missing swizzles are a ValueError."""
    from torch.nn.functional import ScalingType as S, SwizzleType as W
    M = N = K = 128
    x, w = mx_operands(M, N, K)
    xs = torch.full((M, K // 32), 1.0, dtype=torch.float8_e8m0fnu, device=DEV)
    ws = torch.full((N, K // 32), 1.0, dtype=torch.float8_e8m0fnu, device=DEV)
    with pytest.raises(ValueError, match="^swizzle_a must have 1 value, got 0$"):
        F.scaled_mm(x, w, xs, S.BlockWise1x32, ws, S.BlockWise1x32)
    with pytest.raises(ValueError, match="^swizzle_b must have 1 value, got 0$"):
        F.scaled_mm(x, w, xs, S.BlockWise1x32, ws, S.BlockWise1x32, swizzle_a=W.SWIZZLE_32_4_4)
    assert on.dispatch_counts()["scaled_mm"][0] == 0


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_scaled_mm_swizzle_claims_that_do_not_match_the_scales(on, fmt):
    from torch.nn.functional import ScalingType as S, SwizzleType as W
    M, N, K = 100, 256, 512
    a, b = mx_operands(M, N, K, fmt)

    def call(sa, sb, sw_a, sw_b):
        return F.scaled_mm(a, b, sa, S.BlockWise1x32, sb, S.BlockWise1x32, swizzle_a=sw_a, swizzle_b=sw_b,
                           output_dtype=torch.bfloat16)

    unpadded_a, unpadded_b = scales(M * K // 32), scales(N * K // 32)
    msg = f"For Blockwise scaling scale_a should have {padded(M, K)} elements, got: {M * K // 32}"
    with pytest.raises(ValueError, match="^" + re.escape(msg) + "$"):
        call(unpadded_a, unpadded_b, W.SWIZZLE_32_4_4, W.SWIZZLE_32_4_4)
    with pytest.raises(ValueError, match="^scale_a must be swizzled to SWIZZLE_32_4_4 format$"):
        call(scales(padded(M, K)), unpadded_b, W.NO_SWIZZLE, W.NO_SWIZZLE)
    assert on.dispatch_counts()["scaled_mm"] == (0, 0)
    out = call(unpadded_a, unpadded_b, W.NO_SWIZZLE, W.NO_SWIZZLE)  # the right claim: ours
    assert out.shape == (M, N) and on.dispatch_counts()["scaled_mm"][0] == 1


def test_scaled_mm_fp4_fast_accum_is_a_value_error(on):
    from torch.nn.functional import ScalingType as S, SwizzleType as W
    a, b = mx_operands(128, 128, 128, "e2m1")
    with pytest.raises(ValueError, match=re.escape("`use_fast_accum` is not supported when `mat_a` or `mat_b` "
                                                   "tensors have the `Float4_e2m1fn_x2` dtype.")):
        F.scaled_mm(a, b, scales(512), S.BlockWise1x32, scales(512), S.BlockWise1x32, swizzle_a=W.NO_SWIZZLE,
                    swizzle_b=W.NO_SWIZZLE, output_dtype=torch.bfloat16, use_fast_accum=True)
