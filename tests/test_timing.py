import pytest

from gpulab.measuring.timing import benchmark
from gpulab.measuring.measurement import Measurement, compare, quantiles, speedup


class FakeClock:
    """A clock that advances only when the timed function says so."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_benchmark_with_fake_clock_gives_exact_statistics():
    clock = FakeClock()
    durations = iter([0.01] * 1000)

    def fn():
        clock.t += next(durations)

    m = benchmark(fn, min_time_s=0.1, warmup_s=0.02, clock=clock)
    assert m.timer == "perf_counter"
    assert m.warmup_calls == 2
    assert m.n == 10  # 0.1 s of timed runs at 10 ms each
    assert m.median == pytest.approx(0.01)
    assert m.iqr == pytest.approx(0.0)
    assert not m.noisy


def test_median_iqr_and_noise_flag():
    m = Measurement("x", [1.0, 2.0, 3.0, 4.0, 100.0])
    assert m.median == 3.0
    assert (m.q1, m.q3) == (2.0, 4.0)
    assert m.iqr == 2.0
    assert m.noisy  # IQR 2 > 10% of 3
    assert not Measurement("y", [1.0, 1.01, 1.02, 0.99]).noisy
    assert quantiles([5.0]) == (5.0, 5.0, 5.0)


def test_compare_says_within_noise_when_difference_is_inside_spread():
    a = Measurement("a", [1.0, 1.1, 0.9, 1.05, 0.95])
    b = Measurement("b", [1.02, 1.12, 0.92, 1.07, 0.97])
    s = speedup(a, b)
    assert s.within_noise and s.verdict.startswith("within noise")
    steady = Measurement("steady", [1.0, 1.01, 0.99, 1.0])
    fast = Measurement("fast", [0.5, 0.51, 0.49, 0.5])
    s2 = speedup(steady, fast)
    assert not s2.within_noise and s2.ratio == pytest.approx(2.0) and s2.verdict == "2.00x faster"
    assert speedup(fast, steady).verdict == "2.00x slower"
    with pytest.warns(DeprecationWarning, match="gl.speedup"):
        assert compare(fast, steady).verdict == "2.00x slower"  # the old name, for one release


def test_a_large_ratio_with_a_wide_spread_is_noisy_not_within_noise():
    # The CPU case that once printed "within noise (94.25x)": the sides' spreads do not overlap.
    slow = Measurement("slow", [0.05, 0.5, 0.94, 1.5, 3.0])
    quick = Measurement("quick", [0.0099, 0.01, 0.0101, 0.01])
    s = speedup(slow, quick)
    assert not s.within_noise and s.noisy and "noisy" in s.verdict and "94.0x faster" in s.verdict  # three significant figures
    lo, hi = s.estimate().interval
    assert lo < s.ratio < hi


def test_within_noise_needs_overlapping_spreads():
    a = Measurement("a", [1.0, 1.02, 0.98, 1.01, 0.99])
    b = Measurement("b", [0.97, 0.98, 0.96, 0.975])  # medians 2.5% apart, IQRs do not overlap
    assert not speedup(a, b).within_noise
    c = Measurement("c", [0.99, 1.0, 0.98, 1.01])
    assert speedup(a, c).within_noise


def test_speedup_interval_from_paired_rounds():
    b = Measurement("b", [1.0] * 5, meta={"round_medians": [1.0, 1.1, 0.9, 1.0]})
    a = Measurement("a", [0.5] * 5, meta={"round_medians": [0.5, 0.5, 0.5, 0.5]})
    s = speedup(b, a)
    assert s.estimate().interval == pytest.approx((1.8, 2.2))


def test_merged_measurement_is_a_new_value():
    m1 = Measurement("x", [1.0, 2.0, 3.0], windows=[(3, 6.0)])
    m2 = Measurement("x", [4.0, 5.0], windows=[(2, 9.0)])
    m = m1.merged(m2)
    assert m1.times_s == [1.0, 2.0, 3.0] and m1.median == 2.0  # unchanged
    assert m.times_s == [1.0, 2.0, 3.0, 4.0, 5.0] and m.median == 3.0 and m.round_medians == [2.0, 4.5]
    assert m.windows == [(3, 6.0), (2, 9.0)]


def test_pipeline_throughput_is_items_over_the_window_not_over_the_median_call():
    # A bursty producer: 3 of 4 batches are ready at once (1 ms), every 4th waits 100 ms for a worker.
    clock = {"t": 0.0}
    calls = {"n": 0}

    def fake_clock():
        return clock["t"]

    def next_batch():
        calls["n"] += 1
        clock["t"] += 0.100 if calls["n"] % 4 == 0 else 0.001

    m = benchmark(next_batch, min_time_s=2.0, warmup_s=0, min_repeats=40, max_repeats=400, clock=fake_clock)
    per_median = 1 / m.median                    # 1000 batches/s: what the median call suggests
    rate = m.window_rate(1.0)
    assert per_median == pytest.approx(1000, rel=0.01)
    assert rate.value == pytest.approx(4 / 0.103, rel=0.05)  # about 39 batches/s: what the pipeline delivers


def test_measurement_round_trips_through_dict():
    m = Measurement("x", [0.1, 0.2, 0.3], timer="cuda events", warmup_calls=3)
    m2 = Measurement.from_dict(m.to_dict())
    assert m2 == m and m2.median == m.median


@pytest.mark.parametrize("kwargs, match", [
    ({"min_time_s": 0}, "min_time_s"), ({"min_time_s": -1}, "min_time_s"), ({"warmup_s": -1}, "warmup_s"),
    ({"min_time_s": float("nan")}, "min_time_s"), ({"min_time_s": float("inf")}, "min_time_s"),
    ({"warmup_s": float("nan")}, "warmup_s"),
    ({"min_repeats": 0}, "min_repeats"), ({"min_repeats": 5, "max_repeats": 2}, "max_repeats")])
def test_benchmark_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        benchmark(lambda: None, **kwargs)


def test_benchmark_rejects_non_callable_and_empty_measurement():
    with pytest.raises(ValueError, match="fn must be callable"):
        benchmark(3)
    with pytest.raises(ValueError, match="times_s"):
        Measurement("x", [])
    with pytest.raises(ValueError, match="before and after"):
        speedup(1.0, 2.0)


def test_benchmark_runs_a_real_function_on_cpu():
    m = benchmark(lambda: sum(range(1000)), min_time_s=0.02)
    assert m.n >= 5 and m.median > 0


def test_median_estimate_narrows_with_more_timings():
    """The median's confidence interval lies inside the quartiles and narrows as timings are added."""
    few = Measurement("few", [1.0, 1.1, 0.9, 1.2, 0.8, 1.05, 0.95, 1.15, 0.85, 1.0, 1.02, 0.98])
    many = Measurement("many", few.times_s * 8)
    e_few, e_many = few.median_estimate(), many.median_estimate()
    assert e_few.lo <= few.median <= e_few.hi
    assert many.q1 <= e_many.lo and e_many.hi <= many.q3  # with many timings, inside the quartiles
    assert e_many.hi - e_many.lo <= e_few.hi - e_few.lo


def test_a_round_of_a_slow_warm_function_runs_four_calls_not_seven():
    from gpulab.measuring.timing import ROUND

    clock, calls = FakeClock(), []

    def step():  # a 0.6 s training step, timed in a 0.5 s round
        calls.append(1)
        clock.t += 0.6

    m = benchmark(step, min_time_s=0.5, clock=clock, **ROUND)
    assert (m.warmup_calls, m.n, len(calls)) == (1, 3, 4)
    calls.clear()
    assert benchmark(step, min_time_s=0.5, warmup_s=0, clock=clock).n == 5 and len(calls) == 7  # the default


def test_max_time_s_ends_a_window_that_a_fast_warm_up_sized_too_long():
    """A queue-fed call: the warm-up draws ready batches (1 ms), then each call waits for the loader (100 ms)."""
    clock = FakeClock()
    ready = iter([0.001] * 2)

    def fed():
        clock.t += next(ready, 0.1)

    m = benchmark(fed, min_time_s=0.5, warmup_s=0.0, clock=clock, max_time_s=1.0)
    assert m.n == 10 and m.windows[0] == (10, pytest.approx(1.0))  # not 500 calls: 50 s for a 0.5 s window
    clock.t, ready = 0.0, iter([0.001] * 2)
    assert benchmark(fed, min_time_s=0.5, warmup_s=0.0, clock=clock, max_time_s=0.01).n == 5  # min_repeats first
    with pytest.raises(ValueError, match="max_time_s"):
        benchmark(fed, max_time_s=0)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_min_warmup_calls_is_checked(bad):
    with pytest.raises(ValueError, match="min_warmup_calls"):
        benchmark(lambda: None, min_warmup_calls=bad)


def test_a_gpu_warm_up_of_a_slow_op_does_not_queue_a_thousand_calls():
    """On a GPU a call only queues work: the warm-up checks the clock after a synchronize, in doubling batches,
    so a 20 ms op warms up for about 0.1-0.2 s, not the thousand calls a host-clock loop would queue."""
    from gpulab.measuring.timing import _warm_up

    clock, queued, launched = FakeClock(), [], []

    def op():  # 20 ms of GPU work, 50 µs to launch
        launched.append(1)
        queued.append(0.02)
        clock.t += 50e-6

    def sync():
        clock.t += sum(queued)
        queued.clear()

    warm, last, host_s, wall_s = _warm_up(op, sync, clock, clock(), min_calls=2, warmup_s=0.1, max_calls=10_000,
                                          batched=True)
    assert warm == len(launched) == 8 and 0.1 <= clock.t < 0.2  # batches of 2, 2, 4
    assert last == 4 and host_s == pytest.approx(4 * 50e-6) and wall_s == pytest.approx(4 * (50e-6 + 0.02))
    assert _warm_up(op, sync, clock, clock(), min_calls=1, warmup_s=0.0, max_calls=10_000, batched=True)[0] == 1


def _fake_gpu(launch_s: float, kernel_s: float):
    """A fake clock, op and synchronize for a GPU whose kernels take `kernel_s` and cost the host `launch_s` each:
    the device runs a kernel once it is launched and the previous one is done."""
    clock = FakeClock()
    state = {"device_free_at": 0.0}

    def op():
        clock.t += launch_s
        state["device_free_at"] = max(state["device_free_at"], clock.t) + kernel_s

    def sync():
        clock.t = max(clock.t, state["device_free_at"])
    return clock, op, sync


def test_the_warm_up_tells_a_launch_bound_call_from_a_device_bound_one():
    from gpulab.measuring.timing import _warm_up, launch_bound

    for launch_s, kernel_s, bound in ((8e-6, 2e-6, True), (10e-6, 1.4e-3, False)):
        clock, op, sync = _fake_gpu(launch_s, kernel_s)
        warm, last, host_s, wall_s = _warm_up(op, sync, clock, clock(), min_calls=2, warmup_s=0.01,
                                              max_calls=100_000, batched=True)
        assert launch_bound(host_s / last, wall_s / last, on_device=True) is bound


def test_a_single_warm_up_call_is_not_enough_to_decide():
    """One launch-bound call plus a synchronize's own 20 µs looks device-bound; 16 back-to-back calls do not."""
    from gpulab.measuring.timing import _probe, launch_bound

    clock, op, sync = _fake_gpu(8e-6, 2e-6)
    slow_sync = lambda: (sync(), setattr(clock, "t", clock.t + 20e-6))  # noqa: E731
    b0 = clock()
    op()
    issued = clock()
    slow_sync()
    assert not launch_bound(issued - b0, clock() - b0, on_device=True)
    n, host_s, wall_s = _probe(op, slow_sync, clock)
    assert n == 16 and launch_bound(host_s / n, wall_s / n, on_device=True)


def test_launch_bound_rule():
    from gpulab.measuring.timing import launch_bound

    assert launch_bound(9e-6, 10e-6, on_device=True)  # the host paces the device
    assert launch_bound(5e-6, 10e-6, on_device=True)  # half of it: the boundary counts as launch-bound
    assert not launch_bound(10e-6, 1.4e-3, on_device=True)  # a large matmul: the device paces
    assert not launch_bound(75e-3, 75e-3, on_device=True)  # eight steps with a sync each: long, timed per call
    assert launch_bound(2e-6, 2e-6, on_device=False)  # CPU: a 2 µs call, where a clock read per call shows
    assert not launch_bound(1e-3, 1e-3, on_device=False)


def test_auto_times_a_fast_call_as_throughput_and_says_so():
    clock = FakeClock()

    def fast():
        clock.t += 2e-6

    m = benchmark(fast, min_time_s=0.01, warmup_s=0.001, clock=clock)
    assert m.mode == "throughput" and m.calls_per_timing > 1 and m.meta["launch_bound"] is True
    assert m.median == pytest.approx(2e-6) and m.n >= 5
    assert m.method == f"throughput: 1 clock pair around {m.calls_per_timing} calls"
    assert m.method in repr(m) and m.method in m._repr_html_()
    assert sum(n for n, _ in m.windows) == m.n * m.calls_per_timing  # the window counts every call
    d = m.to_dict()
    assert d["mode"] == "throughput" and d["summary"]["method"] == m.method
    back = type(m).from_dict(d)
    assert (back.mode, back.calls_per_timing) == (m.mode, m.calls_per_timing)


def test_auto_times_a_slow_call_per_call_and_each_mode_can_be_forced():
    clock = FakeClock()

    def slow():
        clock.t += 0.01

    m = benchmark(slow, min_time_s=0.1, warmup_s=0.02, clock=clock)
    assert m.mode == "latency" and m.calls_per_timing == 1 and m.n == 10
    assert m.method == "latency: clock around each call"
    t = benchmark(slow, min_time_s=0.1, warmup_s=0.02, clock=clock, mode="throughput", min_repeats=5)
    assert t.mode == "throughput" and t.n >= 5 and t.median == pytest.approx(0.01)
    assert t.meta["mode_asked"] == "throughput"

    def fast():
        clock.t += 2e-6

    lat = benchmark(fast, min_time_s=0.01, warmup_s=0.001, clock=clock, mode="latency", max_repeats=20_000)
    assert lat.mode == "latency" and lat.calls_per_timing == 1 and lat.median == pytest.approx(2e-6)


def test_throughput_blocks_respect_min_repeats_and_max_repeats():
    clock = FakeClock()

    def fast():
        clock.t += 1e-6

    m = benchmark(fast, min_time_s=1.0, warmup_s=0.0, clock=clock, mode="throughput", max_repeats=1000,
                  min_repeats=5)
    assert m.n * m.calls_per_timing <= 1000 and m.n >= 5
    few = benchmark(fast, min_time_s=1e-5, warmup_s=0.0, clock=clock, mode="throughput", min_repeats=3)
    assert few.n >= 3 and few.calls_per_timing >= 1


def test_bad_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="mode='fast'.*'auto', 'latency', 'throughput'"):
        benchmark(lambda: None, mode="fast")
    with pytest.raises(ValueError, match="calls_per_timing"):
        Measurement("x", [1.0], calls_per_timing=0)


def test_merging_two_modes_says_mixed():
    a = Measurement("a", [1.0, 1.1], mode="throughput", calls_per_timing=100)
    b = Measurement("a", [1.0, 1.2])
    m = a.merged(b)
    assert m.mode == "mixed" and len(m.meta["modes"]) == 2
    same = a.merged(Measurement("a", [0.9], mode="throughput", calls_per_timing=100))
    assert same.mode == "throughput" and same.calls_per_timing == 100
    sized = a.merged(Measurement("a", [0.9], mode="throughput", calls_per_timing=120))  # rounds sized apart
    assert sized.mode == "throughput" and sized.method == "throughput: 1 clock pair around 100-120 calls"
    assert m.method.startswith("mixed")
