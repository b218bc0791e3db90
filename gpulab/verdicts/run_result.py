"""One side of a before/after: a RunResult (timing, FLOPs, MFU, monitor trace), and the speed of two pipelines."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..measuring.estimates import Estimate, log_t_interval, median_interval
from ..measuring.flops import mfu as _mfu
from ..measuring.monitor import Trace
from ..measuring.profiling import ProfileSummary
from ..measuring.measurement import Measurement, Speedup


@dataclass
class RunResult:
    """One side of an experiment: its timing, the FLOPs it does and what the device showed meanwhile."""

    label: str
    measurement: Measurement
    flops: float | None = None  # per call
    dtype: str | None = None  # the dtype of its matmuls: picks the peak for MFU
    peak_tflops: float | None = None  # datasheet dense peak of `peak_dtype` (default: of dtype)
    measured_peak_tflops: float | None = None
    items: float | None = None  # samples (or tokens) per call, for throughput
    item_name: str = "samples"
    trace: Trace | None = None
    profile: ProfileSummary | None = None
    pipeline: bool = False  # a producer/consumer loop: throughput from the window's wall time, not the median
    peak_dtype: str | None = None  # the dtype whose peak MFU is measured against, when it is not `dtype`

    @property
    def seconds(self) -> float:
        """Seconds per call: the median call, or for a pipeline the windows' wall time per call."""
        if self.pipeline:
            rate = self.measurement.window_rate(1.0)
            if rate is not None:
                return 1.0 / rate.value
        return self.measurement.median

    @property
    def tflops(self) -> float | None:
        """Achieved TFLOP/s (None without a FLOP count)."""
        return self.flops / self.seconds / 1e12 if self.flops else None

    @property
    def yardstick(self) -> str | None:
        """The dtype whose peak MFU is measured against: `peak_dtype`, else `dtype`."""
        return self.peak_dtype or self.dtype

    @property
    def mfu(self) -> float | None:
        """MFU against the datasheet dense peak of `yardstick` (None when that peak is unknown)."""
        return _mfu(self.flops, self.seconds, self.peak_tflops) if self.flops and self.peak_tflops else None

    @property
    def mfu_measured_peak(self) -> float | None:
        """Achieved FLOP/s over the peak measured on this device for `dtype`."""
        if not (self.flops and self.measured_peak_tflops):
            return None
        # A measured peak is itself a measurement: a workload may beat it by a few % (clocks, another shape),
        # so only a rate more than 5% above it says the FLOP count is wrong (mfu() warns then).
        _mfu(self.flops, self.seconds, None, measured_peak_tflops=self.measured_peak_tflops)
        return self.tflops / self.measured_peak_tflops

    @property
    def throughput(self) -> float | None:
        """Items per second: over the timed windows' wall time for a pipeline, else items / median time."""
        est = self.throughput_estimate()
        return est.value if est else None

    def throughput_estimate(self) -> Estimate | None:
        """Throughput with its interval (per-window rates for a pipeline, the quartiles otherwise)."""
        if not self.items:
            return None
        if self.pipeline:
            rate = self.measurement.window_rate(self.items)
            if rate is not None:
                return rate
        m = self.measurement
        return Estimate(self.items / m.median, self.items / m.q3, self.items / m.q1)

    def metric(self, name: str) -> float | None:
        """The mean of monitor metric `name` over the timed window (None without a trace or that metric)."""
        return self.trace.mean(name) if self.trace else None

    def summary(self) -> dict[str, Any]:
        """Time, throughput, TFLOP/s, MFU and the monitor's means, as a dict."""
        p = self.profile.summary() if self.profile else {}
        return {"label": self.label, "median_ms": self.seconds * 1e3, "iqr_ms": self.measurement.iqr * 1e3,
                "noisy": self.measurement.noisy, "flops": self.flops, "tflops": self.tflops, "dtype": self.dtype,
                "peak_tflops": self.peak_tflops, "peak_dtype": self.peak_dtype, "mfu": self.mfu,
                "mfu_measured_peak": self.mfu_measured_peak,
                "throughput": self.throughput, "item_name": self.item_name, "pipeline": self.pipeline,
                "nvml_util": self.metric("nvml_util"), "gpm_sm_active": self.metric("gpm_sm_active"),
                "gpm_tensor_active": self.metric("gpm_tensor_active"), "busy_fraction": p.get("busy_fraction"),
                "kernels_per_step": p.get("kernels_per_step"), "syncs_per_step": p.get("syncs_per_step")}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"summary": self.summary(), "measurement": self.measurement.to_dict(),
                "trace": self.trace.to_dict() if self.trace else None,
                "profile": self.profile.to_dict() if self.profile else None,
                "items": self.items, "measured_peak_tflops": self.measured_peak_tflops}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        """A RunResult from `to_dict`'s dict."""
        s = d["summary"]
        return cls(label=s["label"], measurement=Measurement.from_dict(d["measurement"]), flops=s.get("flops"),
                   dtype=s.get("dtype"), peak_tflops=s.get("peak_tflops"),
                   measured_peak_tflops=d.get("measured_peak_tflops"), items=d.get("items"),
                   item_name=s.get("item_name", "samples"), pipeline=bool(s.get("pipeline", False)),
                   peak_dtype=s.get("peak_dtype"),
                   trace=Trace.from_dict(d["trace"]) if d.get("trace") else None,
                   profile=ProfileSummary.from_dict(d["profile"]) if d.get("profile") else None)


KINDS = ("optimisation", "demonstration")


def window_pair_ratios(before: RunResult, after: RunResult) -> list[float]:
    """before's wall time per call over after's, window by window (paired in order: the first windows, then each
    interleaved round)."""
    wb = [s / n for n, s in before.measurement.windows if n > 0 and s > 0]
    wa = [s / n for n, s in after.measurement.windows if n > 0 and s > 0]
    return [b / a for b, a in zip(wb, wa)]


def pipeline_speed(before: RunResult, after: RunResult, interval: str = "median") -> Speedup | None:
    """Speedup of two pipelines from their windows' wall time per call, paired window by window.

    The interval is the 95% one for the median of the per-window ratios, or with `interval="t"` the Student-t one of
    their mean log ratio (`estimates.log_t_interval`: honest from a few pairs); "within noise" when it holds 1."""
    pairs = window_pair_ratios(before, after)
    if not pairs:
        return None
    ratio = before.seconds / after.seconds
    if interval == "t" and len(pairs) >= 2:
        lo, hi = log_t_interval(pairs, include=ratio)
    else:
        lo, hi = median_interval(pairs, include=ratio)  # 95% CI of the median pair ratio
    noisy = (hi - lo) > 0.2 * ratio
    within = lo <= 1.0 <= hi
    return Speedup(before.label, after.label, ratio, within, lo, hi, noisy=noisy and not within)
