"""Reading a profiler trace: where each step's GPU time went, and memory over one training step.

`time_breakdown(trace)` splits the steps' GPU timeline into kernels, memcpy/memset and idle time, and each
idle gap by its cause, in the spirit of HolisticTraceAnalysis's temporal and idle-time breakdowns:
- "idle: after a sync": the host had just returned from a synchronizing call (`.item()`, a blocking copy,
  `cudaStreamSynchronize`...): the queue was drained on purpose and the GPU waits for the next launch;
- "idle: host launching": the next kernel was launched after the GPU went idle, with no sync before it:
  the host cannot issue work as fast as the GPU runs it (launch-bound: small ops, Python overhead);
- "idle: queued work waiting": the next work was already queued when the GPU went idle (a dependency on
  another stream, an event, a copy engine).

`step_memory(step)` records one training step with the profiler's memory timeline and sums the live
memory over time by category (parameters, gradients, optimizer state, activations, other).
"""
from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .profiling import STEP_RANGE, SYNC_CALLS

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

    @property
    def kernel_fraction(self) -> float:
        return self.ms.get("kernels", 0.0) / self.window_ms if self.window_ms > 0 else 0.0

    def per_step_ms(self) -> dict[str, float]:
        return {k: v / self.steps for k, v in self.ms.items()}

    def fractions(self) -> dict[str, float]:
        return {k: (v / self.window_ms if self.window_ms > 0 else 0.0) for k, v in self.ms.items()}

    def largest_idle(self) -> str | None:
        """The idle cause that cost the most, or None when the GPU was never idle."""
        idle = {k: self.ms.get(k, 0.0) for k in IDLE_KINDS}
        k = max(idle, key=idle.get)
        return k if idle[k] > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"fractions": self.fractions(), "per_step_ms": self.per_step_ms()}

    def _repr_html_(self) -> str:
        if self.window_ms <= 0 or not self.ms:
            return f"<p><i>{self.note or 'no GPU activity in this trace'}</i></p>"
        rows = "".join(f"<tr><td style='text-align:left'>{k}</td><td>{v / self.steps:.3f} ms</td>"
                       f"<td>{v / self.window_ms:.1%}</td></tr>" for k, v in self.ms.items())
        return (f"<b>GPU time per step</b> ({self.steps} steps, {self.window_ms / self.steps:.3f} ms each, "
                f"{self.kernels / self.steps:.0f} kernels each)<table>{rows}</table>"
                + (f"<p><i>{self.note}</i></p>" if self.note else ""))


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
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


def time_breakdown(trace: str | Path | dict[str, Any], *, step_name: str = STEP_RANGE) -> TimeBreakdown:
    """Where the GPU's time went during the trace's steps (ranges named `step_name`, or the whole trace)."""
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
    kernels = _union(_clip([sp for c, sp, _ in device if c == "kernels"], lo, hi))
    copies = _union(_clip([sp for c, sp, _ in device if c != "kernels"], lo, hi))
    busy = _union(kernels + copies)
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
        return [sum(v[i] for v in self.by_category.values()) for i in range(len(self.times_ms))]

    @property
    def peak_bytes(self) -> int:
        return max(self.totals, default=0)

    @property
    def peak_ms(self) -> float | None:
        t = self.totals
        return self.times_ms[t.index(max(t))] if t else None

    def at_peak(self) -> dict[str, int]:
        """Bytes per category at the peak."""
        if not self.times_ms:
            return {}
        i = self.totals.index(self.peak_bytes)
        return {c: v[i] for c, v in self.by_category.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "peak_bytes": self.peak_bytes, "peak_ms": self.peak_ms,
                "at_peak": self.at_peak(), "note": self.note, "snapshot_path": self.snapshot_path,
                "samples": len(self.times_ms)}


def step_memory(step: Callable[[], Any], *, device: torch.device | str | None = None,
                snapshot_path: str | Path | None = None) -> StepMemoryProfile:
    """Record one call of `step` (a training step: call it once before, so optimizer state exists).

    Uses torch.profiler's memory timeline (profile_memory, record_shapes, with_stack) for the categories. On a
    CUDA GPU it also records the caching allocator's history and, with `snapshot_path`, saves the snapshot
    (drag it onto https://pytorch.org/memory_viz). Degrades to an empty profile with the reason.
    """
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
    names = [getattr(c, "name", None) for c in _CATEGORY_TO_INDEX]  # sizes[i][0] is the total-untracked slot
    out.by_category = {c: [0] * len(times) for c in MEMORY_CATEGORIES}
    for i, row in enumerate(sizes):
        for j, name in enumerate(names):
            out.by_category[_MEMORY_CATEGORY.get(name, "other")][i] += max(0, int(row[j + 1]))
    t0 = next((t for t in times if t > 0), 0)
    out.times_ms = [max(0.0, (t - t0) / 1e3) for t in times]
    return out
