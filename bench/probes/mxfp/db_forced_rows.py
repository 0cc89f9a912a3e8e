# SPDX-License-Identifier: Apache-2.0
# Rewrite db/sm_90a.sql's scaled_gemm rows where a variant forced in bench/mxfp_torch.py beat the
# default dispatch of the same run by more than a margin: the fastest such variant becomes the
# row's winner, the old winner its runner-up, both with this run's times, GPU and date. A split-K
# winner keeps an unsplit runner-up (what the dispatch runs without a workspace): when the old
# winner is a split variant too, the old runner-up stays.
#   python3 bench/probes/mxfp/db_forced_rows.py torch.json VARIANT... [--margin 0.97] [--date D]
import argparse, datetime, json, re

ap = argparse.ArgumentParser()
ap.add_argument("json"); ap.add_argument("variant", nargs="+")
ap.add_argument("--margin", type=float, default=0.97)
ap.add_argument("--sql", default="db/sm_90a.sql")
ap.add_argument("--date", default=datetime.date.today().isoformat())
a = ap.parse_args()
d = json.load(open(a.json))
lines = open(a.sql).read().split("\n")
pat = re.compile(r"^INSERT OR REPLACE INTO tuning VALUES \('sm_90a','scaled_gemm','(\w+)','nt',(\d+),(\d+),(\d+),0,'(\w+)',([\d.]+),'(\w+)',([\d.]+),")
index = {}
for i, l in enumerate(lines):
    m = pat.match(l)
    if m: index[(m[1], int(m[2]), int(m[3]), int(m[4]))] = (i, m[5], m[7], float(m[8]))
changed = 0
split = lambda v: re.search(r"_s\d+$", v) is not None
for r in d["rows"]:
    key = (r["format"], r["N"], r["K"], r["M"])
    forced = [(f["us"], v) for v, f in r.get("forced", {}).items() if v in a.variant]
    if not forced or key not in index: continue
    us, best = min(forced)
    i, old, old_ru, old_ru_us = index[key]
    if old == best or us >= a.margin * r["fly_us"]: continue
    ru, ru_us = (old_ru, old_ru_us) if split(best) and split(old) else (old, r["fly_us"])
    lines[i] = (f"INSERT OR REPLACE INTO tuning VALUES ('sm_90a','scaled_gemm','{key[0]}','nt',{key[1]},{key[2]},{key[3]},0,"
                f"'{best}',{us:.3f},'{ru}',{ru_us:.3f},'{d['gpu']}','{a.date}');")
    changed += 1
    print(f"{key[0]} M={key[3]} N={key[1]} K={key[2]}: {old} {r['fly_us']:.1f} us -> {best} {us:.1f} us "
          f"({r['fly_us'] / us:.2f}x), runner-up {ru}")
open(a.sql, "w").write("\n".join(lines))
print(f"{changed} rows")
