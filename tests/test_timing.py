import pytest

from gpulab.timing import Measurement, benchmark, compare, quantiles


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
    s = compare(a, b)
    assert s.within_noise and s.verdict.startswith("within noise")
    fast = Measurement("fast", [0.5, 0.51, 0.49, 0.5])
    s2 = compare(a, fast)
    assert not s2.within_noise and s2.ratio == pytest.approx(2.0) and s2.verdict == "2.00x faster"
    assert compare(fast, a).verdict == "2.00x slower"


def test_measurement_round_trips_through_dict():
    m = Measurement("x", [0.1, 0.2, 0.3], timer="cuda events", warmup_calls=3)
    m2 = Measurement.from_dict(m.to_dict())
    assert m2 == m and m2.median == m.median


@pytest.mark.parametrize("kwargs, match", [
    ({"min_time_s": 0}, "min_time_s"), ({"min_time_s": -1}, "min_time_s"), ({"warmup_s": -1}, "warmup_s"),
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
        compare(1.0, 2.0)


def test_benchmark_runs_a_real_function_on_cpu():
    m = benchmark(lambda: sum(range(1000)), min_time_s=0.02)
    assert m.n >= 5 and m.median > 0
