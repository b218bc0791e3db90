"""Notebook 04 (sync points): what a cell cannot hold. Its claims as data (each with the guide's words), the two
clocks a copy is timed with (when the call returned on the host, how long the copy ran on the GPU), the share of a
task an overlap hid, and the notebook's per-side trace table and figures.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from ..measuring.estimates import Estimate
from ..measuring.measurement import quantiles
from ..measuring.text import pct, si, sig

__all__ = ["CLAIMS", "pct_faster", "hidden_share", "CopyTiming", "copy_timing", "QueuedCopyTiming",
           "queued_copy_timing", "busy_work", "trace_table_html", "pairs_figure"]

_CUDA, _S41, _S42 = ("cuda",), "guide §4.1", "guide §4.2"
_REVIEW = "002 optimization review"

# Timing claims read "x% faster" off a before/after; sync claims are exact counts (one warning of
# torch.cuda.set_sync_debug_mode per synchronizing call), measured in this run. Each needs CUDA: on a CPU there is no
# queue to drain, so a sync costs nothing, and the debug mode reports nothing.
CLAIMS = [
    dict(key="item_twice", text="a single .item() per step instead of two: 2-5% faster", low=2, high=5, unit="% gain",
         quote="**Impact**: **2-5% faster** (reduced synchronization)", source=f"{_REVIEW}, fix 2", needs=_CUDA),
    dict(key="item_sync", text="eliminating the CPU-GPU sync in the training loop: 15-20% faster iterations",
         low=15, high=20, unit="% gain", quote="Eliminated CPU-GPU sync in training loop (15-20% faster iterations)",
         source="guide summary (000), arr-coc's key optimizations"),
    dict(key="eval", text="GPU-side accumulation of predictions: 10-15% faster evaluation", low=10, high=15,
         unit="% gain", quote="**Impact**: **10-15% faster evaluation**", source=f"{_REVIEW}, fix 3", needs=_CUDA),
    dict(key="zero_grad", text="zero_grad(set_to_none=True): 5-10% faster per step", low=5, high=10, unit="% gain",
         quote="**Impact**: **5-10% faster per step**", source=f"{_REVIEW}, fix 1", needs=_CUDA),
    dict(key="mask_sync", text="boolean-mask indexing forces a CPU-GPU sync", low=1, unit="syncs per step",
         quote="BAD: Boolean indexing forces sync", source=_S41, needs=_CUDA),
    dict(key="where_no_sync", text="the same masked mean with torch.where stays on the GPU", high=0,
         unit="syncs per step", quote="mask = (predictions > threshold)  # OK (stays on GPU)", source=_S41,
         needs=_CUDA),
    dict(key="item_forces", text=".item() forces a CPU-GPU sync", low=1, unit="syncs per step",
         quote="loss_val = loss.item()  # Copies scalar to CPU (sync!)", source=_S41, needs=_CUDA),
    dict(key="cpu_forces", text=".cpu() forces a CPU-GPU sync", low=1, unit="syncs per step",
         quote="BAD: .cpu() forces sync", source=_S41, needs=_CUDA),
    dict(key="branch_forces", text="dynamic control flow (`if tensor.sum() > 0:`) forces a CPU-GPU sync", low=1,
         unit="syncs per step", quote="if tensor.sum() > 0:  # SYNC! (needs to know sum value)", source=_S41,
         needs=_CUDA),
    dict(key="accumulate", text="accumulate on the GPU, log every N steps: one sync per N steps", low=1, high=1,
         unit="syncs per N steps", quote="GOOD: Accumulate on GPU, log every N steps", source=_S42, needs=_CUDA),
    dict(key="logging_thread", text="a logging thread moves the .item() sync off the training loop", high=0,
         unit="syncs per logged step", quote="log_queue.put((i, loss.item()))  # .item() happens in background",
         source="guide §4.3", needs=_CUDA),
    dict(key="numpy", text="`.numpy()` forces a CPU-GPU sync", low=1, unit="syncs", quote="BAD: .numpy() forces sync",
         source=_S41, needs=_CUDA),
    dict(key="int_max", text="`int(tensor.max())` for a dynamic size forces a CPU-GPU sync", low=1, unit="syncs",
         quote="dynamic_size = int(tensor.max())  # SYNC!", source=_S41, needs=_CUDA),
    dict(key="non_blocking", text="a non_blocking copy (pinned memory) returns immediately", high=10, unit="%",
         quote="inputs = inputs.to('cuda', non_blocking=True)  # Returns immediately", source=_S42, needs=_CUDA),
    # "Only after the copy": the call returned after >= 90% of the copy's time on the GPU (the driver may still be
    # moving the last staged chunk when it returns).
    dict(key="pageable_blocks",
         text="non_blocking needs pinned memory: from pageable memory the call returns only after the copy", low=90,
         unit="%", quote="Requires pin_memory=True in DataLoader", source=_S42, needs=_CUDA),
    dict(key="streams", text="work on two CUDA streams runs in parallel (a copy hides behind compute)", low=80,
         unit="%", quote="output2 = model2(input2)  # Runs in parallel in stream2", source=_S42, needs=_CUDA),
]


def pct_faster(cmp: Any) -> Estimate:
    """"x% faster" as (before time / after time - 1) * 100 (10% faster = 1.10x), with the speedup's interval."""
    return cmp.estimate().map(lambda r: (r - 1) * 100)


def hidden_share(speedup: Estimate, overlapped_s: float, shorter: Estimate) -> Estimate:
    """Percent of the shorter task (copy or compute) that overlap hid, with its interval.

    serial - overlapped = overlapped * (speedup - 1), over the shorter task's time; the interval takes the widest
    ratio of the ends of the speedup's interval and the shorter task's.
    """
    if not (overlapped_s > 0 and shorter.lo > 0):
        raise ValueError("overlapped_s and the shorter task's times must be > 0")
    saved = speedup.map(lambda r: (r - 1) * overlapped_s)
    value = saved.value / shorter.value * 100
    ends = [a / b * 100 for a in (saved.lo, saved.hi) for b in (shorter.lo, shorter.hi)] + [value]
    return Estimate(value, min(ends), max(ends))


# ---------------------------------------------------------------- a copy's two clocks

def _need_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA GPU")


@dataclass
class CopyTiming:
    """How long a copy call took to return to Python, against how long the copy ran on the GPU."""

    label: str
    host_s: float  # median time until the call returned control to Python
    device_s: float  # median time the copy took on the GPU (CUDA events around it)
    nbytes: int
    fractions: list[float] = field(default_factory=list)  # host time / device time of each repeat

    @property
    def gbs(self) -> float:
        return self.nbytes / self.device_s / 1e9

    @property
    def host_fraction(self) -> float:
        """Host time over device time: near 0 means the call returned at once; near 1 means it waited."""
        return self.host_s / self.device_s

    def fraction_estimate(self) -> Estimate:
        """The per-repeat host/device fraction: median with its quartiles."""
        if not self.fractions:
            return Estimate.exact(self.host_fraction)
        q1, med, q3 = quantiles(self.fractions)
        return Estimate(med, q1, q3)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"gbs": self.gbs, "host_fraction": self.host_fraction}


def copy_timing(copy: Callable[[], Any], nbytes: int, *, label: str = "", repeats: int = 10) -> CopyTiming:
    """Time `copy()` on two clocks: the host's until the call returns (no sync), and CUDA events on the GPU."""
    _need_cuda("copy_timing")
    copy()  # warm-up
    host, dev = [], []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        s.record()
        copy()
        t1 = time.perf_counter()  # the call has returned; the copy may still be running
        e.record()
        torch.cuda.synchronize()
        host.append(t1 - t0)
        dev.append(s.elapsed_time(e) / 1e3)
    return CopyTiming(label, statistics.median(host), statistics.median(dev), nbytes,
                      fractions=[h / d for h, d in zip(host, dev)])


@dataclass
class QueuedCopyTiming:
    """A copy issued behind queued GPU work: did the call return while the GPU was still busy, or only after the
    queued work and the copy were done?"""

    label: str
    host_s: list[float]  # per repeat: time until the copy call returned
    queued_s: list[float]  # per repeat: the queued work's time on the GPU
    copy_s: list[float]  # per repeat: the copy's time on the GPU (from the end of the queued work)

    @property
    def waited(self) -> list[float]:
        """Per repeat: host time / (queued work + copy). ~1: the call waited for both; ~0: it returned at once."""
        return [h / (q + c) for h, q, c in zip(self.host_s, self.queued_s, self.copy_s)]

    def estimate(self) -> Estimate:
        q1, med, q3 = quantiles(self.waited)
        return Estimate(med, q1, q3)

    def medians(self) -> dict[str, float]:
        return {"host_s": statistics.median(self.host_s), "queued_s": statistics.median(self.queued_s),
                "copy_s": statistics.median(self.copy_s)}

    def to_dict(self) -> dict[str, Any]:
        e = self.estimate()
        return asdict(self) | {"waited_median": e.value, "waited_q1": e.lo, "waited_q3": e.hi} | {
            f"median_{k}": v for k, v in self.medians().items()}


def busy_work(seconds: float, *, device: torch.device | str | None = None, size: int = 2048) -> Callable[[], None]:
    """A callable that queues about `seconds` of GPU work (chained fp32 matmuls) and returns at once."""
    _need_cuda("busy_work")
    a = torch.randn(size, size, device=device or "cuda") / size**0.5
    b = torch.empty_like(a)

    def matmuls(n: int) -> None:
        for _ in range(n):
            torch.matmul(a, a, out=b)

    matmuls(3)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    matmuls(10)
    e.record()
    torch.cuda.synchronize()
    n = max(1, round(seconds / (s.elapsed_time(e) / 1e3 / 10)))
    return lambda: matmuls(n)


def queued_copy_timing(copy: Callable[[], Any], queue_work: Callable[[], Any], *, label: str = "",
                       repeats: int = 10) -> QueuedCopyTiming:
    """Queue `queue_work()` on the GPU, then call `copy()` at once and time how long the call takes to return."""
    _need_cuda("queued_copy_timing")
    queue_work()
    copy()  # warm-up
    host, queued, copied = [], [], []
    for _ in range(repeats):
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize()
        e0.record()
        queue_work()
        e1.record()
        t0 = time.perf_counter()
        copy()
        t1 = time.perf_counter()  # the call has returned; nothing synchronized yet on our side
        e2.record()
        torch.cuda.synchronize()
        host.append(t1 - t0)
        queued.append(e0.elapsed_time(e1) / 1e3)
        copied.append(e1.elapsed_time(e2) / 1e3)
    return QueuedCopyTiming(label, host, queued, copied)


# ---------------------------------------------------------------- tables and figures (they measure nothing)

def trace_table_html(*comparisons: Any) -> str:
    """Each side of each comparison from its profiler trace: GPU busy share, idle time, gaps and syncs per call."""
    rows = []
    for c in comparisons:
        for side in (c.before, c.after):
            p = side.profile
            if p is None or p.busy_fraction is None:
                rows.append(f"<tr><td style='text-align:left'>{side.label}</td>"
                            "<td colspan=4>no GPU trace here</td></tr>")
                continue
            wall = p.wall_ms / p.steps / 1e3
            rows.append(f"<tr><td style='text-align:left'>{side.label}</td><td>{pct(p.busy_fraction)}</td>"
                        f"<td>{si(wall * (1 - p.busy_fraction), 's')} of {si(wall, 's')}</td>"
                        f"<td>{sig(len(p.gaps_ms) / p.steps)}</td><td>{sig(p.syncs_per_step)}</td></tr>")
    return ("<table><tr><th>side</th><th>GPU busy (trace)</th><th>idle per call</th><th>idle gaps per call</th>"
            f"<th>syncs per call</th></tr>{''.join(rows)}</table>")


def _mfu(side: Any) -> float | None:
    return None if side.mfu is None else side.mfu * 100


def _busy(side: Any) -> float | None:
    p = side.profile
    return None if p is None or p.busy_fraction is None else p.busy_fraction * 100


def pairs_figure(groups: dict[str, Any], ref: dict[str, Any] | None, metric: str = "mfu", title: str = "") -> None:
    """One group of bars per experiment (short label -> comparison): before and after, with the reference GPU's
    pair beside in grey. metric: "mfu" (% of the datasheet peak) or "busy" (the trace's GPU busy share). A group
    whose four values are all zero (a copy alone: the busy share counts kernels) is left out, and named below."""
    import textwrap

    import matplotlib.pyplot as plt

    from ..display import plots
    from ..verdicts.results import comparisons

    get, ylabel = (_mfu, "MFU, % of dense peak") if metric == "mfu" else (_busy, "GPU busy, % of wall time")
    rmap = {c.name: c for c in comparisons(ref)} if ref else {}
    groups = {k: c for k, c in groups.items() if c is not None}
    pairs = {k: ([get(c.before), get(c.after)],
                 [get(rmap[c.name].before), get(rmap[c.name].after)] if c.name in rmap else [None, None])
             for k, c in groups.items()}
    empty = [k for k, (m, r) in pairs.items() if not any(m + r)]  # all zero or missing: nothing to compare
    if all(v is None for m, r in pairs.values() for v in m + r):
        return
    pairs = {k: v for k, v in pairs.items() if k not in empty}
    mine, refs = [m for m, _ in pairs.values()], [r for _, r in pairs.values()]
    fig, ax = plt.subplots(figsize=(min(1.45 * len(pairs) + 1.5, 10), 3.8), layout="constrained")
    xs = range(len(pairs))
    sides = [(plots.BEFORE, "before", mine), (plots.AFTER, "after", mine)]
    if any(v is not None for r in refs for v in r):  # no reference run: no empty slots, no legend entry for it
        sides += [("#c4c4c4", "reference GPU, before", refs), (plots.REF, "reference GPU, after", refs)]
    w = 0.8 / len(sides)
    for k, (color, label, src) in enumerate(sides):
        vals = [pair[k % 2] for pair in src]
        bars = ax.bar([x + (k - (len(sides) - 1) / 2) * w for x in xs], [v or 0 for v in vals], w, color=color,
                      label=label)
        ax.bar_label(bars, labels=[("n/a" if src is mine else "") if v is None else sig(v) for v in vals],
                     fontsize=8 if len(sides) == 2 else 7)
    ax.set_xticks(list(xs), [textwrap.fill(k, 14) for k in pairs], fontsize=9)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncols=len(sides), loc="upper center", bbox_to_anchor=(0.5, -0.16))
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.1)
    if empty:
        why = "0 on every side: the trace's busy share counts kernels, not copies" if metric == "busy" else "no value"
        fig.supxlabel(f"left out: {', '.join(empty)} ({why})", fontsize=8, color="#555")
    plt.show()
