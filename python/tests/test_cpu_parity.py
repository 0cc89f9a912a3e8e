# SPDX-License-Identifier: Apache-2.0
"""CPU-side parity tests (no GPU needed): where the stock op rejects an input, our overrides raise
the same error or leave the call to the stock op (issue 46). What runs here: the MX scaled_mm Meta
kernel under FakeTensor (the contract checks it shares with the CUDA kernel), the decision keys and
the op rules behind them on CPU tensors, and the override table."""
import re

import pytest
import torch
import torch.nn.functional as F

import flykernels

ext = flykernels._loader.ext
pytestmark = pytest.mark.skipif(ext is None, reason=f"the extension did not load: {flykernels._loader.load_error}")


def raises_exactly(exc, msg):
    """pytest.raises for exactly this exception type and message."""
    return pytest.raises(exc, match="^" + re.escape(msg) + "$")


# ---- MX F.scaled_mm: the swizzle contract (ValueError where upstream raises it) -----------------
def mx_call(M, N, K, fmt="e4m3", sa_count=None, sb_count=None, swizzle_a=None, swizzle_b=None,
            fast_accum=False, contiguous_scales=True):
    """F.scaled_mm(a [M, K], b [K, N], ...) with BlockWise1x32 E8M0 scales of the given element
    counts (default: the unswizzled M*K/32, N*K/32) on FakeTensor CUDA tensors."""
    from torch.nn.functional import ScalingType as S
    dt = torch.float8_e4m3fn if fmt == "e4m3" else torch.float4_e2m1fn_x2
    kb = K if fmt == "e4m3" else K // 2
    a = torch.empty(M, kb, dtype=dt, device="cuda")
    b = torch.empty(N, kb, dtype=dt, device="cuda").t()
    sa = torch.empty(sa_count or M * K // 32, dtype=torch.float8_e8m0fnu, device="cuda")
    sb = torch.empty(sb_count or N * K // 32, dtype=torch.float8_e8m0fnu, device="cuda")
    if not contiguous_scales:
        sa = torch.empty(2 * sa.numel(), dtype=torch.float8_e8m0fnu, device="cuda")[::2]
    kw = {}
    if swizzle_a is not None:
        kw["swizzle_a"] = swizzle_a
    if swizzle_b is not None:
        kw["swizzle_b"] = swizzle_b
    return F.scaled_mm(a, b, sa, S.BlockWise1x32, sb, S.BlockWise1x32, output_dtype=torch.bfloat16,
                       use_fast_accum=fast_accum, **kw)


def padded(rows, K):
    return (rows + 127) // 128 * 128 * ((K // 32 + 3) // 4 * 4)


@pytest.fixture
def mx(fly):
    fly.enable(["scaled_mm"])
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        yield


def test_scaled_mm_swizzle_lists_of_one(mx):
    """upstream test_passed_swizzle_arrays: no swizzle given is a ValueError, not NO_SWIZZLE."""
    from torch.nn.functional import SwizzleType as W
    with raises_exactly(ValueError, "swizzle_a must have 1 value, got 0"):
        mx_call(128, 128, 128)
    with raises_exactly(ValueError, "swizzle_b must have 1 value, got 0"):
        mx_call(128, 128, 128, swizzle_a=W.SWIZZLE_32_4_4)
    with raises_exactly(ValueError, "swizzle_a must have 1 value, got 2"):
        mx_call(128, 128, 128, swizzle_a=[W.SWIZZLE_32_4_4, W.NO_SWIZZLE], swizzle_b=W.SWIZZLE_32_4_4)
    # where the padded and the unswizzled counts agree, both claims are right
    for w in (W.NO_SWIZZLE, W.SWIZZLE_32_4_4):
        assert mx_call(128, 128, 128, swizzle_a=w, swizzle_b=w).shape == (128, 128)


def test_scaled_mm_swizzle_claim_must_match_the_scales(mx):
    from torch.nn.functional import SwizzleType as W
    M, N, K = 100, 256, 512  # padded counts differ from the unswizzled ones for scale_a only
    assert padded(M, K) != M * K // 32 and padded(N, K) == N * K // 32
    # SWIZZLE_32_4_4 claimed, unswizzled (unpadded) scales: upstream's count check
    with raises_exactly(ValueError, f"For Blockwise scaling scale_a should have {padded(M, K)} elements, got: "
                                    f"{M * K // 32}"):
        mx_call(M, N, K, swizzle_a=W.SWIZZLE_32_4_4, swizzle_b=W.SWIZZLE_32_4_4)
    # NO_SWIZZLE claimed, padded (blocked) scales: upstream's swizzle check
    with raises_exactly(ValueError, "scale_a must be swizzled to SWIZZLE_32_4_4 format"):
        mx_call(M, N, K, sa_count=padded(M, K), swizzle_a=W.NO_SWIZZLE, swizzle_b=W.NO_SWIZZLE)
    # a count that is neither
    with raises_exactly(ValueError, f"For Blockwise scaling scale_b should have {padded(N, K)} elements, got: 7 "
                                    f"(NO_SWIZZLE scales: {N * K // 32})"):
        mx_call(M, N, K, sb_count=7, swizzle_a=W.NO_SWIZZLE, swizzle_b=W.NO_SWIZZLE)
    # each operand's claim on its own: a unswizzled, b blocked (equal counts here) is fine
    assert mx_call(M, N, K, swizzle_a=W.NO_SWIZZLE, swizzle_b=W.SWIZZLE_32_4_4).shape == (M, N)
    # right claims on both: ours
    assert mx_call(M, N, K, swizzle_a=W.NO_SWIZZLE, swizzle_b=W.NO_SWIZZLE).shape == (M, N)
    assert mx_call(M, N, K, sa_count=padded(M, K), sb_count=padded(N, K), swizzle_a=W.SWIZZLE_32_4_4,
                   swizzle_b=W.SWIZZLE_32_4_4).shape == (M, N)


def test_scaled_mm_other_upstream_value_errors(mx):
    from torch.nn.functional import SwizzleType as W
    with raises_exactly(ValueError, "For Blockwise scaling both scales should be contiguous"):
        mx_call(128, 128, 128, swizzle_a=W.NO_SWIZZLE, swizzle_b=W.NO_SWIZZLE, contiguous_scales=False)
    with raises_exactly(ValueError, "`use_fast_accum` is not supported when `mat_a` or `mat_b` tensors have the "
                                    "`Float4_e2m1fn_x2` dtype."):
        mx_call(128, 128, 128, fmt="e2m1", swizzle_a=W.NO_SWIZZLE, swizzle_b=W.NO_SWIZZLE, fast_accum=True)
    assert mx_call(128, 128, 128, swizzle_a=W.NO_SWIZZLE, swizzle_b=W.NO_SWIZZLE, fast_accum=True).shape == (128, 128)


def test_scaled_mm_contract_applies_to_mx_calls_only(mx):
    """Calls that are not MX (other recipes) keep the stock Meta kernel's checks and errors."""
    from torch.nn.functional import ScalingType as S
    a = torch.empty(64, 128, dtype=torch.float8_e4m3fn, device="cuda")
    b = torch.empty(256, 128, dtype=torch.float8_e4m3fn, device="cuda").t()
    one = torch.empty((), dtype=torch.float32, device="cuda")
    out = F.scaled_mm(a, b, one, S.TensorWise, one, S.TensorWise, output_dtype=torch.bfloat16)
    assert out.shape == (64, 256)


# ---- decision keys and the ops' own rules ------------------------------------------------------
def qkv(B, Hq, Hkv, Sq, Sk, D, dtype=torch.bfloat16):
    return (torch.randn(B, Hq, Sq, D, dtype=dtype), torch.randn(B, Hkv, Sk, D, dtype=dtype),
            torch.randn(B, Hkv, Sk, D, dtype=dtype))


def key_sdpa(op, q, k, v, causal=False):
    return ext.key_sdpa(op, q, k, v, causal, check_device=False)


FWD, BWD = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn"), ("sdpa_flash_bwd", "sdpa_efficient_bwd")


def test_sdpa_keys():
    q, k, v = qkv(2, 8, 8, 33, 40, 64)
    for op in FWD + BWD:
        assert key_sdpa(op, q, k, v) == (op, "bf16", "full", 40, 33, 16, 64)
    assert key_sdpa("sdpa_efficient", q, k, v, True)[2] == "causal"
    with pytest.raises(ValueError, match="op must be one of"):
        key_sdpa("sdpa", q, k, v)


def test_sdpa_op_rules_leave_what_the_stock_op_rejects_to_it():
    """The stock flash op rejects head dims above 256 or not a multiple of 8 (SDPA pads them before
    calling it), cuDNN the same, the memory-efficient ops grouped-query heads; empty inputs stay
    stock's; flash's causal mask with Sq != Sk is bottom-right (not ours)."""
    def taken(q, k, v, causal=False):
        return {op for op in FWD + BWD if key_sdpa(op, q, k, v, causal) is not None}

    assert taken(*qkv(1, 4, 4, 16, 16, 72)) == set(FWD + BWD)
    assert taken(*qkv(1, 4, 4, 16, 16, 36)) == {"sdpa_efficient", "sdpa_efficient_bwd"}
    assert taken(*qkv(1, 4, 4, 16, 16, 320)) == {"sdpa_efficient", "sdpa_efficient_bwd"}
    assert taken(*qkv(1, 8, 2, 16, 16, 64)) == {"sdpa_flash", "sdpa_cudnn", "sdpa_flash_bwd"}
    assert taken(*qkv(1, 4, 4, 16, 24, 64), causal=True) == {"sdpa_efficient", "sdpa_cudnn", "sdpa_efficient_bwd"}
    assert taken(*qkv(0, 4, 4, 16, 16, 64)) == set()
    assert taken(*qkv(1, 4, 4, 16, 0, 64)) == set()


def test_rms_norm_topk_grouped_mm_mm_keys():
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    assert ext.key_rms_norm(x, [64], w, 1e-5, check_device=False) == ("rms_norm", "bf16", "w", 64, 6, 0, 0)
    assert ext.key_rms_norm(x, [64], None, None, check_device=False)[2] == "nw"
    assert ext.key_rms_norm(x, [32], None, None, check_device=False) is None
    assert ext.key_rms_norm(x, [64], w, 1e-5) is None  # CPU tensors, device checked
    t = torch.randn(3, 5, 300)
    assert ext.key_topk(t, 8, -1, True, check_device=False) == ("topk", "fp32", "largest", 300, 8, 15, 0)
    assert ext.key_topk(t, 8, -1, False, check_device=False)[2] == "smallest"
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert ext.key_topk(t, 8, -1, True, check_device=False)[1] == "fp32_det"
    finally:
        torch.use_deterministic_algorithms(before)
    assert ext.key_topk(t, 301, -1, True, check_device=False) is None
    a = torch.randn(100, 64, dtype=torch.bfloat16)
    offs = torch.tensor([10, 10, 60, 100], dtype=torch.int32)
    wkn = torch.randn(4, 64, 128, dtype=torch.bfloat16)
    assert ext.key_grouped_mm(a, wkn, offs, check_device=False) == ("grouped_mm", "bf16", "b_kn", 128, 64, 100, 4)
    wnk = torch.randn(4, 128, 64, dtype=torch.bfloat16).transpose(-2, -1)
    assert ext.key_grouped_mm(a, wnk, offs, check_device=False)[2] == "b_nk"
    dc = torch.randn(100, 128, dtype=torch.bfloat16)
    assert ext.key_grouped_mm(a.t(), dc, offs, check_device=False) == ("grouped_mm", "bf16", "ragged_k", 128, 64,
                                                                       100, 4)
    assert ext.key_grouped_mm(a, wkn, offs.long(), check_device=False) is None
    # GEMM's key is Python's (Inductor's provider decides at compile time): op "mm" for addmm too
    from flykernels._ops.gemm import gemm_key
    A, B = torch.randn(32, 48, dtype=torch.float16), torch.randn(48, 80, dtype=torch.float16)
    assert gemm_key(A.dtype, A.shape, A.stride(), B.shape, B.stride()) == ("fp16", "nn", 80, 48, 32)
    Bt = B.t().contiguous().t()
    assert gemm_key(A.dtype, A.shape, A.stride(), Bt.shape, Bt.stride())[1] == "nt"
    At = A.t().contiguous().t()
    assert gemm_key(A.dtype, At.shape, At.stride(), B.shape, B.stride())[1] == "tn"
    assert gemm_key(torch.int8, A.shape, A.stride(), B.shape, B.stride()) is None


# ---- the override table ------------------------------------------------------------------------
def test_override_table_names_and_unknown_names():
    names = ["rms_norm", "topk", "sdpa", "sdpa_cudnn", "sdpa_bwd", "grouped_mm", "scaled_mm"]
    assert ext.override_names() == names
    for call in (ext.enable_op, ext.disable_op, ext.op_enabled):
        with raises_exactly(ValueError, "flykernels: no eager override named 'nope' (" + ", ".join(names) + ")"):
            call("nope")
