"""Measured peaks: the matmul TFLOP/s and copy bandwidth this device sustains, measured once per run."""
from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from .checks import positive_int
from .device import DTYPES, DeviceInfo, check_dtype, get_device
from .peak_search import METHOD, ShapeSearch, search_matmul_peak
from .text import si
from .files import JsonRecord


@dataclass
class MeasuredPeaks(JsonRecord):
    """Achievable matmul TFLOP/s per dtype and copy bandwidth, measured on this device."""

    device: str
    tflops: dict[str, float] = field(default_factory=dict)
    copy_gbs: float | None = None
    matmul_size: int = 0
    notes: list[str] = field(default_factory=list)
    rounds: dict[str, list[float]] = field(default_factory=dict)  # TFLOP/s of each sustained round
    # [lo, hi] TFLOP/s of each round: a 95% confidence interval for its median time (how well its rate is known)
    round_intervals: dict[str, list[list[float]]] = field(default_factory=dict)
    sm_clock_mhz: dict[str, float] = field(default_factory=dict)  # mean SM clock while each dtype ran
    power_w: dict[str, float] = field(default_factory=dict)       # mean board power while each dtype ran
    run_id: str = ""  # the course run these peaks were measured for (one measurement per run)
    shape: dict[str, list[int]] = field(default_factory=dict)   # [M, N, K] of the best shape found per dtype
    interval: dict[str, list[float]] = field(default_factory=dict)  # [min, max] TFLOP/s of the best shape's rounds
    search: dict[str, list[list[float]]] = field(default_factory=dict)  # [M, N, K, TFLOP/s (median call)] per shape
    seconds: dict[str, float] = field(default_factory=dict)     # wall seconds the search of each dtype took
    settle: dict[str, list[float]] = field(default_factory=dict)  # TFLOP/s of each warm-up window before the rounds
    method: str = ""                                            # how each call was timed

    def spread(self, dtype: str) -> float | None:
        """(best - worst) / best over the sustained rounds of `dtype`."""
        r = self.rounds.get(dtype)
        return (max(r) - min(r)) / max(r) if r and max(r) > 0 else None

    def shape_name(self, dtype: str) -> str:
        """The best shape of `dtype` as MxNxK, or the cube size where no search ran."""
        sh = self.shape.get(dtype)
        return "x".join(str(int(v)) for v in sh) if sh else f"{self.matmul_size}³"

    def best_round(self, dtype: str) -> tuple[float, float, float] | None:
        """(TFLOP/s, lo, hi) of the best sustained round of `dtype`, lo and hi a 95% confidence interval for its
        median; None where the rounds' intervals were not kept (peaks measured by an older version)."""
        r, q = self.rounds.get(dtype) or [], self.round_intervals.get(dtype) or []
        if not r or len(q) != len(r):
            return None
        i = max(range(len(r)), key=r.__getitem__)
        return r[i], min(q[i][0], r[i]), max(q[i][1], r[i])

    def _repr_html_(self) -> str:
        def extra(k: str) -> str:
            bits = []
            if k in self.interval:
                lo, hi = self.interval[k]
                bits.append(f"rounds {lo:,.1f}..{hi:,.1f} TFLOP/s")
            if k in self.search:
                bits.append(f"{len(self.search[k])} shapes searched in {self.seconds.get(k, 0):.0f} s")
            if k in self.sm_clock_mhz:
                bits.append(f"SM clock {self.sm_clock_mhz[k]:,.0f} MHz")
            if k in self.power_w:
                bits.append(f"{self.power_w[k]:,.0f} W")
            return ", ".join(bits)
        rows = "".join(f"<tr><td>{k.upper()} matmul {self.shape_name(k)}</td><td>{si(v * 1e12, 'FLOP/s')}</td>"
                       f"<td><small>{extra(k)}</small></td></tr>" for k, v in self.tflops.items())
        if self.copy_gbs:
            rows += f"<tr><td>device copy</td><td>{si(self.copy_gbs * 1e9, 'B/s')}</td></tr>"
        notes = "".join(f"<li>{n}</li>" for n in self.notes)
        return (f"<b>Measured on {self.device}</b> (best matmul shape of each dtype's search, its best round)"
                f"<table>{rows}</table>"
                + (f"<ul>{notes}</ul>" if notes else ""))


_PEAK_CACHE: dict[str, MeasuredPeaks] = {}
RUN_CACHE_S = 6 * 3600  # a run's shared peaks older than this are measured again: the GPU may have changed


def copy_bandwidth_gbs(nbytes: int, device: torch.device | None = None, min_time_s: float = 0.3) -> float:
    """Measured device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    from .timing import benchmark

    if nbytes <= 0:
        raise ValueError(f"nbytes={nbytes} must be > 0")
    device = device or get_device().torch_device
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    m = benchmark(lambda: dst.copy_(src), min_time_s=min_time_s)
    return 2 * src.numel() * 4 / m.median / 1e9


def _run_cache_path(device: DeviceInfo, n: int) -> Path | None:
    """The measured peaks shared by the notebooks, checks and runs that have the same GPULAB_RUN_ID (a temp file)."""
    run_id = os.environ.get("GPULAB_RUN_ID")
    if not run_id:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:80]  # two runs side by side (one per GPU) keep apart
    return Path(tempfile.gettempdir()) / "gpulab-peaks" / f"{device.slug}-{device.index}-{n}-{safe}.json"


def _load_run_peaks(path: Path | None, dtypes: tuple[str, ...]) -> MeasuredPeaks | None:
    if path is None or not path.is_file() or time.time() - path.stat().st_mtime > RUN_CACHE_S:
        return None
    try:
        import json
        p = MeasuredPeaks.from_dict(json.loads(path.read_text()))
    except Exception:
        return None
    if p.run_id != os.environ.get("GPULAB_RUN_ID") or p.copy_gbs is None:
        return None
    skipped = " ".join(p.notes)
    if all(d in p.tflops or d.upper() in skipped for d in dtypes):
        return p
    return None


def measure_peaks(device: DeviceInfo | None = None, *, size: int | None = None, refresh: bool = False,
                  dtypes: tuple[str, ...] = DTYPES, warm_s: float | None = None, rounds: int | None = None,
                  round_s: float | None = None, m_step: int | None = None, shape_s: float | None = None,
                  top: int | None = None) -> MeasuredPeaks:
    """Search matmul shapes for each dtype's best sustained TFLOP/s, and measure copy bandwidth, once per course run.

    Per dtype, `search_matmul_peak` as mamf-finder does it (on a GPU: `warm_s` 3 s, M from `m_step` 256 to 5·`size`
    at N = K = `size` 4096, the `top` 3 shapes in `rounds` 5 interleaved rounds); the warm-up and the settling run
    for the first dtype only, as the GPU stays warm for the next. The peak is the best round of the best shape;
    `interval` keeps its rounds' min and max. On a CPU: a few tiny shapes. Cached per device in this process and,
    inside `gpulab run` (GPULAB_RUN_ID set), in a file shared by every notebook."""
    device = device or get_device()
    if isinstance(dtypes, str):
        raise ValueError(f"dtypes={dtypes!r} must be a tuple of dtype names, e.g. ({dtypes!r},)")
    dtypes = tuple(check_dtype(d, name="dtypes") for d in dtypes)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
        raise ValueError(f"size={size!r} must be a positive int (or None for the default)")
    for name, v in (("rounds", rounds), ("top", top), ("m_step", m_step)):
        if v is not None:
            positive_int(name, v)
    gpu = device.is_cuda
    n = size or (4096 if gpu else 256)
    key = f"{device.slug}:{device.index}:{n}:{','.join(dtypes)}"
    if key in _PEAK_CACHE and not refresh:
        return _PEAK_CACHE[key]
    cache_file = _run_cache_path(device, n)
    if not refresh and (cached := _load_run_peaks(cache_file, dtypes)) is not None:
        _PEAK_CACHE[key] = cached
        return cached
    opts = dict(size=n, m_step=m_step or (None if gpu else n),
                warm_s=(3.0 if gpu else 0.0) if warm_s is None else warm_s,
                shape_s=(0.06 if gpu else 0.005) if shape_s is None else shape_s,
                round_s=(0.2 if gpu else 0.01) if round_s is None else round_s,
                top=(3 if gpu else 2) if top is None else top, rounds=(5 if gpu else 3) if rounds is None else rounds,
                round_calls=100 if gpu else None, round_warm=50 if gpu else 0,  # a round as mamf-finder times a shape
                lead_s=0.3 if gpu else 0.0,  # each round after the sweep's lighter shapes, as mamf-finder meets it
                settle_s=6.0 if gpu else 0.0,  # the best shape until its rate stops climbing: a cold GPU ramps up
                progress=gpu)
    out = MeasuredPeaks(device=device.name, matmul_size=n, run_id=os.environ.get("GPULAB_RUN_ID", ""), method=METHOD)
    old = None if refresh else _load_run_peaks(cache_file, ())  # this run's earlier values stay the values
    for d in dtypes:
        if old is not None and d in old.tflops:
            _copy_dtype(old, out, d)
            continue
        if not gpu and d in ("tf32", "fp8"):
            out.notes.append(f"{d.upper()} skipped: it needs a CUDA GPU with tensor cores")
            continue
        if gpu and d == "tf32" and device.capability < (8, 0):
            out.notes.append("TF32 skipped: tensor cores with TF32 arrive with Ampere (sm_80)")
            continue
        if d == "fp8" and device.capability < (8, 9):
            out.notes.append("FP8 skipped: FP8 tensor cores arrive with Ada/Hopper (sm_89+)")
            continue
        if d == "bf16" and gpu and not torch.cuda.is_bf16_supported():
            out.notes.append("BF16 skipped: not supported on this GPU")
            continue
        try:
            found, state = search_matmul_peak(d, device.torch_device, **opts)
        except Exception as e:  # an unsupported kernel on some GPU must not stop the others
            out.notes.append(f"{d.upper()} failed: {type(e).__name__}: {e}"[:200])
            continue
        opts.update(warm_s=0.0, settle_s=0.0)  # the GPU is warm now: a second warm-up per dtype cost the check 20 s
        _record_search(out, d, found, state)
        if gpu:
            torch.cuda.empty_cache()
    out.copy_gbs = old.copy_gbs if old is not None else copy_bandwidth_gbs(
        (1 << 30) if gpu else (64 << 20), device.torch_device, min_time_s=1.0 if gpu else 0.1)
    if gpu:
        torch.cuda.empty_cache()
    if cache_file is not None:
        from .files import write_json_atomic
        if old is not None:  # keep what an earlier notebook of this run measured for other dtypes
            for d in old.tflops:
                if d not in out.tflops:
                    _copy_dtype(old, out, d)
        try:
            write_json_atomic(cache_file, out.to_dict())
        except OSError as e:
            out.notes.append(f"peaks not shared with the run's other notebooks: {e}")
    _PEAK_CACHE[key] = out
    return out


_PER_DTYPE = ("tflops", "rounds", "round_intervals", "sm_clock_mhz", "power_w", "shape", "interval", "search",
              "seconds", "settle")


def _copy_dtype(src: MeasuredPeaks, dst: MeasuredPeaks, d: str) -> None:
    for attr in _PER_DTYPE:
        if d in getattr(src, attr):
            getattr(dst, attr)[d] = getattr(src, attr)[d]


def _record_search(out: MeasuredPeaks, d: str, found: ShapeSearch, state: dict[str, Any]) -> None:
    """Store one dtype's search in `out`: the peak, the best shape's rounds and interval, every shape's rate."""
    out.tflops[d] = found.tflops
    out.rounds[d] = found.rounds[found.best]
    out.round_intervals[d] = found.round_intervals[found.best]
    out.shape[d] = list(found.best)
    out.interval[d] = list(found.interval)
    out.search[d] = [[int(m), int(n), int(k), float(f"{t:.5g}")] for m, n, k, t in found.rows]
    out.seconds[d] = round(found.search_s + found.rounds_s, 2)
    out.settle[d] = [round(float(r), 2) for r in found.settle]
    for attr in ("sm_clock_mhz", "power_w"):
        if attr in state:
            getattr(out, attr)[d] = state[attr]


def search_figure(peaks: MeasuredPeaks, dtypes: Sequence[str] | None = None, *, colors: dict[str, str] | None = None,
                  title: str | None = None):
    """TFLOP/s against M (N = K fixed) for each searched dtype, its best shape marked, the cube shapes as diamonds."""
    import matplotlib.pyplot as plt

    dtypes = [d for d in (dtypes or list(peaks.search)) if peaks.search.get(d)]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for d in dtypes:
        rows = peaks.search[d]
        line = [r for r in rows if r[1] == peaks.matmul_size and r[2] == peaks.matmul_size]
        other = [r for r in rows if r not in line]
        color = (colors or {}).get(d)
        lo, hi = peaks.interval.get(d, [peaks.tflops[d]] * 2)
        best = peaks.shape.get(d)
        label = (f"{d.upper()}: best {peaks.tflops[d]:,.4g} TFLOP/s [{lo:,.4g}, {hi:,.4g}] at "
                 f"{peaks.shape_name(d)}")
        p = ax.plot([r[0] for r in line], [r[3] for r in line], ".-", ms=3, lw=1, color=color, label=label)[0]
        ax.plot([r[0] for r in other], [r[3] for r in other], "D", ms=5, color=p.get_color(), mfc="none")
        if best:
            ax.errorbar([best[0]], [peaks.tflops[d]], yerr=[[peaks.tflops[d] - lo], [hi - peaks.tflops[d]]],
                        fmt="*", ms=12, color=p.get_color(), mec="black", capsize=3, zorder=5)
    n = peaks.matmul_size
    ax.set_xlabel(f"M (N = K = {n}; diamonds: {2 * n}³)")
    ax.set_ylabel("TFLOP/s (median call)")
    ax.set_title(title or f"matmul shape search on {peaks.device}: star = best shape, its rounds' range")
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
