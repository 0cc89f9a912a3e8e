# Rewrite db/sm_90a.sql's scaled_gemm rows where a variant forced in bench/mxfp_torch.py beat the
# default dispatch of the same run by more than a margin: that variant becomes the row's winner,
# the old winner its runner-up, both with this run's times, GPU and date.
#   python3 bench/probes/db_forced_rows.py torch.json mxfp_widen_n128 [--margin 0.97] [--date D]
import argparse, datetime, json, re

ap = argparse.ArgumentParser()
ap.add_argument("json"); ap.add_argument("variant")
ap.add_argument("--margin", type=float, default=0.97)
ap.add_argument("--sql", default="db/sm_90a.sql")
ap.add_argument("--date", default=datetime.date.today().isoformat())
a = ap.parse_args()
d = json.load(open(a.json))
lines = open(a.sql).read().split("\n")
pat = re.compile(r"^INSERT OR REPLACE INTO tuning VALUES \('sm_90a','scaled_gemm','(\w+)','nt',(\d+),(\d+),(\d+),0,'([\w]+)',")
index = {}
for i, l in enumerate(lines):
    m = pat.match(l)
    if m: index[(m[1], int(m[2]), int(m[3]), int(m[4]))] = (i, m[5])
changed = 0
for r in d["rows"]:
    f = r.get("forced", {}).get(a.variant)
    key = (r["format"], r["N"], r["K"], r["M"])
    if not f or key not in index: continue
    i, old = index[key]
    if old == a.variant or f["us"] >= a.margin * r["fly_us"]: continue
    lines[i] = (f"INSERT OR REPLACE INTO tuning VALUES ('sm_90a','scaled_gemm','{key[0]}','nt',{key[1]},{key[2]},{key[3]},0,"
                f"'{a.variant}',{f['us']:.3f},'{old}',{r['fly_us']:.3f},'{d['gpu']}','{a.date}');")
    changed += 1
    print(f"{key[0]} M={key[3]} N={key[1]} K={key[2]}: {old} {r['fly_us']:.1f} us -> {a.variant} {f['us']:.1f} us ({r['fly_us'] / f['us']:.2f}x)")
open(a.sql, "w").write("\n".join(lines))
print(f"{changed} rows")
