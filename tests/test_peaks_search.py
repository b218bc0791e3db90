"""The peak search's logic, on a fake timer: which shapes it times, how it ranks them, what it reports."""
import pytest

from gpulab.measuring import peak_search as S
from gpulab.measuring import peaks as P


def fake_timer(rate_of, log=None):
    """A time_calls whose calls of shape s take FLOPs / rate_of(s) seconds each (TFLOP/s), a round counter apart."""
    def time_calls(shape, n):
        if log is not None:
            log.append((shape, n))
        return [S.shape_flops(shape) / (rate_of(shape) * 1e12)] * n
    return time_calls


def test_search_shapes_at_4096_is_mamf_finders_quick_range_plus_8192_cubed():
    shapes = S.search_shapes(4096)
    assert shapes[0] == (256, 4096, 4096) and shapes[-2] == (20224, 4096, 4096)
    assert len(shapes) == 79 + 1 and shapes[-1] == (8192, 8192, 8192)
    assert S.search_shapes(64, m_step=64, cube=False) == [(64, 64, 64), (128, 64, 64), (192, 64, 64), (256, 64, 64)]
    with pytest.raises(ValueError, match="size"):
        S.search_shapes(0)
    with pytest.raises(ValueError, match="m_step"):
        S.search_shapes(64, m_step=-1)


def test_search_finds_the_fastest_shape_and_reports_its_median_round_with_the_rounds_range():
    rates = {(256, 64, 64): 50.0, (512, 64, 64): 90.0, (768, 64, 64): 80.0, (128, 128, 128): 70.0}
    found = S.search_best_shape(fake_timer(rates.get), list(rates), shape_s=1e-3, round_s=1e-3, top=2, rounds=3)
    assert found.best == (512, 64, 64) and found.tflops == pytest.approx(90.0)
    assert set(found.rounds) == {(512, 64, 64), (768, 64, 64)}  # only the top two are timed again
    assert found.interval == pytest.approx((90.0, 90.0))
    assert [r[:3] for r in found.rows] == [list(s) for s in rates]
    assert [r[3] for r in found.rows] == pytest.approx(list(rates.values()))


def test_the_rounds_decide_not_the_one_quick_look():
    """A shape that read high once in the quick pass but lower in every round loses to the steady one."""
    seen = {}

    def rate_of(shape):
        seen[shape] = seen.get(shape, 0) + 1
        if shape == (256, 64, 64):
            return 100.0 if seen[shape] <= 2 else 60.0  # fast in its warm-up and quick pass only
        return 80.0

    found = S.search_best_shape(fake_timer(rate_of), [(256, 64, 64), (512, 64, 64)], shape_s=1e-3, round_s=1e-3,
                                top=2, rounds=4)
    assert found.rows[0][3] == pytest.approx(100.0)
    assert found.best == (512, 64, 64) and found.tflops == pytest.approx(80.0)


def test_interval_spans_the_spread_between_rounds():
    calls = iter(range(10_000))
    drift = {}

    def time_calls(shape, n):
        i = next(calls)
        rate = 100.0 if i < 2 else [90.0, 100.0, 95.0][drift.setdefault("r", 0) % 3]
        if i >= 2:
            drift["r"] += 1
        return [S.shape_flops(shape) / (rate * 1e12)] * n

    found = S.search_best_shape(time_calls, [(256, 64, 64)], shape_s=1e-3, round_s=1e-3, top=1, rounds=3)
    assert found.rounds[(256, 64, 64)] == pytest.approx([90.0, 100.0, 95.0])
    # the peak is the best round, as mamf-finder reports the best of its shapes' medians
    assert found.tflops == pytest.approx(100.0) and found.interval == pytest.approx((90.0, 100.0))


def test_calls_per_shape_fit_the_time_budget_within_bounds():
    log = []
    shapes = [(256, 64, 64), (512, 64, 64)]
    t_call = {s: S.shape_flops(s) / 1e12 for s in shapes}  # 1 TFLOP/s
    S.search_best_shape(fake_timer(lambda s: 1.0, log), shapes, shape_s=20 * t_call[(256, 64, 64)],
                        round_s=10 * t_call[(512, 64, 64)], top=1, rounds=2, warm_calls=3, min_calls=5,
                        max_calls=100)
    quick = [n for s, n in log[:4]]
    assert quick == [3, 20, 3, 10]          # warm-up, then shape_s worth of calls (10 for the twice-as-long shape)
    assert [n for _, n in log[4:]] == [20, 20]  # rounds: round_s worth of the chosen (first, equal-rate) shape
    log.clear()
    S.search_best_shape(fake_timer(lambda s: 1.0, log), shapes[:1], shape_s=1e-30, round_s=1e-30, top=1, rounds=1)
    assert [n for _, n in log] == [3, 5, 5]  # never below min_calls


def test_search_records_its_time_from_the_clock():
    ticks = iter([0.0, 7.0, 9.5])
    found = S.search_best_shape(fake_timer(lambda s: 1.0), [(64, 64, 64)], shape_s=1e-3, round_s=1e-3, top=1,
                                rounds=1, clock=lambda: next(ticks))
    assert found.search_s == 7.0 and found.rounds_s == 2.5


def test_median_interval_is_order_statistics_and_the_range_when_few():
    assert S.median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)
    lo, hi = S.median_interval([float(i) for i in range(100)])
    assert 38 <= lo < 49.5 < hi <= 61


def test_measure_peaks_records_the_search_on_a_cpu(cpu_device):
    p = P.measure_peaks(cpu_device, size=32, dtypes=("fp32",), refresh=True)
    assert p.shape["fp32"] in [r[:3] for r in p.search["fp32"]] and len(p.search["fp32"]) == 5
    assert p.interval["fp32"][0] <= p.tflops["fp32"] <= p.interval["fp32"][1]
    assert p.seconds["fp32"] >= 0 and "mamf-finder" in p.method
    assert p.shape_name("fp32") == "x".join(map(str, p.shape["fp32"]))
    assert P.MeasuredPeaks.from_dict(p.to_dict()).shape == p.shape
    with pytest.raises(ValueError, match="rounds"):
        P.measure_peaks(cpu_device, size=32, dtypes=("fp32",), rounds=0, refresh=True)


def test_a_cold_gpu_is_warmed_on_the_best_shape_until_its_rate_stops_climbing():
    """The rate climbs slowly, 700 -> 740, under 1% a window (clocks ramping on a cold GPU), then holds: the
    warm-up runs until 1.5 s pass with no 1% gain, and every round then reads the warm rate."""
    now = [0.0]
    ramp = iter([700.0, 705.0, 711.0, 717.0, 723.0, 729.0, 735.0, 740.0, 740.5, 739.5, 740.2])
    state = {"warm": False}
    timer = fake_timer(lambda s: next(ramp, 740.0) if state["warm"] else 700.0)  # cold in the quick pass

    def time_calls(shape, n):
        state["warm"] = state["warm"] or n == 7  # the warm-up's and rounds' windows: 7 calls here
        now[0] += 0.5
        return timer(shape, n)

    found = S.search_best_shape(time_calls, [(256, 64, 64)], shape_s=1e-3, round_s=1e-3, top=1, rounds=3,
                                round_calls=7, settle_s=60.0, clock=lambda: now[0])
    # each 1% gain moves the mark (700, 711, 723, 735); three windows (1.5 s) without one end it
    assert found.settle == pytest.approx([700.0, 705.0, 711.0, 717.0, 723.0, 729.0, 735.0, 740.0, 740.5, 739.5])
    assert found.rounds[(256, 64, 64)] == pytest.approx([740.0] * 3, rel=1e-3)


def test_the_warm_up_is_bounded_by_time():
    now = [0.0]
    rising = iter(range(100, 1000, 10))

    def time_calls(shape, n):
        now[0] += 1.0
        return fake_timer(lambda s: float(next(rising)))(shape, n)

    rates = S.settle(time_calls, (64, 64, 64), 5, max_s=4.0, clock=lambda: now[0])
    assert len(rates) == 4 and rates == sorted(rates)  # still climbing when the 4 s ran out
    assert S.search_best_shape(fake_timer(lambda s: 1.0), [(64, 64, 64)], shape_s=1e-3, round_s=1e-3, top=1,
                               rounds=1).settle == []  # settle_s=0: no warm-up


def test_a_round_is_one_batch_as_mamf_finder_times_a_shape_after_the_sweep_up_to_it():
    """Each round: the search's shapes before the first re-timed one, about lead_s of them (untimed), then each shape
    in the sweep's order, warm + timed calls in one batch with the warm ones dropped; a slow shape's round is cut to
    round_s, its warm calls in proportion."""
    log = []
    shapes = [(128, 64, 64), (256, 64, 64), (512, 64, 64), (768, 64, 64)]
    rate = {(128, 64, 64): 50.0, (256, 64, 64): 50.0, (512, 64, 64): 90.0, (768, 64, 64): 80.0}
    t_call = {s: S.shape_flops(s) / (rate[s] * 1e12) for s in shapes}
    found = S.search_best_shape(fake_timer(rate.get, log), shapes, shape_s=1e-3, round_s=40 * t_call[(768, 64, 64)],
                                top=2, rounds=2, warm_calls=0, round_calls=100, round_warm=50,
                                lead_s=100 * t_call[(256, 64, 64)])
    rounds = log[4:]
    # 75, 67 and 40 calls of 256, 512 and 768 fit in round_s (all under 100), warm calls half as many: 112 calls of
    # 256 (75 + 37) fill lead_s, so 128 is not replayed; then 512 and 768, in the sweep's order
    assert rounds == [((256, 64, 64), 75 + 37), ((512, 64, 64), 67 + 33), ((768, 64, 64), 40 + 20)] * 2
    assert found.best == (512, 64, 64) and found.tflops == pytest.approx(90.0)
    wide = []
    S.search_best_shape(fake_timer(rate.get, wide), shapes, shape_s=1e-3, round_s=1.0, top=1, rounds=1,
                        warm_calls=0, round_calls=100, round_warm=50, lead_s=1.0)
    # a fast shape: mamf-finder's 50 + 100; a long lead_s replays the sweep from its start
    assert wide[4:] == [((128, 64, 64), 150), ((256, 64, 64), 150), ((512, 64, 64), 150)]
    assert S.lead_in([], {}, {}, 1.0) == []  # the first shape of the sweep has nothing before it


def test_the_best_shape_is_the_one_with_the_best_round():
    """A shape whose rounds swing (one round at 95) beats a steadier one at 90: the peak is achievable, once."""
    seen = {}

    def rate_of(shape):
        seen[shape] = seen.get(shape, 0) + 1
        if shape == (256, 64, 64):
            return 95.0 if seen[shape] == 4 else 85.0  # warm-up, quick pass, then rounds: the 2nd round reads 95
        return 90.0

    found = S.search_best_shape(fake_timer(rate_of), [(256, 64, 64), (512, 64, 64)], shape_s=1e-3, round_s=1e-3,
                                top=2, rounds=3)
    assert found.best == (256, 64, 64) and found.tflops == pytest.approx(95.0)
    assert found.rounds[(512, 64, 64)] == pytest.approx([90.0] * 3)


def test_only_the_first_dtype_searched_is_warmed_up(monkeypatch, cpu_device):
    """The GPU stays warm from one dtype to the next: a second warm-up per dtype only costs the self-check time."""
    seen = []

    def fake_search(d, device, **opts):
        seen.append((d, opts))
        found = S.search_best_shape(fake_timer(lambda s: 1.0), [(64, 64, 64)], shape_s=1e-3, round_s=1e-3, top=1,
                                    rounds=1)
        return found, {}

    monkeypatch.setattr(P, "search_matmul_peak", fake_search)
    p = P.measure_peaks(cpu_device, size=32, dtypes=("fp32", "bf16"), warm_s=2.0, refresh=True)
    assert [(d, o["warm_s"], o["settle_s"]) for d, o in seen] == [("fp32", 2.0, 0.0), ("bf16", 0.0, 0.0)]
    assert p.settle == {"fp32": [], "bf16": []}
