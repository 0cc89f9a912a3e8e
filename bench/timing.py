# SPDX-License-Identifier: Apache-2.0
"""Timing shared by bench/*_torch.py, matching tools/tool_common.cpp (flybench's side):
CUDA events around each call, warm-up, median; before every timed call the L2 is flushed by
READING a 256 MiB buffer (a sum), which leaves the L2 clean. A memset flush (triton's do_bench)
leaves ~50 MB of dirty lines whose write-back the timed kernel would pay for.
FLYBENCH_FLUSH=write switches both sides back to a memset flush, for comparison."""
import math
import os
import time

import torch

_buf = None
SPIN_CYCLES = 200_000  # torch.cuda._sleep: ~100 us at the H200's clocks; touches no memory


def hbm_peak_tbs(override=None):
    """The current card's HBM peak in TB/s (H200 4.8, else the H100's 3.35), or `override`: the
    denominator of the memory-bound benchmarks' "HBM" fraction."""
    if override:
        return override
    return 4.8 if "H200" in torch.cuda.get_device_name() else 3.35


def compile_per_shape(fn, backends=None):
    """torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False) for a benchmark that
    compiles once per suite shape: past dynamo's default limit of 8 recompiles it would silently
    run fn eagerly under the compiled label, so the limits are raised. backends: Inductor's
    max_autotune_gemm_backends for these compiles (e.g. "TRITON"), or None to keep its default."""
    import torch._dynamo.config as dcfg
    if backends is not None:
        import torch._inductor.config as icfg
        icfg.max_autotune_gemm_backends = backends
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dcfg, name):
            setattr(dcfg, name, 1024)
    if hasattr(dcfg, "accumulated_recompile_limit"):
        dcfg.accumulated_recompile_limit = max(dcfg.accumulated_recompile_limit, 4096)
    return torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)


def flush_method():
    return "write" if os.environ.get("FLYBENCH_FLUSH") == "write" else "read"


def flush_l2(i=0):
    global _buf
    if _buf is None:
        # float32, so that sum() is one reduction that reads the buffer: an int32 sum first casts
        # the whole buffer to int64 (writes 512 MiB), which left ~50 MB of dirty lines in L2
        # until 2026-11-30 (bench/probes/gemm/timing_probe.py), the very write-back this flush is meant to avoid.
        _buf = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")  # 256 MiB
    if flush_method() == "write":
        _buf.fill_(i & 0xFF)
    else:
        _buf.sum()


def time_us(fn, reps=50, warmup=5, warm_ms=0.0):
    """Median microseconds of fn() over `reps` timed calls, each after an L2 flush. warm_ms > 0
    extends the warm-up to about that many milliseconds of back-to-back calls (as
    time_median_us's warm_ms in tools/tool_common.cpp: a large GEMM's clock settles under the
    power limit only after some tens of milliseconds)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if warm_ms > 0:  # time 3 calls, then about warm_ms worth more (at most 25 calls)
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        per_ms = max((time.perf_counter() - t0) * 1e3 / 3, 1e-3)
        for _ in range(min(25, math.ceil(warm_ms / per_ms))):
            fn()
        torch.cuda.synchronize()
    ts = sorted(timed_calls(fn, reps))
    return ts[len(ts) // 2]


def interleaved_us(contenders, rounds, before=None, **time_kw):
    """{name: median us over `rounds` rounds} for contenders [(name, fn)], timed with time_us(fn,
    **time_kw) once per round each, in an order rotated by one every round; before(name), if given,
    runs (untimed) before each contender's timing."""
    seen = {name: [] for name, _ in contenders}
    for r in range(rounds):
        for j in range(len(contenders)):
            name, fn = contenders[(j + r) % len(contenders)]
            if before is not None:
                before(name)
            seen[name].append(time_us(fn, **time_kw))
    return {name: sorted(v)[len(v) // 2] for name, v in seen.items()}


def timed_calls(fn, reps):
    """Microseconds of each of `reps` calls of fn(), in order, each after an L2 flush and a spin."""
    ts = []
    for i in range(reps):
        flush_l2(i)
        # A ~100 us spin after the flush, so the host is ahead of the GPU when e0 fires: the flush
        # alone (~65 us) does not cover torch.compile'd callables' launch overhead, which the
        # events would then count.
        torch.cuda._sleep(SPIN_CYCLES)
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1000.0)
    return ts


def profiled_kernels(fn, calls, flush=True):
    """(start, microseconds, name) of every GPU kernel that `calls` calls of fn launch, in launch
    order, from the profiler (CUPTI). With flush, each call follows flush_l2, whose reduction
    kernel is left out."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            if flush:
                flush_l2(i)
            fn()
        torch.cuda.synchronize()
    return sorted((e.time_range.start, e.device_time_total, e.name) for e in prof.events()
                  if e.device_type.name == "CUDA" and not e.name.startswith("void at::native::reduce_kernel"))
