"""How NVML and GPM report what ran: a reading with its interval, NVML's sample period, and NVML's utilization
against bursts of GPU work whose busy time is known from CUDA events (shared by notebooks 01 and 02).

    sampling.samples_estimate(run.trace, "nvml_util")         # mean of NVML's samples, interval their quartiles
    bursts = sampling.run_bursts(work, per_call_s, burst_ms=2, gap_ms=18)   # NVML beside the known busy share
    sampling.captured_by_pattern([bursts])                    # NVML's reading over the true busy time, per pattern"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from ..measuring.estimates import Estimate, median_interval
from ..measuring.device import DeviceInfo, get_device
from ..measuring.monitor import Monitor, Trace
from ..measuring.measurement import quantiles

# ---------------------------------------------------------------- intervals for what a run read


def samples_estimate(trace: Trace | None, metric: str) -> Estimate | None:
    """Mean of `metric`'s samples over the window; its interval is the samples' interquartile range
    (widened to hold the mean). None when the metric has no samples."""
    return trace.estimate(metric, samples_only=True) if trace is not None else None


def gpm_estimate(trace: Trace | None, metric: str, *, steady: bool = False) -> Estimate | None:
    """The whole-window GPM value of `metric`, its interval the range of the ~1 s readings inside the window;
    without a whole-window value the samples' estimate; None when not read.

    `steady`: drop the first and the last reading (start-up, a partial interval) when at least four were read, and
    take the median of the rest with its 95% interval."""
    if trace is None:
        return None
    v = trace.window.get(metric)
    if v is None:
        return samples_estimate(trace, metric)
    readings = trace.values(metric)
    if steady and len(readings) >= 4:
        return Estimate.median_of(readings[1:-1])
    vals = readings + [v]
    return Estimate(v, min(vals), max(vals))


def sample_period(traces: Sequence[Trace]) -> Estimate | None:
    """Spacing of NVML's buffered utilization samples (the driver's sample period): median and quartiles."""
    gaps = []
    for tr in traces:
        ts = [t for t, _ in (tr.series.get("nvml_util", []) if tr is not None else [])]
        gaps += [b - a for a, b in zip(ts, ts[1:]) if b > a]
    if len(gaps) < 3:
        return None
    q1, med, q3 = quantiles(gaps)
    return Estimate(med, q1, q3)


# ---------------------------------------------------------------- NVML against short bursts


def busy_overlap(busy: Sequence[tuple[float, float]], t0: float, t1: float) -> float:
    """Seconds of the intervals in `busy` that fall inside (t0, t1]."""
    return sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in busy)


def burst_periods(samples: Sequence[tuple[float, float]], busy: Sequence[tuple[float, float]], start: float,
                  end: float) -> list[tuple[float, float, float, float]]:
    """Pair each NVML sample with the true busy share of the period it covers.

    A sample at time t reports the period since the previous sample. Only periods lying wholly inside
    [start, end] are kept. Returns (period start, period end, NVML %, true busy %) per period.
    """
    pts = sorted(samples)
    out = []
    for (ta, _), (tb, v) in zip(pts, pts[1:]):
        if tb > ta and ta >= start and tb <= end:
            out.append((ta, tb, float(v), 100 * busy_overlap(busy, ta, tb) / (tb - ta)))
    return out


@dataclass
class BurstRun:
    """Bursts of GPU work of `burst_ms` separated by `gap_ms` idle, and what NVML read meanwhile."""

    burst_ms: float
    gap_ms: float
    busy: list[tuple[float, float]] = field(default_factory=list)  # GPU busy intervals, seconds
    periods: list[tuple[float, float, float, float]] = field(default_factory=list)  # from burst_periods

    @property
    def true_busy_pct(self) -> float | None:
        """Share of the sampled periods' time during which the GPU was running a burst (%)."""
        total = sum(b - a for a, b, _, _ in self.periods)
        return sum((b - a) * t for a, b, _, t in self.periods) / total if total else None

    @property
    def nvml_pct(self) -> float | None:
        """NVML's utilization over the same periods, time-weighted (%)."""
        total = sum(b - a for a, b, _, _ in self.periods)
        return sum((b - a) * v for a, b, v, _ in self.periods) / total if total else None

    @property
    def missed_periods(self) -> int:
        """Periods in which the GPU ran bursts but NVML read 0%."""
        return sum(1 for _, _, v, t in self.periods if t > 0 and v == 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"true_busy_pct": self.true_busy_pct, "nvml_pct": self.nvml_pct,
                               "missed_periods": self.missed_periods}


def _pooled_share(periods: Sequence[tuple[float, float, float, float]]) -> float:
    """NVML-weighted time over true busy time, over busy periods (start, end, NVML, true busy)."""
    return sum((b - a) * v for a, b, v, _ in periods) / sum((b - a) * t for a, b, _, t in periods)


def captured_share(runs: Sequence[BurstRun]) -> Estimate | None:
    """Share of the bursts' busy time that NVML reported: NVML-weighted time over true busy time, pooled
    over `runs`; its interval the interquartile range of the per-period ratios. None under 3 periods."""
    periods = [p for r in runs for p in r.periods if p[3] > 0]
    if len(periods) < 3:
        return None
    pooled = _pooled_share(periods)
    q1, _, q3 = quantiles([v / t for _, _, v, t in periods])
    return Estimate(pooled, min(q1, pooled), max(q3, pooled))


def captured_by_pattern(runs: Sequence[BurstRun]) -> list[Estimate | None]:
    """Share of each burst pattern's busy time that NVML reported, one Estimate per run (None without a busy
    period), its interval the 95% one for the median of the per-period ratios. A short-burst pattern and a long-burst
    one can differ more than the periods of either: pooling them hides the one further from the claim."""
    out: list[Estimate | None] = []
    for r in runs:
        periods = [p for p in r.periods if p[3] > 0]
        if not periods:
            out.append(None)
            continue
        pooled = _pooled_share(periods)
        out.append(Estimate(pooled, *median_interval([v / t for _, _, v, t in periods], include=pooled)))
    return out


def run_bursts(work: Callable[[], Any], per_call_s: float, *, burst_ms: float, gap_ms: float,
               seconds: float = 2.0, device: DeviceInfo | None = None, nvml: Any = None) -> BurstRun:
    """Run bursts of `work` (each about `burst_ms` of GPU time) separated by `gap_ms` of idle, for `seconds`,
    under a Monitor; return each burst's GPU busy interval (CUDA events, ending when the sync returns) paired
    with NVML's samples. `per_call_s` is one call's time, to size the bursts. Needs a CUDA GPU with NVML
    (`nvml` replaces pynvml, for tests)."""
    import torch

    device = device or get_device()
    for name, v in (("per_call_s", per_call_s), ("burst_ms", burst_ms), ("gap_ms", gap_ms), ("seconds", seconds)):
        if not (isinstance(v, (int, float)) and 0 < v < float("inf")):
            raise ValueError(f"{name}={v!r} must be a finite number > 0")
    if not device.is_cuda:
        raise ValueError("run_bursts needs a CUDA GPU: NVML reads a GPU's kernels")
    calls = max(1, round(burst_ms / 1e3 / per_call_s))
    work()
    torch.cuda.synchronize()
    run = BurstRun(burst_ms=burst_ms, gap_ms=gap_ms)
    with Monitor(device, gpm=False, cpu=False, nvml=nvml) as mon:
        t0 = mon._t0_epoch  # NVML's sample times are epoch-based; the monitor counts from this instant
        stop = time.time() + seconds
        while time.time() < stop:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                work()
            end.record()
            end.synchronize()
            done = time.time() - t0
            run.busy.append((done - start.elapsed_time(end) / 1e3, done))
            time.sleep(gap_ms / 1e3)
    run.periods = burst_periods(mon.trace.series.get("nvml_util", []), run.busy, run.busy[0][0], run.busy[-1][1])
    return run
