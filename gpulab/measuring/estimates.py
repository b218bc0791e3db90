"""A measured value with its interval: the Estimate, medians with their confidence intervals, ratios and
differences of estimates."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable


def as_number(x: Any) -> float | None:
    """A finite float from a Python number, numpy scalar or one-element tensor; None for NaN, inf or None."""
    if x is None or isinstance(x, bool):
        return None
    try:
        if hasattr(x, "numel") and x.numel() != 1:  # a tensor of several values is no single measurement
            return None
        v = float(x.item()) if hasattr(x, "item") else float(x)
    except (TypeError, ValueError, RuntimeError):
        return None
    return v if math.isfinite(v) else None


@dataclass(frozen=True)
class Estimate:
    """A measured value and the interval [lo, hi] its spread allows."""

    value: float
    lo: float
    hi: float

    def __post_init__(self):
        for name in ("value", "lo", "hi"):
            if as_number(getattr(self, name)) is None:
                raise ValueError(f"Estimate.{name}={getattr(self, name)!r} must be a finite number")
        if self.lo > self.hi:
            raise ValueError(f"Estimate: lo={self.lo} must be <= hi={self.hi}")

    @classmethod
    def exact(cls, value: float) -> Estimate:
        """A value without spread: a count, a definition or arithmetic."""
        return cls(value, value, value)

    @classmethod
    def median_of(cls, values: list[float]) -> Estimate:
        """The median of `values` with a 95% confidence interval for it (`median_interval`)."""
        mid = statistics.median(values)
        return cls(mid, *median_interval(values, include=mid))

    @property
    def interval(self) -> tuple[float, float]:
        """(lo, hi)."""
        return (self.lo, self.hi)

    @property
    def width(self) -> float:
        """hi - lo."""
        return self.hi - self.lo

    def map(self, f: Callable[[float], float]) -> Estimate:
        """Apply a monotone function (increasing or decreasing) to the value and both ends."""
        a, b = f(self.lo), f(self.hi)
        return Estimate(f(self.value), min(a, b), max(a, b))

    def __repr__(self) -> str:
        return f"{self.value:.4g} [{self.lo:.4g}, {self.hi:.4g}]"


def estimate_of(x: Any) -> Estimate | None:
    """The Estimate behind `x`: an Estimate, a Comparison's `headline()` (items/s ratio where the two sides do
    different work, else the time ratio), anything with `.estimate` (Speedup, Measurement), a (value, (lo, hi))
    pair, or a bare number (zero width). None when it holds no finite number."""
    if x is None:
        return None
    if isinstance(x, Estimate):
        return x
    headline = getattr(x, "headline", None)  # a Comparison: the work-normalised ratio its verdict shows
    if callable(headline):
        return headline()
    est = getattr(x, "estimate", None)
    if est is not None and not isinstance(x, (int, float)):
        return est() if callable(est) else est
    if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], (tuple, list)):
        v, (lo, hi) = x[0], x[1]
        nums = [as_number(v), as_number(lo), as_number(hi)]
        if any(n is None for n in nums):
            return None
        return Estimate(nums[0], min(nums[1], nums[2]), max(nums[1], nums[2]))
    v = as_number(x)
    return None if v is None else Estimate.exact(v)


def ratio(a: Estimate | None, b: Estimate | None) -> Estimate | None:
    """a / b with the widest interval the two allow (a.lo / b.hi to a.hi / b.lo); None if either is missing
    or b's interval reaches zero."""
    if a is None or b is None or b.lo <= 0:
        return None
    return Estimate(a.value / b.value, a.lo / b.hi, a.hi / b.lo)


def difference(a: Estimate | None, b: Estimate | None) -> Estimate | None:
    """a - b with the widest interval the two allow (a.lo - b.hi to a.hi - b.lo); None if either is missing."""
    if a is None or b is None:
        return None
    return Estimate(a.value - b.value, a.lo - b.hi, a.hi - b.lo)


def median_interval(values: list[float], confidence: float = 0.95,
                    include: float | None = None) -> tuple[float, float]:
    """A distribution-free confidence interval for the median of `values` (order statistics).

    (x(k), x(n+1-k)) of the sorted values, with the largest k whose coverage 1 - 2·P(Binomial(n, ½) < k) reaches
    `confidence`; with too few values (up to 8 at 95%) the whole range, which holds the median with probability
    1 - 2/2^n: 93.75% from five, 75% from three (`log_t_interval` is honest from so few). Unlike the range, it
    narrows as rounds are added. `include` widens it to hold that value (its point estimate)."""
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("values must not be empty")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} must be between 0 and 1")
    n, k, below = len(xs), 0, 0.0  # below: P(Binomial(n, 1/2) <= k - 1), accumulated term by term
    while k < n // 2:
        below_next = below + math.comb(n, k) / 2 ** n
        if 1 - 2 * below_next < confidence:
            break
        k, below = k + 1, below_next
    k = max(k, 1)  # no k reaches `confidence`: the whole range
    lo, hi = xs[k - 1], xs[n - k]
    return (lo, hi) if include is None else (min(lo, include), max(hi, include))


def log_t_interval(ratios: list[float], confidence: float = 0.95,
                   include: float | None = None) -> tuple[float, float]:
    """A Student-t `confidence` interval of the ratios' geometric mean (of their mean log), for a few paired
    ratios: from three pairs the order statistics' interval is their range, which holds the median only 75% of the
    time. `include` widens it to hold that value (the pooled ratio it is the interval of)."""
    logs = [math.log(r) for r in ratios]
    if len(logs) < 2:
        raise ValueError(f"a t-interval needs at least two ratios, got {len(logs)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} must be between 0 and 1")
    half = t_quantile(0.5 + confidence / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    lo, hi = math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half)
    return (lo, hi) if include is None else (min(lo, include), max(hi, include))


def t_quantile(p: float, df: int) -> float:
    """The `p` quantile (p >= 0.5) of Student's t with `df` degrees of freedom: bisection on its CDF, the density
    integrated by Simpson's rule (4.303 for p = 0.975 and df = 2; 1.960 as df grows)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x: float, steps: int = 400) -> float:
        h = x / steps
        f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def with_repeats(est: Estimate, repeats: Any) -> Estimate:
    """`est` with its interval widened to cover every finite value in `repeats` (the same quantity measured again:
    interleaved rounds' ratios, repeated measurements of one shape): a verdict at a band edge stands on the spread
    between repeats, not only on one measurement's interval."""
    vals = [v for v in (as_number(r) for r in (repeats or ())) if v is not None]
    if not vals:
        return est
    return Estimate(est.value, min(est.lo, *vals), max(est.hi, *vals))


def interval_of(x: Any) -> tuple[float, float] | None:
    """(lo, hi) of a measurement, comparison, speedup or estimate; None when there is none."""
    e = estimate_of(x)
    return e.interval if e else None
