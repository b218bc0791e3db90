"""compile_lab's measurements as Estimates a claim can judge: ratios between compile modes with their intervals,
the spread of a monitor's samples, and kernel counts of a function eager and compiled.

    mode_speed_ratio(default, reduce_overhead)   # default time / reduce-overhead time, interval from quartiles
    compile_time_ratio(max_autotune, default)    # bounded by each subprocess's whole wall time
    samples_estimate(trace.values("nvml_util"))  # median of the samples with their quartiles
"""
from __future__ import annotations

import statistics
from typing import Any, Callable

from ..claims import Estimate
from .compile_lab import ModeTiming

__all__ = ["mode_speed_ratio", "compile_time_ratio", "samples_estimate", "kernels_per_call"]


def _quartiles(m: ModeTiming) -> tuple[float, float]:
    """(q1, q3) of a mode's time per call; from median ± IQR/2 for a result saved before quartiles were kept."""
    if m.q1_s is not None and m.q3_s is not None:
        return m.q1_s, m.q3_s
    half = (m.iqr_s or 0.0) / 2
    return m.median_s - half, m.median_s + half


def mode_speed_ratio(slower: ModeTiming, faster: ModeTiming) -> Estimate:
    """How many times faster `faster` runs than `slower`: slower time / faster time, with the interval
    both sides' quartiles allow (q1/q3 to q3/q1). Each mode ran in its own process, so there are no paired rounds."""
    for m in (slower, faster):
        if not m.ok or not m.median_s:
            raise ValueError(f"mode {m.mode!r} has no timing: {m.reason or 'it did not run'}")
    (s1, s3), (f1, f3) = _quartiles(slower), _quartiles(faster)
    value = slower.median_s / faster.median_s
    return Estimate(value, min(s1 / f3, value), max(s3 / f1, value))


def compile_time_ratio(a: ModeTiming, b: ModeTiming) -> Estimate:
    """a's compile time over b's, with bounds: each compile is one first call (no repeats to spread), but it
    cannot have taken longer than its whole subprocess, so the ratio lies in [a.compile / b.wall, a.wall / b.compile]."""
    for m in (a, b):
        if not m.ok or not m.compile_s:
            raise ValueError(f"mode {m.mode!r} has no compile time: {m.reason or 'it did not run'}")
    value = a.compile_s / b.compile_s
    lo = a.compile_s / b.wall_s if b.wall_s else value
    hi = a.wall_s / b.compile_s if a.wall_s else value
    return Estimate(value, min(lo, value), max(hi, value))


def samples_estimate(values: list[float]) -> Estimate | None:
    """The median of a monitor's samples with their quartiles; None without samples."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    if len(vals) == 1:
        return Estimate.exact(vals[0])
    q1, med, q3 = statistics.quantiles(vals, n=4, method="inclusive")
    return Estimate(med, q1, q3)


def kernels_per_call(fn: Callable[[], Any]) -> float | None:
    """Device kernels per call of `fn` from the profiler's summary (None on a machine without CUDA)."""
    from ..profiling import profile

    return profile(fn, steps=3, warmup=1).kernels_per_step
