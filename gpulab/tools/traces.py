"""Reading a profiler trace: where each step's GPU time went, and memory over one training step.

`time_breakdown(trace)` splits the steps' GPU timeline into kernels, memcpy/memset and idle time, each idle gap
by its cause, in the spirit of HolisticTraceAnalysis's idle-time breakdown:
- "idle: after a sync": the host had just returned from a synchronizing call: the queue was drained on purpose;
- "idle: host launching": the next kernel was launched after the GPU went idle, with no sync before it: the host
  cannot issue work as fast as the GPU runs it (launch-bound);
- "idle: queued work waiting": the next work was already queued (a dependency on another stream, an event).

`step_memory(step)` sums one training step's live memory over time by category (parameters, gradients,
optimizer state, activations, other)."""
from __future__ import annotations

import gzip
import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..measuring.profiling import STEP_RANGE, SYNC_CALLS
from ..measuring.text import pct, si

DEVICE_CATS = {"kernel": "kernels", "gpu_memcpy": "memcpy/memset", "gpu_memset": "memcpy/memset"}
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
IDLE_KINDS = ("idle: after a sync", "idle: host launching", "idle: queued work waiting")


def load_trace(trace: str | Path | dict[str, Any]) -> dict[str, Any]:
    """A Chrome/Perfetto trace as a dict, from a .json or .json.gz file (or a dict, returned as is)."""
    if isinstance(trace, dict):
        return trace
    path = Path(trace)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


@dataclass
class TimeBreakdown:
    """The steps' GPU timeline in ms: kernels, copies, and idle time by cause (see the module docstring)."""

    steps: int
    window_ms: float
    ms: dict[str, float] = field(default_factory=dict)  # category -> ms over the whole window
    gaps: int = 0
    kernels: int = 0
    note: str = ""
    unprofiled_step_ms: float | None = None  # the step's time without the profiler, when given

    @property
    def kernel_fraction(self) -> float:
        """Share of the window with a kernel running (0 when the trace has no GPU timeline)."""
        return self.ms.get("kernels", 0.0) / self.window_ms if self.window_ms > 0 else 0.0

    def per_step_ms(self) -> dict[str, float]:
        """Milliseconds per step in each category."""
        return {k: v / self.steps for k, v in self.ms.items()}

    def fractions(self) -> dict[str, float]:
        """Each category's share of the window (0 to 1)."""
        return {k: (v / self.window_ms if self.window_ms > 0 else 0.0) for k, v in self.ms.items()}

    def largest_idle(self) -> str | None:
        """The idle cause that cost the most, or None when the GPU was never idle."""
        idle = {k: self.ms.get(k, 0.0) for k in IDLE_KINDS}
        k = max(idle, key=idle.get)
        return k if idle[k] > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, with the fractions and per-step times."""
        return asdict(self) | {"fractions": self.fractions(), "per_step_ms": self.per_step_ms()}

    def __repr__(self) -> str:
        if self.window_ms <= 0 or not self.ms:
            return f"TimeBreakdown({self.note or 'no GPU activity in this trace'})"
        parts = ", ".join(f"{k} {v / self.window_ms:.0%}" for k, v in self.ms.items() if v > 0)
        return f"TimeBreakdown({self.steps} steps, {self.window_ms / self.steps:.3f} ms each: {parts})"

    def _repr_html_(self) -> str:
        if self.window_ms <= 0 or not self.ms:
            return f"<p><i>{self.note or 'no GPU activity in this trace'}</i></p>"
        rows = "".join(f"<tr><td style='text-align:left'>{k}</td><td>{si(v / self.steps / 1e3, 's')}</td>"
                       f"<td>{pct(v / self.window_ms)}</td></tr>" for k, v in self.ms.items())
        return (f"<b>GPU time per step</b> ({self.steps} steps, {si(self.window_ms / self.steps / 1e3, 's')} each, "
                f"{self.kernels / self.steps:.0f} kernels each)<table>{rows}</table>"
                + (f"<p><i>{self.note}</i></p>" if self.note else ""))


def union_spans(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping (start, end) intervals merged, in time order: the busy time of a trace's kernels."""
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in spans)


def _clip(spans: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi]


PROFILER_SLOWDOWN = 1.5  # a step this many times slower under the profiler than without it is flagged


def profiler_overhead_note(profiled_step_ms: float, unprofiled_step_ms: float | None) -> str:
    """A sentence when the profiler slowed the step down markedly (its own host cost), else ""."""
    if not unprofiled_step_ms or profiled_step_ms <= PROFILER_SLOWDOWN * unprofiled_step_ms:
        return ""
    return (f"the step took {profiled_step_ms:.3g} ms under the profiler against {unprofiled_step_ms:.3g} ms without "
            f"it ({profiled_step_ms / unprofiled_step_ms:.1f}x): the profiler itself costs host time, so part of "
            "the idle time (host launching) is the profiler's, not your loop's")


def time_breakdown(trace: str | Path | dict[str, Any], *, step_name: str = STEP_RANGE,
                   unprofiled_step_ms: float | None = None) -> TimeBreakdown:
    """Where the GPU's time went during the trace's steps (ranges named `step_name`, or the whole trace).

    With `unprofiled_step_ms` (the same step timed without the profiler, e.g. `gl.benchmark(step).median *
    1e3`), the note says when the step ran much slower under the profiler: then the profiler's own host cost
    shows up as idle time.
    """
    if unprofiled_step_ms is not None:
        from ..measuring.checks import positive_float

        positive_float("unprofiled_step_ms", unprofiled_step_ms)
    data = load_trace(trace)  # a big trace is read once
    out = _time_breakdown(data, step_name)
    out.unprofiled_step_ms = unprofiled_step_ms
    events = [e for e in data.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = [float(e["dur"]) / 1e3 for e in events if e.get("name") == step_name and e.get("cat") == "user_annotation"]
    profiled = (out.window_ms / out.steps) if out.window_ms > 0 else (sum(steps) / len(steps) if steps else 0.0)
    extra = profiler_overhead_note(profiled, unprofiled_step_ms)
    if extra:
        out.note = f"{out.note}; {extra}" if out.note else extra[0].upper() + extra[1:]
    return out


def _time_breakdown(trace: str | Path | dict[str, Any], step_name: str) -> TimeBreakdown:
    events = [e for e in load_trace(trace).get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    span = lambda e: (float(e["ts"]), float(e["ts"]) + float(e["dur"]))  # noqa: E731
    steps = [span(e) for e in events if e.get("name") == step_name and e.get("cat") == "user_annotation"]
    device = [(DEVICE_CATS[e["cat"]], span(e), e.get("args", {}).get("correlation")) for e in events
              if e.get("cat") in DEVICE_CATS]
    if not device:
        return TimeBreakdown(steps=max(1, len(steps)), window_ms=0.0,
                             note="no kernels or copies in this trace (recorded without a CUDA GPU)")
    if steps:
        lo, hi = min(s for s, _ in steps), max(max(e for _, e in steps), max(e for _, (_, e), _ in device))
    else:
        lo, hi = min(s for _, (s, _), _ in device), max(e for _, (_, e), _ in device)
    kernels = union_spans(_clip([sp for c, sp, _ in device if c == "kernels"], lo, hi))
    copies = union_spans(_clip([sp for c, sp, _ in device if c != "kernels"], lo, hi))
    busy = union_spans(kernels + copies)
    ms = {"kernels": _length(kernels) / 1e3, "memcpy/memset": (_length(busy) - _length(kernels)) / 1e3}
    ms |= {k: 0.0 for k in IDLE_KINDS}
    launches = {e.get("args", {}).get("correlation"): span(e) for e in events
                if e.get("cat") in LAUNCH_CATS and e.get("args", {}).get("correlation") is not None}
    syncs = sorted(span(e)[1] for e in events if e.get("name") in SYNC_CALLS and e.get("cat") in LAUNCH_CATS)
    starts = sorted((sp[0], corr) for _, sp, corr in device)
    edges = [(lo, lo)] + busy + [(hi, hi)]
    gaps = 0
    for (_, g0), (g1, _) in zip(edges, edges[1:]):
        if g1 - g0 <= 0:
            continue
        gaps += 1
        nxt = next((corr for s, corr in starts if s >= g1), None)
        launched = launches.get(nxt, (None, None))[0]
        if launched is not None and launched <= g0:
            kind = "idle: queued work waiting"
        elif any(g0 - 1.0 <= t <= g1 for t in syncs) or (launched is not None and any(
                g0 - 1.0 <= t <= launched for t in syncs)):
            kind = "idle: after a sync"
        else:
            kind = "idle: host launching"
        ms[kind] += (g1 - g0) / 1e3
    n_kernels = sum(1 for c, sp, _ in device if c == "kernels" and lo <= sp[0] <= hi)
    return TimeBreakdown(steps=max(1, len(steps)), window_ms=(hi - lo) / 1e3, ms=ms, gaps=gaps, kernels=n_kernels)


# -- memory over one step --------------------------------------------------------------------------------

# torch.profiler's memory categories -> the five this course draws
_MEMORY_CATEGORY = {"PARAMETER": "parameters", "GRADIENT": "gradients", "OPTIMIZER_STATE": "optimizer state",
                    "ACTIVATION": "activations", "TEMPORARY": "activations", "AUTOGRAD_DETAIL": "other",
                    "INPUT": "other", None: "other"}
MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "other")


@dataclass
class StepMemoryProfile:
    """Live memory by category over one training step (bytes), from the profiler's memory timeline."""

    device: str
    times_ms: list[float] = field(default_factory=list)
    by_category: dict[str, list[int]] = field(default_factory=dict)
    note: str = ""
    snapshot_path: str | None = None

    @property
    def totals(self) -> list[int]:
        """Total live bytes at each time."""
        return [sum(v[i] for v in self.by_category.values()) for i in range(len(self.times_ms))]

    @property
    def peak_bytes(self) -> int:
        """The most bytes live at once during the step."""
        return max(self.totals, default=0)

    @property
    def peak_ms(self) -> float | None:
        """When the peak came, in ms from the step's first memory event (None without a timeline)."""
        t = self.totals
        return self.times_ms[t.index(max(t))] if t else None

    def at_peak(self) -> dict[str, int]:
        """Bytes per category at the peak."""
        if not self.times_ms:
            return {}
        i = self.totals.index(self.peak_bytes)
        return {c: v[i] for c, v in self.by_category.items()}

    def __repr__(self) -> str:
        if not self.times_ms:
            return f"StepMemoryProfile({self.device}: {self.note or 'no memory timeline'})"
        parts = ", ".join(f"{k} {v / 2**20:,.1f} MiB" for k, v in self.at_peak().items())
        return (f"StepMemoryProfile({self.device}: peak {self.peak_bytes / 2**20:,.1f} MiB at {self.peak_ms:.1f} ms "
                f"of {len(self.times_ms)} samples; at the peak: {parts})")

    def _repr_html_(self) -> str:
        if not self.times_ms:
            return f"<p><i>No memory timeline: {html.escape(self.note or 'nothing recorded')}</i></p>"
        # si: 5.39 GB at 15.3 ms, the figure's peak label and the pages' unit (it read 5,140 MiB beside 5.39 GB)
        rows = "".join(f"<tr><td style='text-align:left'>{html.escape(k)}</td><td>{si(v, 'B')}</td></tr>"
                       for k, v in self.at_peak().items())
        note = f"<p><i>{html.escape(self.note)}</i></p>" if self.note else ""
        return (f"<b>Memory at the step's peak</b> ({si(self.peak_bytes, 'B')} at "
                f"{si(self.peak_ms / 1e3, 's')}, "
                f"{html.escape(self.device)})<table>{rows}</table>{note}")

    def to_dict(self) -> dict[str, Any]:
        """The peak and the bytes per category at it (the timeline itself stays out of the JSON)."""
        return {"device": self.device, "peak_bytes": self.peak_bytes, "peak_ms": self.peak_ms,
                "at_peak": self.at_peak(), "note": self.note, "snapshot_path": self.snapshot_path,
                "samples": len(self.times_ms)}


def step_memory(step: Callable[[], Any], *, device: torch.device | str | None = None,
                snapshot_path: str | Path | None = None) -> StepMemoryProfile:
    """Record one call of `step` (a training step: call it once before, so optimizer state exists).

    Uses torch.profiler's memory timeline for the categories; on a CUDA GPU, with `snapshot_path`, also saves the
    allocator's history (drag it onto https://pytorch.org/memory_viz). Degrades to an empty profile with the reason."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev_str = f"cuda:{dev.index or 0}" if dev.type == "cuda" else "cpu"
    out = StepMemoryProfile(device=dev_str)
    history = dev.type == "cuda" and snapshot_path is not None
    if history:
        torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                         if dev.type == "cuda" else [])
        with torch.profiler.profile(activities=acts, profile_memory=True, record_shapes=True,
                                    with_stack=True) as prof:
            step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        if history:
            import pickle

            Path(snapshot_path).parent.mkdir(parents=True, exist_ok=True)
            with open(snapshot_path, "wb") as f:
                pickle.dump(torch.cuda.memory._snapshot(), f)
            out.snapshot_path = str(snapshot_path)
    except Exception as e:  # a profiler that cannot record memory here must not stop the lesson
        out.note = f"memory profile not recorded: {type(e).__name__}: {e}"
        return out
    finally:
        if history:
            torch.cuda.memory._record_memory_history(enabled=None)
    try:
        from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

        times, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(dev_str)
    except Exception as e:  # a private API: say so if this torch version changed it
        out.note = f"the profiler's memory timeline is not available in this torch: {type(e).__name__}: {e}"
        return out
    if not times:
        out.note = f"no memory events on {dev_str}"
        return out
    names = [None] * len(_CATEGORY_TO_INDEX)  # sizes[i][0] is the total-untracked slot
    for c, j in _CATEGORY_TO_INDEX.items():
        names[j] = getattr(c, "name", None)
    out.by_category, inferred = categorize(names, [row[1:] for row in sizes])
    if inferred:
        out.note = (f"{si(inferred, 'B')} the profiler could not categorize was allocated and freed within "
                    "the step: counted as activations (temporaries of forward and backward)")
    t0 = next((t for t in times if t > 0), 0)
    out.times_ms = [max(0.0, (t - t0) / 1e3) for t in times]
    return out


def categorize(names: list[str | None], rows: list[list[int]]) -> tuple[dict[str, list[int]], int]:
    """Bytes per category over time from the profiler's per-category rows (`names[j]` names column j).

    The profiler leaves memory uncategorized where it cannot follow a tensor (fused attention, compiled code), often
    most of what forward saves for backward. Uncategorized memory above its level at the step's start and end lived
    within the step: activations and temporaries; the level that stays is "other". Returns the series and the peak."""
    out = {c: [0] * len(rows) for c in MEMORY_CATEGORIES}
    unknown = [0] * len(rows)
    for i, row in enumerate(rows):
        for j, name in enumerate(names):
            v = max(0, int(row[j]))
            if name is None:
                unknown[i] += v
            else:
                out[_MEMORY_CATEGORY.get(name, "other")][i] += v
    base = min(unknown[0], unknown[-1]) if unknown else 0
    inferred = 0
    for i, v in enumerate(unknown):
        moved = max(0, v - base)
        out["activations"][i] += moved
        out["other"][i] += v - moved
        inferred = max(inferred, moved)
    return out, inferred
