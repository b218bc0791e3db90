"""One way to time a function: warm-up, CUDA events or a host clock, repeats sized by time, median and IQR.

Two modes. *Latency* times each call on its own (an event pair, or two clock reads, around every call): right for a
call that keeps the device busy, whose time the events' own cost cannot move. *Throughput* times a batch of
back-to-back calls with one pair around the batch (as torch.utils.benchmark's blocked_autorange does) and divides:
right for a launch-bound call, where the host paces the device and an event pair per call adds its own host time
to every call. `mode="auto"` picks throughput for a launch-bound call (see `launch_bound`).
"""
from __future__ import annotations

import inspect
import time
from typing import Any, Callable

import torch

from . import checks
from .measurement import Measurement

MODES = ("auto", "latency", "throughput")
# A CUDA call is launch-bound when the host spends at least this share of the call's synchronized time issuing it:
# the device then waits on the host, and what a loop of such calls achieves is the host's issue rate.
LAUNCH_BOUND_HOST_SHARE = 0.5
# ... and lasts under this: an event pair's few µs of host time are then over about 0.5% of the call. A longer call
# that the host paces (a loop with a sync inside) is timed per call: the pair's cost vanishes beside it.
LAUNCH_BOUND_BELOW_S = 1e-3
# On the CPU every call is host time; below this a clock read per call (tens of ns) is a visible share of it.
CPU_THROUGHPUT_BELOW_S = 50e-6
PROBE_CALLS = 16  # back-to-back calls that decide "auto" when the warm-up's last batch was shorter
THROUGHPUT_BLOCKS = 20  # timings (blocks of back-to-back calls) a throughput measurement aims for


def launch_bound(host_s_per_call: float, wall_s_per_call: float, *, on_device: bool) -> bool:
    """Whether a call is launch-bound: on a CUDA device, it lasts under 1 ms and issuing it takes the host at least
    half that time (the device waits on the host); on the CPU, where each call is host time, it lasts under 50 µs."""
    if wall_s_per_call <= 0:
        return True
    if on_device:
        return (wall_s_per_call < LAUNCH_BOUND_BELOW_S
                and host_s_per_call >= LAUNCH_BOUND_HOST_SHARE * wall_s_per_call)
    return wall_s_per_call < CPU_THROUGHPUT_BELOW_S


def check_timeable(fn: Any, name: str = "fn") -> None:
    """Refuse what cannot be timed: a non-callable, or a generator or coroutine function (calling one only
    creates the generator: its body never runs, and the timing would be of nothing)."""
    if not callable(fn):
        raise ValueError(f"{name} must be callable with no arguments; got {fn!r}")
    target = getattr(fn, "__call__", fn) if not inspect.isfunction(fn) and not inspect.ismethod(fn) else fn
    for f in (fn, target):
        if inspect.isgeneratorfunction(f) or inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f):
            raise ValueError(f"{name}={getattr(fn, '__name__', fn)!r} is a generator or coroutine function: calling it "
                             "does not run its body, so there is nothing to time; wrap it, e.g. lambda: list(gen())")


def _on_cuda(device: torch.device | str | None) -> bool:
    if device is None:
        return torch.cuda.is_available()
    return torch.device(device).type == "cuda"


# A further timed round of a function that is already warm: one untimed call, at least three timed ones.
ROUND: dict[str, Any] = {"warmup_s": 0.0, "min_warmup_calls": 1, "min_repeats": 3}


def _warm_up(fn: Callable[[], Any], sync: Callable[[], Any], clock: Callable[[], float], t0: float, *,
             min_calls: int, warmup_s: float, max_calls: int, batched: bool) -> tuple[int, int, float, float]:
    """Call `fn` untimed until at least `min_calls` calls and `warmup_s` seconds since `t0`.

    Returns (calls, calls in the last batch, host seconds issuing that batch, seconds until it had finished), which
    tell whether the host or the device paces the call (`launch_bound`). `batched` (CUDA, where calls only queue
    work) reads the clock after a synchronize, in doubling batches: checking only the host clock would queue a tenth
    of a second of launches, for a 20 ms matmul twenty seconds of GPU time."""
    warm, batch = 0, min_calls
    while True:
        n = min(batch, max_calls - warm)
        b0 = clock()
        for _ in range(n):
            fn() if warm else checks.timeable_result(fn())  # `lambda: gen()` only makes a generator: refused
        issued = clock()
        sync()
        done = clock()
        warm += n
        if warm >= max_calls or (warm >= min_calls and done - t0 >= warmup_s):
            return warm, max(n, 1), issued - b0, done - b0
        batch = warm if batched else 1


def _probe(fn: Callable[[], Any], sync: Callable[[], Any], clock: Callable[[], float],
           calls: int = PROBE_CALLS) -> tuple[int, float, float]:
    """(calls, host seconds issuing them, seconds until they had finished) of `calls` back-to-back calls: one
    synchronize's own cost (tens of µs) would make a single launch-bound call look device-bound."""
    sync()
    b0 = clock()
    for _ in range(calls):
        fn()
    issued = clock()
    sync()
    return calls, issued - b0, clock() - b0


def benchmark(fn: Callable[[], Any], *, label: str = "", min_time_s: float = 0.5, warmup_s: float = 0.1,
              min_repeats: int = 5, max_repeats: int = 10_000, device: torch.device | str | None = None,
              clock: Callable[[], float] | None = None, min_warmup_calls: int = 2,
              mode: str = "auto", max_time_s: float | None = None) -> Measurement:
    """Time `fn()`: warm up, then repeat until `min_time_s` of timed calls.

    `mode`: "latency" times each call, "throughput" blocks of back-to-back calls (at least `min_repeats` blocks)
    divided by their calls, "auto" (default) throughput where the warm-up finds the call launch-bound
    (`launch_bound`), else latency; the Measurement records which. `clock` replaces the host clock (tests).
    `min_warmup_calls` can be 1 for a function that is already warm (an interleaved round), so that a half-second
    training step is not run seven times for a quarter-second window. `max_repeats` caps the timed calls, and
    `max_time_s` the timed window's host seconds (after `min_repeats` timings): a queue-fed call whose warm-up drew
    ready batches sizes its window for a rate the queue cannot keep up (one such window ran 10 s for 0.6)."""
    check_timeable(fn)
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: choose one of {', '.join(map(repr, MODES))}")
    if device is not None and torch.device(device).type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r} but this machine has no CUDA GPU (torch.cuda.is_available() "
                             "is False): leave device=None to time on the CPU")
        index = torch.device(device).index
        if index is not None and index >= torch.cuda.device_count():
            raise ValueError(f"device={str(device)!r} but this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    checks.positive_float("min_time_s", min_time_s)
    checks.positive_float("warmup_s", warmup_s, allow_zero=True)
    checks.positive_float("max_time_s", max_time_s, allow_none=True)
    if min_repeats < 1 or max_repeats < min_repeats:
        raise ValueError(f"min_repeats={min_repeats}, max_repeats={max_repeats}: need 1 <= min_repeats <= max_repeats")
    if isinstance(min_warmup_calls, bool) or not isinstance(min_warmup_calls, int) or min_warmup_calls < 1:
        raise ValueError(f"min_warmup_calls={min_warmup_calls!r} must be an int >= 1 (the first call also sizes the "
                         "repeats)")
    use_events = _on_cuda(device) and clock is None
    clock = clock or time.perf_counter
    sync = _synchronizer(use_events)

    # Warm-up: at least two calls (first-call costs: module load, cuBLAS handles, compilation).
    sync()
    t0 = clock()
    warm, last, host_s, wall_s = _warm_up(fn, sync, clock, t0, min_calls=min_warmup_calls, warmup_s=warmup_s,
                                          max_calls=max_repeats, batched=use_events)
    per_call = max((clock() - t0) / warm, 1e-9)
    calls = int(min(max_repeats, max(min_repeats, min_time_s / per_call)))
    if mode == "auto" and use_events and last < PROBE_CALLS and wall_s / last < LAUNCH_BOUND_BELOW_S:
        last, host_s, wall_s = _probe(fn, sync, clock)
        warm += last
    bound = launch_bound(host_s / last, wall_s / last, on_device=use_events or _on_cuda(device))
    chosen = mode if mode != "auto" else ("throughput" if bound else "latency")
    why = {"host_s_per_call": host_s / last, "wall_s_per_call": wall_s / last, "launch_bound": bound,
           "mode_asked": mode}
    if chosen == "throughput":
        per_block = max(1, calls // max(min_repeats, THROUGHPUT_BLOCKS))
        blocks = max(min_repeats, calls // per_block)
        return _timed_blocks(fn, blocks, per_block, label=label, use_events=use_events, clock=clock,
                             warmup_calls=warm, meta=why, stop=_stop(clock, max_time_s, min_repeats))
    m = _timed_window(fn, calls, label=label, use_events=use_events, clock=clock, warmup_calls=warm,
                      stop=_stop(clock, max_time_s, min_repeats))
    m.meta.update(why)
    return m


def time_calls(fn: Callable[[], Any], calls: int, *, label: str = "", device: torch.device | str | None = None,
               clock: Callable[[], float] | None = None) -> Measurement:
    """Time exactly `calls` calls of a function that is already warm, with no warm-up call: one short round of an
    interleaved comparison (`before_after(round_calls=...)`), so that the two sides' calls sit next to each other.
    Each call is timed on its own (latency)."""
    check_timeable(fn)
    checks.positive_int("calls", calls)
    use_events = _on_cuda(device) and clock is None
    return _timed_window(fn, calls, label=label, use_events=use_events, clock=clock or time.perf_counter,
                         warmup_calls=0)


def _synchronizer(use_events: bool) -> Callable[[], None]:
    """The wait that ends a timed stretch: `torch.cuda.synchronize` where calls run on a CUDA device (they only
    queue work), nothing on the CPU (they have finished when they return)."""
    return torch.cuda.synchronize if use_events else (lambda: None)


def _stop(clock: Callable[[], float], max_time_s: float | None, min_timings: int) -> Callable[[float, int], bool]:
    """stop(w0, timings): whether a window begun at `w0` has run its `max_time_s` (never before `min_timings`)."""
    if max_time_s is None:
        return lambda w0, n: False
    return lambda w0, n: n >= min_timings and clock() - w0 >= max_time_s


def _timed_window(fn: Callable[[], Any], repeats: int, *, label: str, use_events: bool,
                  clock: Callable[[], float], warmup_calls: int,
                  stop: Callable[[float, int], bool] = lambda w0, n: False) -> Measurement:
    """`repeats` timed calls in one window (fewer where `stop` says so): CUDA events per call on a GPU, else the
    host clock (latency)."""
    sync = _synchronizer(use_events)
    times: list[float] = []
    sync()
    w0 = clock()
    if use_events:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        done = 0
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
            done += 1
            if stop(w0, done):
                break
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / 1e3 for s, e in zip(starts[:done], ends[:done])]
    else:
        for _ in range(repeats):
            t = clock()
            fn()
            times.append(clock() - t)
            if stop(w0, len(times)):
                break
    sync()
    window = (len(times), clock() - w0)
    return Measurement(label=label or getattr(fn, "__name__", "fn"), times_s=times,
                       timer="cuda events" if use_events else "perf_counter", warmup_calls=warmup_calls,
                       windows=[window], mode="latency")


def _timed_blocks(fn: Callable[[], Any], blocks: int, per_block: int, *, label: str, use_events: bool,
                  clock: Callable[[], float], warmup_calls: int, meta: dict[str, Any] | None = None,
                  stop: Callable[[float, int], bool] = lambda w0, n: False) -> Measurement:
    """`blocks` timings of `per_block` back-to-back calls each, one event (or clock) pair around each block; each
    timing is the block's time over its calls (throughput)."""
    sync = _synchronizer(use_events)
    times: list[float] = []
    sync()
    w0 = clock()
    if use_events:
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(blocks + 1)]
        marks[0].record()
        done = 0
        for e in marks[1:]:  # back to back: each block's end event is the next one's start
            for _ in range(per_block):
                fn()
            e.record()
            done += 1
            if stop(w0, done):
                break
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) / 1e3 / per_block for a, b in zip(marks[:done], marks[1:done + 1])]
    else:
        for _ in range(blocks):
            t = clock()
            for _ in range(per_block):
                fn()
            times.append((clock() - t) / per_block)
            if stop(w0, len(times)):
                break
    sync()
    window = (len(times) * per_block, clock() - w0)
    return Measurement(label=label or getattr(fn, "__name__", "fn"), times_s=times,
                       timer="cuda events" if use_events else "perf_counter", warmup_calls=warmup_calls,
                       meta=dict(meta or {}), windows=[window], mode="throughput", calls_per_timing=per_block)
