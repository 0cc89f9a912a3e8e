# SPDX-License-Identifier: Apache-2.0
"""FlyKernels through Hugging Face's `kernels` package on the GPU (flykernels/hub): tiny Llama /
Qwen3 models (random weights, bf16) kernelized with our mapping (flykernels.kernelize, and
transformers' own set_use_kernels with a KernelConfig naming our local repository) against the
same model stock: logits and gradients within the patch's tolerances, our ops counted as having
run, torch.compile and a CUDA graph, and unkernelize giving the stock forward back.

Needs transformers and kernels 0.16.x (transformers 5.17 takes no other); the GPU machine's image
has neither kernels nor kernels-data: carry their wheels (pip download --no-deps 'kernels==0.16.2'
'kernels-data==0.16.2' into .whl/) and install them there with
`pip install --no-deps --no-index --target /tmp/kpkgs .whl/kernels*.whl` + PYTHONPATH=/tmp/kpkgs."""
import pytest
import torch

import flykernels
from conftest import graph_logits
from flykernels import _hub
from flykernels.hub import layers

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not flykernels.available,
                                reason="needs a CUDA device FlyKernels runs on")
transformers = pytest.importorskip("transformers")
try:
    kernels = _hub._kernels()
except ImportError as e:
    pytest.skip(f"`kernels` not usable here: {e}", allow_module_level=True)

FAMILIES = {"LlamaConfig": {}, "Qwen3Config": {}}


def _model(cfg_name):
    cfg = getattr(transformers, cfg_name)(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, vocab_size=512, **FAMILIES[cfg_name])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model = model.to(device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:  # fresh norms are all ones: a dropped weight would go unnoticed
                p.normal_(0.0, 0.5)
    if not hasattr(type(model.model.norm), "kernel_layer_name"):
        pytest.skip(f"transformers {transformers.__version__} does not decorate its layers with kernels "
                    f"{kernels.__version__}")
    return model


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _norms(model):
    return sum(1 for m in model.modules() if type(m).__name__.endswith("RMSNorm"))


def _ours(model):
    """Modules (and kernels' function wrappers) whose forward is one of our layers'."""
    return sum(1 for t, _, _ in _hub._targets(model) if _hub._ours(t.__dict__.get("forward")))


@pytest.mark.parametrize("cfg_name", list(FAMILIES))
def test_kernelized_model_matches_stock_and_runs_ours(cfg_name, fly):
    model = _model(cfg_name).train()
    ids = torch.randint(0, 512, (2, 48), device="cuda")

    def run():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                     if p.grad is not None and any(t in n for t in ("norm", "q_proj", "k_proj"))}
    ref_logits, ref_grads = run()
    report = flykernels.kernelize(model)  # mode TRAINING: the model is in train()
    try:
        assert report["skipped"] == {}
        assert sum(c for k, c in report["kernelized"].items() if k.endswith("RMSNorm")) == _norms(model) > 0
        assert any(k.startswith("rotary_pos_emb") for k in report["kernelized"])
        fly.reset_counts()
        logits, grads = run()
        counts = fly.dispatch_counts()
        # every norm reached F.rms_norm's override, ours where it takes the shape (forced: the fixture)
        assert sum(counts["rms_norm"]) == _norms(model) and counts["rms_norm"][0] > 0
        assert counts["rope"] == (2, 0) and counts["rope_bwd"] == (2, 0)  # one call per layer, each ours
        assert _rel(logits, ref_logits) < 2e-2
        assert grads.keys() == ref_grads.keys()
        for n in grads:
            assert _rel(grads[n], ref_grads[n]) < 5e-2, n
    finally:
        assert flykernels.unkernelize(model) == sum(report["kernelized"].values())
    assert _ours(model) == 0
    assert torch.equal(run()[0], ref_logits)


def test_kernelized_model_compiles_and_graphs(fly):
    model = _model("LlamaConfig").eval()
    ids = torch.randint(0, 512, (1, 64), device="cuda")
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        flykernels.kernelize(model)
        try:
            torch._dynamo.reset()
            fly.reset_counts()
            compiled = torch.compile(model, fullgraph=False)
            got = compiled(input_ids=ids).logits
            assert _rel(got, ref) < 2e-2
            assert fly.dispatch_counts()["rope"][0] > 0  # the compiled graph calls flykernels::rope
            # A CUDA graph of the kernelized eager forward replays what it captured.
            assert _rel(graph_logits(model, ids), ref) < 2e-2
        finally:
            flykernels.unkernelize(model)
            torch._dynamo.reset()


def test_transformers_kernel_config_with_our_repository(fly):
    """transformers' own path: set_use_kernels with a KernelConfig naming flykernels/hub as a local
    repository (from_pretrained(use_kernels=True, kernel_config=...) takes the same config; in
    transformers 5.17 its local-repository branch fails on its own rewritten mapping, see
    docs/pytorch.md)."""
    model = _model("LlamaConfig").eval()
    ids = torch.randint(0, 512, (2, 32), device="cuda")
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    config = transformers.KernelConfig(kernel_mapping=flykernels.kernel_config_mapping(model), use_local_kernel=True)
    model.set_use_kernels(True, config)
    try:
        # KernelConfig registers the repository for the mode current at set_use_kernels (here
        # INFERENCE); train() kernelizes again as TRAINING, which kernels does not serve from an
        # INFERENCE entry: the own forwards, until eval() kernelizes as INFERENCE again
        # (docs/pytorch.md; flykernels.kernelize maps every mode).
        assert _ours(model) == _norms(model) + 1
        model.train()
        assert _ours(model) == 0
        model.eval()
        assert model.model.norm.forward.__func__ is layers.RMSNorm.forward
        assert _ours(model) == _norms(model) + 1  # the norms and Llama's rotary wrapper
        fly.reset_counts()
        with torch.no_grad():
            got = model(input_ids=ids).logits
        counts = fly.dispatch_counts()
        assert sum(counts["rms_norm"]) == _norms(model) and counts["rms_norm"][0] > 0 and counts["rope"] == (2, 0)
        assert _rel(got, ref) < 2e-2
        with flykernels.torch.disabled():  # the controller's switch: the modules' own forwards
            with torch.no_grad():
                assert torch.equal(model(input_ids=ids).logits, ref)
    finally:
        assert flykernels.unkernelize(model) == _norms(model) + 1
    assert not model.use_kernels
    model.train()  # would re-kernelize a model transformers still marks as using kernels
    assert _ours(model) == 0
    with torch.no_grad():
        assert torch.equal(model.eval()(input_ids=ids).logits, ref)


def test_silu_and_mul_layer_runs_the_fused_glu(fly):
    @kernels.use_kernel_forward_from_hub("SiluAndMul")
    class SiluAndMul(torch.nn.Module):
        def forward(self, x):
            d = x.shape[-1] // 2
            return torch.nn.functional.silu(x[..., :d]) * x[..., d:]

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), SiluAndMul()).to(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ref = model(x)
    (gref,) = torch.autograd.grad(ref.float().square().sum(), x)
    report = flykernels.kernelize(model)
    assert report == {"kernelized": {"SiluAndMul": 1}, "skipped": {}}
    fly.reset_counts()
    got = model(x)
    (g,) = torch.autograd.grad(got.float().square().sum(), x)
    assert fly.dispatch_counts()["glu"] == (1, 0) and fly.dispatch_counts()["glu_bwd"] == (1, 0)
    assert _rel(got, ref) < 1e-2 and _rel(g, gref) < 2e-2
    assert flykernels.unkernelize(model) == 1
