-- FlyKernels tuning database, schema version 2 (version 1 had no k3; the library reads both, a
-- version 1 file as k3 = 0; flytune migrates one it writes into).
-- One row per tuned key: (arch, op, dtype, layout, k0, k1, k2, k3) -> variant.
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
-- Profile rows (op "<op>_profile", e.g. gemm_profile in db/sm_90a_gemm_profile.sql): one row per
--   (shape, variant) of a profiling run; k0..k2 the shape, k3 numbers the variants of a shape,
--   time_us the variant's time over the best time on that shape (1.0 = the best).
-- Lookup (src/dispatch.cpp): exact key in the overlay DB, then the embedded DB; then, for ops
-- with profile rows (gemm), a vote of the 5 nearest profiled shapes (DispatchRequest::profile_op);
-- then the nearest row of the same (arch, op, dtype, layout) by weighted log2 distance over
-- k0..k3; then the family's default rule.
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR REPLACE INTO meta VALUES ('schema_version', '2');
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
