-- FlyKernels tuning database, schema version 1.
-- One row per tuned key: (arch, op, dtype, layout, k0, k1, k2) -> variant.
--   arch    "sm_90a"
--   op      "rmsnorm_fwd" | "topk" | "gemm"
--   dtype   "fp16" | "bf16" | "fp32"; topk: "fp32" (+ "_det" suffix for deterministic mode)
--   layout  "row" (rmsnorm, topk), "nn" | "nt" | "tn" | "tt" (gemm)
--   k0..k2  shape features, most significant first:
--             rmsnorm_fwd: N, M, 0      topk: C, k, R      gemm: N, K, M
--   variant canonical variant name (must be bundled; tools/flygen builds the ones named here)
--   time_us median time of the winner, runner_up / runner_up_us the second best
--   gpu, tuned_at: device name and date of the measurement
-- Lookup (src/dispatch.cpp): exact key in the overlay DB, then the embedded DB; then the nearest
-- row of the same (arch, op, dtype, layout) by weighted log2 distance over k0..k2; then the
-- family's default rule.
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR REPLACE INTO meta VALUES ('schema_version', '1');
CREATE TABLE IF NOT EXISTS tuning (
  arch TEXT NOT NULL,
  op TEXT NOT NULL,
  dtype TEXT NOT NULL,
  layout TEXT NOT NULL,
  k0 INTEGER NOT NULL,
  k1 INTEGER NOT NULL,
  k2 INTEGER NOT NULL,
  variant TEXT NOT NULL,
  time_us REAL,
  runner_up TEXT,
  runner_up_us REAL,
  gpu TEXT,
  tuned_at TEXT,
  PRIMARY KEY (arch, op, dtype, layout, k0, k1, k2)
);
