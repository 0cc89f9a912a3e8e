# SPDX-License-Identifier: Apache-2.0
"""GPU tests of the decisions: an eligible call whose row says stock reaches the stock kernel, one
whose row says ours runs ours, the nearest row's margin, autotune timing both sides and caching,
and the tuner writing rows the overrides find again."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from flykernels import _decisions, _loader
from conftest import needs_gpu

pytestmark = needs_gpu
ext = _loader.ext


@pytest.fixture
def rows(fly):
    tag = _decisions.device_tag()

    def install(rs):
        ext.set_decision_rows([(tag, *r, "test") for r in rs])
    fly.enable()
    yield install
    ext.set_autotune(False, None)
    _decisions.load()


def _rms_key(x, w):
    key = ext.key_rms_norm(x, [x.shape[-1]], w, 1e-6)
    assert key is not None
    return key


def test_row_saying_stock_reaches_stock_and_ours_reaches_ours(rows, fly):
    x = torch.randn(512, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    op, dt, lay, *k = _rms_key(x, w)
    rows([(op, dt, lay, *k, 10.0, 9.0)])
    fly.reset_counts()
    ref = F.rms_norm(x, [4096], w, 1e-6)
    assert fly.dispatch_counts()["rms_norm"] == (0, 1)
    assert fly.explain_rms_norm(x, [4096], w, 1e-6) == "tuned: stock, ours 0.90x"
    rows([(op, dt, lay, *k, 10.0, 12.0)])
    fly.reset_counts()
    got = F.rms_norm(x, [4096], w, 1e-6)
    assert fly.dispatch_counts()["rms_norm"] == (1, 0)
    assert fly.explain_rms_norm(x, [4096], w, 1e-6) == "tuned: ours 1.20x"
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


def test_no_row_means_stock_for_every_override(rows, fly):
    rows([])
    fly.reset_counts()
    x = torch.randn(64, 1000, device="cuda")
    torch.topk(x, 5)
    q = torch.randn(1, 8, 256, 128, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    c = fly.dispatch_counts()
    assert c["topk"][0] == 0 and c["topk"][1] >= 1
    assert sum(v[0] for k, v in c.items() if k.startswith("sdpa")) == 0


def test_nearest_row_needs_the_margin(rows, fly):
    x = torch.randn(300, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    op, dt, lay, N, M, *_ = _rms_key(x, w)
    rows([(op, dt, lay, N, M * 2, 0, 0, 10.0, 10.1)])
    fly.reset_counts()
    F.rms_norm(x, [4096], w, 1e-6)
    assert fly.dispatch_counts()["rms_norm"] == (0, 1)
    rows([(op, dt, lay, N, M * 2, 0, 0, 10.0, 11.0)])
    fly.reset_counts()
    F.rms_norm(x, [4096], w, 1e-6)
    assert fly.dispatch_counts()["rms_norm"] == (1, 0)


def test_autotune_times_both_and_caches(rows, fly, tmp_path, monkeypatch):
    monkeypatch.setenv("FLYKERNELS_CACHE_DIR", str(tmp_path))
    rows([])
    _decisions.set_autotune(True)
    x = torch.randn(8192, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    F.rms_norm(x, [4096], w, 1e-6)
    rule = fly.explain_rms_norm(x, [4096], w, 1e-6)
    assert rule.startswith("autotune: "), rule
    cached = _decisions.read_rows(_decisions.autotune_path())
    assert len(cached) == 1 and cached[0][1] == "rms_norm" and cached[0][8] > 0 and cached[0][9] > 0
    # a CUDA graph capture never measures: the rows (none here) decide, stock
    g = torch.cuda.CUDAGraph()
    z = torch.randn(16, 1024, dtype=torch.bfloat16, device="cuda")
    wz = torch.randn(1024, dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            out = F.rms_norm(z, [1024], wz, 1e-6)
    g.replay()
    torch.cuda.synchronize()
    assert len(_decisions.read_rows(_decisions.autotune_path())) == 1  # z's key was not measured
    torch.testing.assert_close(out, F.rms_norm(z, [1024], wz, 1e-6))


def test_tune_writes_rows_the_overrides_find(tmp_path):
    db = tmp_path / "tuned.sqlite"
    dump = tmp_path / "tuned.sql"
    env = dict(os.environ, FLYKERNELS_CACHE_DIR=str(tmp_path))
    suites = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "suites")
    r = subprocess.run([sys.executable, "-m", "flykernels", "tune", "--ops", "rms_norm,topk", "--no-models",
                        "--suite", suites, "--quick", "--db", str(db), "--dump", str(dump)],
                       capture_output=True, text=True, env=env, cwd="/", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    got = _decisions.read_rows(db)
    assert len(got) >= 20 and {g[1] for g in got} == {"rms_norm", "topk"}
    assert sorted(_decisions.read_rows(dump)) == sorted(_decisions.read_rows(db, str(dump)))
