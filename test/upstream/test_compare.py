# SPDX-License-Identifier: Apache-2.0
"""CPU test of test/upstream/compare.py on two small synthetic JUnit reports (pytest's format):
    python3 -m pytest -q test/upstream/test_compare.py"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare  # noqa: E402

STOCK = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="6" time="3.0">
<testcase classname="test_transformers.TestSDPAFailureModesCUDA" name="test_flash_atteention_large_bf16_nan_values_cuda" time="0.5">
 <properties><property name="function" value="test_transformers::TestSDPAFailureModes::test_flash_atteention_large_bf16_nan_values"/>
 <property name="parametrizations" value="1"/></properties></testcase>
<testcase classname="test_transformers.TestSDPACudaOnlyCUDA" name="test_flash_attention_vs_math_ref_grads_cuda_float16_0" time="0.5">
 <properties><property name="function" value="test_transformers::TestSDPACudaOnly::test_flash_attention_vs_math_ref_grads"/>
 <property name="parametrizations" value="24"/></properties></testcase>
<testcase classname="test_transformers.TestSDPACudaOnlyCUDA" name="test_flash_attention_vs_math_ref_grads_cuda_float16_12" time="0.5">
 <properties><property name="function" value="test_transformers::TestSDPACudaOnly::test_flash_attention_vs_math_ref_grads"/>
 <property name="parametrizations" value="24"/></properties></testcase>
<testcase classname="test_matmul_cuda.TestMatmulCudaCUDA" name="test_grouped_gemm_2d_3d_cuda" time="0.5">
 <failure message="AssertionError: Tensor-likes are not close!">trace</failure></testcase>
<testcase classname="test_scaled_matmul_cuda.TestFP8MatmulCUDA" name="test_mx_skip_cuda" time="0.0">
 <skipped type="pytest.skip" message="MX gemm is only supported on CUDA capability 10.0+">skip</skipped></testcase>
<testcase classname="test_scaled_matmul_cuda.TestFP8MatmulCUDA" name="test_passed_swizzle_arrays_cuda" time="0.5"/>
</testsuite></testsuites>
"""

FLY = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="5" time="3.0">
<testcase classname="test_transformers.TestSDPAFailureModesCUDA" name="test_flash_atteention_large_bf16_nan_values_cuda" time="0.5">
 <properties><property name="function" value="test_transformers::TestSDPAFailureModes::test_flash_atteention_large_bf16_nan_values"/>
 <property name="parametrizations" value="1"/><property name="fly_ours:sdpa_flash" value="1"/></properties>
 <failure message="AssertionError: True is not false : Output should not contain NaNs!&#10;second line">trace</failure></testcase>
<testcase classname="test_transformers.TestSDPACudaOnlyCUDA" name="test_flash_attention_vs_math_ref_grads_cuda_float16_0" time="0.5">
 <properties><property name="function" value="test_transformers::TestSDPACudaOnly::test_flash_attention_vs_math_ref_grads"/>
 <property name="parametrizations" value="24"/><property name="fly_ours:sdpa_flash" value="2"/>
 <property name="fly_ours:sdpa_flash_bwd" value="1"/></properties></testcase>
<testcase classname="test_matmul_cuda.TestMatmulCudaCUDA" name="test_grouped_gemm_2d_3d_cuda" time="0.5">
 <properties><property name="fly_ours:grouped_mm" value="1"/></properties></testcase>
<testcase classname="test_scaled_matmul_cuda.TestFP8MatmulCUDA" name="test_mx_skip_cuda" time="0.0">
 <skipped type="pytest.skip" message="MX gemm is only supported on CUDA capability 10.0+">skip</skipped></testcase>
<testcase classname="test_scaled_matmul_cuda.TestFP8MatmulCUDA" name="test_passed_swizzle_arrays_cuda" time="0.5">
 <error message="RuntimeError: CUDA error">trace</error></testcase>
</testsuite></testsuites>
"""


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_parse_outcomes_and_properties(tmp_path):
    t = compare.parse(_write(tmp_path, "stock.xml", STOCK))
    assert len(t) == 6
    key = "test_matmul_cuda.TestMatmulCudaCUDA::test_grouped_gemm_2d_3d_cuda"
    assert t[key]["outcome"] == "failed"
    assert t[key]["message"] == "AssertionError: Tensor-likes are not close!"
    assert t["test_scaled_matmul_cuda.TestFP8MatmulCUDA::test_mx_skip_cuda"]["outcome"] == "skipped"
    assert t["test_scaled_matmul_cuda.TestFP8MatmulCUDA::test_passed_swizzle_arrays_cuda"]["outcome"] == "passed"
    f = compare.parse(_write(tmp_path, "fly.xml", FLY))
    nan = f["test_transformers.TestSDPAFailureModesCUDA::test_flash_atteention_large_bf16_nan_values_cuda"]
    assert nan["message"] == "AssertionError: True is not false : Output should not contain NaNs!"
    assert nan["ours"] == {"sdpa_flash": 1}


def test_counts_functions_and_regressions(tmp_path):
    stock = compare.parse(_write(tmp_path, "stock.xml", STOCK))
    fly = compare.parse(_write(tmp_path, "fly.xml", FLY))
    res = compare.compare(stock, fly)
    assert res["stock"] == {"tests": 6, "passed": 4, "failed": 1, "error": 0, "skipped": 1, "functions": 5,
                            "parametrizations_of_functions": 25, "time_s": 2.5}
    assert res["fly"]["tests"] == 5 and res["fly"]["failed"] == 1 and res["fly"]["error"] == 1
    regs = {r["test"]: r for r in res["regressions"]}
    # passed stock: a failure, an error and a test missing from the flykernels report
    assert set(regs) == {
        "test_transformers.TestSDPAFailureModesCUDA::test_flash_atteention_large_bf16_nan_values_cuda",
        "test_scaled_matmul_cuda.TestFP8MatmulCUDA::test_passed_swizzle_arrays_cuda",
        "test_transformers.TestSDPACudaOnlyCUDA::test_flash_attention_vs_math_ref_grads_cuda_float16_12",
    }
    assert regs["test_scaled_matmul_cuda.TestFP8MatmulCUDA::test_passed_swizzle_arrays_cuda"]["fly"] == "error"
    assert regs["test_transformers.TestSDPACudaOnlyCUDA::test_flash_attention_vs_math_ref_grads_cuda_float16_12"][
        "fly"].startswith("missing")
    assert res["fixed"] == ["test_matmul_cuda.TestMatmulCudaCUDA::test_grouped_gemm_2d_3d_cuda"]
    assert res["tests_running_ours"] == 3
    assert res["tests_running_ours_per_op"] == {"grouped_mm": 1, "sdpa_flash": 2, "sdpa_flash_bwd": 1}
    text = compare.render(res)
    assert "Pass stock, fail with flykernels: 3" in text
    assert "| stock | 6 | 4 | 1 | 0 | 1 | 5 | 25 |" in text


def test_cli_exit_status_and_outputs(tmp_path):
    s, f = _write(tmp_path, "stock.xml", STOCK), _write(tmp_path, "fly.xml", FLY)
    (tmp_path / "fly.meta.json").write_text(json.dumps({"torch": "2.11.0", "sample": 16, "kept": 5, "collected": 80,
                                                         "flykernels_active": ["sdpa"], "forced": "ours"}))
    js, md = str(tmp_path / "cmp.json"), str(tmp_path / "cmp.md")
    cli = [sys.executable, os.path.join(HERE, "compare.py")]
    r = subprocess.run(cli + [s, f, "--json", js, "--md", md], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert "Pass stock, fail with flykernels: 3" in r.stdout
    assert "sample 1 in 16, kept 5 of 80 collected" in r.stdout
    assert json.load(open(js))["stock"]["tests"] == 6
    assert open(md).read() == r.stdout
    r = subprocess.run(cli + [s, s], capture_output=True, text=True)  # identical runs: no regression
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Pass stock, fail with flykernels: 0" in r.stdout
    bad = _write(tmp_path, "bad.xml", "<testsuites>")
    r = subprocess.run(cli + [bad, f], capture_output=True, text=True)
    assert r.returncode != 0


DEMO = '''
import os
import unittest


def _make(i):
    def test_add(self):  # one def, ten parametrizations (as PyTorch's instantiated tests: wraps keeps __name__)
        if os.environ.get("FAIL_ADD") == str(i):
            self.fail("boom")
    return test_add


class TestDemoCUDA(unittest.TestCase):
    def test_single_cuda(self):
        pass


for _i in range(10):
    setattr(TestDemoCUDA, f"test_add_{_i}_cuda", _make(_i))


class TestDemoCPU(unittest.TestCase):  # not a CUDA class: never selected
    def test_cpu_only(self):
        pass
'''


def _run_plugin(tmp_path, name, sample, fail=None):
    (tmp_path / "test_demo.py").write_text(DEMO)
    env = dict(os.environ, PYTHONPATH=HERE, UPSTREAM_SAMPLE=str(sample), UPSTREAM_META=str(tmp_path / f"{name}.meta.json"))
    if fail is not None:
        env["FAIL_ADD"] = str(fail)
    xml = str(tmp_path / f"{name}.xml")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "flykernels_upstream",
                    f"--junitxml={xml}", "-o", "junit_family=xunit1", str(tmp_path / "test_demo.py")],
                   cwd=str(tmp_path), env=env, capture_output=True, text=True)
    return xml


def test_plugin_selects_cuda_samples_every_function_and_records(tmp_path):
    xml = _run_plugin(tmp_path, "s4", 4)
    t = compare.parse(xml)
    funcs = {v["function"] for v in t.values()}
    assert funcs == {"test_demo::TestDemo::test_add", "test_demo::TestDemo::test_single_cuda"}
    adds = [k for k, v in t.items() if v["function"].endswith("::test_add")]
    assert 2 <= len(adds) <= 3  # 1 in 4 of 10, at the function's offset
    assert all(v["parametrizations"] == 10 for k, v in t.items() if k in adds)
    assert not any("cpu_only" in k for k in t)
    meta = json.load(open(tmp_path / "s4.meta.json"))
    assert meta["functions"] == 2 and meta["kept"] == len(t) and meta["sample"] == 4
    assert _run_plugin(tmp_path, "again", 4) and set(compare.parse(str(tmp_path / "again.xml"))) == set(t)  # deterministic


def test_plugin_reports_feed_compare(tmp_path):
    stock = compare.parse(_run_plugin(tmp_path, "stock", 1))
    fly = compare.parse(_run_plugin(tmp_path, "fly", 1, fail=3))
    assert len(stock) == 11
    res = compare.compare(stock, fly)
    assert [r["test"] for r in res["regressions"]] == ["test_demo.TestDemoCUDA::test_add_3_cuda"]
    assert res["stock"]["functions"] == 2 and res["stock"]["parametrizations_of_functions"] == 11
