# SPDX-License-Identifier: Apache-2.0
"""flykernels.patch on Hugging Face models (small configs, random weights, bf16, on the GPU):
logits and gradients of the patched model against the same model unpatched, eager, under
torch.compile and in a CUDA graph; every RMSNorm module of each family patched, and its MLPs or
experts' gate (flykernels::glu)."""
import pytest
import torch

import flykernels

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not flykernels.available,
                                reason="needs a CUDA device FlyKernels runs on")
transformers = pytest.importorskip("transformers")

FAMILIES = {  # config class: extra config fields
    "LlamaConfig": {},
    "MistralConfig": {},
    "Qwen2Config": {},
    "Qwen3Config": {},
    "Qwen3MoeConfig": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64),
    "MixtralConfig": dict(num_local_experts=4, num_experts_per_tok=2),
    "Gemma2Config": dict(head_dim=32),
    "Gemma3TextConfig": dict(head_dim=32),
}


def _model(cfg_name):
    cfg_cls = getattr(transformers, cfg_name, None)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cfg_name}")
    cfg = cfg_cls(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, **FAMILIES[cfg_name])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model = model.to(device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:  # fresh norms are all ones / zeros: a dropped weight would go unnoticed
                p.normal_(0.0, 0.5)
    return model


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _norm_count(model):
    return sum(1 for m in model.modules() if type(m).__name__.endswith("RMSNorm"))


@pytest.mark.parametrize("cfg_name", list(FAMILIES))
def test_patched_model_matches_stock(cfg_name):
    model = _model(cfg_name)
    ids = torch.randint(0, 512, (2, 48), device="cuda")

    def run():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                     if p.grad is not None and any(t in n for t in ("norm", "mlp", "experts"))}
    ref_logits, ref_grads = run()
    report = flykernels.patch(model)
    try:
        assert report["skipped"] == {}
        norms = sum(c for k, c in report["patched"].items() if k.endswith("RMSNorm"))
        assert norms == _norm_count(model) > 0
        assert sum(report["patched"].values()) > norms  # the MLPs or the experts' gate as well
        logits, grads = run()
        assert _rel(logits, ref_logits) < 2e-2
        assert grads.keys() == ref_grads.keys()
        for n in grads:
            assert _rel(grads[n], ref_grads[n]) < 5e-2, n
    finally:
        assert flykernels.unpatch(model) == sum(report["patched"].values())


def test_patched_model_compiles_and_graphs():
    model = _model("LlamaConfig").eval()
    ids = torch.randint(0, 512, (1, 64), device="cuda")
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        flykernels.patch(model)
        try:
            torch._dynamo.reset()
            compiled = torch.compile(model, fullgraph=False)
            got = compiled(input_ids=ids).logits
            assert _rel(got, ref) < 2e-2
            # A CUDA graph of the patched eager forward replays what it captured.
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
            assert _rel(out, ref) < 2e-2
        finally:
            flykernels.unpatch(model)
            torch._dynamo.reset()
