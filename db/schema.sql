-- FlyKernels tuning database, schema version 3. Version 1 had no k3; version 2 added it and kept
-- profile rows in `tuning` (op "<op>_profile", k3 an ordinal over a shape's variants, time_us the
-- ratio); version 3 gave them the `profile` table. The library reads all three: a version 1 file
-- as k3 = 0, a version 1 or 2 file's "<op>_profile" tuning rows as profile rows of <op> (users'
-- overlay databases keep working); flytune migrates a file it writes into to version 3.
-- tuning: one row per tuned key: (arch, op, dtype, layout, k0, k1, k2, k3) -> variant.
--   arch    "sm_90a"
--   op      "rmsnorm_fwd" | "topk" | "gemm"
--   dtype   "fp16" | "bf16" | "fp32"; topk: "fp32" (+ "_det" suffix for deterministic mode)
--   layout  "row" (rmsnorm, topk), "nn" | "nt" | "tn" | "tt" (gemm)
--   k0..k3  shape features, most significant first (0 where a family has fewer):
--             rmsnorm_fwd: N, M         topk: C, k, R      gemm: N, K, M
--             grouped_gemm: N, K, mean rows per group (power of two), G
--             attention_fwd / attention_bwd: Sk, Sq, B * Hq
--   variant canonical variant name (must be bundled; tools/flygen builds the ones named here)
--   time_us median time of the winner, runner_up / runner_up_us the second best
--   gpu, tuned_at: device name and date of the measurement
-- profile: one row per (shape, variant) of a profiling run (db/sm_90a_gemm_profile.sql):
--   op       the op the profile serves ("gemm"; DispatchRequest::profile_op)
--   k0..k2   the profiled shape in that op's key order, layout its layout
--   variant  the variant measured (in the profiled dtype; the op maps names to the call's)
--   rel_time the variant's time over the best time on that shape (1.0 = the best, >= 1)
--   gpu, profiled_at: device name and date of the run
-- Lookup (src/dispatch.cpp): exact key in the overlay DB, then the embedded DB; then, for ops
-- with profile rows (gemm), a vote of the 5 nearest profiled shapes (DispatchRequest::profile_op);
-- then the nearest row of the same (arch, op, dtype, layout) by weighted log2 distance over
-- k0..k3; then the family's default rule.
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR REPLACE INTO meta VALUES ('schema_version', '3');
CREATE TABLE IF NOT EXISTS tuning (
  arch TEXT NOT NULL,
  op TEXT NOT NULL,
  dtype TEXT NOT NULL,
  layout TEXT NOT NULL,
  k0 INTEGER NOT NULL,
  k1 INTEGER NOT NULL,
  k2 INTEGER NOT NULL,
  k3 INTEGER NOT NULL DEFAULT 0,
  variant TEXT NOT NULL,
  time_us REAL,
  runner_up TEXT,
  runner_up_us REAL,
  gpu TEXT,
  tuned_at TEXT,
  PRIMARY KEY (arch, op, dtype, layout, k0, k1, k2, k3)
);
CREATE TABLE IF NOT EXISTS profile (
  arch TEXT NOT NULL,
  op TEXT NOT NULL,
  dtype TEXT NOT NULL,
  layout TEXT NOT NULL,
  k0 INTEGER NOT NULL,
  k1 INTEGER NOT NULL,
  k2 INTEGER NOT NULL,
  variant TEXT NOT NULL,
  rel_time REAL NOT NULL CHECK (rel_time >= 1),
  gpu TEXT,
  profiled_at TEXT,
  PRIMARY KEY (arch, op, dtype, layout, k0, k1, k2, variant)
);
