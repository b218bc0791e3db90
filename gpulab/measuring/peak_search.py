"""The matmul shape search behind measured peaks, as mamf-finder does it: every shape's median call, then the
fastest few again in interleaved rounds."""
from __future__ import annotations

import math
import time
from statistics import median
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .checks import positive_int
from .device import check_dtype, float32_matmul_precision, get_device
from .dtypes import torch_dtype

Shape = tuple[int, int, int]  # (M, N, K): an M×K matrix times a K×N one
TimeCalls = Callable[[Shape, int], Sequence[float]]  # seconds of each of n calls of one shape


METHOD = ("each call timed alone (CUDA events around it, after a write that evicts the L2 cache and a rewrite of "
          "the output, as mamf-finder times it); a shape's rate is its median call; a round is the median of 100 calls "
          "after 50 untimed ones in one batch (fewer where 100 calls outlast a round), each round after the search's "
          "smaller shapes replayed up to it, as mamf-finder meets a shape in its sweep; the peak is the best round")


def search_shapes(size: int, *, m_step: int | None = None, m_stop: int | None = None,
                  cube: bool = True) -> list[Shape]:
    """The shapes a peak search times: M from m_step up to m_stop at N = K = size, then (2·size)³.

    At size 4096 the defaults are mamf-finder's quick range (`--m_range 0 20480 256 --n 4096 --k 4096`) plus 8192³.
    """
    positive_int("size", size)
    m_step = m_step or max(1, size // 16)
    m_stop = m_stop or 5 * size
    positive_int("m_step", m_step)
    shapes = [(m, size, size) for m in range(m_step, m_stop, m_step)]
    if cube:
        shapes.append((2 * size,) * 3)
    if not shapes:
        raise ValueError(f"m_step={m_step} and m_stop={m_stop} leave no shape to search")
    return shapes


def shape_flops(shape: Shape) -> int:
    """FLOPs of one (M, N, K) matmul: 2·M·N·K."""
    m, n, k = shape
    return 2 * m * n * k


def median_interval(xs: Sequence[float]) -> tuple[float, float]:
    """A distribution-free 95% confidence interval for the median of `xs` (order statistics; the range below 6)."""
    v = sorted(xs)
    n = len(v)
    if n < 6:
        return v[0], v[-1]
    half = 1.96 * math.sqrt(n) / 2
    return v[max(0, math.floor(n / 2 - half))], v[min(n - 1, math.ceil(n / 2 + half) - 1)]


@dataclass
class ShapeSearch:
    """What a peak search found: each shape's rate, the best shapes' rounds, the winner and how long it took."""

    rows: list[list[float]]                   # [M, N, K, TFLOP/s of the median call] per shape, in search order
    rounds: dict[Shape, list[float]]          # TFLOP/s of each round of the shapes re-measured
    round_intervals: dict[Shape, list[list[float]]]  # [lo, hi] TFLOP/s per round: 95% for its median call
    best: Shape
    search_s: float
    rounds_s: float
    settle: list[float] = field(default_factory=list)  # TFLOP/s of each warm-up window before the rounds

    @property
    def tflops(self) -> float:
        """The achievable rate: the best shape's best round (mamf-finder's best median over its shapes)."""
        return max(self.rounds[self.best])

    @property
    def interval(self) -> tuple[float, float]:
        """(min, max) TFLOP/s over the best shape's rounds."""
        r = self.rounds[self.best]
        return min(r), max(r)


def search_best_shape(time_calls: TimeCalls, shapes: Sequence[Shape], *, shape_s: float, round_s: float,
                      top: int = 3, rounds: int = 5, warm_calls: int = 3, min_calls: int = 5,
                      max_calls: int = 100, round_calls: int | None = None, round_warm: int = 0,
                      lead_s: float = 0.0, settle_s: float = 0.0, clock: Callable[[], float] = time.perf_counter,
                      progress: Callable[[Any], Any] = iter) -> ShapeSearch:
    """Time every shape briefly, then the `top` fastest again in `rounds` interleaved rounds; the best is the shape
    with the highest round, and its best round is the peak (`tflops`), as mamf-finder reports its best median.

    `time_calls(shape, n)` returns each of n calls' seconds. A shape's rate is its median call, after `warm_calls`
    untimed ones. Rounds go shape by shape, so a drifting clock moves every candidate alike, with untimed calls in
    the same batch (`round_warm` per `round_calls`: mamf-finder's 50 before 100); a slow dtype's round is cut to
    `round_s`. Each round replays, untimed, up to `lead_s` seconds of the shapes searched before it (`lead_in`):
    a GPU at its power limit runs a shape faster after lighter work than after seconds of the same (the best shapes
    back to back read 724-736 TFLOP/s on one H200, mamf-finder 753-760). Before the rounds the fastest shape runs
    until its rate stops climbing, for at most `settle_s` (`settle`): a cold GPU's clocks ramp up over seconds
    (714 -> 744 TFLOP/s on one H200 without it)."""
    if not shapes:
        raise ValueError("shapes must name at least one (M, N, K) shape")
    positive_int("top", top)
    positive_int("rounds", rounds)
    positive_int("min_calls", min_calls)
    t0 = clock()
    rows, per_call = [], {}
    for shape in progress(list(shapes)):
        warm = list(time_calls(shape, warm_calls)) if warm_calls else []
        guess = median(warm) if warm else 0.0
        calls = max(min_calls, min(max_calls, int(shape_s / guess) if guess > 0 else max_calls))
        t = median(time_calls(shape, calls))
        per_call[shape] = t
        rows.append([*shape, shape_flops(shape) / max(t, 1e-12) / 1e12])
    t1 = clock()
    ranked = sorted(per_call, key=lambda sh: shape_flops(sh) / max(per_call[sh], 1e-12), reverse=True)[:top]
    order = list(per_call)  # the search's order: each round's lead-in is the shapes timed just before it

    def n_calls(sh: Shape) -> int:
        fit = max(min_calls, int(round_s / max(per_call[sh], 1e-12)))
        return min(round_calls, fit) if round_calls else fit

    def n_warm(sh: Shape) -> int:
        return round_warm * n_calls(sh) // round_calls if round_calls else round_warm

    out_rounds: dict[Shape, list[float]] = {sh: [] for sh in ranked}
    out_iv: dict[Shape, list[list[float]]] = {sh: [] for sh in ranked}
    warmed = settle(time_calls, ranked[0], n_calls(ranked[0]), max_s=settle_s, clock=clock) if settle_s > 0 else []
    in_order = sorted(ranked, key=order.index)  # the sweep's order, as mamf-finder meets them
    lead = lead_in(order[:order.index(in_order[0])], {sh: n_warm(sh) + n_calls(sh) for sh in order}, per_call, lead_s)
    for _ in range(rounds):
        for prev, n in lead:
            time_calls(prev, n)
        for sh in in_order:
            calls, warm = n_calls(sh), n_warm(sh)
            times = list(time_calls(sh, warm + calls))[warm:]  # one batch: no idle gap before the timed calls
            f = shape_flops(sh) / 1e12
            out_rounds[sh].append(f / max(median(times), 1e-12))
            lo, hi = median_interval(times)
            out_iv[sh].append([f / max(hi, 1e-12), f / max(lo, 1e-12)])
    best = max(ranked, key=lambda sh: max(out_rounds[sh]))
    return ShapeSearch(rows, out_rounds, out_iv, best, t1 - t0, clock() - t1, warmed)


def lead_in(before: Sequence[Shape], calls: dict[Shape, int], per_call: dict[Shape, float],
            lead_s: float) -> list[tuple[Shape, int]]:
    """The last shapes of `before` (the search's shapes ahead of a round's first) whose `calls` take about `lead_s`
    seconds by their quick-pass `per_call` times, in the search's order: what a round replays, untimed, first."""
    out: list[tuple[Shape, int]] = []
    spent = 0.0
    for sh in reversed(before):
        if spent >= lead_s:
            break
        out.append((sh, calls[sh]))
        spent += calls[sh] * per_call[sh]
    return out[::-1]


def settle(time_calls: TimeCalls, shape: Shape, calls: int, *, max_s: float, tolerance: float = 0.01,
           steady_s: float = 1.5, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Windows of `calls` calls of `shape` until the rate has not risen by more than `tolerance` for `steady_s`
    seconds (a slow ramp rises a little every window, so one flat window would stop it too soon), or `max_s`
    seconds in all. Returns each window's TFLOP/s (the record of the warm-up; none of them is a measurement)."""
    positive_int("calls", calls)
    start = clock()
    f, rates, mark, t_mark = shape_flops(shape) / 1e12, [], None, start
    while (now := clock()) < start + max_s and (mark is None or now - t_mark < steady_s):
        rate = f / max(median(time_calls(shape, calls)), 1e-12)
        rates.append(rate)
        if mark is None or rate > mark * (1 + tolerance):
            mark, t_mark = rate, clock()
    return rates


def _shape_timer(dtype: str, device: torch.device, shapes: Sequence[Shape]) -> TimeCalls:
    """A `time_calls` for `search_best_shape`: nn.Linear's layout (A @ B.T, B stored N×K), operands allocated once
    per (N, K) at the largest M and sliced; on a GPU each call alone between CUDA events after an L2 eviction."""
    cuda = device.type == "cuda"
    if dtype == "fp8" and not (cuda and hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")):
        raise ValueError("dtype='fp8' needs torch._scaled_mm on a CUDA GPU with FP8 tensor cores (sm_89+)")
    tdt = torch.bfloat16 if dtype == "fp8" else torch_dtype(dtype)
    operands: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}
    for nk in {(n, k) for _, n, k in shapes}:
        m_max = max(m for m, n, k in shapes if (n, k) == nk)
        a = torch.randn(m_max, nk[1], device=device, dtype=tdt)
        b = torch.randn(nk[0], nk[1], device=device, dtype=tdt)
        if dtype == "fp8":
            a, b = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        c = torch.empty(m_max, nk[0], device=device, dtype=tdt)
        operands[nk] = (a, b, c, torch.randn_like(c) if cuda else c)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=device) if cuda else None
    one = torch.tensor(1.0, device=device)

    def call(shape: Shape) -> tuple[Callable[[], Any], Callable[[], Any]]:
        m, n, k = shape
        a, b, c, c_rand = operands[(n, k)]
        a, bt, c, c_rand = a[:m], b.t(), c[:m], c_rand[:m]
        if dtype == "fp8":
            fn = lambda: torch._scaled_mm(a, bt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        else:
            fn = lambda: torch.mm(a, bt, out=c)  # noqa: E731

        def reset() -> None:
            if flush is not None:
                flush.zero_()      # evict the L2 cache: operands come from memory, as in a model
                c.copy_(c_rand)    # the output is written for real each call
        return fn, reset

    def time_calls(shape: Shape, n_calls: int) -> list[float]:
        fn, reset = call(shape)
        with torch.no_grad(), float32_matmul_precision("high" if dtype == "tf32" else "highest"):
            if not cuda:
                out = []
                for _ in range(n_calls):
                    t = time.perf_counter()
                    fn()
                    out.append(time.perf_counter() - t)
                return out
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n_calls)]
            for start, end in ev:
                reset()
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize(device)
            return [s.elapsed_time(e) / 1e3 for s, e in ev]
    return time_calls


def search_matmul_peak(dtype: str, device: torch.device | None = None, *, size: int = 4096,
                       m_step: int | None = None, warm_s: float = 3.0, shape_s: float = 0.06,
                       round_s: float = 0.2, top: int = 3, rounds: int = 5, round_calls: int | None = None,
                       round_warm: int = 0, lead_s: float = 0.0, settle_s: float = 0.0,
                       progress: bool = False) -> tuple[ShapeSearch, dict[str, Any]]:
    """Search matmul shapes for the best sustained rate of `dtype`, as mamf-finder does, and re-measure the best.

    `warm_s` seconds of the largest shape first (clocks and power at their steady state), then `search_best_shape`.
    Returns the search and the mean SM clock and power seen during it (absent without NVML)."""
    dtype = check_dtype(dtype)
    device = device or get_device().torch_device
    shapes = search_shapes(size, m_step=m_step)
    timer = _shape_timer(dtype, device, shapes)
    biggest = max(shapes, key=shape_flops)
    t_end = time.perf_counter() + warm_s
    while True:  # at least one call, so the first timed shape does not pay cuBLAS's set-up
        timer(biggest, 1)
        if time.perf_counter() >= t_end:
            break
    mon = None
    if device.type == "cuda":
        from .monitor import Monitor
        mon = Monitor(get_device(device.index), poll_s=0.2, gpm=False, cpu=False).start()
    bar = iter
    if progress:
        from tqdm.auto import tqdm
        bar = lambda xs: tqdm(xs, desc=f"{dtype.upper()} matmul shapes", leave=False)  # noqa: E731
    try:
        found = search_best_shape(timer, shapes, shape_s=shape_s, round_s=round_s, top=top, rounds=rounds,
                                  round_calls=round_calls, round_warm=round_warm, lead_s=lead_s,
                                  settle_s=settle_s, progress=bar)
    finally:
        trace = mon.stop() if mon else None
    state: dict[str, Any] = {}
    for metric in ("sm_clock_mhz", "power_w"):
        v = trace.mean(metric) if trace else None
        if v is not None:
            state[metric] = v
    return found, state
