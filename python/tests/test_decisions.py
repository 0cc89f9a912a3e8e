# SPDX-License-Identifier: Apache-2.0
"""The never-slower decisions (python/csrc/decisions.cpp, flykernels/_decisions.py), CPU-side: rows,
exact and nearest keys, the margin, card preference, force, sources and their precedence, the
cache file under concurrent writers, autotune's callback and its capture rule."""
import os
import multiprocessing
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flykernels
from flykernels import _decisions, _loader, _tune

ext = _loader.ext
pytestmark = pytest.mark.skipif(ext is None, reason="the extension did not load")
TAG = "sm_90a:H100"


def row(op, k, ours, stock, layout="w", dtype="bf16", arch=TAG, source="test"):
    k = list(k) + [0] * (4 - len(k))
    return (arch, op, dtype, layout, *k, float(ours), float(stock), source)


@pytest.fixture
def rows():
    """Installs rows for a test and restores the loaded ones (and tag, autotune, force) after."""
    saved_tag = _decisions.device_tag()

    def install(rs, tag=TAG):
        ext.set_device_tag(tag)
        ext.set_decision_rows(rs)
    yield install
    ext.set_autotune(False, None)
    ext.set_forced(0)
    ext.set_forced_process(0)
    ext.set_device_tag(saved_tag)
    _decisions.load()


def test_exact_row_decides_both_ways(rows):
    rows([row("rms_norm", [4096, 8192], 10.0, 13.1), row("rms_norm", [4096, 64], 5.0, 4.65)])
    assert ext.decide("rms_norm", "bf16", "w", 4096, 8192) == (True, "tuned: ours 1.31x")
    assert ext.decide("rms_norm", "bf16", "w", 4096, 64) == (False, "tuned: stock, ours 0.93x")


def test_no_row_is_stock(rows):
    rows([row("rms_norm", [4096, 8192], 10.0, 13.1)])
    assert ext.decide("topk", "fp32", "largest", 128, 8, 4096) == (False, "no row: stock")
    # another dtype or layout is another group: no row either
    assert ext.decide("rms_norm", "fp16", "w", 4096, 8192) == (False, "no row: stock")
    assert ext.decide("rms_norm", "bf16", "nw", 4096, 8192) == (False, "no row: stock")


def test_nearest_row_with_margin(rows):
    rows([row("rms_norm", [4096, 8192], 10.0, 10.1),  # 1.01x: inside the margin
          row("rms_norm", [1024, 16], 10.0, 11.0)])   # 1.10x
    ours, rule = ext.decide("rms_norm", "bf16", "w", 4096, 9000)
    assert not ours and rule.startswith("nearest: stock, ours 1.01x at [4096, 8192, 0, 0]") and "< 1.02x" in rule
    ours, rule = ext.decide("rms_norm", "bf16", "w", 1024, 32)
    assert ours and rule == "nearest: ours 1.10x at [1024, 16, 0, 0]"
    # the nearest by log2 distance, not the first row
    rows([row("rms_norm", [1024, 16], 10.0, 11.0), row("rms_norm", [8192, 16384], 10.0, 9.0)])
    assert ext.decide("rms_norm", "bf16", "w", 8192, 8192)[1].startswith("nearest: stock, ours 0.90x at [8192, 16384")


def test_margin_is_two_percent(rows):
    rows([row("grouped_mm", [1536, 2048, 4096, 64], 100.0, 101.9, layout="b_nk")])
    assert not ext.decide("grouped_mm", "bf16", "b_nk", 1536, 2048, 4000, 64)[0]
    rows([row("grouped_mm", [1536, 2048, 4096, 64], 100.0, 102.1, layout="b_nk")])
    assert ext.decide("grouped_mm", "bf16", "b_nk", 1536, 2048, 4000, 64)[0]


def test_own_card_rows_first_then_other_card_of_the_arch(rows):
    own = row("mm", [4096, 4096, 64], 10.0, 9.0, layout="nt")
    other = row("mm", [4096, 4096, 64], 10.0, 12.0, layout="nt", arch="sm_90a:H200")
    rows([own, other])
    assert ext.decide("mm", "bf16", "nt", 4096, 4096, 64) == (False, "tuned: stock, ours 0.90x")
    rows([other])  # only the H200's: they serve the H100
    assert ext.decide("mm", "bf16", "nt", 4096, 4096, 64) == (True, "tuned: ours 1.20x")
    rows([row("mm", [4096, 4096, 64], 10.0, 12.0, layout="nt", arch="sm_100a:B200")])  # another arch: no
    assert ext.decide("mm", "bf16", "nt", 4096, 4096, 64) == (False, "no row: stock")


def test_later_rows_win_and_answers_are_recomputed_when_rows_change(rows):
    rows([row("topk", [128, 8, 64], 10.0, 20.0, layout="largest", dtype="fp32"),
          row("topk", [128, 8, 64], 10.0, 5.0, layout="largest", dtype="fp32")])
    assert ext.decide("topk", "fp32", "largest", 128, 8, 64)[0] is False
    rows([row("topk", [128, 8, 64], 10.0, 20.0, layout="largest", dtype="fp32")])
    assert ext.decide("topk", "fp32", "largest", 128, 8, 64)[0] is True


def test_forced_is_restored(rows):
    rows([])
    with flykernels.torch.forced("ours"):
        assert ext.decide("rms_norm", "bf16", "w", 1, 1) == (True, "forced: ours")
        with flykernels.torch.forced("stock"):
            assert ext.decide("rms_norm", "bf16", "w", 1, 1) == (False, "forced: stock")
        assert ext.forced() == 1
    assert ext.forced() == 0
    assert ext.decide("rms_norm", "bf16", "w", 1, 1) == (False, "no row: stock")
    with pytest.raises(ValueError, match="forced"):
        flykernels.torch.forced("fastest")


def test_forced_reaches_other_threads_unless_thread_only(rows):
    """The autograd engine runs CUDA backward ops on its own thread: a forced() block around a
    backward must force that thread too (process=True, the default); autotune's own timing forces
    only its thread (process=False)."""
    import threading
    rows([])

    def seen_elsewhere():
        got = []
        t = threading.Thread(target=lambda: got.append(ext.decide("rms_norm", "bf16", "w", 1, 1)))
        t.start()
        t.join()
        return got[0]
    with flykernels.torch.forced("ours"):
        assert seen_elsewhere() == (True, "forced: ours")
        with flykernels.torch.forced("stock", process=False):
            assert ext.decide("rms_norm", "bf16", "w", 1, 1) == (False, "forced: stock")
            assert seen_elsewhere() == (True, "forced: ours")
        assert ext.forced_state() == (1, 1)
    assert ext.forced_state() == (0, 0)
    assert seen_elsewhere() == (False, "no row: stock")


def test_autotune_measures_an_unseen_key_once_and_caches(rows):
    rows([])
    calls = []

    def cb(key, op, overload, args):
        calls.append((key, op, overload, args))
        return 10.0, 15.0
    ext.set_autotune(True, cb)
    x = torch.ones(3)
    r1 = ext.decide_timed("rms_norm", "bf16", "w", [64, 2], "aten::_fused_rms_norm", "", [x, [3], None, 1e-5])
    r2 = ext.decide_timed("rms_norm", "bf16", "w", [64, 2], "aten::_fused_rms_norm", "", [x, [3], None, 1e-5])
    assert r1 == r2 == (True, "autotune: ours 1.50x")
    assert len(calls) == 1
    key, op, overload, args = calls[0]
    assert key == ("rms_norm", "bf16", "w", 64, 2, 0, 0) and op == "aten::_fused_rms_norm" and overload == ""
    assert torch.equal(args[0], x) and list(args[1]) == [3] and args[2] is None
    # a key with an exact row is not measured
    rows([row("rms_norm", [8, 8], 10.0, 9.0)])
    ext.set_autotune(True, cb)
    assert ext.decide_timed("rms_norm", "bf16", "w", [8, 8], "aten::_fused_rms_norm", "", [])[1].startswith("tuned:")
    assert len(calls) == 1


def test_autotune_not_measuring_leaves_the_rows_to_decide_and_retries(rows):
    rows([row("rms_norm", [64, 2], 10.0, 11.0)])
    n = []

    def cb(key, op, overload, args):  # what _decisions._autotune answers during a graph capture
        n.append(1)
        return None
    ext.set_autotune(True, cb)
    for _ in range(2):
        assert ext.decide_timed("rms_norm", "bf16", "w", [64, 3], "aten::x", "", []) == \
            (True, "nearest: ours 1.10x at [64, 2, 0, 0]")
    assert len(n) == 2  # not cached: measured once the capture is over

    def bad(key, op, overload, args):
        raise RuntimeError("boom")
    ext.set_autotune(True, bad)
    assert ext.decide_timed("rms_norm", "bf16", "w", [64, 4], "aten::x", "", [])[0] is True
    # a plain query (no call to time) never measures
    ext.set_autotune(True, cb)
    assert ext.decide("rms_norm", "bf16", "w", 64, 5)[0] is True and len(n) == 2


def test_autotune_callback_declines_during_capture(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert _decisions._autotune(("rms_norm", "bf16", "w", 1, 1, 0, 0), "aten::_fused_rms_norm", "", []) is None


def test_db_rows_round_trip_through_file_and_dump(tmp_path):
    rs = [_decisions.db_row(TAG, "rms_norm", "bf16", "w", [4096, 8192], 10.0, 13.0, "NVIDIA H100"),
          _decisions.db_row(TAG, "topk", "fp32_det", "largest", [128, 8, 64], 7.0, 3.5, "NVIDIA H100")]
    assert rs[0][8:12] == ("ours", 10.0, "stock", 13.0) and rs[1][8:12] == ("stock", 3.5, "ours", 7.0)
    db = tmp_path / "t.sqlite"
    _decisions.write_rows(db, rs)
    got = sorted(_decisions.read_rows(db, "x"))
    assert got == sorted([(TAG, "rms_norm", "bf16", "w", 4096, 8192, 0, 0, 10.0, 13.0, "x"),
                          (TAG, "topk", "fp32_det", "largest", 128, 8, 64, 0, 7.0, 3.5, "x")])
    dump = tmp_path / "d.sql"
    _decisions.dump_sql(dump, rs, "test")
    assert sorted(_decisions.read_rows(dump, "x")) == got
    # the library's own rows in the same file are not decisions, and it stays a valid library DB
    con = sqlite3.connect(db)
    con.execute("INSERT INTO tuning VALUES ('sm_90a','gemm','bf16','nt',1,2,3,0,'gemm_x',1.0,'',0,'g','d')")
    con.commit()
    assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("2",)
    con.close()
    assert len(_decisions.read_rows(db)) == 2


def _writer(path, i):
    from flykernels import _decisions as d
    for j in range(20):
        d.write_rows(path, [d.db_row(TAG, "rms_norm", "bf16", "w", [i, j], 1.0, 2.0, "g")])


def test_cache_file_takes_concurrent_writers(tmp_path):
    path = tmp_path / "cache" / "autotune.sqlite"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert len(_decisions.read_rows(path)) == 80


def test_sources_precedence_and_bad_files(tmp_path, monkeypatch, rows):
    shipped, tuned, auto, overlay = (tmp_path / n for n in ("s.sql", "t.sqlite", "a.sqlite", "o.sqlite"))
    k = [4096, 8192]
    _decisions.dump_sql(shipped, [_decisions.db_row(TAG, "rms_norm", "bf16", "w", k, 10, 20, "g"),
                                  _decisions.db_row(TAG, "rms_norm", "bf16", "w", [1, 1], 10, 20, "g")], "s")
    _decisions.write_rows(tuned, [_decisions.db_row(TAG, "rms_norm", "bf16", "w", k, 10, 5, "g")])
    monkeypatch.setattr(_decisions, "SHIPPED", shipped)
    monkeypatch.setattr(_decisions, "tuned_path", lambda: tuned)
    monkeypatch.setattr(_decisions, "autotune_path", lambda: auto)  # missing: skipped quietly
    monkeypatch.setattr(_decisions, "device_tag", lambda *a: TAG)
    monkeypatch.delenv("FLYKERNELS_TUNING_DB", raising=False)
    assert _decisions.load() == 2
    assert ext.decide("rms_norm", "bf16", "w", *k)[0] is False  # tuned over shipped
    assert ext.decide("rms_norm", "bf16", "w", 1, 1)[0] is True
    _decisions.write_rows(overlay, [_decisions.db_row(TAG, "rms_norm", "bf16", "w", k, 10, 30, "g")])
    monkeypatch.setenv("FLYKERNELS_TUNING_DB", str(overlay))
    _decisions.load()
    assert ext.decide("rms_norm", "bf16", "w", *k) == (True, "tuned: ours 3.00x")  # the overlay wins
    assert [s for s, _ in _decisions.sources] == [str(shipped), str(tuned), str(overlay)]
    overlay.write_bytes(b"not a database")
    _decisions.load()  # a corrupt overlay: a warning, the others decide
    assert ext.decide("rms_norm", "bf16", "w", *k)[0] is False


def test_device_tag_names_the_card_model():
    assert _decisions.card_model("NVIDIA H100 80GB HBM3") == "H100"
    assert _decisions.card_model("NVIDIA H200") == "H200"
    assert _decisions.device_tag("sm_90a", "NVIDIA H100 PCIe") == "sm_90a:H100"


def test_shipped_rows_parse():
    rs = _decisions.read_rows(_decisions.SHIPPED)
    ops = {"rms_norm", "topk", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_flash_bwd",
           "sdpa_efficient_bwd", "grouped_mm", "mm"}
    assert all(r[1] in ops and r[0].startswith("sm_90a:") for r in rs)


def test_tune_without_gpu_says_why():
    r = subprocess.run([sys.executable, "-m", "flykernels", "tune"], capture_output=True, text=True, cwd="/")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert r.returncode == 2 and "cannot run here" in r.stderr


def test_tune_refuses_a_run_with_nothing_to_time():
    """Arguments are checked before the GPU: a missing suites folder, or no suites, no model shapes and no
    random shapes, end with status 2 and say why (not a run that writes zero rows)."""
    r = subprocess.run([sys.executable, "-m", "flykernels", "tune", "--suite", "/nonexistent-suites"],
                       capture_output=True, text=True, cwd="/")
    assert r.returncode == 2 and "not a suites folder" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "flykernels", "tune", "--suite", os.devnull, "--no-models"],
                       capture_output=True, text=True, cwd="/")
    assert r.returncode == 2 and "nothing to time" in r.stderr, r.stderr


def _late_bound_names(tree):
    """(function, line, name) for each lambda or def inside a for loop that reads a name the loop
    (re)binds without taking it as a default argument: it would see the last iteration's value."""
    import ast
    found = []

    def bound_in(nodes):
        names = set()
        for n in nodes:
            for sub in ast.walk(n):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
        return names

    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        for loop in (n for n in ast.walk(fn) if isinstance(n, ast.For)):
            rebound = bound_in([loop.target, *loop.body])
            for inner in ast.walk(loop):
                if not isinstance(inner, (ast.Lambda, ast.FunctionDef)) or inner is fn:
                    continue
                params = {a.arg for a in inner.args.args + inner.args.kwonlyargs}
                body = inner.body if isinstance(inner.body, list) else [inner.body]
                local = bound_in(body)
                for sub in (x for b in body for x in ast.walk(b)):
                    if (isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and sub.id in rebound
                            and sub.id not in params and sub.id not in local):
                        found.append((fn.name, sub.lineno, sub.id))
    return sorted(set(found))


def test_tune_cases_bind_their_inputs_when_made():
    """Each timing case's callable keeps the tensors of its own shape: a closure over a loop variable
    (grouped_mm's offsets once) times every case with the last shape's value."""
    import ast
    src = Path(_tune.__file__).read_text()
    assert _late_bound_names(ast.parse(src)) == []
    bad = "def f(xs):\n    out = []\n    for x in xs:\n        y = x + 1\n        out.append(lambda x=x: x + y)\n    return out\n"
    assert _late_bound_names(ast.parse(bad)) == [("f", 5, "y")]


def test_tune_knows_which_cuda_errors_end_the_process_context():
    assert _tune._context_lost(RuntimeError("CUDA error: device-side assert triggered"))
    assert _tune._context_lost(RuntimeError("flykernels grouped_mm: FLY_ERROR_CUDA: cuTensorMapEncodeTiled (a): "
                                            "CUDA_ERROR_ASSERT (device-side assert triggered)"))
    assert _tune._context_lost(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not _tune._context_lost(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not _tune._context_lost(RuntimeError("No available kernel. Aborting execution."))


def test_status_lists_decision_sources():
    r = subprocess.run([sys.executable, "-m", "flykernels"], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0 and "decisions:" in r.stdout, r.stdout + r.stderr


def test_gemm_candidate_offered_only_where_rows_say_ours(rows):
    from flykernels._ops import gemm
    key = gemm.gemm_key(torch.bfloat16, (64, 4096), (4096, 1), (4096, 14336), (1, 4096))
    assert key == ("bf16", "nt", 14336, 4096, 64)
    assert gemm.gemm_key(torch.bfloat16, ("s0", 4096), (4096, 1), (4096, 14336), (1, 4096)) is None
    rows([row("mm", [14336, 4096, 64], 10.0, 9.0, layout="nt")])
    assert gemm._decided_ours("mm", key) is False
    rows([row("mm", [14336, 4096, 64], 10.0, 10.5, layout="nt")])
    assert gemm._decided_ours("mm", key) is False  # ours in eager (1.05x), short of the compile margin
    rows([row("mm", [14336, 4096, 64], 10.0, 11.0, layout="nt")])
    assert gemm._decided_ours("mm", key) is True
    gk = gemm.grouped_key(torch.bfloat16, (4096, 2048), (64, 2048, 1536), (2048 * 1536, 1, 2048))
    assert gk == ("bf16", "b_nk", 1536, 2048, 4096, 64)


def test_boxed_arguments_split_by_the_schema():
    fn = _decisions._op_overload("aten::_scaled_dot_product_flash_attention", "")
    pos, kw = _decisions._split_args(fn, ["q", "k", "v", 0.0, True, False, 0.125])
    assert pos == ["q", "k", "v", 0.0, True, False] and kw == {"scale": 0.125}
    pos, kw = _decisions._split_args(_decisions._op_overload("aten::topk", ""), ["x", 3, -1, True, True])
    assert pos == ["x", 3, -1, True, True] and kw == {}


def test_compile_grouped_key_is_the_overrides_key():
    from flykernels._ops import gemm
    a = torch.randn(96, 64, dtype=torch.bfloat16)
    offs = torch.tensor([32, 96], dtype=torch.int32)
    for b in (torch.randn(2, 64, 48, dtype=torch.bfloat16),
              torch.randn(2, 48, 64, dtype=torch.bfloat16).transpose(1, 2)):
        want = ext.key_grouped_mm(a, b, offs, False)
        assert want is not None
        assert ("grouped_mm",) + gemm.grouped_key(b.dtype, a.shape, b.shape, b.stride()) == tuple(want)
