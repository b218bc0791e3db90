"""Measured peaks: the matmul TFLOP/s and copy bandwidth this device sustains, measured once per run."""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .checks import positive_int
from .device import DTYPES, DeviceInfo, check_dtype, float32_matmul_precision, get_device
from .dtypes import torch_dtype
from .text import si, sig


@dataclass
class MeasuredPeaks:
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

    def spread(self, dtype: str) -> float | None:
        """(best - worst) / best over the sustained rounds of `dtype`."""
        r = self.rounds.get(dtype)
        return (max(r) - min(r)) / max(r) if r and max(r) > 0 else None

    def best_round(self, dtype: str) -> tuple[float, float, float] | None:
        """(TFLOP/s, lo, hi) of the best sustained round of `dtype`, lo and hi a 95% confidence interval for its
        median; None where the rounds' intervals were not kept (peaks measured by an older version)."""
        r, q = self.rounds.get(dtype) or [], self.round_intervals.get(dtype) or []
        if not r or len(q) != len(r):
            return None
        i = max(range(len(r)), key=r.__getitem__)
        return r[i], min(q[i][0], r[i]), max(q[i][1], r[i])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MeasuredPeaks:
        """MeasuredPeaks from `to_dict`'s dict."""
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def _repr_html_(self) -> str:
        def extra(k: str) -> str:
            bits = []
            if self.spread(k) is not None:
                bits.append(f"rounds spread {sig(100 * self.spread(k), 2)}%")
            if k in self.sm_clock_mhz:
                bits.append(f"SM clock {self.sm_clock_mhz[k]:,.0f} MHz")
            if k in self.power_w:
                bits.append(f"{self.power_w[k]:,.0f} W")
            return ", ".join(bits)
        rows = "".join(f"<tr><td>{k.upper()} matmul</td><td>{si(v * 1e12, 'FLOP/s')}</td>"
                       f"<td><small>{extra(k)}</small></td></tr>" for k, v in self.tflops.items())
        if self.copy_gbs:
            rows += f"<tr><td>device copy</td><td>{si(self.copy_gbs * 1e9, 'B/s')}</td></tr>"
        notes = "".join(f"<li>{n}</li>" for n in self.notes)
        return (f"<b>Measured on {self.device}</b> (matmul {self.matmul_size}³)<table>{rows}</table>"
                + (f"<ul>{notes}</ul>" if notes else ""))


_PEAK_CACHE: dict[str, MeasuredPeaks] = {}


def _fp8_matmul_fn(n: int, device: torch.device):
    """A callable doing an n³ FP8 matmul through torch._scaled_mm, or None where FP8 is unavailable."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return None
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major second operand
    one = torch.tensor(1.0, device=device)
    return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def _matmul_fn(n: int, dtype: str, device: torch.device):
    if dtype == "fp8":
        fn = _fp8_matmul_fn(n, device) if device.type == "cuda" else None
        if fn is None:
            raise ValueError("dtype='fp8' needs torch._scaled_mm on a CUDA GPU with FP8 tensor cores (sm_89+)")
        return fn
    a = torch.randn(n, n, device=device, dtype=torch_dtype(dtype))
    b = torch.randn(n, n, device=device, dtype=torch_dtype(dtype))
    return lambda: a @ b


def sustained_matmul_tflops(n: int, dtype: str, device: torch.device | None = None, *, warm_s: float = 2.0,
                            rounds: int = 3, round_s: float = 0.5) -> tuple[list[float], dict[str, Any]]:
    """TFLOP/s of each of `rounds` timed rounds of an n³ matmul after `warm_s` of back-to-back work.

    A peak is a sustained rate: the first second of load runs at boost clocks and power limits bite later,
    so a short burst reads high on one run and low on the next. Returns the rounds (each at its median time)
    and a dict: "round_intervals", [lo, hi] TFLOP/s of each round from a 95% confidence interval for its median
    time, and the mean SM clock and power seen during them ("sm_clock_mhz", "power_w"; absent without NVML).
    """
    from .timing import benchmark

    dtype = check_dtype(dtype)
    if n <= 0:
        raise ValueError(f"n={n} must be > 0")
    device = device or get_device().torch_device
    fn = _matmul_fn(n, dtype, device)
    with float32_matmul_precision("high" if dtype == "tf32" else "highest"):
        benchmark(fn, min_time_s=max(warm_s, 1e-3), warmup_s=0, device=device)  # reach the steady state
        mon = None
        if device.type == "cuda":
            from .monitor import Monitor
            mon = Monitor(get_device(device.index), poll_s=0.2, gpm=False, cpu=False).start()
        try:
            timed = [benchmark(fn, min_time_s=round_s, warmup_s=0, device=device) for _ in range(rounds)]
        finally:
            trace = mon.stop() if mon else None
    out = [2 * n**3 / m.median / 1e12 for m in timed]
    ci = [m.median_estimate() for m in timed]
    state: dict[str, Any] = {"round_intervals": [[2 * n**3 / e.hi / 1e12, 2 * n**3 / max(e.lo, 1e-9) / 1e12]
                                                 for e in ci]}
    for metric in ("sm_clock_mhz", "power_w"):
        v = trace.mean(metric) if trace else None
        if v is not None:
            state[metric] = v
    return out, state


def matmul_tflops(n: int, dtype: str, device: torch.device | None = None, min_time_s: float = 0.3) -> float:
    """Measured TFLOP/s of an n×n×n matmul in `dtype` on `device` (random inputs, warm-up, median)."""
    from .timing import benchmark

    dtype = check_dtype(dtype)
    positive_int("n", n)
    device = device or get_device().torch_device
    fn = _matmul_fn(n, dtype, device)
    with float32_matmul_precision("high" if dtype == "tf32" else "highest"):
        m = benchmark(fn, min_time_s=min_time_s, device=device)
    return 2 * n**3 / m.median / 1e12


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
    """Where this course run keeps its measured peaks, so every notebook of the run uses the same values."""
    run_id = os.environ.get("GPULAB_RUN_ID")
    if not run_id:
        return None
    from .results import results_dir
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:80]  # two runs side by side (one per GPU) keep apart
    return results_dir() / device.slug / "peaks" / f"peaks-{n}-{safe}.json"


def _load_run_peaks(path: Path | None, dtypes: tuple[str, ...]) -> MeasuredPeaks | None:
    if path is None or not path.is_file():
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
                  round_s: float | None = None) -> MeasuredPeaks:
    """Measure sustained matmul TFLOP/s per dtype and copy bandwidth, once per course run.

    Each dtype is warmed for `warm_s` (2 s on a GPU) to reach the clock and power steady state, then timed
    in `rounds` rounds; the best round is the peak, and the rounds, SM clock and power are kept. Cached per
    device in this process and, inside `gpulab run` (GPULAB_RUN_ID set), in a file shared by every notebook.
    """
    device = device or get_device()
    if isinstance(dtypes, str):
        raise ValueError(f"dtypes={dtypes!r} must be a tuple of dtype names, e.g. ({dtypes!r},)")
    dtypes = tuple(check_dtype(d, name="dtypes") for d in dtypes)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
        raise ValueError(f"size={size!r} must be a positive int (or None for the default)")
    n = size or (8192 if device.is_cuda else 512)
    key = f"{device.slug}:{device.index}:{n}:{','.join(dtypes)}"
    if key in _PEAK_CACHE and not refresh:
        return _PEAK_CACHE[key]
    cache_file = _run_cache_path(device, n)
    if not refresh and (cached := _load_run_peaks(cache_file, dtypes)) is not None:
        _PEAK_CACHE[key] = cached
        return cached
    warm_s = (2.0 if device.is_cuda else 0.05) if warm_s is None else warm_s
    rounds = (3 if device.is_cuda else 1) if rounds is None else rounds
    round_s = (0.5 if device.is_cuda else 0.1) if round_s is None else round_s
    out = MeasuredPeaks(device=device.name, matmul_size=n, run_id=os.environ.get("GPULAB_RUN_ID", ""))
    old = None if refresh else _load_run_peaks(cache_file, ())  # this run's earlier values stay the values
    for d in dtypes:
        if old is not None and d in old.tflops:
            out.tflops[d], out.rounds[d] = old.tflops[d], old.rounds.get(d, [])
            for attr in ("round_intervals", "sm_clock_mhz", "power_w"):
                if d in getattr(old, attr):
                    getattr(out, attr)[d] = getattr(old, attr)[d]
            continue
        if not device.is_cuda and d in ("tf32", "fp8"):
            out.notes.append(f"{d.upper()} skipped: it needs a CUDA GPU with tensor cores")
            continue
        if device.is_cuda and d == "tf32" and device.capability < (8, 0):
            out.notes.append("TF32 skipped: tensor cores with TF32 arrive with Ampere (sm_80)")
            continue
        if d == "fp8" and device.capability < (8, 9):
            out.notes.append("FP8 skipped: FP8 tensor cores arrive with Ada/Hopper (sm_89+)")
            continue
        if d == "bf16" and device.is_cuda and not torch.cuda.is_bf16_supported():
            out.notes.append("BF16 skipped: not supported on this GPU")
            continue
        try:
            r, state = sustained_matmul_tflops(n, d, device.torch_device, warm_s=warm_s, rounds=rounds,
                                               round_s=round_s)
            out.tflops[d], out.rounds[d] = max(r), r
            for attr in ("round_intervals", "sm_clock_mhz", "power_w"):
                if attr in state:
                    getattr(out, attr)[d] = state[attr]
        except Exception as e:  # an unsupported kernel on some GPU must not stop the others
            out.notes.append(f"{d.upper()} failed: {type(e).__name__}: {e}"[:200])
    out.copy_gbs = old.copy_gbs if old is not None else copy_bandwidth_gbs(
        (1 << 30) if device.is_cuda else (64 << 20), device.torch_device, min_time_s=1.0 if device.is_cuda else 0.1)
    if device.is_cuda:
        torch.cuda.empty_cache()
    if cache_file is not None:
        from .results import write_json_atomic
        if old is not None:  # keep what an earlier notebook of this run measured for other dtypes
            for d in old.tflops:
                if d not in out.tflops:
                    out.tflops[d], out.rounds[d] = old.tflops[d], old.rounds.get(d, [])
                    if d in old.round_intervals:
                        out.round_intervals[d] = old.round_intervals[d]
        try:
            write_json_atomic(cache_file, out.to_dict())
        except OSError as e:
            out.notes.append(f"peaks not shared with the run's other notebooks: {e}")
    _PEAK_CACHE[key] = out
    return out
