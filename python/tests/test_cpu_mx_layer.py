# SPDX-License-Identifier: Apache-2.0
"""flykernels.quantize_ and flykernels.nn.MXLinear on the CPU (CI): the quantizer bit for bit
against a port of the C++ reference (kernels/gemm/gemm_mx.h), exact packing round trips, the
forward against nn.Linear on the dequantized weight, from_linear, quantize_'s skip rules,
state_dict save / load, torch.compile, autograd, bad arguments, and the CUDA path's fallback logic
with a stand-in extension (no device needed)."""
import copy
import io
import math
import struct

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flykernels
from flykernels import _mx
from flykernels.nn import MXLinear

FORMATS = ["mxfp8", "mxfp4"]


# ---- a port of the C++ reference quantizer (gemm_mx.h), element by element ---------------------
def _f32(v):
    return struct.unpack("f", struct.pack("f", v))[0]


def _dec_e4m3(b):
    e, m = (b >> 3) & 0xF, b & 7
    mag = math.nan if (e == 15 and m == 7) else (math.ldexp(m, -9) if e == 0 else math.ldexp(1 + m / 8, e - 7))
    return -mag if b & 0x80 else mag


def _dec_e2m1(n):
    e, m = (n >> 1) & 3, n & 1
    mag = 0.5 * m if e == 0 else math.ldexp(1 + 0.5 * m, e - 1)
    return -mag if n & 8 else mag


def _encode_nearest_even(x, top, sign_bit, nan_code, dec):
    if math.isnan(x):
        return nan_code
    a = abs(x)
    sign = sign_bit if math.copysign(1.0, x) < 0 else 0
    if a >= dec(top):
        return top | sign
    best = 0
    for c in range(1, top + 1):
        dc, db = abs(dec(c) - a), abs(dec(best) - a)
        if dc < db or (dc == db and c % 2 == 0):
            best = c
        if dec(c) > a:
            break
    return best | sign


def _ref_quantize(w, fmt):
    """(codes one per element, scale bytes) of w [N, K] (float32 values), as gemm_mx.h quantize()."""
    fp4 = fmt == "mxfp4"
    emax = 2 if fp4 else 8
    rows = w.tolist()
    codes, scales = [], []
    for row in rows:
        crow, srow = [], []
        for b in range(0, len(row), 32):
            blk = [_f32(v) for v in row[b:b + 32]]
            if any(math.isnan(v) or math.isinf(v) for v in blk):
                s = 0xFF
            else:
                amax = max(abs(v) for v in blk)
                if amax == 0:
                    s = 0
                else:
                    e = math.frexp(amax)[1] - 1 - emax
                    s = max(e, -127) + 127
            srow.append(s)
            scale = math.nan if s == 0xFF else math.ldexp(1.0, s - 127)
            for v in blk:
                x = math.nan if s == 0xFF else _f32(v / scale)
                crow.append(_encode_nearest_even(x, 7, 8, 7, _dec_e2m1) if fp4
                            else _encode_nearest_even(x, 0x7E, 0x80, 0x7F, _dec_e4m3))
        codes.append(crow)
        scales.append(srow)
    return codes, scales


def _pack(codes, fmt):
    if fmt == "mxfp8":
        return torch.tensor(codes, dtype=torch.uint8)
    return torch.tensor([[r[i] | (r[i + 1] << 4) for i in range(0, len(r), 2)] for r in codes], dtype=torch.uint8)


def _dequant64(q, s, fmt):
    """float64 values from a table: an independent decoder."""
    q = q.view(torch.uint8).long()
    if fmt == "mxfp4":
        table = torch.tensor([_dec_e2m1(n) for n in range(16)], dtype=torch.float64)
        vals = torch.stack([table[q & 0xF], table[q >> 4]], dim=-1).reshape(q.shape[0], -1)
    else:
        table = torch.tensor([_dec_e4m3(b) for b in range(256)], dtype=torch.float64)
        vals = table[q]
    sc = torch.where(s.long() == 255, torch.full(s.shape, math.nan, dtype=torch.float64),
                     torch.pow(2.0, s.double() - 127.0))
    return vals * sc.repeat_interleave(32, dim=1)


def _hostile_rows():
    """Rows of 256 (8 blocks each) over the cases the quantizer distinguishes."""
    g = torch.Generator().manual_seed(1)
    rows = []
    rows.append(torch.randn(256, generator=g))                                           # plain
    rows.append(torch.randn(256, generator=g) * torch.exp2(torch.randint(-30, 30, (256,), generator=g).float()))
    z = torch.randn(256, generator=g)
    z[0:32] = 0.0
    z[32:64] = -0.0                                   # zero blocks: scale 0x00, signed zero codes
    z[64:96] = torch.randn(32, generator=g) * 1e-40   # FP32 subnormals
    z[96] = float("nan")                              # NaN block
    z[130] = float("inf")                             # Inf block
    z[170] = -float("inf")
    z[200:232] = torch.randn(32, generator=g) * 3e38  # near FP32's top
    rows.append(z)
    # exact E4M3 / E2M1 midpoints and ties under a known scale: block max 448 (E4M3 scale 2^0) / 6
    # (E2M1 scale 2^0)
    e4 = torch.tensor([_dec_e4m3(b) for b in range(0x7E)])
    mids = (e4[:-1] + e4[1:]) / 2
    t = torch.cat([mids, -mids, torch.tensor([448.0, -448.0, 500.0, -511.0] * 3)])[:256]
    t[31] = 448.0
    rows.append(torch.cat([t, torch.zeros(256 - t.numel())]) if t.numel() < 256 else t)
    e2 = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.9, 6.0, 0.1, -0.25, -0.75, -2.5, -5.0, 0.0, -0.0] * 16)
    e2[15::32] = 6.0
    rows.append(e2)
    return torch.stack(rows)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantizer_is_bit_for_bit_the_reference(fmt):
    w = _hostile_rows()
    codes, scales = _ref_quantize(w, fmt)
    q, s = _mx.quantize(w, fmt)
    assert q.dtype == torch.uint8 and s.dtype == torch.uint8
    assert q.shape == (w.shape[0], 256 if fmt == "mxfp8" else 128) and s.shape == (w.shape[0], 8)
    assert torch.equal(s, torch.tensor(scales, dtype=torch.uint8))
    assert torch.equal(q, _pack(codes, fmt))
    # the cases the rows were built for
    assert s[2, 0] == 0 and s[2, 1] == 0 and s[2, 3] == 0xFF and s[2, 4] == 0xFF and s[2, 5] == 0xFF
    if fmt == "mxfp8":
        assert (q[2, 32:64] == 0x80).all() and (q[2, 96:128] == 0x7F).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_packing_round_trip_is_bit_exact(fmt, dtype):
    torch.manual_seed(0)
    w = (torch.randn(96, 320) * torch.exp2(torch.randint(-8, 8, (96, 1)).float())).to(dtype)
    q, s = _mx.quantize(w, fmt)
    wd = _mx.dequantize(q, s, fmt)                    # FP32, exact
    assert torch.equal(wd.double(), _dequant64(q, s, fmt))
    q2, s2 = _mx.quantize(wd, fmt)                    # quantize -> dequantize -> quantize
    assert torch.equal(q2, q) and torch.equal(s2, s)
    if dtype != torch.float32:                        # the dequantized BF16 / FP16 weight is exact too
        wd16 = _mx.dequantize(q, s, fmt, dtype)
        assert torch.equal(wd16.float(), wd)
        q3, s3 = _mx.quantize(wd16, fmt)
        assert torch.equal(q3, q) and torch.equal(s3, s)
    # the error is what the format allows, relative to each block's max: the OCP scale puts it at
    # [256, 512) x scale (E4M3) / [4, 8) x scale (E2M1), saturating above 448 / 6: at most 1/8 / 1/4
    blk = w.float().reshape(96, 10, 32)
    err = (wd.reshape(96, 10, 32) - blk).abs().amax(-1) / blk.abs().amax(-1)
    assert err.max() <= (0.125 if fmt == "mxfp8" else 0.25) + 1e-6


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_every_byte_at_every_scale(fmt):
    """Every code byte under every scale byte: FP32 against the float64 table decoder, and the
    BF16 path (computed in BF16; MXFP4 through the pair table) the FP32 weight rounded once."""
    q = torch.arange(256, dtype=torch.uint8).repeat(256, 1)            # row r: every byte
    kb = q.shape[1] * (2 if fmt == "mxfp4" else 1) // 32
    s = torch.arange(256, dtype=torch.uint8)[:, None].expand(256, kb).contiguous()  # row r: scale r
    w32 = _mx.dequantize(q, s, fmt)
    # exact wherever FP32 holds the value; beyond it (448 x 2^127 ...) infinite, as the cast says
    torch.testing.assert_close(w32, _dequant64(q, s, fmt).float(), rtol=0, atol=0, equal_nan=True)
    for dt in (torch.bfloat16, torch.float16):
        for _ in range(2):  # the pair table made, then kept
            torch.testing.assert_close(_mx.dequantize(q, s, fmt, dt), w32.to(dt), rtol=0, atol=0, equal_nan=True)


def test_dequantize_special_bytes():
    q = torch.tensor([[0x7F, 0xFF, 0x80, 0x01] * 8], dtype=torch.uint8)
    for sb, expect_nan in [(0, False), (255, True), (254, False)]:
        w = _mx.dequantize(q, torch.tensor([[sb]], dtype=torch.uint8), "mxfp8")
        assert torch.isnan(w[0, 0]) and torch.isnan(w[0, 1])           # E4M3 NaN codes
        assert bool(torch.isnan(w[0, 3])) == expect_nan
        if not expect_nan:
            assert w[0, 2] == 0 and torch.signbit(w[0, 2])
            assert w[0, 3] == math.ldexp(1.0, -9 + sb - 127)             # smallest subnormal x scale
    assert _mx.e8m0_to_float(torch.tensor([0], dtype=torch.uint8)).item() == math.ldexp(1.0, -127)


def _linear(k=64, n=48, bias=True, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(k, n, bias=bias).to(dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("act", ["bf16", "mx"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_matches_linear_on_the_dequantized_weight(fmt, act, dtype, bias):
    lin = _linear(96, 40, bias, dtype)
    m = MXLinear.from_linear(lin, fmt, act)
    x = torch.randn(2, 5, 96).to(dtype)
    y = m(x)
    assert y.shape == (2, 5, 40) and y.dtype == dtype
    xr = x.double() if act == "bf16" else _dequant64(*_mx.quantize(x.reshape(10, 96), fmt), fmt).reshape(2, 5, 96)
    ref = xr @ _dequant64(m.qweight, m.scales, fmt).t()
    if bias:
        ref = ref + lin.bias.double()
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())
    # the CPU path is F.linear in FP32 on the exact weight, then one rounding
    wd = m.dequantize(torch.float32)
    xin = x.float() if act == "bf16" else _mx.dequantize(*_mx.quantize(x.reshape(10, 96), fmt), fmt).reshape(2, 5, 96)
    assert torch.equal(y, F.linear(xin, wd, lin.bias.float() if bias else None).to(dtype))


@pytest.mark.parametrize("fmt", FORMATS)
def test_from_linear(fmt):
    lin = _linear(128, 24, True, torch.bfloat16)
    m = MXLinear.from_linear(lin, fmt, "mx")
    assert (m.in_features, m.out_features, m.format, m.activations) == (128, 24, fmt, "mx")
    assert m.qweight.dtype == torch.uint8 and m.qweight.shape == (24, 128 if fmt == "mxfp8" else 64)
    assert m.scales.dtype == torch.uint8 and m.scales.shape == (24, 4)
    assert m.bias is lin.bias  # the same parameter
    q, s = _mx.quantize(lin.weight, fmt)
    assert torch.equal(m.qweight, q) and torch.equal(m.scales, s)
    assert m.dtype == torch.bfloat16 and m.dequantize().dtype == torch.bfloat16
    assert torch.equal(m.dequantize(torch.float32).double(), _dequant64(q, s, fmt))
    r = repr(m)
    assert f"format={fmt}" in r and "activations=mx" in r and "in_features=128" in r and "out_features=24" in r
    nb = MXLinear.from_linear(_linear(64, 8, False), fmt)
    assert nb.bias is None and "bias=False" in repr(nb)
    assert nb(torch.randn(3, 64, dtype=torch.bfloat16)).shape == (3, 8)
    # a meta weight (a model built without memory): meta buffers of the right shapes
    with torch.device("meta"):
        ml = nn.Linear(64, 16)
    mm = MXLinear.from_linear(ml, fmt)
    assert mm.qweight.is_meta and mm.qweight.shape == (16, 64 if fmt == "mxfp8" else 32) and mm.scales.shape == (16, 2)


def test_dtype_follows_module_to_and_bytes_stay():
    m = MXLinear.from_linear(_linear(64, 8), "mxfp4")
    q = m.qweight.clone()
    m.to(torch.float16)
    assert m.dtype == torch.float16 and m.bias.dtype == torch.float16 and m.dequantize().dtype == torch.float16
    assert m.qweight.dtype == torch.uint8 and torch.equal(m.qweight, q)
    m.float()
    assert m.dtype == torch.float32 and m.scales.dtype == torch.uint8


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.ModuleDict(dict(q_proj=nn.Linear(64, 64), o_proj=nn.Linear(64, 64, bias=False)))
        self.mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
        self.mha = nn.MultiheadAttention(64, 4, batch_first=True)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([_Block(), _Block()])
        self.lm_head = nn.Linear(64, 100, bias=False)

    def forward(self, x):
        for blk in self.layers:
            x = x + blk.attn["o_proj"](blk.attn["q_proj"](x))
            x = x + blk.mlp(x)
        return self.lm_head(x)


def test_quantize_swaps_linears_and_honours_skip():
    torch.manual_seed(0)
    model = _Model().to(torch.bfloat16)
    ref = copy.deepcopy(model)
    out = flykernels.quantize_(model, "mxfp8", activations="bf16", skip=["lm_head", "layers.1.attn.*"])
    assert out is model
    kinds = {n: type(m).__name__ for n, m in model.named_modules()}
    assert kinds["lm_head"] == "Linear"
    assert kinds["layers.0.attn.q_proj"] == kinds["layers.0.attn.o_proj"] == "MXLinear"
    assert kinds["layers.1.attn.q_proj"] == kinds["layers.1.attn.o_proj"] == "Linear"
    assert kinds["layers.0.mlp.0"] == kinds["layers.1.mlp.2"] == "MXLinear"
    assert kinds["layers.0.mha.out_proj"] == "NonDynamicallyQuantizableLinear"  # a subclass: left alone
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    y, yr = model(x), ref(x)
    cos = F.cosine_similarity(y.float().flatten(), yr.float().flatten(), dim=0)
    assert cos > 0.99, cos
    # skip by dotted suffix and by fnmatch; a string for one pattern
    m2 = flykernels.quantize_(_Model(), "mxfp4", skip="*.mlp.*")
    kinds = {n: type(m).__name__ for n, m in m2.named_modules()}
    assert kinds["layers.0.mlp.0"] == "Linear" and kinds["lm_head"] == "MXLinear"
    assert m2.lm_head.format == "mxfp4" and m2.lm_head.activations == "bf16"
    m3 = flykernels.quantize_(_Model(), "mxfp8", "mx", skip=["q_proj", "mlp.2"])
    kinds = {n: type(m).__name__ for n, m in m3.named_modules()}
    assert kinds["layers.1.attn.q_proj"] == "Linear" and kinds["layers.1.mlp.2"] == "Linear"
    assert kinds["layers.1.mlp.0"] == "MXLinear" and m3.layers[1].mlp[0].activations == "mx"
    # a bare Linear: the new layer is returned
    assert isinstance(flykernels.quantize_(nn.Linear(32, 4), "mxfp8"), MXLinear)


def test_quantize_shared_linear_becomes_one_layer():
    shared = nn.Linear(32, 32)
    model = nn.ModuleDict(dict(a=shared, b=shared))
    flykernels.quantize_(model, "mxfp8")
    assert isinstance(model["a"], MXLinear) and model["a"] is model["b"]


def test_state_dict_round_trip():
    torch.manual_seed(0)
    for fmt, bias in [("mxfp8", True), ("mxfp4", False)]:
        m = MXLinear.from_linear(_linear(64, 24, bias), fmt)
        sd = m.state_dict()
        assert set(sd) == ({"qweight", "scales", "bias"} if bias else {"qweight", "scales"})
        buf = io.BytesIO()
        torch.save(sd, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=True)
        fresh = MXLinear(64, 24, format=fmt, bias=bias, device="cpu", dtype=torch.bfloat16)
        fresh.load_state_dict(loaded)
        for k in sd:
            assert torch.equal(fresh.state_dict()[k], sd[k]), k
        x = torch.randn(4, 64, dtype=torch.bfloat16)
        assert torch.equal(fresh(x), m(x))
    # a whole quantized model into a freshly quantized copy of another init
    torch.manual_seed(1)
    a = flykernels.quantize_(_Model().to(torch.bfloat16), "mxfp4", skip=["lm_head"])
    torch.manual_seed(2)
    b = flykernels.quantize_(_Model().to(torch.bfloat16), "mxfp4", skip=["lm_head"])
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b.load_state_dict(torch.load(buf, weights_only=True))
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    assert torch.equal(a(x), b(x))
    # into an MXLinear of the other format: refused by shape
    with pytest.raises(RuntimeError, match="size mismatch"):
        MXLinear(64, 24, format="mxfp4").load_state_dict(MXLinear(64, 24, format="mxfp8").state_dict())


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_compile_traces_the_ops(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 32)).to(torch.bfloat16)
    flykernels.quantize_(model, "mxfp4", skip=["2"])
    model[2] = MXLinear.from_linear(nn.Linear(96, 32).to(torch.bfloat16), "mxfp8", "mx")
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    eager = model(x)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    assert torch.equal(compiled(x), eager)
    # shape inference under fake tensors (what torch.compile's tracing does)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(torch.empty(7, 2, 64, dtype=torch.float16))
        fw, fs = mode.from_tensor(model[0].qweight), mode.from_tensor(model[0].scales)
        out = torch.ops.flykernels.mx_linear(fx, fw, fs, "mxfp4", None)
        assert out.shape == (7, 2, 96) and out.dtype == torch.float16
    torch._dynamo.reset()


@pytest.mark.parametrize("op", ["mx_linear", "mx_linear_mx"])
def test_opcheck(op):
    """torch.library.opcheck: schema, autograd registration, the fake implementation against the
    real one, AOT dispatch with dynamic shapes."""
    m = MXLinear.from_linear(_linear(64, 16), "mxfp4")
    x = torch.randn(3, 64, dtype=torch.bfloat16, requires_grad=True)
    torch.library.opcheck(getattr(torch.ops.flykernels, op), (x, m.qweight, m.scales, "mxfp4", m.bias))


def test_autograd_through_the_ops():
    m = MXLinear.from_linear(_linear(64, 16, True, torch.float32), "mxfp8")
    x = torch.randn(3, 64, requires_grad=True)
    m(x).sum().backward()
    w = m.dequantize(torch.float32)
    torch.testing.assert_close(x.grad, torch.ones(3, 16) @ w)
    torch.testing.assert_close(m.bias.grad, torch.full((16,), 3.0))
    assert m.qweight.grad is None


def test_bad_arguments_have_clear_errors():
    lin = _linear(64, 8)
    with pytest.raises(ValueError, match="format must be 'mxfp4' or 'mxfp8', got 'fp4'"):
        flykernels.quantize_(nn.Sequential(lin), "fp4")
    with pytest.raises(ValueError, match="activations must be 'bf16'.*got 'int8'"):
        flykernels.quantize_(nn.Sequential(lin), "mxfp8", activations="int8")
    with pytest.raises(ValueError, match="format must be"):
        MXLinear.from_linear(lin, "nvfp4")
    with pytest.raises(TypeError, match="expected an nn.Linear"):
        MXLinear.from_linear(nn.Conv1d(4, 4, 1), "mxfp8")
    model = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 8))
    with pytest.raises(ValueError, match=r"layer '1' has in_features = 48, not a multiple of 32.*skip="):
        flykernels.quantize_(model, "mxfp8")
    assert type(model[0]) is nn.Linear  # nothing swapped on an error
    flykernels.quantize_(model, "mxfp8", skip=["1"])
    assert isinstance(model[0], MXLinear) and type(model[1]) is nn.Linear
    with pytest.raises(ValueError, match="in_features = 48 is not a multiple of 32"):
        MXLinear(48, 8)
    with pytest.raises(ValueError, match="MX quantization needs"):
        _mx.quantize(torch.randn(4, 40), "mxfp8")
    m = MXLinear.from_linear(_linear(64, 8), "mxfp4")
    with pytest.raises(RuntimeError, match="x has K = 32 but wq is"):
        m(torch.randn(2, 32, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="format must be"):
        torch.ops.flykernels.mx_linear(torch.randn(2, 64), m.qweight, m.scales, "e2m1", None)


class _StubExt:
    """Stands in for the extension on the CPU: mx_linear_run declines (None) or answers."""

    def __init__(self, answer):
        self.answer = answer
        self.calls = []

    def mx_linear_run(self, a, scale_a, wq, scales, format, bias, out_dtype):
        self.calls.append((tuple(a.shape), a.dtype, scale_a is not None, format, bias is not None, out_dtype))
        return None if self.answer is None else self.answer(a, wq)

    def mx_quantize(self, x, format, rceil):
        fmt = {"e4m3": "mxfp8", "e2m1": "mxfp4"}[format]
        q, s = _mx.quantize(x, fmt)
        return (q.view(torch.float8_e4m3fn) if fmt == "mxfp8" else q.view(torch.float4_e2m1fn_x2),
                s.view(torch.float8_e8m0fnu))


@pytest.mark.parametrize("fmt", FORMATS)
def test_cuda_path_calls_the_extension_and_falls_back(monkeypatch, fmt):
    """_weight_only_cuda / _mx_act_cuda's logic with CPU tensors: the extension's answer when it
    gives one, dequantize + F.linear when it declines or is missing, fp32 activations not offered."""
    from flykernels import _loader
    m = MXLinear.from_linear(_linear(64, 8, True), fmt)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    ref = F.linear(x, m.dequantize(torch.bfloat16), m.bias)
    declines = _StubExt(None)
    monkeypatch.setattr(_loader, "available", True)
    monkeypatch.setattr(_loader, "ext", declines)
    assert torch.equal(_mx._weight_only_cuda(x, m.qweight, m.scales, fmt, m.bias), ref)
    assert declines.calls == [((5, 64), torch.bfloat16, False, fmt, True, None)]
    y32 = _mx._weight_only_cuda(x.float(), m.qweight, m.scales, fmt, m.bias)  # not offered
    assert len(declines.calls) == 1 and y32.dtype == torch.float32
    sentinel = torch.full((5, 8), 7.0, dtype=torch.bfloat16)
    answers = _StubExt(lambda a, wq: sentinel)
    monkeypatch.setattr(_loader, "ext", answers)
    assert _mx._weight_only_cuda(x, m.qweight, m.scales, fmt, m.bias) is sentinel
    assert _mx._mx_act_cuda(x, m.qweight, m.scales, fmt, None) is sentinel
    a_shape, a_dtype, has_sa, _, has_bias, od = answers.calls[-1]
    assert a_dtype == (torch.float8_e4m3fn if fmt == "mxfp8" else torch.float4_e2m1fn_x2) and has_sa
    assert not has_bias and od == torch.bfloat16
    # MX activations declined: the exact emulation
    monkeypatch.setattr(_loader, "ext", declines)
    xq = _mx.dequantize(*_mx.quantize(x, fmt), fmt, torch.bfloat16)
    assert torch.equal(_mx._mx_act_cuda(x, m.qweight, m.scales, fmt, m.bias), F.linear(xq, m.dequantize(), m.bias))
    # an extension built before mx_linear_run: the fallback, no error
    monkeypatch.setattr(_loader, "ext", object())
    assert torch.equal(_mx._weight_only_cuda(x, m.qweight, m.scales, fmt, m.bias), ref)


def test_extension_binding_declines_what_it_cannot_run(fly):
    """csrc/mx_linear.cpp's mx_linear_run through pybind (the wheel's extension): CPU tensors are
    not ours (None, counted as stock), a bad format is a ValueError."""
    from flykernels import _loader
    if _loader.ext is None or not hasattr(_loader.ext, "mx_linear_run"):
        pytest.skip("the extension has no mx_linear_run (built before it)")
    run = _loader.ext.mx_linear_run
    m = MXLinear.from_linear(_linear(64, 16), "mxfp4")
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    fly.reset_counts()
    assert run(x, None, m.qweight, m.scales, "mxfp4", m.bias, None) is None
    qa, sa = _mx.quantize(x, "mxfp4")
    assert run(qa.view(torch.float4_e2m1fn_x2), sa.view(torch.float8_e8m0fnu), m.qweight, m.scales, "mxfp4") is None
    counts = fly.dispatch_counts()
    assert counts["mx_linear"] == (0, 1) and counts["mx_linear_mx"] == (0, 1), counts
    with pytest.raises(ValueError, match="format must be 'mxfp8' or 'mxfp4'"):
        run(x, None, m.qweight, m.scales, "e2m1")
