"""torch.profiler made readable: GPU busy vs idle, kernel count, launch gaps, synchronizing calls.

Only device kernels count as kernels and as busy time; memcpy and memset are their own category; the
`record_function` ranges around steps (mirrored on the GPU timeline as annotations) are neither.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from . import checks
from .files import JsonRecord

SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy")


@dataclass
class ProfileSummary(JsonRecord):
    """What the GPU did during some steps: busy time, idle gaps, kernels and the calls that made the CPU wait."""

    steps: int
    wall_ms: float
    gpu_busy_ms: float | None = None  # union of kernel intervals (copies and annotations excluded)
    kernel_count: int | None = None  # device kernels only
    memcpy_count: int | None = None
    memset_count: int | None = None
    memcpy_ms: float | None = None
    memset_ms: float | None = None
    gaps_ms: list[float] = field(default_factory=list)  # idle gaps: no kernel, copy or memset on the GPU
    sync_calls: dict[str, int] = field(default_factory=dict)
    top_kernels: list[tuple[str, float, int]] = field(default_factory=list)  # name, total ms, count
    cpu_ops: int = 0
    note: str = ""
    trace_path: str | None = None

    @property
    def busy_fraction(self) -> float | None:
        """Fraction of the wall time with a kernel running on the GPU (from the trace, not sampled)."""
        if self.gpu_busy_ms is None or self.wall_ms <= 0:
            return None
        return min(1.0, self.gpu_busy_ms / self.wall_ms)

    @property
    def kernels_per_step(self) -> float | None:
        """Device kernels per step (None without a GPU timeline)."""
        return None if self.kernel_count is None else self.kernel_count / self.steps

    @property
    def copies_per_step(self) -> float | None:
        """memcpy and memset operations per step (not counted as kernels)."""
        if self.memcpy_count is None:
            return None
        return (self.memcpy_count + (self.memset_count or 0)) / self.steps

    @property
    def syncs_per_step(self) -> float:
        """Synchronizing calls per step."""
        return sum(self.sync_calls.values()) / self.steps

    def summary(self) -> dict[str, Any]:
        """The per-step numbers as a short dict (no idle-gap list)."""
        return {"wall_ms_per_step": self.wall_ms / self.steps, "busy_fraction": self.busy_fraction,
                "kernels_per_step": self.kernels_per_step, "syncs_per_step": self.syncs_per_step,
                "copies_per_step": self.copies_per_step,
                "median_gap_us": statistics.median(self.gaps_ms) * 1e3 if self.gaps_ms else None}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with every field and the summary."""
        return asdict(self) | {"summary": self.summary()}

    def __repr__(self) -> str:
        s = self.summary()
        busy = "n/a" if s["busy_fraction"] is None else f"{s['busy_fraction']:.0%}"
        kernels = "n/a" if s["kernels_per_step"] is None else f"{s['kernels_per_step']:.0f}"
        return (f"ProfileSummary({self.steps} steps, {s['wall_ms_per_step']:.3f} ms per step, GPU busy {busy}, "
                f"{kernels} kernels per step, {s['syncs_per_step']:.1f} syncs per step, {len(self.gaps_ms)} idle gaps"
                + (f", trace {Path(self.trace_path).name}" if self.trace_path else "") + ")")

    def _repr_html_(self) -> str:
        s = self.summary()
        from .text import pct, si, sig  # three significant figures, SI units: 67.7 ms, not 67.745 ms

        rows = [("wall time per step", si(s["wall_ms_per_step"] / 1e3, "s")), ("GPU busy (trace)",
                                                                             pct(s["busy_fraction"])),
                ("kernels per step", sig(s["kernels_per_step"])), ("memcpy/memset per step", sig(s["copies_per_step"])),
                ("synchronizing calls per step", sig(s["syncs_per_step"])),
                ("median idle gap", si(None if s["median_gap_us"] is None else s["median_gap_us"] / 1e6, "s"))]
        body = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows)
        top = "".join(f"<tr><td>{n[:70]}</td><td>{si(ms / 1e3, 's')}</td><td>{c}</td></tr>"
                      for n, ms, c in self.top_kernels)
        note = f"<p><i>{self.note}</i></p>" if self.note else ""
        return (f"<table>{body}</table>{note}"
                + (f"<details><summary>top kernels</summary><table>{top}</table></details>" if top else ""))


def _union_ms(intervals: list[tuple[float, float]]) -> tuple[float, list[float]]:
    """Total covered time of (start, end) µs intervals, and the gaps between them, both in ms."""
    busy, gaps, cur_s, cur_e = 0.0, [], None, None
    for s, e in sorted(intervals):
        if cur_e is None:
            cur_s, cur_e = s, e
        elif s <= cur_e:
            cur_e = max(cur_e, e)
        else:
            busy += cur_e - cur_s
            gaps.append((s - cur_e) / 1e3)
            cur_s, cur_e = s, e
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy / 1e3, gaps


STEP_RANGE = "gpulab_step"  # the record_function range put around each profiled step


def device_activity_kind(event: Any) -> str | None:
    """What a profiler event did on the GPU: "kernel", "memcpy", "memset", or None (not device work).

    A `record_function` range is mirrored on the GPU timeline as a user annotation with the CUDA device type: not a
    kernel, nor is a sync event. torch >= 2.13 names the activity type; older ones flag `is_user_annotation`."""
    if getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
        return None
    if getattr(event, "is_user_annotation", False):
        return None
    activity = str(getattr(event, "activity_type", None) or "").lower()
    name = str(getattr(event, "name", ""))
    if "memcpy" in activity or (not activity and name.startswith("Memcpy")):
        return "memcpy"
    if "memset" in activity or (not activity and name.startswith("Memset")):
        return "memset"
    if activity and activity != "kernel":
        return None  # gpu_user_annotation, cuda_sync, ...: not work the SMs did
    return "kernel"


def summarize_events(events: Any, *, steps: int, cuda: bool, step_name: str = STEP_RANGE,
                     top: int = 5) -> ProfileSummary:
    """Summarise a profiler's events (FunctionEvent-like objects) over the `steps` ranges named `step_name`.

    Counts and times device kernels only: memcpy and memset are their own category, and annotations are not
    device work. Busy time is the union of kernel intervals (overlapping kernels on two streams count once).
    """
    events = list(events)
    cpu_type = torch.autograd.DeviceType.CPU
    step_ranges = [(e.time_range.start, e.time_range.end) for e in events
                   if e.name == step_name and e.device_type == cpu_type]
    if not step_ranges:
        raise RuntimeError(f"the profiler recorded no {step_name!r} ranges")
    kinds = {"kernel": [], "memcpy": [], "memset": []}
    for e in events:
        kind = device_activity_kind(e)
        if kind is not None:
            kinds[kind].append(e)
    device_work = kinds["kernel"] + kinds["memcpy"] + kinds["memset"]
    start = min(s for s, _ in step_ranges)
    end = max([t for _, t in step_ranges] + [e.time_range.end for e in device_work])
    # Synchronizing calls made by the steps themselves (not the profiler's closing synchronize).
    syncs = Counter(e.name for e in events if e.device_type != torch.autograd.DeviceType.CUDA
                    and e.name in SYNC_CALLS
                    and any(s <= e.time_range.start <= t for s, t in step_ranges))
    cpu_ops = sum(1 for e in events if e.device_type == cpu_type and e.name.startswith("aten::"))
    wall_ms = (end - start) / 1e3
    if not cuda:
        return ProfileSummary(steps=steps, wall_ms=wall_ms, sync_calls=dict(syncs), cpu_ops=cpu_ops,
                              note="no CUDA GPU: the trace has CPU operators only")
    spans = lambda evs: [(e.time_range.start, e.time_range.end) for e in evs]  # noqa: E731
    busy_ms, _ = _union_ms(spans(kinds["kernel"]))
    _, gaps = _union_ms(spans(device_work))
    per_kernel: dict[str, list[float]] = {}
    for e in kinds["kernel"]:
        per_kernel.setdefault(e.name, []).append((e.time_range.end - e.time_range.start) / 1e3)
    top_k = sorted(((n, sum(v), len(v)) for n, v in per_kernel.items()), key=lambda r: -r[1])[:top]
    total = lambda evs: sum(e.time_range.end - e.time_range.start for e in evs) / 1e3  # noqa: E731
    return ProfileSummary(steps=steps, wall_ms=wall_ms, gpu_busy_ms=busy_ms, kernel_count=len(kinds["kernel"]),
                          memcpy_count=len(kinds["memcpy"]), memset_count=len(kinds["memset"]),
                          memcpy_ms=total(kinds["memcpy"]), memset_ms=total(kinds["memset"]),
                          gaps_ms=gaps, sync_calls=dict(syncs), top_kernels=top_k, cpu_ops=cpu_ops)


@contextlib.contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    """An NVTX range (shown by Nsight Systems) and a profiler range around a block; NVTX is skipped without CUDA."""
    pushed = False
    if torch.cuda.is_available():
        try:
            torch.cuda.nvtx.range_push(name)
            pushed = True
        except Exception:  # NVTX missing from this build: the profiler range still marks the block
            pushed = False
    try:
        with torch.profiler.record_function(name):
            yield
    finally:
        if pushed:
            torch.cuda.nvtx.range_pop()


_CYCLE_WARNING = ".*Profiler clears events at the end of each cycle"  # torch's, on every scheduled profile


PROFILER_LOG = ("USDT:",)  # the profiler library's own lines ("USDT:... profiler_start"): nothing a reader can act on


@contextlib.contextmanager
def _without_profiler_log() -> Iterator[None]:
    """Hold back the profiler library's log lines, which it writes to the process's stderr from C++ (Python's
    warnings filter never sees them): stderr goes to a temporary file meanwhile, and every other line written
    there (a warning, the reader's own output) is passed on afterwards, in order."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real stderr here (an embedded interpreter): nothing to hide
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [ln for ln in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not ln.startswith(PROFILER_LOG)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def profile(fn: Callable[[], Any], *, steps: int = 5, warmup: int = 2, top: int = 5, wait: int = 0,
            profiler_warmup: int = 1, trace_path: str | Path | None = None,
            record_shapes: bool = False) -> ProfileSummary:
    """Run `fn()` `warmup` times, then under torch.profiler's schedule, and summarise the active steps.

    The schedule skips `wait` steps, records and drops `profiler_warmup` (the profiler's own start-up cost), then
    keeps `steps`, each inside a "gpulab_step" NVTX and `record_function` range. `trace_path` (.json.gz or .json)
    writes them as a Chrome/Perfetto trace (https://ui.perfetto.dev)."""
    checks.positive_int("steps", steps)
    checks.positive_int("warmup", warmup, minimum=0)
    checks.positive_int("wait", wait, minimum=0)
    checks.positive_int("profiler_warmup", profiler_warmup, minimum=0)
    if trace_path is not None and not str(trace_path).endswith((".json", ".json.gz")):
        raise ValueError(f"trace_path={str(trace_path)!r} must end in .json.gz (or .json)")
    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    sched = torch.profiler.schedule(wait=wait, warmup=profiler_warmup, active=steps, repeat=1)
    with warnings.catch_warnings():
        # torch warns, as the profiler starts, that a schedule's cycle clears its events; we read them before the
        # cycle ends (see below), so the filter must be in place before the profiler is entered
        warnings.filterwarnings("ignore", message=_CYCLE_WARNING, category=UserWarning)
        with _without_profiler_log(), torch.profiler.profile(activities=acts, schedule=sched,
                                                                     record_shapes=record_shapes) as prof:
            _profiled_steps(prof, fn, wait + profiler_warmup, steps, cuda)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_CYCLE_WARNING, category=UserWarning)
        summary = summarize_events(prof.events(), steps=steps, cuda=cuda, top=top)
    if trace_path is not None:
        Path(trace_path).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))  # a .gz name is gzipped by the profiler
        summary.trace_path = str(trace_path)
    return summary


def find_syncs(fn: Callable[[], Any]) -> list[str] | None:
    """Run `fn()` once with torch.cuda.set_sync_debug_mode("warn") and return the synchronizing ops it hit.

    Without CUDA this returns None and does not run `fn` (an empty list always means "no syncs found")."""
    if not callable(fn):
        raise ValueError(f"fn={fn!r} must be callable (one step of your loop)")
    if not torch.cuda.is_available():
        return None
    old = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(old)
    msgs = [str(w.message).splitlines()[0][:160] for w in caught]
    return [m for m in msgs if "synchroniz" in m.lower() and "prototype" not in m.lower()]


def _profiled_steps(prof: Any, fn: Callable[[], Any], unkept: int, steps: int, cuda: bool) -> None:
    """Run `unkept` steps the schedule discards, then `steps` kept ones, each kept step inside an NVTX range."""
    for i in range(unkept + steps):
        if i >= unkept:
            with nvtx_range(STEP_RANGE):
                fn()
        else:
            fn()
        if cuda and i < unkept:
            torch.cuda.synchronize()  # unkept steps end before the kept ones begin
        if cuda and i == unkept + steps - 1:
            torch.cuda.synchronize()  # the last kept kernels land inside the recorded window
        if i < unkept + steps - 1:
            prof.step()  # not after the last: that would close the cycle and clear its events
