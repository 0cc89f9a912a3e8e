# SPDX-License-Identifier: Apache-2.0
"""CPU-side tests of the flykernels package (run in CI, no GPU needed)."""
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import flykernels
from _subproc import run_py
from flykernels._ops import gemm

HAS_GPU = torch.cuda.is_available()


def test_extension_loaded_and_library_bundled():
    assert flykernels._loader.ext is not None, flykernels._loader.load_error
    info = flykernels._loader.ext.library_info()
    assert info["version"] == "0.1.0"
    assert info["variant_count"] > 0
    assert {"rmsnorm", "topk", "gemm"} <= set(info["families"])
    lib = os.path.join(os.path.dirname(flykernels.__file__), "libflykernels.so.0")
    assert os.path.exists(lib)


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_no_gpu_leaves_available_false_with_reason():
    assert flykernels.available is False
    assert flykernels.torch.available is False
    assert "no CUDA device" in flykernels.reason or "no CUDA" in flykernels.reason
    assert flykernels.torch.active() == []  # nothing installed at import where nothing can run


def test_switches(fly):
    fly.disable()
    assert fly.active() == []
    assert fly.enable(ops=["rms_norm"]) == ["rms_norm"]
    assert fly.enable("topk") == ["rms_norm", "topk"]
    with fly.disabled():
        assert fly.active() == []
    assert fly.active() == ["rms_norm", "topk"]
    with fly.disabled(ops=["topk"]):
        assert fly.active() == ["rms_norm"]
    assert fly.active() == ["rms_norm", "topk"]
    fly.disable("rms_norm")
    assert fly.active() == ["topk"]
    fly.enable()
    assert set(fly.active()) == {"rms_norm", "topk", "gemm", "sdpa", "sdpa_cudnn", "sdpa_bwd", "grouped_mm",
                                 "scaled_mm", "grouped_mm_compile", "patch"}
    with pytest.raises(ValueError, match="unknown op"):
        fly.enable(ops=["no_such_op"])


def test_disabled_restores_state_after_an_exception(fly):
    fly.disable()
    fly.enable("rms_norm")
    with pytest.raises(RuntimeError):
        with fly.disabled():
            raise RuntimeError("boom")
    assert fly.active() == ["rms_norm"]


def dispatch_file(op):
    """The file that registered op's CUDA kernel, from the dispatcher's table."""
    dump = torch._C._dispatch_dump(op)
    line = next(ln for ln in dump.splitlines() if ln.startswith("CUDA:"))
    return line


def test_override_is_the_registered_cuda_kernel_and_disable_restores_stock(fly):
    fly.disable()
    stock_rms, stock_topk = dispatch_file("aten::_fused_rms_norm"), dispatch_file("aten::topk")
    assert "flykernels._C" not in stock_rms
    fly.enable(["rms_norm", "topk"])
    assert "flykernels._C" in dispatch_file("aten::_fused_rms_norm")
    assert "flykernels._C" in dispatch_file("aten::topk")
    assert "flykernels._C" in dispatch_file("aten::topk.values")
    fly.disable()
    assert dispatch_file("aten::_fused_rms_norm") == stock_rms
    assert dispatch_file("aten::topk") == stock_topk
    fly.enable(["topk"])  # re-enabling works
    assert "flykernels._C" in dispatch_file("aten::topk")


SDPA_OPS = ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
            "aten::_scaled_dot_product_cudnn_attention")


def test_sdpa_overrides_are_registered_and_disable_restores_stock(fly):
    from torch.nn.attention import _registry
    fly.disable()
    stock = {op: dispatch_file(op) for op in SDPA_OPS}
    assert all("flykernels._C" not in line for line in stock.values())
    fly.enable(["sdpa"])
    assert _registry.current_flash_attention_impl() == "FLY"  # through torch's impl registry
    assert "flykernels._C" in dispatch_file(SDPA_OPS[0])
    assert "flykernels._C" in dispatch_file(SDPA_OPS[1])
    assert dispatch_file(SDPA_OPS[2]) == stock[SDPA_OPS[2]]  # cuDNN is its own switch
    fly.enable(["sdpa_cudnn"])
    assert "flykernels._C" in dispatch_file(SDPA_OPS[2])
    fly.disable(["sdpa", "sdpa_cudnn"])
    assert _registry.current_flash_attention_impl() is None
    assert {op: dispatch_file(op) for op in SDPA_OPS} == stock
    fly.enable(["sdpa"])  # again, after the registry restored the default once
    assert fly.active() == ["sdpa"] and "flykernels._C" in dispatch_file(SDPA_OPS[0])


def test_sdpa_eligibility():
    why = lambda q, k, v, p=0.0: flykernels.torch.explain_sdpa(q, k, v, p, check_device=False)  # noqa: E731
    q = torch.randn(2, 8, 33, 64, dtype=torch.bfloat16)
    kv = torch.randn(2, 2, 40, 64, dtype=torch.bfloat16)
    assert why(q, kv, kv) == ""  # grouped-query heads, Sq != Sk
    assert why(q.transpose(1, 2).contiguous().transpose(1, 2), kv, kv) == ""  # BSHD strides
    assert why(q.half(), kv.half(), kv.half()) == ""
    assert "dtype" in why(q.float(), kv.float(), kv.float())
    assert "mixed" in why(q, kv.half(), kv)
    assert "dropout" in why(q, kv, kv, 0.1)
    assert "[B, H, S, D]" in why(q[0], kv[0], kv[0])
    assert "head dim" in why(q, kv, torch.randn(2, 2, 40, 32, dtype=torch.bfloat16))
    assert "multiple" in why(torch.randn(2, 3, 33, 64, dtype=torch.bfloat16), kv, kv)
    assert "innermost" in why(q.transpose(2, 3).contiguous().transpose(2, 3), kv, kv)
    assert "CUDA" in flykernels.torch.explain_sdpa(q, kv, kv)  # with the device checks: CPU tensors


def test_backward_and_grouped_families_are_on_by_default_and_switch_alone(fly):
    bwd_ops = ("aten::_scaled_dot_product_flash_attention_backward",
               "aten::_scaled_dot_product_efficient_attention_backward")
    fly.disable()
    stock = {op: dispatch_file(op) for op in bwd_ops + ("aten::_grouped_mm",)}
    fly.enable()
    assert {"sdpa_bwd", "grouped_mm"} <= set(fly.active())
    assert all("flykernels._C" in dispatch_file(op) for op in stock)
    with fly.disabled():
        assert {op: dispatch_file(op) for op in stock} == stock
    assert {"sdpa_bwd", "grouped_mm"} <= set(fly.active())  # the previous state again
    fly.disable(["sdpa_bwd", "grouped_mm"])
    assert {op: dispatch_file(op) for op in stock} == stock
    assert "sdpa" in fly.active()  # the others stay
    fly.enable()


def test_a_default_off_family_is_installed_only_when_named(fly, monkeypatch):
    from flykernels import _ops

    class Dummy:  # a family registered with default_on=False
        kind, default_on, on = "eager", False, False

        def supported(self):
            return ""

        def installed(self):
            return self.on

        def install(self):
            self.on = True

        def remove(self):
            self.on = False

    monkeypatch.setitem(_ops.REGISTRY, "dummy", Dummy())
    fly.enable()
    assert "dummy" not in fly.active()
    fly.enable(["dummy"])
    assert "dummy" in fly.active()
    fly.disable(["dummy"])
    assert "dummy" not in fly.active()


def test_grouped_mm_eligibility():
    why = lambda a, b, offs, bias=None: flykernels.torch.explain_grouped_mm(a, b, offs, bias, check_device=False)  # noqa: E731
    a = torch.randn(100, 64, dtype=torch.bfloat16)
    w = torch.randn(4, 64, 128, dtype=torch.bfloat16)
    offs = torch.tensor([10, 10, 60, 100], dtype=torch.int32)
    assert why(a, w, offs) == ""
    assert why(a, w.transpose(-2, -1).contiguous().transpose(-2, -1), offs) == ""  # K-contiguous B
    assert why(a.half(), w.half(), offs) == ""
    assert "dtype" in why(a.float(), w.float(), offs)
    assert "mixed" in why(a, w.half(), offs)
    assert "2-D x 3-D" in why(a[None], w, offs)  # 3-D x 3-D: the stock op's
    assert "offsets" in why(a, w, None)
    assert "int32" in why(a, w, offs.long())
    assert "int32" in why(a, w, offs[:3])
    assert "K of A" in why(a[:, :32], w, offs)
    assert "row-major" in why(a.t().contiguous().t(), w, offs)
    assert "multiple of 8" in why(a, w[:, :, :100], offs)
    assert "bias" in why(a, w, offs, torch.randn(4, 128, dtype=torch.bfloat16))
    assert "CUDA" in flykernels.torch.explain_grouped_mm(a, w, offs)


def test_grouped_mm_ragged_k_eligibility():
    """The 2-D x 2-D form (autograd's dB = X^T @ dC per group, offsets along K)."""
    why = lambda a, b, offs, bias=None: flykernels.torch.explain_grouped_mm(a, b, offs, bias, check_device=False)  # noqa: E731
    x = torch.randn(100, 64, dtype=torch.bfloat16)   # [T, K]: a = x.t() [K, T], M contiguous
    dc = torch.randn(100, 128, dtype=torch.bfloat16)  # [T, N]
    offs = torch.tensor([10, 10, 60, 100], dtype=torch.int32)
    assert why(x.t(), dc, offs) == ""
    assert why(dc.t(), x, offs) == ""  # the K-contiguous weight's dB: grad.t() @ x
    assert "M-contiguous" in why(x.t().contiguous(), dc, offs)  # K contiguous a: the stock op's
    assert "N-contiguous" in why(x.t(), dc.t().contiguous().t(), offs)  # K contiguous b
    assert why(x.t().half(), dc.half(), offs) == ""
    assert "K of A" in why(x.t(), dc[:50], offs)
    assert "int32" in why(x.t(), dc, offs.long())
    assert "offsets" in why(x.t(), dc, None)
    assert "multiple of 8" in why(x.t(), dc[:, :100], offs)
    assert "M-contiguous" in why(x.t()[::2], dc, offs)
    assert "bias" in why(x.t(), dc, offs, torch.randn(4, 128, dtype=torch.bfloat16))
    assert "CUDA" in flykernels.torch.explain_grouped_mm(x.t(), dc, offs)


def test_cpu_tensors_reach_the_stock_kernels(fly):
    fly.enable()
    fly.reset_counts()
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    y = F.rms_norm(x, [64], w, 1e-5)
    ref = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * w.double())
    assert torch.allclose(y.double(), ref, rtol=2e-2, atol=2e-2)
    v, i = torch.topk(torch.randn(4, 100), 5)
    assert v.shape == (4, 5) and i.dtype == torch.int64
    counts = fly.dispatch_counts()
    assert all(ours == 0 and stock == 0 for ours, stock in counts.values()), counts


def test_no_override_warning_reaches_the_user():
    r = run_py("""
        import warnings
        warnings.simplefilter("always")
        import flykernels, flykernels.torch as t
        t.disable(); t.enable(); t.disable(); t.enable()
        print("ACTIVE", t.active())
    """)
    assert r.returncode == 0, r.stderr
    assert "ACTIVE" in r.stdout
    assert "Overriding a previously registered kernel" not in r.stderr + r.stdout


def test_env_off_at_import():
    r = run_py("import flykernels; print('ACTIVE', flykernels.torch.active())", env={"FLYKERNELS_TORCH": "0"})
    assert r.returncode == 0, r.stderr
    assert "ACTIVE []" in r.stdout


def test_on_at_import_where_available():
    r = run_py("import flykernels; print('ACTIVE', sorted(flykernels.torch.active()), flykernels.available)")
    assert r.returncode == 0, r.stderr
    on = ["gemm", "grouped_mm", "grouped_mm_compile", "rms_norm", "scaled_mm", "sdpa", "sdpa_bwd", "sdpa_cudnn", "topk"]
    expected = f"{on} True" if flykernels.available else "[] False"
    assert f"ACTIVE {expected}" in r.stdout


def test_library_load_failure_leaves_torch_working(tmp_path):
    pkg = os.path.dirname(flykernels.__file__)
    broken = tmp_path / "flykernels"
    shutil.copytree(pkg, broken, ignore=shutil.ignore_patterns("libflykernels.so*", "__pycache__"))
    r = run_py("""
        import sys; sys.path.insert(0, %r)
        import torch, flykernels
        assert flykernels.__file__.startswith(%r), flykernels.__file__
        print("AVAILABLE", flykernels.available)
        print("REASON", flykernels.reason)
        print("ACTIVE", flykernels.torch.active())
        print("TOPK", torch.topk(torch.arange(10.), 3).values.tolist())
    """ % (str(tmp_path), str(tmp_path)))
    assert r.returncode == 0, r.stderr
    assert "AVAILABLE False" in r.stdout
    assert "libflykernels.so.0" in r.stdout  # the reason names what failed
    assert "ACTIVE []" in r.stdout
    assert "TOPK [9.0, 8.0, 7.0]" in r.stdout


def test_python_m_flykernels():
    r = subprocess.run([sys.executable, "-m", "flykernels"], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert "libflykernels 0.1.0" in r.stdout
    assert "available:" in r.stdout
    for name in ("rms_norm", "topk", "gemm", "sdpa", "sdpa_cudnn", "sdpa_bwd", "grouped_mm"):
        assert name in r.stdout


# ---- eligibility logic, on CPU tensors (device checks skipped) -------------------------------
def rms_why(x, shape, w=None, eps=1e-5):
    return flykernels.torch.explain_rms_norm(x, shape, w, eps, check_device=False)


def test_rms_norm_eligibility():
    x = torch.randn(4, 6, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    assert rms_why(x, [64], w) == ""
    assert rms_why(x, [6, 64], torch.randn(6, 64, dtype=torch.bfloat16)) == ""
    assert rms_why(x, [64], None, None) == ""
    for dt in (torch.float16, torch.float32):
        assert rms_why(x.to(dt), [64], w.to(dt)) == ""
    assert "dtype" in rms_why(x.double(), [64], w.double())
    assert "not contiguous" in rms_why(x.transpose(0, 1), [64], w)
    assert "normalized_shape" in rms_why(x, [32], None)
    assert "normalized_shape" in rms_why(x, [], None)
    assert "weight dtype" in rms_why(x, [64], w.float())
    assert "weight shape" in rms_why(x, [64], torch.randn(32, dtype=torch.bfloat16))
    assert "weight is not contiguous" in rms_why(x, [64], torch.randn(128, dtype=torch.bfloat16)[::2])
    assert "eps" in rms_why(x, [64], w, -1.0)
    assert "eps" in rms_why(x, [64], w, float("nan"))
    assert "empty" in rms_why(torch.empty(0, 64, dtype=torch.bfloat16), [64], w)
    assert "CUDA" in flykernels.torch.explain_rms_norm(x, [64], w, 1e-5, check_device=True)


def topk_why(x, k, dim=-1):
    return flykernels.torch.explain_topk(x, k, dim, check_device=False)


def test_topk_eligibility():
    x = torch.randn(16, 300)
    assert topk_why(x, 8) == ""
    assert topk_why(x, 300) == ""
    assert topk_why(x, 8, dim=1) == ""
    assert topk_why(torch.randn(300), 8) == ""
    assert topk_why(torch.randn(2, 3, 300), 8) == ""
    assert topk_why(torch.randn(16, 600)[:, :300], 8) == ""  # row-strided 2-D is taken
    assert "not contiguous" in topk_why(torch.randn(2, 3, 600)[..., :300], 8)
    assert "dim" in topk_why(x, 8, dim=0)
    assert "k outside" in topk_why(x, 0)
    assert "k outside" in topk_why(x, 301)
    assert "dtype" in topk_why(x.half(), 8)
    assert "dtype" in topk_why(x.double(), 8)
    assert "zero-dimensional" in topk_why(torch.tensor(1.0), 1)
    assert "empty" in topk_why(torch.empty(0, 300), 8)
    assert "CUDA" in flykernels.torch.explain_topk(x, 8, -1, check_device=True)


def test_gemm_candidate_eligibility():
    bf = torch.bfloat16
    M, N, K = 128, 256, 512
    row_a, col_a = ((M, K), (K, 1)), ((M, K), (1, M))
    row_b, col_b = ((K, N), (N, 1)), ((K, N), (1, K))
    for a in (row_a, col_a):
        for b in (row_b, col_b):  # all four layouts
            assert gemm.gemm_shape_ok(bf, bf, bf, *a, *b, (N, 1), "cuda")
    assert gemm.gemm_shape_ok(torch.float16, torch.float16, torch.float16, *row_a, *row_b, (N, 1), "cuda")
    assert not gemm.gemm_shape_ok(torch.float32, torch.float32, torch.float32, *row_a, *row_b, (N, 1), "cuda")
    assert not gemm.gemm_shape_ok(bf, bf, bf, *row_a, *row_b, (N, 1), "cpu")
    assert not gemm.gemm_shape_ok(bf, torch.float16, bf, *row_a, *row_b, (N, 1), "cuda")
    # odd leading dimensions are offered (the cp.async kernel); strided inner dimensions are not
    assert gemm.gemm_shape_ok(bf, bf, bf, (M, 100), (100, 1), (100, N), (N, 1), (N, 1), "cuda")  # lda 100
    assert gemm.gemm_shape_ok(bf, bf, bf, (77, K), (1, 77), (K, N), (1, K + 1), (N, 1), "cuda")  # TN, M = 77
    assert not gemm.gemm_shape_ok(bf, bf, bf, (M, K), (2 * K, 2), *row_b, (N, 1), "cuda")
    assert not gemm.gemm_shape_ok(bf, bf, bf, *row_a, *row_b, (1, M), "cuda")  # column-major out
    import sympy
    s = sympy.Symbol("s0")
    assert not gemm.gemm_shape_ok(bf, bf, bf, (s, K), (K, 1), *row_b, (N, 1), "cuda")


def test_inductor_hook_installs_and_restores(fly):
    if fly.why_not("gemm"):
        pytest.skip(fly.why_not("gemm"))
    import torch._inductor.kernel.mm as mm
    fly.disable()
    original = mm.autotune_select_algorithm
    fly.enable("gemm")
    assert mm.autotune_select_algorithm is not original
    assert mm.autotune_select_algorithm.__wrapped__ is original
    fly.disable("gemm")
    assert mm.autotune_select_algorithm is original


def test_inductor_hook_reaches_providers_and_survives_a_broken_one(fly):
    """A CPU mm under max-autotune goes through the wrapped selector: our GEMM provider declines
    (CPU), a provider that raises is dropped, and the compiled result is right."""
    if fly.why_not("gemm"):
        pytest.skip(fly.why_not("gemm"))
    import torch._inductor.config as ic
    from torch._inductor.utils import run_and_get_code
    from flykernels._ops import inductor
    fly.enable("gemm")
    seen = []

    def broken(choices, nodes, layout):
        seen.append((len(nodes), layout.device.type))
        raise RuntimeError("a broken provider")

    inductor.register_candidates("mm", broken, key="test-broken")
    try:
        a, b = torch.randn(64, 32), torch.randn(32, 16)
        torch._dynamo.reset()
        with ic.patch(force_disable_caches=True):
            out, code = run_and_get_code(torch.compile(lambda x, y: x @ y, mode="max-autotune-no-cudagraphs"), a, b)
    finally:
        inductor.unregister_candidates("mm", "test-broken")
        torch._dynamo.reset()
    assert seen == [(2, "cpu")]
    assert "flykernels" not in "\n".join(code)
    torch.testing.assert_close(out, a @ b)
    assert inductor.registered("mm", "flykernels") and not inductor.registered("mm", "test-broken")


def test_gemm_family_does_not_import_inductor_until_torch_does():
    r = run_py("""
        import sys
        import flykernels.torch as t
        t.enable()
        print("ACTIVE", t.active(), "torch._inductor" in sys.modules)
        import torch._inductor.kernel.mm as mm
        print("WRAPPED", hasattr(mm.autotune_select_algorithm, "__wrapped__"))
        t.disable("gemm")
        print("RESTORED", not hasattr(mm.autotune_select_algorithm, "__wrapped__"))
    """)
    assert r.returncode == 0, r.stderr
    assert ("ACTIVE ['rms_norm', 'topk', 'grouped_mm', 'scaled_mm', 'gemm', 'grouped_mm_compile', 'sdpa', 'sdpa_cudnn',"
            " 'sdpa_bwd', 'patch'] False") in r.stdout
    assert "WRAPPED True" in r.stdout and "RESTORED True" in r.stdout


@pytest.mark.parametrize("env", [{}, {"FLYKERNELS_TORCH": "0"}])
def test_extern_kernels_named_for_cached_graphs(env):
    """Code that Inductor's caches hand back calls extern_kernels.flykernels_* without running a
    lowering: the names exist once Inductor's select_algorithm is imported, families on or off,
    and compute the product (here through the stock ops: CPU tensors)."""
    r = run_py("""
        import torch, flykernels
        from torch._inductor.select_algorithm import extern_kernels as ek
        a, b, bias = torch.randn(5, 7), torch.randn(7, 3), torch.randn(3)
        out = torch.empty(5, 3)
        ek.flykernels_mm(a, b, out=out)
        ok_mm = torch.allclose(out, a @ b, atol=1e-5)
        ek.flykernels_addmm(bias, a, b, out=out)
        ok_addmm = torch.allclose(out, a @ b + bias, atol=1e-5)
        print("NAMED", all(hasattr(ek, n) for n in ("flykernels_mm", "flykernels_addmm", "flykernels_grouped_mm")),
              ok_mm, ok_addmm)
    """, env=env)
    assert r.returncode == 0, r.stderr
    assert "NAMED True True True" in r.stdout


# ---- MX F.scaled_mm -------------------------------------------------------------------------
def mx_operands(M, N, K, fmt="e4m3", device="cpu", swizzled=False):
    dt = torch.float8_e4m3fn if fmt == "e4m3" else torch.float4_e2m1fn_x2
    kb = K if fmt == "e4m3" else K // 2
    a = torch.empty(M, kb, dtype=dt, device=device)
    b = torch.empty(N, kb, dtype=dt, device=device).t()
    if swizzled:
        pad = lambda r: (r + 127) // 128 * 128 * ((K // 32 + 3) // 4 * 4)  # noqa: E731
        sa = torch.empty(pad(M), dtype=torch.float8_e8m0fnu, device=device)
        sb = torch.empty(pad(N), dtype=torch.float8_e8m0fnu, device=device)
    else:
        sa = torch.empty(M, K // 32, dtype=torch.float8_e8m0fnu, device=device)
        sb = torch.empty(N, K // 32, dtype=torch.float8_e8m0fnu, device=device)
    return a, b, sa, sb


def test_scaled_mm_eligibility():
    why = lambda *args, **kw: flykernels.torch.explain_scaled_mm(*args, check_device=False, **kw)  # noqa: E731
    a, b, sa, sb = mx_operands(100, 256, 512)
    assert why(a, b, sa, sb, 0, None, torch.bfloat16) == ""
    assert why(a, b, sa, sb, 0, None, torch.float16) == ""
    assert why(*mx_operands(100, 256, 512, "e2m1"), 0, None, torch.bfloat16) == ""
    assert why(*mx_operands(100, 256, 512, swizzled=True), 1, None, torch.bfloat16) == ""
    assert why(a, b, sa, sb, 0, torch.empty(256, dtype=torch.bfloat16), torch.bfloat16) == ""
    assert "output dtype" in why(a, b, sa, sb, 0, None, torch.float32)
    assert "output dtype" in why(a, b, sa, sb, 0, None, None)
    assert "bias dtype" in why(a, b, sa, sb, 0, torch.empty(256, dtype=torch.float16), torch.bfloat16)
    assert "bias not" in why(a, b, sa, sb, 0, torch.empty(255, dtype=torch.bfloat16), torch.bfloat16)
    assert "padded" in why(a, b, sa, sb, 1, None, torch.bfloat16)  # unswizzled count, swizzled claim
    assert "rows * K/32" in why(a, b, sa[:50], sb, 0, None, torch.bfloat16)
    assert "e8m0" in why(a, b, sa.view(torch.uint8), sb, 0, None, torch.bfloat16)
    assert "column-major" in why(a, b.t().contiguous().t().contiguous(), sa, sb, 0, None, torch.bfloat16)
    assert "row-major" in why(a.t().contiguous().t(), b, sa, sb, 0, None, torch.bfloat16)
    assert "multiple of 32" in why(*mx_operands(100, 256, 48), 0, None, torch.bfloat16)
    assert "mixed" in why(a, mx_operands(100, 256, 512, "e2m1")[1], sa, sb, 0, None, torch.bfloat16)
    f8 = torch.empty(100, 512, dtype=torch.float8_e5m2)
    assert "e4m3" in why(f8, b, sa, sb, 0, None, torch.bfloat16)
    assert "CUDA" in flykernels.torch.explain_scaled_mm(a, b, sa, sb, 0, None, torch.bfloat16)


def test_scaled_mm_meta_traces_no_swizzle_scales_and_disable_restores_stock(fly):
    """FakeTensor (what torch.compile traces with): the stock Meta kernel refuses NO_SWIZZLE MX scales on
    CUDA; ours gives [M, N] of the output dtype for what we take and defers to stock for the rest."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.functional import ScalingType as S, SwizzleType as W

    def call(fmt="e4m3", sw=W.NO_SWIZZLE, out=torch.bfloat16, v1=False):
        a, b, sa, sb = mx_operands(100, 256, 512, fmt, "cuda", swizzled=sw == W.SWIZZLE_32_4_4)
        if v1:
            return torch._scaled_mm(a, b, sa, sb, out_dtype=out)
        return F.scaled_mm(a, b, sa, S.BlockWise1x32, sb, S.BlockWise1x32, swizzle_a=sw, swizzle_b=sw,
                           output_dtype=out)

    fly.disable(["scaled_mm"])
    with FakeTensorMode(), pytest.raises(RuntimeError, match="swizzle"):
        call()
    stock_meta = next(ln for ln in torch._C._dispatch_dump("aten::_scaled_mm_v2").splitlines() if ln.startswith("Meta:"))
    fly.enable(["scaled_mm"])
    assert "flykernels._C" in dispatch_file("aten::_scaled_mm_v2")
    assert "flykernels._C" in dispatch_file("aten::_scaled_mm")
    with FakeTensorMode():
        for fmt in ("e4m3", "e2m1"):
            for sw in (W.NO_SWIZZLE, W.SWIZZLE_32_4_4):
                r = call(fmt, sw)
                assert r.shape == (100, 256) and r.dtype == torch.bfloat16 and r.device.type == "cuda"
        assert call(out=torch.float16).dtype == torch.float16
        assert call(sw=W.SWIZZLE_32_4_4, v1=True).shape == (100, 256)
        with pytest.raises(RuntimeError, match="swizzle"):  # fp32 output: not ours, the stock checks run
            call(out=torch.float32)
    fly.disable(["scaled_mm"])
    assert "flykernels._C" not in dispatch_file("aten::_scaled_mm_v2")
    assert next(ln for ln in torch._C._dispatch_dump("aten::_scaled_mm_v2").splitlines()
                if ln.startswith("Meta:")) == stock_meta
    with FakeTensorMode(), pytest.raises(RuntimeError, match="swizzle"):
        call()


def test_mx_quantize_names_the_problem(fly):
    with pytest.raises(ValueError, match="format"):
        flykernels.torch.mx_quantize(torch.randn(4, 64), "e5m2")
    with pytest.raises(ValueError, match="CUDA"):
        flykernels.torch.mx_quantize(torch.randn(4, 64))


# ---- Inductor grouped GEMM candidate ----------------------------------------------------------
def test_grouped_candidate_shape_rules():
    ok = lambda **kw: gemm.grouped_shape_ok(**{**dict(  # noqa: E731
        a_dtype=torch.bfloat16, b_dtype=torch.bfloat16, offs_dtype=torch.int32, out_dtype=torch.bfloat16,
        a_sizes=(300, 128), a_strides=(128, 1), b_sizes=(4, 128, 256), b_strides=(128 * 256, 256, 1),
        offs_sizes=(4,), out_sizes=(300, 256), out_strides=(256, 1), device_type="cuda"), **kw})
    assert ok()
    assert ok(b_strides=(128 * 256, 1, 128))  # K-contiguous B (w.transpose(-2, -1))
    assert ok(a_dtype=torch.float16, b_dtype=torch.float16, out_dtype=torch.float16)
    assert not ok(device_type="cpu")
    assert not ok(out_dtype=torch.float32)
    assert not ok(offs_dtype=torch.int64)
    assert not ok(b_sizes=(4, 128, 252), b_strides=(128 * 252, 252, 1), out_sizes=(300, 252), out_strides=(252, 1))
    assert not ok(a_strides=(1, 300))  # A column-major
    assert not ok(b_strides=(128 * 256, 256, 2))
    assert not ok(a_sizes=(300, 120), a_strides=(120, 1))  # K of A and B differ
    assert not ok(offs_sizes=(3,))
    assert not ok(out_strides=(1, 300))
    assert not ok(a_sizes=("s0", 128))  # dynamic sizes are not offered


def test_grouped_candidate_family_wraps_the_grouped_lowering_and_restores_it(fly):
    import torch._inductor.kernel.mm_grouped as mg
    fly.disable()  # on a GPU machine the import already wrapped it: start from the stock function
    original = mg.autotune_select_algorithm
    assert not hasattr(original, "__wrapped__")
    fly.enable()
    assert "grouped_mm_compile" in fly.active()  # on by default
    assert mg.autotune_select_algorithm.__wrapped__ is original
    fly.disable(["grouped_mm_compile"])
    assert "grouped_mm_compile" not in fly.active()
    assert mg.autotune_select_algorithm is original  # restored at once, whatever else stays on
    import torch._inductor.kernel.mm as mm
    assert "gemm" in fly.active() and hasattr(mm.autotune_select_algorithm, "__wrapped__")  # the dense stay
    fly.enable(["grouped_mm_compile"])
    fly.disable(["gemm"])
    assert not hasattr(mm.autotune_select_algorithm, "__wrapped__")
    assert mg.autotune_select_algorithm.__wrapped__ is original
    fly.disable(["grouped_mm_compile"])
    assert mg.autotune_select_algorithm is original


def test_scaled_mm_meta_with_symbolic_sizes(fly):
    """Dynamic-shape tracing (symbolic sizes): ours gives [M, N] from the dtypes alone; the stock
    Meta kernel refuses NO_SWIZZLE scales there too."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
    from torch.nn.functional import ScalingType as S, SwizzleType as W

    def run():
        mode = FakeTensorMode(shape_env=ShapeEnv())
        with torch.device("meta"):
            ts = [torch.empty(100, 512, dtype=torch.float8_e4m3fn), torch.empty(256, 512, dtype=torch.float8_e4m3fn),
                  torch.empty(100, 16, dtype=torch.float8_e8m0fnu), torch.empty(256, 16, dtype=torch.float8_e8m0fnu)]
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 2)
        a, bt, sa, sb = (mode.from_tensor(t, symbolic_context=ctx) for t in ts)
        with mode:
            a, bt, sa, sb = (t.to("cuda") for t in (a, bt, sa, sb))
            return F.scaled_mm(a, bt.t(), sa, S.BlockWise1x32, sb, S.BlockWise1x32, swizzle_a=W.NO_SWIZZLE,
                               swizzle_b=W.NO_SWIZZLE, output_dtype=torch.bfloat16)

    fly.enable(["scaled_mm"])
    out = run()
    assert out.dim() == 2 and out.dtype == torch.bfloat16 and out.device.type == "cuda"
    assert not isinstance(out.shape[0], int)  # symbolic M
    fly.disable(["scaled_mm"])
    with pytest.raises(RuntimeError, match="swizzle"):
        run()
