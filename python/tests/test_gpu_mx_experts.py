# SPDX-License-Identifier: Apache-2.0
"""MX expert weights (flykernels.nn.MXExperts, quantize_ on fused experts) on the GPU: the expert
bytes fly_mx_quantize writes against the torch-ops quantizer on the CPU (both layouts), and tiny
Hugging Face Qwen3-MoE / gpt-oss models in BF16 (grouped_mm experts): logits against the same model
holding the dequantized weights, and the quantized model in a CUDA graph. The compute path is
dequantize + the model's own forward (no MX grouped GEMM yet), so these check correctness on the
device, not speed."""
import copy

import pytest
import torch

import flykernels
from flykernels import _mx
from flykernels.nn import MXExperts
from conftest import require_experts_impl

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not flykernels.available,
                                reason="needs a CUDA device FlyKernels runs on")
DEV = "cuda"


def rel_err(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
@pytest.mark.parametrize("transposed", [False, True])
def test_expert_bytes_equal_the_torch_quantizer(fmt, transposed):
    torch.manual_seed(0)
    w = (torch.randn(4, 96, 256) * torch.exp2(torch.randint(-4, 5, (4, 1, 256)).float())).to(torch.bfloat16)
    src = w.transpose(-2, -1).contiguous() if transposed else w
    q, s = _mx.quantize_experts(src.to(DEV), fmt, transposed)  # fly_mx_quantize on CUDA
    qc, sc = _mx.quantize_experts(src, fmt, transposed)         # torch ops on the CPU
    assert q.is_cuda and torch.equal(q.cpu(), qc) and torch.equal(s.cpu(), sc)
    back = _mx.dequantize_experts(q, s, fmt, torch.bfloat16, transposed)
    assert torch.equal(back.cpu(), _mx.dequantize_experts(qc, sc, fmt, torch.bfloat16, transposed))


CONFIGS = {
    "Qwen3MoeConfig": dict(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128, norm_topk_prob=True),
    "GptOssConfig": dict(num_local_experts=8, num_experts_per_tok=2, head_dim=64,
                         layer_types=["full_attention", "full_attention"]),
}


def _hf_pair(cfg_name, fmt):
    """(the quantized model, the same model holding the dequantized weights, ids), BF16 on the GPU."""
    transformers = pytest.importorskip("transformers")
    cfg_cls = getattr(transformers, cfg_name, None)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cfg_name}")
    require_experts_impl(transformers, "grouped_mm")
    cfg = cfg_cls(hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, **CONFIGS[cfg_name])
    torch.manual_seed(0)
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation="grouped_mm")
    except (TypeError, ValueError, KeyError) as e:
        pytest.skip(f"experts_implementation=grouped_mm: {e}")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "experts" in n or "router" in n or n.endswith("gate.weight"):
                p.normal_(0.0, 0.05)
    model = model.to(DEV, torch.bfloat16).eval()
    dense = copy.deepcopy(model)
    flykernels.quantize_(model, fmt, skip=["lm_head"])
    experts = [(n, m) for n, m in model.named_modules() if isinstance(m, MXExperts)]
    assert len(experts) == 2 and experts[0][1].gate_up_proj_qweight.device.type == DEV
    with torch.no_grad():
        for n, m in experts:
            for wn, w in m.dequantize().items():
                getattr(dense.get_submodule(n), wn).copy_(w)
        for n, m in model.named_modules():
            if isinstance(m, flykernels.nn.MXLinear):
                dense.get_submodule(n).weight.copy_(m.dequantize())
    ids = torch.randint(0, 512, (2, 40), device=DEV)
    return model, dense, ids


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
@pytest.mark.parametrize("cfg_name", list(CONFIGS))
def test_hf_moe_logits_against_the_dequantized_model(cfg_name, fmt):
    model, dense, ids = _hf_pair(cfg_name, fmt)
    with torch.no_grad():
        a, b = model(input_ids=ids).logits.float(), dense(input_ids=ids).logits.float()
    # the same BF16 weights and ops, except the MXLinear projections' own GEMM path
    assert rel_err(a, b) < 2e-2


@pytest.mark.parametrize("cfg_name", list(CONFIGS))
def test_hf_moe_cuda_graph(cfg_name):
    from conftest import graph_logits, sdpa_off_cudnn
    model, _, ids = _hf_pair(cfg_name, "mxfp4")
    with torch.no_grad(), sdpa_off_cudnn():
        a = model(input_ids=ids, use_cache=False).logits.float()
        g = graph_logits(model, ids)
    assert rel_err(g, a) < 1e-2
