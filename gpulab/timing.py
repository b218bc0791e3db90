"""One way to time a function: warm-up, CUDA events or a host clock, repeats sized by time, median and IQR."""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

NOISE_THRESHOLD = 0.10  # IQR over median above this is flagged as noisy, as torch.utils.benchmark does


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """(q1, median, q3) of a non-empty list, by linear interpolation."""
    if not values:
        raise ValueError("values must not be empty")
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


@dataclass
class Measurement:
    """Timings of repeated calls of one function, in seconds, with their median and spread."""

    label: str
    times_s: list[float]
    timer: str = "perf_counter"
    warmup_calls: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not self.times_s:
            raise ValueError("times_s must hold at least one timing")

    @property
    def n(self) -> int:
        return len(self.times_s)

    @property
    def median(self) -> float:
        return quantiles(self.times_s)[1]

    @property
    def q1(self) -> float:
        return quantiles(self.times_s)[0]

    @property
    def q3(self) -> float:
        return quantiles(self.times_s)[2]

    @property
    def iqr(self) -> float:
        q1, _, q3 = quantiles(self.times_s)
        return q3 - q1

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times_s)

    @property
    def noisy(self) -> bool:
        """True when the spread (IQR) is over 10% of the median: treat small differences with care."""
        return self.iqr > NOISE_THRESHOLD * self.median

    def summary(self) -> dict[str, Any]:
        return {"median_ms": self.median * 1e3, "iqr_ms": self.iqr * 1e3, "n": self.n, "noisy": self.noisy,
                "timer": self.timer}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"summary": self.summary()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def __repr__(self) -> str:
        warn = "  (noisy: IQR > 10% of median)" if self.noisy else ""
        return (f"Measurement({self.label!r}: median {fmt_time(self.median)}, IQR {fmt_time(self.iqr)}, "
                f"{self.n} runs, {self.timer}){warn}")

    def _repr_html_(self) -> str:
        warn = " <span style='color:#b35900'>noisy: IQR &gt; 10% of median</span>" if self.noisy else ""
        return (f"<b>{self.label}</b>: median {fmt_time(self.median)}, IQR {fmt_time(self.iqr)} "
                f"over {self.n} runs ({self.timer}){warn}")


def fmt_time(seconds: float) -> str:
    """Seconds in the most readable unit."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def _on_cuda(device: torch.device | str | None) -> bool:
    if device is None:
        return torch.cuda.is_available()
    return torch.device(device).type == "cuda"


def benchmark(fn: Callable[[], Any], *, label: str = "", min_time_s: float = 0.5, warmup_s: float = 0.1,
              min_repeats: int = 5, max_repeats: int = 10_000, device: torch.device | str | None = None,
              clock: Callable[[], float] | None = None) -> Measurement:
    """Time `fn()`: warm up, then repeat until `min_time_s` of timed runs, one timing per call.

    On a CUDA device each call is timed with a pair of CUDA events (device time, launch included);
    on the CPU with `time.perf_counter`. `clock` replaces the host clock (tests use a fake one).
    """
    if not callable(fn):
        raise ValueError("fn must be callable")
    if min_time_s <= 0:
        raise ValueError(f"min_time_s={min_time_s} must be > 0")
    if warmup_s < 0:
        raise ValueError(f"warmup_s={warmup_s} must be >= 0")
    if min_repeats < 1 or max_repeats < min_repeats:
        raise ValueError(f"min_repeats={min_repeats}, max_repeats={max_repeats}: need 1 <= min_repeats <= max_repeats")
    use_events = _on_cuda(device) and clock is None
    clock = clock or time.perf_counter

    def sync():
        if use_events:
            torch.cuda.synchronize()

    # Warm-up: at least two calls (first-call costs: module load, cuBLAS handles, compilation).
    sync()
    t0, warm = clock(), 0
    while warm < 2 or clock() - t0 < warmup_s:
        fn()
        warm += 1
        if warm >= max_repeats:
            break
    sync()
    per_call = max((clock() - t0) / warm, 1e-9)
    repeats = int(min(max_repeats, max(min_repeats, min_time_s / per_call)))

    times: list[float] = []
    if use_events:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]
    else:
        for _ in range(repeats):
            t = clock()
            fn()
            times.append(clock() - t)
    return Measurement(label=label or getattr(fn, "__name__", "fn"), times_s=times,
                       timer="cuda events" if use_events else "perf_counter", warmup_calls=warm)


@dataclass
class Speedup:
    """How much faster `after` is than `before`, and whether the difference is outside the noise."""

    before: str
    after: str
    ratio: float  # before median / after median: > 1 means after is faster
    within_noise: bool

    @property
    def verdict(self) -> str:
        if self.within_noise:
            return f"within noise ({self.ratio:.2f}x)"
        return f"{self.ratio:.2f}x faster" if self.ratio >= 1 else f"{1 / self.ratio:.2f}x slower"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"verdict": self.verdict}

    def __repr__(self) -> str:
        return f"Speedup({self.after!r} vs {self.before!r}: {self.verdict})"


def compare(before: Measurement, after: Measurement) -> Speedup:
    """Speed of `after` relative to `before`; 'within noise' when the medians differ by less than the spread."""
    if not isinstance(before, Measurement) or not isinstance(after, Measurement):
        raise ValueError("before and after must be Measurement objects (from benchmark())")
    spread = max(before.iqr, after.iqr)
    within = abs(before.median - after.median) <= spread
    return Speedup(before.label, after.label, before.median / after.median, within)
