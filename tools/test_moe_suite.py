#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ctest moe_suite: suites/moe.json (issue 49) is what suites/gen_moe.py generates (byte for byte),
its cases are right for their models (rows per expert summing to tokens x top-k, K and N of each
projection and pass, the layouts of the pass), the loads are skewed (not uniform) with empty and
one-row groups in decode, and bench/grouped_gemm_torch.py reads it without torch or a GPU (--help,
--list with its filters; no device: exit 3). Plain Python (no torch): runs in CI's ctest.

  python3 tools/test_moe_suite.py [-v]
"""
import importlib.util
import json
import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join(ROOT, "suites", "moe.json")
BENCH = os.path.join(ROOT, "bench", "grouped_gemm_torch.py")
MODELS = {  # name: experts, top-k, hidden, expert MLP width (issue 49)
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "olmoe": (64, 8, 2048, 1024),
    "mixtral-8x7b": (8, 2, 4096, 14336),
    "deepseek-v3": (256, 8, 7168, 2048),
    "gpt-oss-20b": (32, 4, 2880, 2880),
}


def load_gen():
    spec = importlib.util.spec_from_file_location("gen_moe", os.path.join(ROOT, "suites", "gen_moe.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench(*args):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, BENCH, *args], capture_output=True, text=True, env=env, cwd=ROOT)


class MoeSuite(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(SUITE) as f:
            cls.text = f.read()
        cls.suite = json.loads(cls.text)
        cls.cases = cls.suite["cases"]

    def test_reproducible(self):
        gen = load_gen()
        self.assertEqual(gen.dumps(gen.build()), self.text,
                         "suites/moe.json is not what suites/gen_moe.py generates: rerun it and commit both")

    def test_models(self):
        self.assertEqual(set(self.suite["models"]), set(MODELS))
        for name, (e, k, h, i) in MODELS.items():
            m = self.suite["models"][name]
            self.assertEqual((m["experts"], m["topk"], m["hidden"], m["moe_intermediate"]), (e, k, h, i), name)

    def test_case_set(self):
        seen = {(c["model"], c["phase"], c["tokens"], c["proj"], c["pass"]) for c in self.cases}
        self.assertEqual(len(seen), len(self.cases), "duplicate cases")
        want = set()
        for name in MODELS:
            for t in (4096, 8192, 16384, 32768):
                want |= {(name, "prefill", t, p, w) for p in ("gate_up", "down") for w in ("fwd", "dA", "dB")}
            for t in (16, 64, 128, 512):
                want |= {(name, "decode", t, p, "fwd") for p in ("gate_up", "down")}
        self.assertEqual(seen, want)

    def test_shapes_and_loads(self):
        layout = {"fwd": "nt", "dA": "nn", "dB": "mn"}
        for i, c in enumerate(self.cases):
            e, k, h, inter = MODELS[c["model"]]
            with self.subTest(case=i):
                self.assertEqual(len(c["M"]), e)
                self.assertEqual(c["G"], e)
                self.assertEqual(c["topk"], k)
                self.assertTrue(all(isinstance(m, int) and m >= 0 for m in c["M"]))
                self.assertEqual(sum(c["M"]), c["tokens"] * k)
                self.assertTrue(all(m <= c["tokens"] for m in c["M"]), "an expert is picked at most once per token")
                K, N = (inter, h) if c["proj"] == "down" else (h, 2 * inter)
                if c["pass"] == "dA":
                    K, N = N, K
                self.assertEqual((c["K"], c["N"]), (K, N))
                self.assertEqual(c["layout"], layout[c["pass"]])
                self.assertEqual(c["kind"], c["phase"])
        # The same routing for every projection and pass of one (model, phase, tokens).
        rows = {}
        for c in self.cases:
            rows.setdefault((c["model"], c["phase"], c["tokens"]), c["M"])
            self.assertEqual(rows[(c["model"], c["phase"], c["tokens"])], c["M"])

    def test_skewed_not_uniform(self):
        for c in self.cases:
            if c["phase"] == "prefill" and c["proj"] == "gate_up" and c["pass"] == "fwd":
                mean = sum(c["M"]) / len(c["M"])
                self.assertGreater(max(c["M"]) / mean, 1.25, (c["model"], c["tokens"]))
                self.assertLess(min(c["M"]) / mean, 0.75, (c["model"], c["tokens"]))
        d16 = {c["model"]: c["M"] for c in self.cases if c["phase"] == "decode" and c["tokens"] == 16}
        for name in ("qwen3-30b-a3b", "deepseek-v3"):
            self.assertGreaterEqual(sum(m == 0 for m in d16[name]), 20, name)
            self.assertGreaterEqual(sum(m == 1 for m in d16[name]), 20, name)

    def test_bench_help_and_list(self):
        r = bench("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--suite", r.stdout)
        r = bench("--suite", "moe", "--list")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"{len(self.cases)} of {len(self.cases)} cases", r.stdout)
        r = bench("--suite", SUITE, "--dry-run", "--models", "deepseek", "--phases", "decode")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"8 of {len(self.cases)} cases", r.stdout)
        r = bench("--list")  # the default suite, suites/grouped_gemm.json
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(ROOT, "suites", "grouped_gemm.json")) as f:
            self.assertEqual(len(r.stdout.strip().splitlines()), len(json.load(f)["cases"]))

    def test_bench_without_device(self):
        r = bench("--suite", "moe", "--lib", "/nonexistent/libflykernels.so")
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertTrue("no CUDA device" in r.stderr or "torch is needed" in r.stderr, r.stderr)
        r = bench("--suite", "moe", "--dB", "--list")
        self.assertEqual(r.returncode, 2)
        self.assertIn("carry their own pass", r.stderr)


if __name__ == "__main__":
    unittest.main()
