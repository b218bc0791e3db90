"""A training loop fed by a loader, timed as a pipeline: a fed loop's throughput is the samples it trained over the
wall time of whole windows, not items over the median call (a bursty queue makes most calls look fast).

    with Feed(endless_loader(ds, batch_size=64, num_workers=8, pin_memory=True), step, device) as feed:
        run = measure_feed(feed, 4, label="8 workers", items=4 * 64)   # samples over the windows' wall time

`compare_feeds` times two fed loops in interleaved windows (drift cancels in each pair), `compare_worker_counts`
two worker counts, `utilization_by_workers` every worker count of a sweep.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

from torch.utils.data import Dataset
from tqdm.auto import tqdm

from ..measuring import checks
from ..measuring.device import as_torch_device, get_device
from ..measuring.estimates import Estimate, log_t_interval
from ..measuring.timing import ROUND, benchmark
from ..verdicts.experiment import Comparison, default_min_time, measure
from ..verdicts.run_result import RunResult, window_pair_ratios
from .dataloading import CUDAPrefetcher, _shutdown, endless_loader, to_device, workers


class Feed:
    """An endless stream of batches feeding a training step: `run(n)` trains on the next `n` batches.

    `source` is any endless iterable of (x, y) CPU batches. The plain loop copies each batch right before its step;
    with `prefetch=True` a `CUDAPrefetcher` copies batch i+1 on a side stream while batch i computes (`prefetch` may
    be a prefetcher class of your own; off CUDA it is the plain loop). The workers start at the first `run`, so an
    untimed first call absorbs the start-up. Use as a context manager: closing stops the workers."""

    def __init__(self, source: Iterable, step: Callable[[Any, Any], Any], device: Any = None, *,
                 prefetch: bool | Callable[[Iterator, Any], Iterable] = False, non_blocking: bool | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        if not callable(step):
            raise ValueError("step must be callable as step(x, y)")
        self.device = as_torch_device(device)
        self.source, self.step, self.clock = source, step, clock
        pinned = bool(getattr(source, "pin_memory", False))
        self.non_blocking = pinned if non_blocking is None else non_blocking
        self.prefetch = bool(prefetch) and self.device.type == "cuda"
        self._prefetcher = prefetch if callable(prefetch) else CUDAPrefetcher
        self._source_it: Iterator | None = None
        self._it: Iterator | None = None
        self.batches = 0
        self.samples = 0
        self.wait_s = 0.0  # host seconds spent waiting for the next batch: the loop's data-loading time

    @property
    def queue_capacity(self) -> int:
        """Batches the source can hold ready: num_workers × prefetch_factor for a DataLoader with workers
        (each worker loads prefetch_factor batches ahead), plus one a prefetcher holds; 0 without a queue."""
        workers = getattr(self.source, "num_workers", 0) or 0
        ahead = getattr(self.source, "prefetch_factor", None) or 0
        return workers * ahead + (1 if self.prefetch else 0)

    def settle(self) -> None:
        """Train on as many batches as the queue holds (untimed), back to back with what follows.

        While a loop is idle its workers fill the queue; a window that starts on that backlog overstates the rate.
        Consuming `queue_capacity` batches first leaves the queue as the steady state has it."""
        n = self.queue_capacity
        if n or self._it is None:
            self.run(max(n, 1))

    def _start(self) -> Iterator:
        self._source_it = iter(self.source)
        self._it = iter(self._prefetcher(self._source_it, self.device)) if self.prefetch else self._source_it
        return self._it

    def run(self, n: int) -> None:
        """Train on the next `n` batches (no synchronize: time it with gl.benchmark / gl.measure)."""
        it = self._it or self._start()
        for _ in range(n):
            t0 = self.clock()
            x, y = next(it)
            self.wait_s += self.clock() - t0
            if not self.prefetch:
                x, y = to_device((x, y), self.device, non_blocking=self.non_blocking)
            self.step(x, y)
            self.batches += 1
            self.samples += len(x)

    def close(self) -> None:
        """Stop the source's worker processes (if any); a later `run` starts them again."""
        if self._it is not None and self._it is not self._source_it and hasattr(self._it, "close"):
            self._it.close()  # the prefetcher's generator
        if self._source_it is not None:
            _shutdown(self._source_it)
        self._it = self._source_it = None

    def __enter__(self) -> Feed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cycle(batches: Sequence[Any]) -> Iterator[Any]:
    """The same few batches over and over: a source with no loading cost at all."""
    if not batches:
        raise ValueError("batches must not be empty")
    while True:
        yield from batches


def utilization_by_workers(dataset: Dataset, step: Callable[[Any, Any], Any], workers: Sequence[int], *,
                           batch_size: int, pin_memory: bool = False, prefetch_factor: int = 2,
                           batches_per_call: int = 4, flops_per_sample: float | None = None,
                           dtype: str | None = None, min_time_s: float | None = None, device: Any = None,
                           rounds: int | None = None, window_s: float | None = None,
                           progress: bool = True) -> list[tuple[int, RunResult]]:
    """For each worker count: the training loop fed by an endless loader, timed as a pipeline by `measure_feed`.

    Workers start before timing and stay alive. `rounds` more windows follow the monitored one (None: 10 on a CUDA
    GPU, 3 elsewhere): with 11 a rate's interval is a 95% confidence interval of the median window rate (with 4,
    bursty loaders left the worker claims undecided on one GPU and decided on another). `window_s` (None: 1 s on a
    CUDA GPU, where a quarter second held only about twenty batches; a quarter of `min_time_s` elsewhere)."""
    dev_info = device if hasattr(device, "is_cuda") else get_device()
    rounds = (10 if dev_info.is_cuda else 3) if rounds is None else rounds
    window_s = _feed_window_s(window_s, min_time_s, dev_info)
    out = []
    for w in tqdm(list(workers), desc="utilization per worker count", disable=not progress):
        loader = endless_loader(dataset, batch_size=batch_size, num_workers=w, pin_memory=pin_memory,
                                prefetch_factor=prefetch_factor)
        with Feed(loader, step, dev_info.torch_device) as feed:
            n = batches_per_call * batch_size
            run = measure_feed(feed, batches_per_call, label=f"num_workers={w}", items=n,
                               flops=flops_per_sample * n if flops_per_sample else None, dtype=dtype,
                               min_time_s=min_time_s, device=dev_info, rounds=rounds, window_s=window_s)
        out.append((w, run))
    return out


def _window(feed: Feed, batches_per_call: int, seconds: float, device: Any, waits: list[float],
            max_s: float | None = None) -> Any:
    """One more timed window of the fed loop, started on a settled queue; appends its data wait per batch.
    Like an interleaved round of `gl.before_after` (`timing.ROUND`): one untimed call, at least three timed ones, so
    a starved loop's half-second calls are not run seven times for a one-second window. `max_s` caps its seconds."""
    feed.settle()
    w0, b0 = feed.wait_s, feed.batches
    m = benchmark(lambda: feed.run(batches_per_call), min_time_s=seconds, device=device, max_time_s=max_s, **ROUND)
    waits.append((feed.wait_s - w0) / max(1, feed.batches - b0))
    return m


def _feed_window_s(window_s: float | None, min_time_s: float | None, dev: Any) -> float:
    """Seconds per extra window of a fed loop: `window_s` if given, else 1 s on a CUDA GPU (many of a loader's
    bursts) and a quarter of `min_time_s` elsewhere."""
    return window_s or (1.0 if dev.is_cuda else (min_time_s or default_min_time(dev)) / 4)


def measure_feed(feed: Feed, batches_per_call: int, *, label: str, items: float, rounds: int = 3,
                 flops: float | None = None, dtype: str | None = None, item_name: str = "samples",
                 min_time_s: float | None = None, device: Any = None, profile: bool = False,
                 window_s: float | None = None, max_window_s: float | None = None) -> RunResult:
    """The loop fed by `feed` as a pipeline: `gl.measure(..., pipeline=True)` on a settled queue, then
    `rounds` more windows of `window_s` each (None: a quarter of the time), so the throughput (items over each
    window's wall time) has a spread. The data wait per batch of each window is kept in
    `meta['data_wait_s_per_batch']`. `max_window_s` caps each window's seconds (None: no cap): a warm-up call that
    drew ready batches can size a window for a rate the loader cannot keep up."""
    checks.positive_int("batches_per_call", batches_per_call)
    checks.positive_int("rounds", rounds, minimum=0)
    checks.positive_float("window_s", window_s, allow_none=True)
    dev = device if hasattr(device, "is_cuda") else get_device()
    feed.settle()
    w0, b0 = feed.wait_s, feed.batches
    run = measure(lambda: feed.run(batches_per_call), label=label, items=items, flops=flops, dtype=dtype,
                  item_name=item_name, min_time_s=min_time_s, device=dev, profile=profile, pipeline=True,
                  max_time_s=max_window_s)
    waits = [(feed.wait_s - w0) / max(1, feed.batches - b0)]
    window_s = window_s or (min_time_s or default_min_time(dev)) / 4
    for _ in range(rounds):
        extra = _window(feed, batches_per_call, window_s, dev.torch_device, waits, max_window_s)
        run.measurement = run.measurement.merged(extra)
    run.measurement.meta["data_wait_s_per_batch"] = waits
    return run


def compare_feeds(before: Feed, after: Feed, batches_per_call: int, *, name: str, items: float,
                  before_label: str = "before", after_label: str = "after", rounds: int = 4,
                  flops: float | None = None, dtype: str | None = None, item_name: str = "samples",
                  min_time_s: float | None = None, device: Any = None, profile: bool = False,
                  kind: str = "optimisation", window_s: float | None = None, progress: bool = True,
                  min_rounds: int | None = None, decided: Callable[[Comparison], bool] | None = None,
                  budget_s: float | None = None, clock: Callable[[], float] = time.perf_counter,
                  pair_interval: str = "median", max_window_s: float | None = None) -> Comparison:
    """`gl.before_after` for two fed loops, as pipelines: each side's monitored window, then `rounds` interleaved
    windows (before, after, after, before, ...), each started on a settled queue.

    Both loaders stay alive, so before each window the other side's workers get the time to refill their queue
    (`refill_s`): idle workers then take no CPU from the side being timed (when they did, a no-op change read
    1.14x on one run and 0.90x on the next). `window_s`: each interleaved window's seconds (None: 1 s on a CUDA
    GPU, long enough to hold many of a loader's bursts; a quarter of `min_time_s` elsewhere).
    With `min_rounds`, the rounds past it run only if `decided` (asked once, after `min_rounds` rounds) says the
    pairs do not yet settle the question, and while they have taken less than `budget_s` (checked after each pair
    of rounds, so both orders stay balanced). `pair_interval`: "t" where a claim on the pair is judged on
    `paired_ratio`, so that the comparison's header and the claim say the same. `max_window_s` caps every window's
    seconds (`measure_feed`)."""
    dev = device if hasattr(device, "is_cuda") else get_device()
    checks.positive_int("rounds", rounds, minimum=0)
    if min_rounds is not None:
        checks.positive_int("min_rounds", min_rounds, minimum=0)
    checks.positive_float("budget_s", budget_s, allow_none=True)
    checks.positive_float("window_s", window_s, allow_none=True)
    checks.positive_float("max_window_s", max_window_s, allow_none=True)
    b = measure_feed(before, batches_per_call, label=before_label, items=items, rounds=0, flops=flops,
                     dtype=dtype, item_name=item_name, min_time_s=min_time_s, device=dev, profile=profile,
                     max_window_s=max_window_s)
    _sleep(refill_s(before, b.measurement, batches_per_call))
    a = measure_feed(after, batches_per_call, label=after_label, items=items, rounds=0, flops=flops,
                     dtype=dtype, item_name=item_name, min_time_s=min_time_s, device=dev, profile=profile,
                     max_window_s=max_window_s)
    waits = {id(b): list(b.measurement.meta["data_wait_s_per_batch"]),
             id(a): list(a.measurement.meta["data_wait_s_per_batch"])}
    round_s = _feed_window_s(window_s, min_time_s, dev)
    last = (after, a.measurement)  # the side timed last, whose workers now refill its queue
    t0 = clock()
    for i in tqdm(range(rounds), desc=f"{name}: interleaved windows", leave=False, disable=not progress):
        if min_rounds is not None and i >= min_rounds:
            if i == min_rounds and decided is not None and decided(
                    Comparison(name=name, before=b, after=a, device=dev.name, kind=kind, pair_interval=pair_interval)):
                break
            if budget_s is not None and i % 2 == 0 and clock() - t0 >= budget_s:
                break
        sides = ((before, b), (after, a)) if i % 2 == 0 else ((after, a), (before, b))
        for feed, run in sides:
            if last[0] is not feed:
                _sleep(refill_s(last[0], last[1], batches_per_call))
            extra = _window(feed, batches_per_call, round_s, dev.torch_device, waits[id(run)], max_window_s)
            run.measurement = run.measurement.merged(extra)
            run.measurement.meta["interleaved_rounds"] = i + 1
            last = (feed, extra)
    for run in (b, a):
        run.measurement.meta["data_wait_s_per_batch"] = waits[id(run)]
    return Comparison(name=name, before=b, after=a, device=dev.name, kind=kind, pair_interval=pair_interval)


_sleep = time.sleep  # replaced in tests
REFILL_MAX_S = 3.0  # a loader slower than this to refill its queue is starved anyway: its workers never idle


def refill_s(feed: Feed, measured: Any, batches_per_call: int, margin: float = 1.5) -> float:
    """Seconds `feed`'s workers need to fill its queue again after a timed window: its `queue_capacity` at the
    window's mean rate (calls of `batches_per_call` batches over their summed time; the median call of a bursty
    queue looks faster than the loop runs), times `margin`, at most REFILL_MAX_S; 0 without a queue."""
    times = list(getattr(measured, "times_s", None) or [])
    total = sum(times)
    if not feed.queue_capacity or total <= 0:
        return 0.0
    batches_per_s = batches_per_call * len(times) / total
    return min(REFILL_MAX_S, margin * feed.queue_capacity / batches_per_s)


def compare_worker_counts(dataset: Dataset, step: Callable[[Any, Any], Any], before: int, after: int, *, name: str,
                          batch_size: int, pin_memory: bool, batches_per_call: int, flops_per_sample: float,
                          device: Any, **timing: Any) -> Comparison:
    """Two worker counts feeding `step`, both loaders alive, in interleaved windows (`compare_feeds`'s `timing`;
    each window waits for the other loader's queue to refill first)."""
    n, kw = batches_per_call * batch_size, dict(batch_size=batch_size, pin_memory=pin_memory)
    with Feed(endless_loader(dataset, num_workers=before, **kw), step, device.torch_device) as f_before, \
         Feed(endless_loader(dataset, num_workers=after, **kw), step, device.torch_device) as f_after:
        return compare_feeds(f_before, f_after, batches_per_call, name=name, before_label=workers(before),
                             after_label=workers(after), flops=flops_per_sample * n, items=n, device=device,
                             kind="demonstration", **timing)


def pipeline_mfu(run: RunResult) -> float | None:
    """MFU of a fed loop from its window throughput (FLOPs per item × items/s over the peak), not from the
    median call, which a bursty queue makes look faster than the loop runs; None without FLOPs or a peak."""
    rate = run.throughput
    if not (run.flops and run.items and run.peak_tflops and rate):
        return None
    return run.flops / run.items * rate / (run.peak_tflops * 1e12)


def paired_ratio(cmp: Comparison, confidence: float = 0.95) -> Estimate:
    """after's rate over before's for two fed loops timed in paired windows (`compare_feeds`): the pooled ratio of
    `cmp.estimate()`, with a Student-t `confidence` interval of the pairs' mean log ratio (widened to hold it).

    `cmp.estimate()`'s distribution-free interval needs six pairs to reach 95%: three pairs that happen to agree
    would decide a claim they cannot settle. From three pairs an honest 95% interval is ±4.30 standard errors."""
    pairs = window_pair_ratios(cmp.before, cmp.after)
    if len(pairs) < 2:
        raise ValueError(f"{cmp.name!r}: a t-interval needs at least two window pairs, got {len(pairs)}")
    value = cmp.estimate().value
    return Estimate(value, *log_t_interval(pairs, confidence, include=value))


def data_wait(run: RunResult) -> Estimate | None:
    """Seconds per batch the loop waited for data: the median over the timed windows, with their range."""
    waits = run.measurement.meta.get("data_wait_s_per_batch") or []
    if not waits:
        return None
    return Estimate(statistics.median(waits), min(waits), max(waits))


def share_of_best(rates: dict[Any, Estimate], key: Any) -> Estimate | None:
    """rates[key] over the best rate in the table (at most 1), with its interval: the best's own value is
    uncertain, so the interval runs from key's low over the highest high to key's high over the highest low."""
    if key not in rates or not rates:
        return None
    r = rates[key]
    best_v = max(e.value for e in rates.values())
    best_lo, best_hi = max(e.lo for e in rates.values()), max(e.hi for e in rates.values())
    value = r.value / best_v
    return Estimate(value, min(value, r.lo / best_hi), max(value, min(1.0, r.hi / best_lo)))


def knee_estimate(rates: dict[int, Estimate], fraction: float = 0.95) -> Estimate | None:
    """`knee` of the values, with an interval from the rates' spreads: from the fewest settings that could
    reach `fraction` of the best (high end >= fraction × the best low) to the fewest that surely do
    (low end >= fraction × the best high; the largest setting if none surely does)."""
    if not rates:
        return None
    value = knee({k: e.value for k, e in rates.items()}, fraction)
    best_lo, best_hi = max(e.lo for e in rates.values()), max(e.hi for e in rates.values())
    lo = min(k for k, e in rates.items() if e.hi >= fraction * best_lo)
    sure = [k for k, e in rates.items() if e.lo >= fraction * best_hi]
    hi = min(sure) if sure else max(rates)
    return Estimate(value, min(lo, value), max(hi, value))


def throughput_by_workers(rows: Sequence[dict[str, Any]], **match: Any) -> dict[int, float]:
    """From `tune_dataloader` rows: the best samples/s per worker count, among rows matching `match`
    (e.g. pin_memory=True)."""
    out: dict[int, float] = {}
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            out[r["num_workers"]] = max(out.get(r["num_workers"], 0.0), r["samples_per_s"])
    return dict(sorted(out.items()))

def knee(throughput: dict[int, float], fraction: float = 0.95) -> int | None:
    """The smallest setting that reaches `fraction` of the best throughput (the point past which more
    only adds a little); None for an empty table."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction} must be in (0, 1]")
    if not throughput:
        return None
    best = max(throughput.values())
    return min(k for k, v in throughput.items() if v >= fraction * best)
