"""Pipeline throughput of a fed training loop, on a fake clock with a bursty producer (no real time, no GPU)."""
from __future__ import annotations

import pytest
import torch

from gpulab.tools import feeds
from gpulab.measuring.estimates import ratio
from gpulab.measuring.estimates import Estimate
from gpulab.measuring.timing import benchmark
from gpulab.workloads import image_feeds


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class BurstyLoader:
    """k workers each loading one batch in `load_s`; at most k × prefetch_factor batches in flight (a new
    index is handed out each time a batch is taken, as DataLoader does). Batches of one round of workers
    arrive together: a burst every `load_s`, then nothing."""

    def __init__(self, clock: FakeClock, num_workers: int, load_s: float, prefetch_factor: int = 2):
        self.clock, self.num_workers, self.load_s, self.prefetch_factor = clock, num_workers, load_s, prefetch_factor
        self.ready: list[float] = []  # when batch i is ready
        self.taken: list[float] = []  # when batch i was taken

    def _ready_time(self, i: int) -> float:
        cap = self.num_workers * self.prefetch_factor
        dispatched = 0.0 if i < cap else self.taken[i - cap]  # its index goes out when batch i - cap is taken
        free = self.ready[i - self.num_workers] if i >= self.num_workers else 0.0  # its worker's last batch
        return max(dispatched, free) + self.load_s

    def __iter__(self):
        x, y = torch.ones(4, 2), torch.zeros(4, dtype=torch.long)
        while True:
            i = len(self.ready)
            self.ready.append(self._ready_time(i))
            self.clock.t = max(self.clock.t, self.ready[i])  # wait for it
            self.taken.append(self.clock.t)
            yield x, y


def _fed(clock, workers=8, load_s=0.1, step_s=0.002):
    def step(x, y):
        clock.t += step_s  # the GPU step: fast, so loading is the bottleneck

    return feeds.Feed(BurstyLoader(clock, workers, load_s), step, "cpu", clock=clock)


def test_median_call_overstates_a_bursty_pipeline_and_the_window_does_not():
    clock = FakeClock()
    feed = _fed(clock)  # 8 workers × 1 batch / 0.1 s = 80 batches/s at most; the step could take 500/s
    feed.settle()
    m = benchmark(lambda: feed.run(2), min_time_s=5.0, warmup_s=0, clock=clock)
    true_rate = 80.0
    median_rate = 2 / m.median
    window = m.window_rate(items_per_call=2)
    assert median_rate > 2 * true_rate  # 3 calls in 4 find a burst waiting: the median call is fast
    assert window.value == pytest.approx(true_rate, rel=0.05)


def test_settle_keeps_a_backlog_out_of_the_window():
    clock = FakeClock()
    feed = _fed(clock, workers=8, load_s=0.1)
    assert feed.queue_capacity == 16

    def short_window():  # a short interleaved round, as before_after's rounds are
        return benchmark(lambda: feed.run(2), min_time_s=0.02, warmup_s=0, clock=clock).window_rate(2).value

    feed.run(40)
    clock.t += 10.0  # idle while the other side of an experiment ran: 16 batches pile up
    backlog = short_window()
    feed.run(40)
    clock.t += 10.0
    feed.settle()
    settled = short_window()
    assert backlog > 3 * 80.0  # the window ran on batches loaded during the idle time
    assert settled == pytest.approx(80.0, rel=0.25)  # ten batches: a burst of eight more or less


def test_feed_counts_its_data_wait():
    clock = FakeClock()
    starved = _fed(clock, workers=1, load_s=0.05, step_s=0.01)  # a batch every 50 ms, a 10 ms step
    starved.settle()
    w0, b0 = starved.wait_s, starved.batches
    starved.run(20)
    assert (starved.wait_s - w0) / (starved.batches - b0) == pytest.approx(0.04, rel=0.01)  # 50 - 10 ms
    fed = _fed(clock, workers=8, load_s=0.05, step_s=0.01)  # 160 batches/s loaded, 100/s trained
    fed.settle()
    w0, b0 = fed.wait_s, fed.batches
    fed.run(40)
    assert (fed.wait_s - w0) / (fed.batches - b0) < 0.002


def test_compare_feeds_is_a_pipeline_comparison_on_cpu():
    batches = image_feeds.random_image_batches(2, 4, 8)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
    step = image_feeds.cnn_train_step(model, "cpu")
    with feeds.Feed(feeds.cycle(batches), step, "cpu") as a, feeds.Feed(feeds.cycle(batches), step, "cpu") as b:
        cmp = feeds.compare_feeds(a, b, 2, name="same loop twice", items=8, rounds=2, min_time_s=0.02,
                               kind="demonstration")
    assert cmp.kind == "demonstration" and cmp.before.pipeline and cmp.after.pipeline
    assert len(cmp.before.measurement.windows) == 3  # the main window and two rounds
    assert len(cmp.before.measurement.meta["data_wait_s_per_batch"]) == 3
    r = cmp.throughput_ratio()
    assert r.lo <= r.value <= r.hi and feeds.data_wait(cmp.after).value >= 0


def test_ratio_share_and_knee_estimates():
    e = Estimate
    assert ratio(e(10, 9, 11), e(5, 4, 5)).interval == pytest.approx((9 / 5, 11 / 4))
    assert ratio(None, e(1, 1, 1)) is None
    rates = {0: e(100, 95, 105), 4: e(300, 280, 320), 8: e(330, 300, 340), 16: e(320, 310, 335)}
    s = feeds.share_of_best(rates, 8)
    assert s.value == 1.0 and s.hi == 1.0 and s.lo == pytest.approx(300 / 340)
    k = feeds.knee_estimate(rates, 0.95)
    assert k.value == 8 and k.lo == 4 and k.hi == 16  # 4 could be within 5%; 16 surely is (310 >= 0.95 × 340)
    assert feeds.knee_estimate({}) is None and feeds.share_of_best(rates, 2) is None


def test_pipeline_mfu_uses_the_window_not_the_median_call():
    from gpulab.verdicts.run_result import RunResult
    from gpulab.measuring.measurement import Measurement

    # 4 calls: three fast (a burst was waiting), one slow; 4 calls of 10 items in 1.0 s of wall time
    m = Measurement("fed", [0.05, 0.05, 0.05, 0.85], windows=[(4, 1.0)])
    run = RunResult("fed", m, flops=10e12, items=10, peak_tflops=1000.0, pipeline=True)
    assert run.throughput == pytest.approx(40.0)  # items over the window
    assert feeds.pipeline_mfu(run) == pytest.approx(10e12 / 10 * 40 / 1e15)  # 4%
    assert run.mfu == pytest.approx(feeds.pipeline_mfu(run))  # a pipeline's core MFU uses the window too
    assert feeds.pipeline_mfu(RunResult("x", m)) is None


class _Queued:
    """An endless source with a DataLoader's queue attributes (num_workers × prefetch_factor batches ready)."""

    def __init__(self, batches, num_workers: int, prefetch_factor: int):
        self.batches, self.num_workers, self.prefetch_factor = batches, num_workers, prefetch_factor

    def __iter__(self):
        return feeds.cycle(self.batches)


def test_refill_time_is_the_queue_at_the_window_mean_rate():
    from gpulab.measuring.measurement import Measurement

    f = feeds.Feed(_Queued([None], 4, 2), lambda x, y: None, "cpu")
    m = Measurement("w", [0.1, 0.1, 0.4])  # 3 calls of 2 batches in 0.6 s: 10 batches/s (the median says 20)
    assert feeds.refill_s(f, m, 2) == pytest.approx(1.5 * 8 / 10)
    assert feeds.refill_s(f, Measurement("w", [10.0]), 2) == feeds.REFILL_MAX_S
    assert feeds.refill_s(feeds.Feed(feeds.cycle([None]), lambda x, y: None, "cpu"), m, 2) == 0.0  # no queue


def test_compare_feeds_lets_the_other_loader_refill_before_each_window(monkeypatch):
    slept = []
    monkeypatch.setattr(feeds, "_sleep", slept.append)
    batches = image_feeds.random_image_batches(2, 4, 8)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
    step = image_feeds.cnn_train_step(model, "cpu")
    with feeds.Feed(_Queued(batches, 2, 2), step, "cpu") as a, feeds.Feed(_Queued(batches, 2, 4), step, "cpu") as b:
        feeds.compare_feeds(a, b, 2, name="factor 2 -> 4", items=8, rounds=2, min_time_s=0.02)
    # main a | wait | main b | wait | a | wait | b ; b | wait | a: a wait at every switch of side, none between
    # two windows of the same side
    assert len(slept) == 4 and all(0 < s <= feeds.REFILL_MAX_S for s in slept)


def test_compare_feeds_stops_early_where_the_pairs_decide_or_the_budget_is_spent():
    batches = image_feeds.random_image_batches(2, 4, 8)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
    step = image_feeds.cnn_train_step(model, "cpu")
    asked, clock = [], FakeClock()

    def rounds_run(tick=False, **early):
        def now():
            clock.t += 1.0 if tick else 0.0  # ticking: every reading a second later
            return clock.t
        with feeds.Feed(feeds.cycle(batches), step, "cpu") as a, feeds.Feed(feeds.cycle(batches), step, "cpu") as b:
            cmp = feeds.compare_feeds(a, b, 1, name="same loop twice", items=4, rounds=6, min_time_s=0.01,
                                      window_s=0.002, clock=now, **early)
        return len(cmp.before.measurement.windows) - 1  # the interleaved rounds, less the main window

    assert rounds_run() == 6
    assert rounds_run(min_rounds=2, decided=lambda c: asked.append(c) or True) == 2 and len(asked) == 1
    assert rounds_run(min_rounds=2, decided=lambda c: False) == 6  # undecided, no budget: all the rounds
    assert rounds_run(min_rounds=2, decided=lambda c: False, budget_s=1.0) == 6  # a clock that stands still
    assert rounds_run(tick=True, min_rounds=2, decided=lambda c: False, budget_s=0.5) == 2  # budget spent
    assert rounds_run(tick=True, min_rounds=2, budget_s=100.0) == 6
