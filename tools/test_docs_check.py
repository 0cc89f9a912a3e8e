#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Tests of tools/docs_check.py on small trees in temporary folders (standard library only).

  python3 tools/test_docs_check.py
"""
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import docs_check  # noqa: E402

RESULTS = """# Results
## Current figures
### TopK figures
| family | geomean | min |
|---|---:|---:|
| TopK | 9.91x / 9.90x | 1.38x |

### GEMM figures
| GEMM | 0.967x | 0.793x |
#### Detail
seeds 4 / 5: 0.970x / 1.059x

# History
## TopK
19.9x once, and 2.50x
"""

README = """# Demo
See [the design](docs/design.md#the-path-of-one-call) and [topk](#latest-figures).

```sh
[not a link](nowhere.md)
```
Inline code `[not a link](nowhere.md)` either.

## Latest figures
| family | geomean | min | details |
|---|---:|---:|---|
| TopK | 9.91x / 9.90x | 1.38x | [TopK](bench/RESULTS.md#topk-figures) |
| GEMM | 0.967x, seeds 0.970x-1.059x | 0.793x | [GEMM](bench/RESULTS.md#gemm-figures) |

## Read more
"""

DESIGN = """# Design
## The path of one call
## Repeated
## Repeated
See [above](#repeated-1), [the readme](../README.md) and [`code`](../src/x.cpp).
"""


class DocsCheckTest(unittest.TestCase):
    def tree(self, files):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        root = Path(tmp.name)
        for name, text in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        return root

    def run_check(self, **overrides):
        files = {"README.md": README, "bench/RESULTS.md": RESULTS, "docs/design.md": DESIGN, "src/x.cpp": "//\n"}
        files.update({k.replace("__", "/").replace("_md", ".md"): v for k, v in overrides.items()})
        return docs_check.Checker(self.tree(files)).run()

    def test_good_tree_passes(self):
        self.assertEqual(self.run_check(), [])

    def test_slugs(self):
        self.assertEqual(docs_check.github_slug("Set-up: two commands"), "set-up-two-commands")
        self.assertEqual(docs_check.github_slug("`fly_gemm` and [links](x.md)!"), "fly_gemm-and-links")
        self.assertEqual(docs_check.github_slug("Decisions: ours only where ours is faster"),
                         "decisions-ours-only-where-ours-is-faster")
        self.assertEqual(docs_check.github_slug("Backward, D 257..512"), "backward-d-257512")

    def test_missing_file(self):
        errors = self.run_check(docs__design_md=DESIGN.replace("../src/x.cpp", "../src/y.cpp"))
        self.assertEqual(len(errors), 1)
        self.assertIn("docs/design.md:5:", errors[0])
        self.assertIn("../src/y.cpp", errors[0])

    def test_missing_anchor(self):
        errors = self.run_check(README_md=README.replace("#the-path-of-one-call", "#the-path"))
        self.assertEqual(len(errors), 1)
        self.assertIn("README.md:2:", errors[0])
        self.assertIn("#the-path", errors[0])

    def test_repeated_heading_anchor(self):
        errors = self.run_check(docs__design_md=DESIGN.replace("#repeated-1", "#repeated-2"))
        self.assertEqual(len(errors), 1)
        self.assertIn("#repeated-2", errors[0])

    def test_figure_not_in_section(self):
        # 2.50x is in RESULTS.md, but in the History, not in the linked section
        errors = self.run_check(README_md=README.replace("| 1.38x |", "| 2.50x |"))
        self.assertEqual(len(errors), 1)
        self.assertIn("README.md:12:", errors[0])
        self.assertIn("2.50x", errors[0])

    def test_figure_prefix_does_not_match(self):
        for wrong in ("9.9x", "1.91x", "9.910x"):
            errors = self.run_check(README_md=README.replace("9.91x / 9.90x", wrong + " / 9.90x"))
            self.assertEqual(len(errors), 1, wrong)
            self.assertIn(wrong, errors[0])

    def test_subsection_counts_as_section(self):
        # 1.059x is in a deeper heading inside "GEMM figures": part of the section
        self.assertEqual(self.run_check(README_md=README.replace("0.970x-1.059x", "1.059x")), [])

    def test_row_without_section(self):
        errors = self.run_check(README_md=README.replace(" [GEMM](bench/RESULTS.md#gemm-figures) ", " GEMM "))
        self.assertEqual(len(errors), 1)
        self.assertIn("README.md:13:", errors[0])
        self.assertIn("names no section", errors[0])

    def test_unknown_section(self):
        errors = self.run_check(README_md=README.replace("#gemm-figures", "#gemm"))
        self.assertTrue(any("#gemm" in e and "README.md:13:" in e for e in errors), errors)

    def test_cited_logs(self):
        logs = {"bench/logs/run-a1.log": "", "bench/logs/run-a2.log": "", "bench/logs/ncu-x.txt": ""}
        page = ("Logs `bench/logs/run-a{1,2}.log`, bench/logs/ncu-*.txt, the folder `bench/logs/`.\n"
                "```\ncat bench/logs/run-a1.log\n```\n")
        self.assertEqual(self.run_check(docs__logs_md=page, **{k.replace("/", "__"): v for k, v in logs.items()}), [])
        errors = self.run_check(docs__logs_md=page.replace("{1,2}", "{1,3}").replace("ncu-*", "prof-*"),
                                **{k.replace("/", "__"): v for k, v in logs.items()})
        # two citations of missing files, and the two logs no page names any more
        self.assertEqual(len(errors), 4, errors)
        self.assertTrue(any("docs/logs.md:1:" in e and "bench/logs/run-a3.log" in e for e in errors), errors)
        self.assertTrue(any("bench/logs/prof-*.txt" in e for e in errors), errors)
        self.assertTrue(any(e.startswith("bench/logs/run-a2.log:1:") and "cited by no page" in e for e in errors), errors)
        self.assertTrue(any(e.startswith("bench/logs/ncu-x.txt:1:") and "cited by no page" in e for e in errors), errors)

    def test_uncited_log(self):
        page = "The run: `bench/logs/kept.log`.\n"
        errors = self.run_check(docs__logs_md=page, **{"bench/logs/kept.log": "", "bench/logs/old/stray.txt": ""})
        self.assertEqual(len(errors), 1, errors)
        self.assertIn("bench/logs/old/stray.txt:1:", errors[0])
        self.assertIn("cited by no page", errors[0])
        # a citation in a source file is not a page: the log still counts as uncited
        errors = self.run_check(**{"src/y.cpp": "// bench/logs/kept.log\n", "bench/logs/kept.log": ""})
        self.assertEqual(len(errors), 1, errors)
        self.assertIn("bench/logs/kept.log:1:", errors[0])

    def test_probes_listed(self):
        readme = "| `a.py` | a question | `python3 bench/probes/x/a.py` |\n"
        self.assertEqual(self.run_check(**{"bench/probes/README.md": readme, "bench/probes/x/a.py": ""}), [])
        errors = self.run_check(**{"bench/probes/README.md": readme, "bench/probes/x/a.py": "", "bench/probes/x/b.sh": ""})
        self.assertEqual(len(errors), 1, errors)
        self.assertIn("bench/probes/README.md:1:", errors[0])
        self.assertIn("bench/probes/x/b.sh", errors[0])

    def test_main_exit_status(self):
        root = self.tree({"README.md": "[x](missing.md)\n## Latest figures\n"})
        self.assertEqual(docs_check.main(["docs_check.py", str(root)]), 1)


if __name__ == "__main__":
    unittest.main(verbosity=1)
