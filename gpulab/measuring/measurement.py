"""A timing's value types: a Measurement (median, quartiles and interval of repeated timings) and the Speedup of one
over another."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from .estimates import Estimate, median_interval
from .text import ratio as _ratio, sig
from .files import JsonRecord


NOISE_THRESHOLD = 0.10  # IQR over median above this is flagged as noisy, as torch.utils.benchmark does


def describe_mode(mode: str, calls_per_timing: int, timer: str, most: int | None = None) -> str:
    """How a Measurement was timed, in words: "throughput: 1 event pair around 100 calls" (`most`: merged rounds
    of different block sizes, "100-120 calls")."""
    pair = "event pair" if timer == "cuda events" else "clock pair"
    if mode == "throughput":
        n = f"{calls_per_timing}-{most}" if most and most != calls_per_timing else f"{calls_per_timing}"
        return f"throughput: 1 {pair} around {n} call{'s' if n != '1' else ''}"
    if mode == "latency":
        return f"latency: {'events' if timer == 'cuda events' else 'clock'} around each call"
    return "mixed: rounds timed in latency and throughput modes"


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """(q1, median, q3) of a non-empty list, by linear interpolation."""
    if not values:
        raise ValueError("values must not be empty")
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


@dataclass
class Measurement(JsonRecord):
    """Timings of repeated calls of one function, in seconds, with their median and spread.

    A value: its statistics are computed once; `merged` makes a new one. `windows` holds (calls, wall seconds) of
    each timed window, for the throughput of a pipeline, which per-call medians overstate when a queue is involved.
    `mode` is "latency" (a timing is one call) or "throughput" (the mean of `calls_per_timing` back-to-back calls)."""

    label: str
    times_s: list[float]
    timer: str = "perf_counter"
    warmup_calls: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    windows: list[tuple[int, float]] = field(default_factory=list)
    mode: str = "latency"
    calls_per_timing: int = 1

    def __post_init__(self):
        if not self.times_s:
            raise ValueError("times_s must hold at least one timing")
        bad = [t for t in self.times_s if not isinstance(t, (int, float)) or isinstance(t, bool)
               or not math.isfinite(t) or t < 0]
        if bad:
            raise ValueError(f"times_s holds {len(bad)} timing(s) that are not finite numbers >= 0 (e.g. {bad[0]!r}): "
                             "a duration in seconds is never negative")
        self.times_s = [float(t) for t in self.times_s]
        if statistics.median(self.times_s) == 0:
            raise ValueError("times_s has a median of 0 s: the clock did not resolve these calls (time several "
                             "calls per timing), and no ratio can be taken of a zero time")
        self.windows = [(int(n), float(s)) for n, s in self.windows]
        if self.mode not in ("latency", "throughput", "mixed"):
            raise ValueError(f"mode={self.mode!r}: a Measurement is 'latency', 'throughput' or 'mixed' (merged)")
        if isinstance(self.calls_per_timing, bool) or not isinstance(self.calls_per_timing, int) \
                or self.calls_per_timing < 1:
            raise ValueError(f"calls_per_timing={self.calls_per_timing!r} must be an int >= 1")

    @property
    def method(self) -> str:
        """How it was timed, in words: "throughput: 1 event pair around 100 calls" or "latency: events around
        each call"."""
        lo, hi = self.meta.get("calls_per_timing_range", [self.calls_per_timing] * 2)
        return describe_mode(self.mode, self.calls_per_timing, self.timer, most=hi)

    @cached_property
    def _quartiles(self) -> tuple[float, float, float]:
        return quantiles(self.times_s)

    @property
    def n(self) -> int:
        """How many timed calls."""
        return len(self.times_s)

    @property
    def median(self) -> float:
        """Median seconds per call."""
        return self._quartiles[1]

    @property
    def q1(self) -> float:
        """First quartile of the seconds per call."""
        return self._quartiles[0]

    @property
    def q3(self) -> float:
        """Third quartile of the seconds per call."""
        return self._quartiles[2]

    @property
    def iqr(self) -> float:
        """Interquartile range (q3 - q1), in seconds."""
        return self.q3 - self.q1

    @property
    def mean(self) -> float:
        """Mean seconds per call (the median is the robust number)."""
        return statistics.fmean(self.times_s)

    @property
    def noisy(self) -> bool:
        """True when the spread (IQR) is over 10% of the median: treat small differences with care."""
        return self.iqr > NOISE_THRESHOLD * self.median

    @property
    def round_medians(self) -> list[float]:
        """The median time of each timing round (the first window, then interleaved rounds), if recorded."""
        return list(self.meta.get("round_medians", []))

    def estimate(self) -> Estimate:
        """The median with its interquartile range."""
        return Estimate(self.median, self.q1, self.q3)

    def median_estimate(self) -> Estimate:
        """The median with a 95% confidence interval for it (order statistics of the timings): how well the
        median is known, where `estimate` shows how much single calls vary."""
        return Estimate.median_of(self.times_s)

    def window_rate(self, items_per_call: float = 1.0) -> Estimate | None:
        """Items per second over the wall time of the timed windows (all windows pooled), with the spread
        of the per-window rates as its interval; None when no window was recorded."""
        wins = [(n, s) for n, s in self.windows if n > 0 and s > 0]
        if not wins:
            return None
        rate = items_per_call * sum(n for n, _ in wins) / sum(s for _, s in wins)
        return Estimate(rate, *median_interval([items_per_call * n / s for n, s in wins], include=rate))

    def merged(self, other: Measurement) -> Measurement:
        """A new Measurement holding both sets of timings and windows (self's label and timer)."""
        meta = dict(self.meta)
        meta["round_medians"] = (self.round_medians or [self.median]) + (other.round_medians or [other.median])
        same_mode = self.mode == other.mode
        if not same_mode:
            meta["modes"] = sorted({self.method, other.method} | set(self.meta.get("modes", [])))
        calls = (self.calls_per_timing, other.calls_per_timing, *self.meta.get("calls_per_timing_range", []))
        if same_mode and min(calls) != max(calls):  # rounds of one mode sized apart: say the range
            meta["calls_per_timing_range"] = [min(calls), max(calls)]
        return Measurement(label=self.label, times_s=self.times_s + other.times_s, timer=self.timer,
                           warmup_calls=self.warmup_calls, meta=meta, windows=self.windows + other.windows,
                           mode=self.mode if same_mode else "mixed",
                           calls_per_timing=min(calls) if same_mode else 1)

    def summary(self) -> dict[str, Any]:
        """Median, quartiles, IQR and count in ms, as a dict."""
        return {"median_ms": self.median * 1e3, "iqr_ms": self.iqr * 1e3, "q1_ms": self.q1 * 1e3,
                "q3_ms": self.q3 * 1e3, "n": self.n, "noisy": self.noisy, "timer": self.timer,
                "mode": self.mode, "method": self.method}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with every timing."""
        return {"label": self.label, "times_s": self.times_s, "timer": self.timer,
                "warmup_calls": self.warmup_calls, "meta": self.meta, "windows": [list(w) for w in self.windows],
                "mode": self.mode, "calls_per_timing": self.calls_per_timing, "summary": self.summary()}

    def __repr__(self) -> str:
        warn = "  (noisy: IQR > 10% of median)" if self.noisy else ""
        return (f"Measurement({self.label!r}: median {fmt_time(self.median)}, IQR {fmt_time(self.iqr)}, "
                f"{self.n} timings, {self.method}){warn}")

    def _repr_html_(self) -> str:
        warn = " <span style='color:#b35900'>noisy: IQR &gt; 10% of median</span>" if self.noisy else ""
        return (f"<b>{self.label}</b>: median {fmt_time(self.median)}, IQR {fmt_time(self.iqr)} "
                f"over {self.n} timings ({self.method}){warn}")


def fmt_time(seconds: float) -> str:
    """Seconds in the most readable unit, at three significant figures (11.0 ms, not 11 ms)."""
    if seconds >= 1:
        return f"{sig(seconds)} s"
    if seconds >= 1e-3:
        return f"{sig(seconds * 1e3)} ms"
    return f"{sig(seconds * 1e6)} µs"


@dataclass
class Speedup:
    """How much faster `after` is than `before`, with the interval its spread allows.

    - within noise: the two sides' interquartile ranges overlap;
    - noisy: they do not overlap, but one side's spread is over 10% of its median (the ratio is real, its
      size uncertain);
    - otherwise a plain "N.NNx faster" or "slower".
    """

    before: str
    after: str
    ratio: float  # before median / after median: > 1 means after is faster
    within_noise: bool
    lo: float | None = None
    hi: float | None = None
    noisy: bool = False

    def estimate(self) -> Estimate:
        """The ratio with its interval, as an Estimate."""
        lo = self.ratio if self.lo is None else min(self.lo, self.ratio)
        hi = self.ratio if self.hi is None else max(self.hi, self.ratio)
        return Estimate(self.ratio, lo, hi)

    @property
    def verdict(self) -> str:
        """One line: "N.NNx faster", "slower", "within noise" or "noisy"."""
        if self.within_noise:
            return f"within noise ({_ratio(self.ratio)})"
        s = f"{_ratio(self.ratio)} faster" if self.ratio >= 1 else f"{_ratio(1 / self.ratio)} slower"
        return f"{s}, noisy (spread over 10%)" if self.noisy else s

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self) | {"verdict": self.verdict}

    def __repr__(self) -> str:
        return f"Speedup({self.after!r} vs {self.before!r}: {self.verdict} [{self.estimate()!r}])"


def speedup_interval(before: Measurement, after: Measurement) -> tuple[float, float]:
    """Interval of before/after: from paired timing rounds when there are at least three (a 95% confidence
    interval for the median of their ratios, the whole range up to 8 rounds), otherwise from both sides'
    quartiles (q1/q3 to q3/q1). It always holds the overall ratio."""
    rb, ra = before.round_medians, after.round_medians
    ratio = before.median / after.median
    if len(rb) >= 3 and len(rb) == len(ra):
        return median_interval([b / a for b, a in zip(rb, ra)], include=ratio)
    return before.q1 / after.q3, before.q3 / after.q1


def compare(before: Measurement, after: Measurement) -> Speedup:
    """Deprecated: `speedup` (the name says what it returns)."""
    import warnings

    warnings.warn("gl.compare is deprecated: use gl.speedup (it returns a Speedup)", DeprecationWarning, stacklevel=2)
    return speedup(before, after)


def speedup(before: Measurement, after: Measurement) -> Speedup:
    """Speed of `after` relative to `before`; 'within noise' when the two interquartile ranges overlap."""
    if not isinstance(before, Measurement) or not isinstance(after, Measurement):
        raise ValueError("before and after must be Measurement objects (from benchmark())")
    within = before.q1 <= after.q3 and after.q1 <= before.q3
    lo, hi = speedup_interval(before, after)
    return Speedup(before.label, after.label, before.median / after.median, within, lo, hi,
                   noisy=(before.noisy or after.noisy) and not within)
