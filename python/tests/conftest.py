# SPDX-License-Identifier: Apache-2.0
import os
import sys

import pytest

# Test the installed package, never the source folder beside these tests (it has no _C).
_src = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _src]

torch = pytest.importorskip("torch", reason="torch is not installed")
flykernels = pytest.importorskip("flykernels", reason="the flykernels package is not installed")


@pytest.fixture(autouse=True)
def _opt_in_patch_families(monkeypatch):
    """The tests run patch() with add_rms_norm and moe on whatever the shipped package's defaults
    (_patch.SHIPPED_DEFAULTS, which can switch a family off while it waits for a GPU run);
    test_cpu_patch.py checks the shipped defaults themselves."""
    from flykernels import _patch
    monkeypatch.setattr(_patch, "_defaults", {"add_rms_norm": True, "moe": True})


@pytest.fixture
def patch_on():
    """The "patch" family on for the test (the patched layers run the fused ops only while it is on;
    off where FlyKernels does not run, as on a CPU machine), its previous state back afterwards."""
    before = flykernels.torch.active()
    flykernels.torch.enable(["patch"])
    yield
    flykernels.torch.disable(["patch"])
    flykernels.torch.enable(before)


def require_experts_impl(transformers, impl):
    """Skip, naming it, where this transformers release has no such experts_implementation (an
    unknown name fails only at the first forward)."""
    if impl == "eager":
        return
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no experts_implementation registry")
    if impl not in ALL_EXPERTS_FUNCTIONS:
        pytest.skip(f"transformers {transformers.__version__} has no experts_implementation={impl}")


@pytest.fixture
def fly():
    """The controller, with every family back in its starting state afterwards."""
    ctl = flykernels.torch
    before = ctl.active()
    ctl.reset_counts()
    yield ctl
    ctl.disable()
    if before:
        ctl.enable(before)


def gpu_reason():
    if not torch.cuda.is_available():
        return "no CUDA device"
    if not flykernels.available:
        return f"flykernels not available here: {flykernels.reason}"
    return ""


needs_gpu = pytest.mark.skipif(bool(gpu_reason()), reason=gpu_reason() or "gpu")


@pytest.fixture(autouse=True)
def _ours_where_eligible(request):
    """The kernel tests (test_gpu*.py) check our kernels, so every eligible call runs ours there
    whatever the decision rows say (flykernels.torch.forced("ours")); the decision tests
    (test_*decisions*.py) see the rows."""
    name = request.module.__name__
    if "test_gpu" not in name or "decisions" in name:
        yield
        return
    with flykernels.torch.forced("ours"):
        yield


def sdpa_off_cudnn():
    """SDPA's stock backends without cuDNN: on small Hugging Face models cuDNN's SDPA allocates a
    workspace inside a CUDA-graph capture (CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, H100,
    torch 2.11), which invalidates the capture and leaves the context unusable for later tests. For
    graph tests about other layers than attention."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def graph_logits(model, ids):
    """The logits of model(input_ids=ids) captured in a CUDA graph and replayed once: two warm-up
    calls on a side stream first (lazy kernel loads and allocator growth happen outside the capture,
    as torch.cuda.graphs requires)."""
    static_ids = ids.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            model(input_ids=static_ids, use_cache=False)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = model(input_ids=static_ids, use_cache=False).logits
    g.replay()
    torch.cuda.synchronize()
    return out
