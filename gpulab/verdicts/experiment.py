"""The before/after harness: time, FLOPs, monitor and (optionally) profile two versions of one workload."""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Callable

from tqdm.auto import tqdm

from ..measuring import checks
from .claims import Claim
from ..measuring.estimates import Estimate, as_number
from ..measuring.text import pct, ratio as _ratio, si
from ..measuring.device import DeviceInfo, check_dtype, get_device, synchronize
from ..measuring.global_state import StateWatch
from ..measuring.peaks import MeasuredPeaks
from ..measuring.monitor import Monitor
from ..measuring.profiling import profile as _profile
from ..measuring.timing import ROUND, benchmark, time_calls
from ..measuring.measurement import Speedup, fmt_time, speedup
from .run_result import KINDS, RunResult, pipeline_speed, window_pair_ratios

__all__ = ["Claim", "Comparison", "RunResult", "before_after", "measure", "KINDS"]


@dataclass
class Comparison:
    """A before/after experiment: both runs, the speedup and whether it is outside the noise."""

    name: str
    before: RunResult
    after: RunResult
    device: str = ""
    notes: list[str] = field(default_factory=list)
    kind: str = "optimisation"  # or "demonstration": a contrast that teaches, not a change to adopt
    pair_interval: str = "median"  # a pipeline's window pairs: "median" (order statistics) or "t" (mean log ratio)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r}; allowed: {', '.join(KINDS)}")
        if self.pair_interval not in ("median", "t"):
            raise ValueError(f"pair_interval={self.pair_interval!r}; allowed: median, t")
        self._speed: Speedup | None = None

    @property
    def speed(self) -> Speedup:
        """The Speedup of after over before (computed once)."""
        if self._speed is None:  # the measurements are values: compare once
            self._speed = (pipeline_speed(self.before, self.after, self.pair_interval)
                           if self.before.pipeline and self.after.pipeline
                           else None) or speedup(self.before.measurement, self.after.measurement)
        return self._speed

    def estimate(self) -> Estimate:
        """The speedup with its interval (paired rounds, or both sides' quartiles)."""
        return self.speed.estimate()

    def _work(self) -> tuple[float, str] | None:
        """(after work / before work per call, the rate's name) when the two sides do different work per call:
        items per call when both sides count them ("images/s"), else FLOPs per call ("FLOP/s"); None otherwise."""
        def differ(b, a):
            return bool(b and a) and abs(a - b) > 1e-9 * max(abs(a), abs(b))
        b, a = self.before, self.after
        if b.items and a.items:
            return (a.items / b.items, f"{a.item_name}/s") if differ(b.items, a.items) else None
        if differ(b.flops, a.flops):
            return a.flops / b.flops, "FLOP/s"
        return None

    @property
    def work_differs(self) -> bool:
        """Whether the two sides do different work per call: items per call differ (batch 4 -> 16), or without
        items on both sides, FLOPs per call differ."""
        return self._work() is not None

    @property
    def basis(self) -> str:
        """What the headline ratio compares: "items/s" or "FLOP/s" when the work per call differs, else "time"."""
        w = self._work()
        return "time" if w is None else "FLOP/s" if w[1] == "FLOP/s" else "items/s"

    def headline(self) -> Estimate:
        """The work-normalised ratio with its interval, the one the verdict shows and `Claim.check` judges: after
        items/s over before items/s when the items per call differ (the time speedup scaled by the exact ratio of
        items), FLOP/s likewise when only the FLOPs per call differ, else the time speedup (before time / after
        time). Above 1 the after side does more work per second."""
        est = self.estimate()
        w = self._work()
        return est if w is None else est.map(lambda x: x * w[0])

    def round_ratios(self) -> list[float]:
        """The headline ratio round by round (work-normalised like `headline`): paired windows of a pipeline, else
        before / after of each pair of timing rounds; empty without paired rounds. Pass them as `repeats=` to
        `Claim.check` or `Lesson.check`, so a verdict near a band edge covers the spread between rounds."""
        if self.before.pipeline and self.after.pipeline:
            raw = window_pair_ratios(self.before, self.after)
        else:
            rb, ra = self.before.measurement.round_medians, self.after.measurement.round_medians
            raw = [b / a for b, a in zip(rb, ra) if a > 0] if len(rb) == len(ra) and len(rb) >= 2 else []
        w = self._work()
        return [r * w[0] for r in raw] if w else raw

    def throughput_ratio(self) -> Estimate | None:
        """after throughput / before throughput with its interval (for pipelines: window rates)."""
        b, a = self.before.throughput_estimate(), self.after.throughput_estimate()
        if b is None or a is None:
            return None
        return Estimate(a.value / b.value, a.lo / b.hi, a.hi / b.lo)

    @property
    def speedup(self) -> float:
        """before time / after time: 2.0 means the after version takes half the time."""
        return self.speed.ratio

    @property
    def within_noise(self) -> bool:
        """Whether the headline ratio's interval holds 1 (no measurable difference)."""
        h = self.headline()
        return h.lo <= 1.0 <= h.hi

    @property
    def noisy(self) -> bool:
        """Outside the noise, but its size is uncertain: with equal work, a side's spread is over 10% of its
        median (`Speedup.noisy`); with unequal work, the items/s interval is wider than 20% of its value."""
        if self.within_noise:
            return False
        if not self.work_differs:
            return bool(self.speed.noisy)
        h = self.headline()
        return (h.hi - h.lo) > 0.2 * h.value

    @property
    def verdict(self) -> str:
        """The headline in words: "3.38x faster", "1.14x slower", or with unequal work "tokens/s 3.90x higher"
        (or "FLOP/s 2.02x higher" when only the FLOPs differ); "within noise (...)" only when the headline
        interval holds 1."""
        h = self.headline()
        if self.work_differs:
            rate = self._work()[1]
            if self.within_noise:
                return f"within noise ({rate} {_ratio(h.value)})"
            s = f"{rate} {_ratio(h.value)} higher" if h.value >= 1 else f"{rate} {_ratio(1 / h.value)} lower"
        else:
            if self.within_noise:
                return f"within noise ({_ratio(h.value)})"
            s = f"{_ratio(h.value)} faster" if h.value >= 1 else f"{_ratio(1 / h.value)} slower"
        why = "interval over 20%" if self.work_differs else "spread over 10%"
        return f"{s}, noisy ({why})" if self.noisy else s

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: both sides, the time speedup's interval and the headline (work-normalised) ratio."""
        est, h = self.estimate(), self.headline()
        return {"name": self.name, "kind": self.kind, "before": self.before.to_dict(), "after": self.after.to_dict(),
                "speedup": self.speedup, "speedup_interval": [est.lo, est.hi], "within_noise": self.within_noise,
                "noisy": self.noisy, "verdict": self.verdict, "device": self.device, "notes": self.notes,
                "ratio": h.value, "ratio_interval": [h.lo, h.hi], "ratio_basis": self.basis,
                "pair_interval": self.pair_interval}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Comparison:
        """A Comparison from `to_dict`'s dict."""
        return cls(name=d["name"], before=RunResult.from_dict(d["before"]), after=RunResult.from_dict(d["after"]),
                   device=d.get("device", ""), notes=d.get("notes", []),
                   kind=d.get("kind", "optimisation") if d.get("kind", "optimisation") in KINDS else "optimisation",
                   pair_interval="t" if d.get("pair_interval") == "t" else "median")

    def mfu_label(self) -> str:
        """The MFU row's name, saying which peak both sides are measured against."""
        b, a = self.before.yardstick, self.after.yardstick
        if b and b == a:
            both = ", both sides" if self.before.dtype != self.after.dtype else ""
            return f"MFU (datasheet {b.upper()} peak{both})"
        peak = self.before.peak_tflops
        if peak and peak == self.after.peak_tflops:  # one number on both sides, its dtype not recorded (older runs)
            return f"MFU (datasheet peak {peak:.4g} TFLOP/s, both sides)"
        return "MFU (datasheet peak of each side's dtype)"

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, before, after) rows of the comparison's table."""
        b, a = self.before, self.after
        rows = [("time per call", f"{fmt_time(b.seconds)} ± {fmt_time(b.measurement.iqr)}",
                 f"{fmt_time(a.seconds)} ± {fmt_time(a.measurement.iqr)}")]
        if b.throughput or a.throughput:
            rows.append((f"{b.item_name}/s", si(b.throughput), si(a.throughput)))
        if b.flops or a.flops:
            rows.append(("FLOP/s", si(None if b.tflops is None else b.tflops * 1e12),
                         si(None if a.tflops is None else a.tflops * 1e12)))
            rows.append((self.mfu_label(), pct(b.mfu), pct(a.mfu)))
            if b.measured_peak_tflops or a.measured_peak_tflops:
                rows.append(("MFU (measured peak)", pct(b.mfu_measured_peak), pct(a.mfu_measured_peak)))
        for metric, label in (("nvml_util", "GPU busy, NVML"), ("gpm_sm_active", "SM active, GPM"),
                              ("gpm_tensor_active", "tensor active, GPM")):
            bv, av = b.metric(metric), a.metric(metric)
            if bv is not None or av is not None:
                rows.append((label, pct(bv, 1), pct(av, 1)))
        if b.profile or a.profile:
            bp = b.profile.summary() if b.profile else {}
            ap = a.profile.summary() if a.profile else {}
            rows.append(("GPU busy, profiler trace", pct(bp.get("busy_fraction")), pct(ap.get("busy_fraction"))))
            rows.append(("kernels per call", si(bp.get("kernels_per_step")), si(ap.get("kernels_per_step"))))
            rows.append(("syncs per call", si(bp.get("syncs_per_step")), si(ap.get("syncs_per_step"))))
        return rows

    def __repr__(self) -> str:
        lines = [f"{self.name}: {self.verdict}"] + [f"  {k:<26} {b:>22}  ->  {a}" for k, b, a in self.rows()]
        return "\n".join(lines)

    def _interval_text(self) -> str:
        """The headline's interval in the verdict's direction: "1.14x slower" beside 1.13x–1.22x, not 0.82x–0.89x."""
        est = self.headline()
        lo, hi = (est.lo, est.hi) if self.within_noise or est.value >= 1 else (1 / est.hi, 1 / est.lo)
        return f"{lo:.3g}x–{hi:.3g}x"

    def verdict_line_html(self) -> str:
        """The experiment in one line: its name, the verdict in colour and the headline's interval."""
        e = html.escape
        color = "#666" if self.within_noise else ("#1a7f37" if self.headline().value >= 1 else "#b42318")
        what = f"{self._work()[1]} ratio " if self.work_differs else ""
        return (f"<b>{e(self.name)}</b>: <span style='color:{color}'><b>{e(self.verdict)}</b></span> "
                f"<small>({e(what)}interval {self._interval_text()})</small>")

    def _repr_html_(self) -> str:
        """One verdict line; the table of both sides (time, throughput, MFU, utilization) and the notes folded."""
        e = html.escape
        body = "".join(f"<tr><td style='text-align:left'>{e(str(k))}</td><td>{e(str(b))}</td><td>{e(str(a))}</td></tr>"
                       for k, b, a in self.rows())
        notes = "".join(f"<li>{e(n)}</li>" for n in self.notes)
        return (f"<details class='gpulab-verdict'><summary>{self.verdict_line_html()}</summary>"
                f"<small>{e(self.before.label)} -> {e(self.after.label)} on {e(str(self.device))}; {e(self.kind)}"
                f"</small><table><tr><th></th><th>{e(self.before.label)}</th><th>{e(self.after.label)}</th></tr>"
                f"{body}</table>" + (f"<ul>{notes}</ul>" if notes else "") + "</details>")


def default_min_time(device: DeviceInfo) -> float:
    """Timed seconds per side: 1 s on a GPU (GPM needs about a second to be reliable), 0.2 s on a CPU."""
    return 1.0 if device.is_cuda else 0.2


def measure(fn: Callable[[], Any], *, label: str = "", flops: float | None = None, dtype: str | None = None,
            items: float | None = None, item_name: str = "samples", min_time_s: float | None = None,
            monitor: bool = True, profile: bool = False, device: DeviceInfo | None = None,
            peaks: MeasuredPeaks | None = None, pipeline: bool = False, peak_dtype: str | None = None,
            warm: bool = False, max_time_s: float | None = None) -> RunResult:
    """Time `fn()` under the monitor (and optionally the profiler) and return a RunResult.

    Args:
        flops: FLOPs per call (from `count_flops` or a formula), for TFLOP/s and MFU.
        dtype: the dtype the matmuls run in ("fp32", "tf32", "bf16", "fp16", "fp8"); picks the peak.
        items: samples or tokens per call, for throughput.
        peaks: measured peaks (from `measure_peaks`) for MFU against a measured peak too.
        pipeline: `fn` pulls from a queue (a DataLoader, a prefetcher): its throughput is items over the
            wall time of the timed window, not items over the median call, which a bursty queue overstates.
        peak_dtype: measure MFU against this dtype's peak instead of `dtype`'s (one yardstick for two sides).
        warm: the caller has already run `fn` (e.g. a training step timed alone, compile included): no
            untimed first call, and one warm-up call as an interleaved round takes (timing.ROUND), not two.
        max_time_s: end the timed window after this many seconds (`gl.benchmark`'s cap for a queue-fed call).
    """
    device = device or get_device()
    if dtype is not None:
        dtype = check_dtype(dtype)
    if peak_dtype is not None:
        peak_dtype = check_dtype(peak_dtype)
    yard = peak_dtype or dtype
    for pname, v in (("flops", flops), ("items", items), ("min_time_s", min_time_s)):
        if v is not None and (as_number(v) is None or v <= 0):
            raise ValueError(f"{pname}={v!r} must be a finite number > 0 (or None)")
    min_time_s = min_time_s or default_min_time(device)
    if not warm:
        fn()  # first call outside the monitor window: compilation and allocation are not steady state
        synchronize()
    bench = dict(label=label, min_time_s=min_time_s, device=device.torch_device, max_time_s=max_time_s)
    if warm:
        bench |= {k: v for k, v in ROUND.items() if k != "min_repeats"}  # one warm-up call; the window as usual
    trace = None
    if monitor:
        with Monitor(device) as mon:
            m = benchmark(fn, **bench)
        trace = mon.trace
    else:
        m = benchmark(fn, **bench)
    prof = _profile(fn, steps=3, warmup=0) if profile else None
    return RunResult(label=label or m.label, measurement=m, flops=flops, dtype=dtype,
                     peak_tflops=device.datasheet_tflops(yard) if yard else None,
                     measured_peak_tflops=peaks.tflops.get(yard) if peaks and yard else None,
                     items=items, item_name=item_name, trace=trace, profile=prof, pipeline=pipeline,
                     peak_dtype=peak_dtype if peak_dtype != dtype else None)


def before_after(before: Callable[[], Any], after: Callable[[], Any], *, name: str,
                 before_label: str = "before", after_label: str = "after",
                 flops: float | None = None, after_flops: float | None = None,
                 dtype: str | None = None, after_dtype: str | None = None,
                 items: float | None = None, after_items: float | None = None, item_name: str = "samples",
                 min_time_s: float | None = None, monitor: bool = True, profile: bool = False,
                 device: DeviceInfo | None = None, peaks: MeasuredPeaks | None = None,
                 interleave: bool = True, rounds: int = 4, round_s: float | None = None,
                 round_calls: int | None = None, pipeline: bool = False,
                 kind: str = "optimisation", peak_dtype: str | None = None, progress: bool = True) -> Comparison:
    """Run `before` and `after` through the same harness and compare them.

    `flops`, `dtype` and `items` apply to both sides unless an `after_*` value is given (e.g. a bf16 after).
    `interleave` adds `rounds` alternating rounds (before, after, after, before, ...) so that drift between the two
    windows (clocks, temperature, host load) does not read as a speedup; the spread of the per-round ratios is the
    interval. `round_s`: each side's seconds per round (None: a quarter of `min_time_s`); a big matmul wants whole
    seconds, to read the sustained, power-limited clock. `round_calls` times that many calls per side and round
    instead: with 1, a host that changes speed every second slows both calls of a pair alike.
    `kind` is "optimisation" (a change to adopt) or "demonstration" (a contrast that teaches).
    MFU: each side against its own dtype's peak; one peak for both would put the slower dtype against a peak it
    cannot reach (FP32 at 76% of its own read 10% of TF32's). `peak_dtype` sets one yardstick where the text says why.
    With unequal work per call (`after_items`), the headline is the items/s ratio, not the time per call."""
    if not name:
        raise ValueError("name must be a non-empty string")
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; allowed: {', '.join(KINDS)}")
    for pname, v in (("after_flops", after_flops), ("after_items", after_items)):
        if v is not None and (as_number(v) is None or v <= 0):
            raise ValueError(f"{pname}={v!r} must be a finite number > 0 (or None: same as the before side)")
    checks.positive_int("rounds", rounds, minimum=0)
    checks.positive_float("round_s", round_s, allow_none=True)
    checks.positive_int("round_calls", round_calls, allow_none=True)
    if round_s is not None and round_calls is not None:
        raise ValueError(f"round_s={round_s!r} and round_calls={round_calls!r}: give one of them (seconds or calls "
                         "per side and round), not both")
    device = device or get_device()
    common = dict(item_name=item_name, min_time_s=min_time_s, monitor=monitor, profile=profile, device=device,
                  peaks=peaks, pipeline=pipeline)
    a_dtype = after_dtype or dtype
    watch = StateWatch()  # a side that leaves threads or precision changed slows or speeds the other's rounds
    b = measure(before, label=before_label, flops=flops, dtype=dtype, items=items, peak_dtype=peak_dtype, **common)
    watch.after(before_label)
    a = measure(after, label=after_label, flops=flops if after_flops is None else after_flops,
                dtype=a_dtype, items=items if after_items is None else after_items, peak_dtype=peak_dtype, **common)
    watch.after(after_label)
    if interleave and rounds:
        round_s = round_s or (min_time_s or default_min_time(device)) / 4
        for i in tqdm(range(rounds), desc=f"{name}: interleaved rounds", leave=False, disable=not progress):
            sides = ((before, b), (after, a)) if i % 2 == 0 else ((after, a), (before, b))
            for fn, run in sides:
                extra = (time_calls(fn, round_calls, device=device.torch_device) if round_calls else
                         benchmark(fn, min_time_s=round_s, device=device.torch_device, **ROUND))
                run.measurement = run.measurement.merged(extra)
                run.measurement.meta["interleaved_rounds"] = i + 1
                watch.after(run.label)
    return Comparison(name=name, before=b, after=a, device=device.name, kind=kind, notes=watch.notes())
