# SPDX-License-Identifier: Apache-2.0
"""Merges `python -m flykernels tune --dump` files (one per op, TUNE_OPS=... tools/device_python.sh build tune)
into python/flykernels/decisions_sm_90a.sql: a card's rows of an op replace that card's earlier rows of
that op; other cards' and other ops' rows stay. Usage: python3 bench/probes/decisions/merge_rows.py OUT/rows_*.sql"""
import sqlite3
import sys
from pathlib import Path
shipped = Path(__file__).resolve().parents[3] / "python" / "flykernels" / "decisions_sm_90a.sql"
dumps = [Path(p) for p in sys.argv[1:]]
con = sqlite3.connect(":memory:")
con.execute("""CREATE TABLE tuning (arch TEXT, op TEXT, dtype TEXT, layout TEXT, k0 INT, k1 INT, k2 INT, k3 INT,
  variant TEXT, time_us REAL, runner_up TEXT, runner_up_us REAL, gpu TEXT, tuned_at TEXT,
  PRIMARY KEY (arch, op, dtype, layout, k0, k1, k2, k3))""")
con.executescript("\n".join(l for l in shipped.read_text().splitlines() if l.startswith("INSERT")))
new = sqlite3.connect(":memory:")
new.execute("CREATE TABLE tuning (arch,op,dtype,layout,k0,k1,k2,k3,variant,time_us,runner_up,runner_up_us,gpu,tuned_at)")
for d in dumps:
    new.executescript("\n".join(l for l in d.read_text().splitlines() if l.startswith("INSERT")))
pairs = set(new.execute("select distinct arch, op from tuning").fetchall())
for a, o in pairs:
    con.execute("delete from tuning where arch=? and op=?", (a, o))
con.executemany("insert or replace into tuning values (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", new.execute("select * from tuning").fetchall())
def lit(v):
    if isinstance(v, str): return "'" + v.replace("'", "''") + "'"
    if isinstance(v, float): return f"{v:.3f}"
    return str(v)
rows = con.execute("select * from tuning").fetchall()
cards = sorted({r[12] for r in rows})
header = ("-- FlyKernels decision rows: ours or stock per PyTorch call, both times (python -m flykernels tune --dump; "
          "python/flykernels/_decisions.py). Rows of " + ", ".join(cards) + ": H100 rows from `python -m flykernels tune --quick` "
          "(2026-12-07); H200 rows from bench/*_latest.json (bench/probes/decisions/rows_from_bench.py) where no tune run replaced them")
lines = [header] + [f"INSERT OR REPLACE INTO tuning VALUES ({','.join(lit(v) for v in r)});"
                    for r in sorted(rows, key=lambda r: tuple(str(x) for x in r[:8]))]
shipped.write_text("\n".join(lines) + "\n")
for a, o in sorted(pairs):
    n, ours = con.execute("select count(*), sum(variant='ours') from tuning where arch=? and op=?", (a, o)).fetchone()
    print(f"{a} {o}: {n} rows, ours {ours}")
print("total", len(rows))
