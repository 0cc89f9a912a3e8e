# SPDX-License-Identifier: Apache-2.0
"""CPU tests of the benchmark scripts' own logic (CI: .ci/python.sh runs them with the CPU torch):
bench/grouped_gemm_torch.py's MoE path end to end on a tiny suite in the moe format, with CPU
stand-ins for the device, the library (torch._grouped_mm on the CPU) and the timing; and
bench/gemm_random.py's stride classes and per-class summary."""
import json
import os
import random
import sys
import types

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_random  # noqa: E402
import grouped_gemm_torch as ggt  # noqa: E402


def tiny_moe_suite():
    """Two models' worth of cases in suites/moe.json's format, small enough for the CPU."""
    cases = []
    for model, rows_pre, rows_dec in (("m8", [5, 0, 9, 2, 7, 1, 0, 8], [1, 0, 0, 1, 0, 2, 0, 0]),
                                      ("m4", [3, 6, 2, 5], [0, 1, 1, 0])):
        for phase, rows, passes in (("prefill", rows_pre, ("fwd", "dA", "dB")), ("decode", rows_dec, ("fwd",))):
            for proj, (k, n) in (("gate_up", (64, 96)), ("down", (48, 64))):
                for what in passes:
                    K, N = (n, k) if what == "dA" else (k, n)
                    cases.append({"model": model, "phase": phase, "tokens": sum(rows), "topk": 1, "proj": proj,
                                  "pass": what, "layout": {"fwd": "nt", "dA": "nn", "dB": "mn"}[what],
                                  "kind": phase, "G": len(rows), "K": K, "N": N, "M": rows})
    return {"op": "grouped_gemm", "cases": cases}


@pytest.fixture
def cpu_device(monkeypatch):
    """grouped_gemm_torch's globals pointed at CPU stand-ins: tensors made on the CPU, no-op
    syncs, each contender called once and given a made-up time, and 'ours' computed by
    torch._grouped_mm into the output the real caller would write."""
    def no_device(f):
        def made(*a, **k):
            k.pop("device", None)
            return f(*a, **k)
        return made
    fake = types.SimpleNamespace(**{n: getattr(torch, n) for n in dir(torch) if not n.startswith("__")})
    fake.__version__ = torch.__version__
    fake.randn, fake.empty, fake.tensor = no_device(torch.randn), no_device(torch.empty), no_device(torch.tensor)
    fake.cuda = types.SimpleNamespace(synchronize=lambda: None, empty_cache=lambda: None,
                                      get_device_name=lambda: "cpu stand-in")
    rng = random.Random(7)

    def timed(contenders, rounds, **kw):
        for _, fn in contenders:
            fn()
        return {name: rng.uniform(10, 20) for name, _ in contenders}

    def caller(lib, a, b, offs, c, force=None):
        return lambda: c.copy_(torch._grouped_mm(a, b, offs=offs))

    monkeypatch.setattr(ggt, "torch", fake)
    monkeypatch.setattr(ggt, "interleaved_us", timed)
    monkeypatch.setattr(ggt, "hbm_peak_tbs", lambda override=None: override or 3.35)
    monkeypatch.setattr(ggt, "grouped_caller", caller)
    monkeypatch.setattr(ggt, "ragged_k_caller", caller)
    return types.SimpleNamespace(fly_last_variant=lambda: b"stand_in")


def moe_args(tmp_path, **kw):
    base = dict(suite="tiny", cases=None, models=None, phases=None, passes=None, projs=None, tokens=None,
                mm_loop=True, hbm_tbs=None, json=str(tmp_path / "moe.json"))
    base.update(kw)
    return ggt.argparse.Namespace(**base)


def test_moe_runs_every_case_and_writes_the_summary(cpu_device, tmp_path, capsys):
    suite = tiny_moe_suite()
    assert ggt.main_moe(moe_args(tmp_path), cpu_device, suite) == 0
    out = json.loads((tmp_path / "moe.json").read_text())
    rows = out["rows"]
    assert len(rows) == len(suite["cases"])
    assert all(r["status"] == "ok" and r["err"] == 0.0 and r["variant"] == "stand_in" for r in rows)
    assert {r["pass"] for r in rows} == {"fwd", "dA", "dB"}
    assert set(out["summary"]["per_model_phase"]) == {"m8 prefill", "m8 decode", "m4 prefill", "m4 decode"}
    assert set(out["summary"]["per_pass"]) == {"fwd", "dA", "dB"}
    assert out["summary"]["decode_floor"]["fly_mean"] > 0
    for r in rows:
        assert r["x_grouped_mm"] == pytest.approx(r["grouped_mm_us"] / r["fly_us"])
        assert "x_mm_loop" in r
    text = capsys.readouterr().out
    assert "targets (issue 49)" in text and "decode HBM byte floor" in text


def test_moe_filters(cpu_device, tmp_path):
    suite = tiny_moe_suite()
    args = moe_args(tmp_path, models="m4", phases="prefill", passes="dB", mm_loop=False)
    assert [c["pass"] for _, c in ggt.moe_selected(args, suite)] == ["dB", "dB"]
    assert ggt.main_moe(args, cpu_device, suite) == 0
    rows = json.loads((tmp_path / "moe.json").read_text())["rows"]
    assert [(r["model"], r["pass"]) for r in rows] == [("m4", "dB"), ("m4", "dB")]


def test_moe_wrong_result_is_reported(cpu_device, tmp_path, monkeypatch):
    def wrong(lib, a, b, offs, c, force=None):
        return lambda: c.copy_(torch._grouped_mm(a, b, offs=offs) + 1.0)
    monkeypatch.setattr(ggt, "grouped_caller", wrong)
    args = moe_args(tmp_path, passes="fwd", mm_loop=False)
    assert ggt.main_moe(args, cpu_device, tiny_moe_suite()) == 1
    rows = json.loads((tmp_path / "moe.json").read_text())["rows"]
    assert all(r["status"] == "WRONG" for r in rows)


def test_decode_byte_floor_counts_only_used_experts():
    c = {"pass": "fwd", "M": [0, 3, 0, 1], "K": 64, "N": 32}
    floor, _ = ggt.moe_bytes(c)
    assert floor == (2 * 64 * 32 + 4 * 64 + 4 * 32) * 2


def test_gemm_random_stride_classes():
    s = {"M": 13, "N": 256, "K": 512, "layout": "tn"}
    assert gemm_random.stride_class(s) == "odd"  # A column-major with M = 13 rows per line
    assert gemm_random.stride_class(dict(s, layout="nt")) == "aligned"
    assert gemm_random.stride_class(dict(s, layout="nn", lda_extra=1)) == "odd"
    assert gemm_random.stride_class(s, "gemm:nt", "gemm_bf16_bn128") == "aligned"  # the library's routing wins
    assert gemm_random.stride_class(s, "gemm:nt:packed", "gemm_bf16_bn128") == "odd"
    assert gemm_random.stride_class(s, "gemm", "gemm_odd_bf16_bn128") == "odd"
    rows = [dict(M=i, N=8, K=8, dtype="bf16", layout="nn", bias=False, ratio=r, fly_us=1.0, torch_us=r, variant="v",
                 **{"class": cls}) for i, (r, cls) in enumerate([(0.5, "aligned"), (2.0, "aligned"), (0.8, "odd"),
                                                                 (1.25, "odd"), (1.0, "aligned")])]
    classes, lines = gemm_random.class_summary(rows, worst=2)
    assert classes["aligned"]["shapes"] == 3 and classes["odd"]["shapes"] == 2
    assert classes["aligned"]["geomean"] == pytest.approx(1.0)
    assert classes["aligned"]["below_0.85"] == 1 and classes["odd"]["below_0.85"] == 1
    assert [w["ratio"] for w in classes["aligned"]["worst"]] == [0.5, 1.0]
    assert any("NOT met" in ln for ln in lines)  # aligned: one shape below 0.85x


# ---- bench/e2e.py generate (issue 48): the smoke run on the CPU, and the hand-rolled static-cache loop

def _e2e():
    pytest.importorskip("transformers", reason="transformers is not installed (bench/e2e.py needs it)")
    import e2e
    return e2e


def test_generate_loop_matches_hf_generate():
    """GenRunner's static-cache greedy loop (prefill, then decode steps on static tensors: what the
    CUDA graph captures) gives the tokens of Hugging Face's own greedy generate()."""
    e2e = _e2e()
    import transformers as tf
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                         intermediate_size=128, vocab_size=256, num_hidden_layers=2, max_position_embeddings=512)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float().eval()
    import inspect
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    prompt = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    run = e2e.GenRunner(model, cache_kw, prompt, 10, "eager", torch.device("cpu"))
    warm = run.prepare(3)
    run.rewind()
    run.prefill()
    run.decode()
    ours = run.out.clone()
    assert torch.equal(ours[:, :4], warm)
    with torch.no_grad():
        ref = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, do_sample=False,
                             min_new_tokens=10, pad_token_id=0)
    assert torch.equal(ours, ref[:, 12:])


def test_generate_smoke_report(tmp_path):
    """bench/e2e.py generate --smoke on the CPU: every configuration reported with its fields (MX
    runs the torch emulation here, or is skipped with a reason where flykernels does not import)."""
    _e2e()
    import subprocess
    out = tmp_path / "gen.json"
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e.py")
    p = subprocess.run([sys.executable, script, "generate", "--smoke", "--device", "cpu", "--batches", "1,2",
                        "--gen", "6", "--reps", "1", "--ttft-reps", "1", "--json", str(out),
                        "--png", str(tmp_path / "gen.png")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "decode tok/s" in p.stdout
    assert (tmp_path / "gen.png").exists() or "matplotlib missing: no chart" in p.stdout
    rep = json.loads(out.read_text())
    assert rep["mode"] == "generate"
    s = rep["settings"]
    assert s["batches"] == [1, 2] and s["gen"] == 6 and s["graph"] == "eager" and s["skip"] == ["lm_head"]
    cfgs = {c["name"]: c for c in rep["configs"]}
    assert list(cfgs) == ["bf16", "mxfp8-bf16", "mxfp8-mx", "mxfp4-bf16", "mxfp4-mx"]
    bf = cfgs["bf16"]
    assert bf["status"] == "ok" and bf["weight_bytes"] > 0
    for name, c in cfgs.items():
        if c["status"] != "ok":  # only MX, and only where flykernels does not import
            assert name != "bf16" and "flykernels" in c["reason"]
            continue
        assert [r["batch"] for r in c["batches"]] == [1, 2]
        for r in c["batches"]:
            assert r["decode_tok_s"] > 0 and r["ttft_ms"] > 0 and r["ms_per_step"] > 0
            assert r["decode_steps"] == 5 and r["graph"] == "eager"
            assert r["repeat_identical"] and r["graph_matches_warmup"]
            if name == "bf16":
                assert "token_agreement" not in r and "tokens" not in r
            else:
                assert 0.0 <= r["token_agreement"] <= 1.0 and 0.0 <= r["prefix_agreement"] <= 1.0
                assert r["logits_cos_mean"] > 0.95 and r["logits_cos_min"] <= r["logits_cos_mean"] + 1e-12
        if name != "bf16":
            assert c["format"] in ("mxfp8", "mxfp4") and c["mx_layers"] > 0
            assert c["weight_bytes"] < bf["weight_bytes"]
            assert "no CUDA device" in c["mx_note"]
            assert rep["summary"][name]["weights_smaller_x"] > 1.0
            assert set(rep["summary"][name]["decode_x"]) == {"1", "2"}
    if all(c["status"] == "ok" for c in cfgs.values()):  # MXFP4 packs tighter than MXFP8
        assert cfgs["mxfp4-bf16"]["weight_bytes"] < cfgs["mxfp8-bf16"]["weight_bytes"]


def test_fp32_reference_verdicts(tmp_path):
    """bench/e2e.py --fp32-ref on the CPU (both states run stock here, so on and off agree): every
    mode gets both states' distance from the FP32 copy (and the gradients' in training), equal."""
    _e2e()
    import subprocess
    out = tmp_path / "e2e.json"
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e.py")
    p = subprocess.run([sys.executable, script, "--smoke", "--device", "cpu", "--models", "qwen3moe", "--no-compile",
                        "--no-patch", "--fp32-ref", "--batches", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert {r["mode"] for r in rows} == {"prefill", "decode", "train"}
    for r in rows:
        on, off = r["out_on_vs_fp32"]["rel_l2"], r["out_off_vs_fp32"]["rel_l2"]
        assert 0 < off < 0.1 and on == off and r["ok"], r
        if r["mode"] == "train":
            assert r["grads_on_vs_fp32"]["rel_l2"] == r["grads_off_vs_fp32"]["rel_l2"] > 0
