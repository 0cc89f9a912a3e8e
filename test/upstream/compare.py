#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compares two JUnit XML reports of the same upstream tests, stock and with FlyKernels
(test/upstream/run.sh writes them): every test that passes stock and fails with FlyKernels (or
errors, or does not finish), the counts of each run, how many test functions and parametrizations
ran, and in how many tests our kernels ran (the "fly_ours:<op>" properties the plugin records).

    python3 test/upstream/compare.py STOCK.xml FLY.xml [--json OUT.json] [--md OUT.md]

Exit status: 0 when nothing that passes stock fails with FlyKernels, 1 otherwise, 2 on bad input.
Standard library only (runs anywhere; test/upstream/test_compare.py tests it on synthetic reports).
"""
import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET

OUTCOMES = ("passed", "failed", "error", "skipped")


def parse(path):
    """{test id: record} of a JUnit XML file (pytest's, or any with testsuite/testcase). A record:
    outcome (passed / failed / error / skipped), message (first line), time, function, props."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        raise SystemExit(f"compare.py: cannot read {path}: {e}")
    tests = {}
    for tc in root.iter("testcase"):
        cls = tc.get("classname", "")
        name = tc.get("name", "")
        tid = f"{cls}::{name}" if cls else name
        outcome, message = "passed", ""
        for child in tc:
            tag = child.tag
            if tag in ("failure", "error"):
                outcome = "failed" if tag == "failure" else "error"
                message = child.get("message") or (child.text or "")
                break
            if tag == "skipped":
                outcome = "skipped"
                message = child.get("message") or (child.text or "")
        props = {}
        for p in tc.iter("property"):
            props.setdefault(p.get("name"), p.get("value"))
        message = message.strip().splitlines()[0][:300] if message.strip() else ""
        tests[tid] = {
            "outcome": outcome,
            "message": message,
            "time": float(tc.get("time") or 0.0),
            "function": props.get("function") or tid,  # the plugin's def name; else each test its own
            "parametrizations": int(props.get("parametrizations") or 0),
            "ours": {k.split(":", 1)[1]: int(v) for k, v in props.items() if k.startswith("fly_ours:")},
        }
    return tests


def summarize(tests):
    counts = {o: 0 for o in OUTCOMES}
    for t in tests.values():
        counts[t["outcome"]] += 1
    functions = {}
    for t in tests.values():
        functions[t["function"]] = max(functions.get(t["function"], 0), t["parametrizations"])
    return {
        "tests": len(tests),
        **counts,
        "functions": len(functions),
        "parametrizations_of_functions": sum(functions.values()),
        "time_s": round(sum(t["time"] for t in tests.values()), 1),
    }


def compare(stock, fly):
    """The comparison: regressions (passed stock; failed, errored or missing with FlyKernels),
    fixes, tests failing both ways, and the tests our kernels ran in."""
    regressions, fixed, both_fail, skip_diff = [], [], [], []
    for tid, s in sorted(stock.items()):
        f = fly.get(tid)
        if s["outcome"] == "passed" and (f is None or f["outcome"] in ("failed", "error")):
            regressions.append({
                "test": tid,
                "fly": f["outcome"] if f else "missing (crashed or timed out)",
                "message": f["message"] if f else "",
                "ours": f["ours"] if f else {},
            })
        elif f is not None and s["outcome"] in ("failed", "error") and f["outcome"] == "passed":
            fixed.append(tid)
        elif f is not None and s["outcome"] in ("failed", "error") and f["outcome"] in ("failed", "error"):
            both_fail.append(tid)
        elif f is not None and (s["outcome"] == "skipped") != (f["outcome"] == "skipped"):
            skip_diff.append({"test": tid, "stock": s["outcome"], "fly": f["outcome"]})
    only_fly = sorted(set(fly) - set(stock))
    ran_ours = {tid: f["ours"] for tid, f in fly.items() if f["ours"]}
    per_op = {}
    for ops in ran_ours.values():
        for op in ops:
            per_op[op] = per_op.get(op, 0) + 1
    return {
        "stock": summarize(stock),
        "fly": summarize(fly),
        "regressions": regressions,
        "fixed": fixed,
        "fail_both": both_fail,
        "skip_differs": skip_diff,
        "only_in_fly": only_fly,
        "tests_running_ours": len(ran_ours),
        "tests_running_ours_per_op": dict(sorted(per_op.items())),
    }


def render(res, meta=None):
    lines = []
    s, f = res["stock"], res["fly"]
    lines.append("| run | tests | passed | failed | error | skipped | test functions | their parametrizations | time (s) |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, c in (("stock", s), ("flykernels", f)):
        lines.append(f"| {name} | {c['tests']} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} | "
                     f"{c['functions']} | {c['parametrizations_of_functions']} | {c['time_s']} |")
    lines.append("")
    lines.append(f"Our kernels ran in {res['tests_running_ours']} tests"
                 + (": " + ", ".join(f"{op} {n}" for op, n in res["tests_running_ours_per_op"].items())
                    if res["tests_running_ours_per_op"] else "") + ".")
    if meta:
        for run, m in meta.items():
            if m:
                lines.append(f"{run}: torch {m.get('torch')}, flykernels active {m.get('flykernels_active')}, "
                             f"forced {m.get('forced')}, sample 1 in {m.get('sample')}, kept {m.get('kept')} of "
                             f"{m.get('collected')} collected")
    lines.append("")
    lines.append(f"## Pass stock, fail with flykernels: {len(res['regressions'])}")
    for r in res["regressions"]:
        ours = (" [ours: " + ", ".join(f"{k} {v}" for k, v in r["ours"].items()) + "]") if r["ours"] else ""
        lines.append(f"- {r['test']}: {r['fly']}{ours} {r['message']}")
    lines.append("")
    lines.append(f"Fail stock, pass with flykernels: {len(res['fixed'])}")
    for t in res["fixed"]:
        lines.append(f"- {t}")
    lines.append(f"Fail both ways: {len(res['fail_both'])}")
    for t in res["fail_both"]:
        lines.append(f"- {t}")
    if res["skip_differs"]:
        lines.append(f"Skipped in one run only: {len(res['skip_differs'])}")
        for d in res["skip_differs"]:
            lines.append(f"- {d['test']}: stock {d['stock']}, flykernels {d['fly']}")
    if res["only_in_fly"]:
        lines.append(f"Only in the flykernels report: {len(res['only_in_fly'])}")
    return "\n".join(lines) + "\n"


def _meta_of(xml_path):
    p = os.path.splitext(xml_path)[0] + ".meta.json"
    try:
        with open(p) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stock")
    ap.add_argument("fly")
    ap.add_argument("--json", help="write the full comparison here")
    ap.add_argument("--md", help="write the report (markdown) here too")
    a = ap.parse_args(argv)
    stock, fly = parse(a.stock), parse(a.fly)
    if not stock:
        print(f"compare.py: {a.stock} has no test cases", file=sys.stderr)
        return 2
    res = compare(stock, fly)
    meta = {"stock": _meta_of(a.stock), "flykernels": _meta_of(a.fly)}
    text = render(res, meta)
    sys.stdout.write(text)
    if a.md:
        with open(a.md, "w") as fh:
            fh.write(text)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({**res, "meta": meta}, fh, indent=1)
    return 1 if res["regressions"] else 0


if __name__ == "__main__":
    sys.exit(main())
