"""torch.profiler made readable: GPU busy vs idle, kernel count, launch gaps, synchronizing calls."""
from __future__ import annotations

import statistics
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy")


@dataclass
class ProfileSummary:
    """What the GPU did during some steps: busy time, idle gaps, kernels and the calls that made the CPU wait."""

    steps: int
    wall_ms: float
    gpu_busy_ms: float | None = None
    kernel_count: int | None = None
    gaps_ms: list[float] = field(default_factory=list)  # idle gaps between consecutive GPU activities
    sync_calls: dict[str, int] = field(default_factory=dict)
    top_kernels: list[tuple[str, float, int]] = field(default_factory=list)  # name, total ms, count
    cpu_ops: int = 0
    note: str = ""

    @property
    def busy_fraction(self) -> float | None:
        """Fraction of the wall time with a kernel or copy running on the GPU (from the trace, not sampled)."""
        if self.gpu_busy_ms is None or self.wall_ms <= 0:
            return None
        return min(1.0, self.gpu_busy_ms / self.wall_ms)

    @property
    def kernels_per_step(self) -> float | None:
        return None if self.kernel_count is None else self.kernel_count / self.steps

    @property
    def syncs_per_step(self) -> float:
        return sum(self.sync_calls.values()) / self.steps

    def summary(self) -> dict[str, Any]:
        return {"wall_ms_per_step": self.wall_ms / self.steps, "busy_fraction": self.busy_fraction,
                "kernels_per_step": self.kernels_per_step, "syncs_per_step": self.syncs_per_step,
                "median_gap_us": statistics.median(self.gaps_ms) * 1e3 if self.gaps_ms else None}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"summary": self.summary()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProfileSummary:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def _repr_html_(self) -> str:
        s = self.summary()
        busy = "n/a" if s["busy_fraction"] is None else f"{s['busy_fraction']:.0%}"
        rows = [("wall time per step", f"{s['wall_ms_per_step']:.3f} ms"), ("GPU busy (trace)", busy),
                ("kernels per step", "n/a" if s["kernels_per_step"] is None else f"{s['kernels_per_step']:.1f}"),
                ("synchronizing calls per step", f"{s['syncs_per_step']:.1f}"),
                ("median idle gap", "n/a" if s["median_gap_us"] is None else f"{s['median_gap_us']:.1f} µs")]
        body = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows)
        top = "".join(f"<tr><td>{n[:70]}</td><td>{ms:.3f} ms</td><td>{c}</td></tr>" for n, ms, c in self.top_kernels)
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


def profile(fn: Callable[[], Any], *, steps: int = 5, warmup: int = 2, top: int = 5) -> ProfileSummary:
    """Run `fn()` `warmup` times, then `steps` times under torch.profiler, and summarise the trace."""
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    if warmup < 0:
        raise ValueError(f"warmup={warmup} must be >= 0")
    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    # One profiled warm-up step absorbs the profiler's own start-up cost; only the active steps are kept.
    sched = torch.profiler.schedule(wait=0, warmup=1, active=steps)
    with torch.profiler.profile(activities=acts, schedule=sched) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
        prof.step()
        for _ in range(steps):
            with torch.profiler.record_function("gpulab_step"):
                fn()
        if cuda:
            torch.cuda.synchronize()
    events = prof.events()
    step_ranges = [(e.time_range.start, e.time_range.end) for e in events if e.name == "gpulab_step"]
    if not step_ranges:
        raise RuntimeError("the profiler recorded no steps")
    gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    start = min(s for s, _ in step_ranges)
    end = max([e for _, e in step_ranges] + [e.time_range.end for e in gpu])
    # Synchronizing calls made by the steps themselves (not the profiler's closing synchronize).
    syncs = Counter(e.name for e in events if e.device_type != torch.autograd.DeviceType.CUDA
                    and e.name in SYNC_CALLS
                    and any(s <= e.time_range.start <= t for s, t in step_ranges))
    cpu_ops = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CPU
                  and e.name.startswith("aten::"))
    if not cuda:
        return ProfileSummary(steps=steps, wall_ms=(end - start) / 1e3, sync_calls=dict(syncs), cpu_ops=cpu_ops,
                              note="no CUDA GPU: the trace has CPU operators only")
    busy_ms, gaps = _union_ms([(e.time_range.start, e.time_range.end) for e in gpu])
    kernels = [e for e in gpu if not e.name.startswith(("Memcpy", "Memset"))]
    per_kernel: dict[str, list[float]] = {}
    for e in kernels:
        per_kernel.setdefault(e.name, []).append((e.time_range.end - e.time_range.start) / 1e3)
    top_k = sorted(((n, sum(v), len(v)) for n, v in per_kernel.items()), key=lambda r: -r[1])[:top]
    return ProfileSummary(steps=steps, wall_ms=(end - start) / 1e3, gpu_busy_ms=busy_ms,
                          kernel_count=len(kernels), gaps_ms=gaps, sync_calls=dict(syncs), top_kernels=top_k,
                          cpu_ops=cpu_ops)


def find_syncs(fn: Callable[[], Any]) -> list[str]:
    """Run `fn()` once with torch.cuda.set_sync_debug_mode("warn") and return the synchronizing ops it hit.

    On a machine without CUDA this returns [] and does nothing else: there is no device to wait for.
    """
    if not torch.cuda.is_available():
        return []
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
