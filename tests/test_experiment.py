import functools
import json

import pytest
import torch

import gpulab as gl
from gpulab.verdicts import experiment
from gpulab.measuring import timing
from gpulab.verdicts.experiment import Claim, Comparison
from gpulab.verdicts.run_result import RunResult
from gpulab.measuring.timing import time_calls
from gpulab.measuring.measurement import Measurement


def _run(label, times, flops=None, peak=None):
    return RunResult(label, Measurement(label, times), flops=flops, dtype="bf16" if peak else None, peak_tflops=peak)


def test_claim_verdict_comes_out_either_way():
    c = Claim("BF16 is 2-3x faster", low=2, high=3, source="guide §7.1")
    assert c.check(2.5).verdict == "confirmed"
    assert Claim("BF16 is 2-3x faster", low=2, high=3).check(1.4).verdict == "refuted"
    assert Claim("at least 45% MFU", low=45, unit="%").check(44.9).verdict == "refuted"
    assert Claim("idle under 10%", high=10, unit="%").check(2).verdict == "confirmed"
    u = Claim("FP8 4x FP16", low=3.5, high=4.5).untestable("no FP8 tensor cores")
    assert u.verdict == "not tested" and u.note == "no FP8 tensor cores" and u.measured is None
    assert Claim("x", low=1).check(None).verdict == "not tested"
    assert Claim("x", low=2, high=3).expected == "2–3x"


def test_claim_rejects_empty_or_inverted_range():
    with pytest.raises(ValueError, match="low and/or high"):
        Claim("nothing")
    with pytest.raises(ValueError, match="low=3"):
        Claim("inverted", low=3, high=2)


def test_comparison_mfu_speedup_and_round_trip():
    before = _run("fp32", [0.02, 0.021, 0.019], flops=1e12, peak=989.4)
    after = _run("bf16", [0.004, 0.0041, 0.0039], flops=1e12, peak=989.4)
    cmp = Comparison("autocast", before, after, device="test")
    assert cmp.speedup == pytest.approx(5.0) and not cmp.within_noise
    assert after.mfu == pytest.approx(1e12 / 0.004 / 989.4e12)
    back = Comparison.from_dict(json.loads(json.dumps(cmp.to_dict())))
    assert back.speedup == pytest.approx(cmp.speedup) and back.after.mfu == pytest.approx(after.mfu)
    html = cmp._repr_html_()
    assert "MFU (datasheet BF16 peak)" in html and "5.00x faster" in html
    slower = Comparison("accumulated", after, before, device="test")._repr_html_()  # 06 read "1.14x slower
    assert "5.00x slower" in slower and "interval 4.81x–5.19x" in slower          # (interval 0.823x–0.887x)"


def test_before_after_on_cpu_records_timing_flops_and_cpu_monitor(cpu_device):
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    cmp = gl.before_after(lambda: a @ b, lambda: (a @ b) @ b, name="one vs two matmuls", flops=2 * 64**3,
                          after_flops=4 * 64**3, dtype="fp32", min_time_s=0.05, device=cpu_device)
    assert cmp.before.measurement.n >= 5 and cmp.after.tflops > 0
    assert cmp.before.mfu is None  # a CPU has no datasheet peak
    assert cmp.before.trace.available["cpu_percent"] == "ok"
    assert "GPU busy" not in repr(cmp)  # no NVML row when nothing was measured


@pytest.mark.parametrize("kwargs, match", [
    ({"name": ""}, "name"), ({"name": "x", "flops": -1}, "flops"), ({"name": "x", "dtype": "int8"}, "dtype"),
    ({"name": "x", "items": 0}, "items")])
def test_before_after_rejects_bad_input_before_running(kwargs, match):
    calls = []
    with pytest.raises(ValueError, match=match):
        gl.before_after(lambda: calls.append(1), lambda: calls.append(2), **kwargs)
    assert not calls  # checked before any work starts


def test_a_pipeline_comparison_takes_its_speed_from_the_windows():
    """Two fed loops: the median call says 10x, the windows' wall time says 2x; the windows win."""
    def side(label, times, windows):
        return RunResult(label, Measurement(label, times, windows=windows), items=32, pipeline=True)

    before = side("0 workers", [0.010] * 8, [(8, 0.8), (8, 0.82), (8, 0.78)])     # 0.1 s per batch by wall
    after = side("4 workers", [0.001] * 8, [(8, 0.4), (8, 0.41), (8, 0.39)])      # bursty: 1 ms median call
    cmp = Comparison("workers", before, after)
    assert cmp.speedup == pytest.approx(2.0, rel=0.02)
    lo, hi = cmp.estimate().interval
    assert lo <= 2.0 <= hi and hi - lo < 0.2 and not cmp.within_noise
    assert after.throughput == pytest.approx(32 / (1.2 / 24), rel=0.01)
    assert after.seconds == pytest.approx(1.2 / 24)


@pytest.fixture
def fake_clock(monkeypatch):
    """The harness timed on a clock that advances only when a timed function says so (no wall time, no load)."""
    from test_timing import FakeClock

    clock = FakeClock()
    monkeypatch.setattr(experiment, "benchmark", functools.partial(timing.benchmark, clock=clock))
    monkeypatch.setattr(experiment, "time_calls", functools.partial(timing.time_calls, clock=clock))
    return clock


def test_before_after_rounds_last_round_s_each(cpu_device, fake_clock):
    """`round_s` sets each side's seconds per interleaved round (a big matmul needs whole seconds to settle)."""
    def before():
        fake_clock.t += 2**-10  # about 1 ms; powers of two add up exactly

    def after():
        fake_clock.t += 2**-11

    cmp = gl.before_after(before, after, name="steps", min_time_s=2**-5, rounds=2, round_s=2**-3, monitor=False,
                          device=cpu_device)
    assert cmp.before.measurement.meta["interleaved_rounds"] == 2
    for run, calls_per_round in ((cmp.before, 128), (cmp.after, 256)):
        # each round lasts round_s (0.125 s), not min_time_s / 4 (8 ms, 8 calls of before)
        assert run.measurement.windows[-2:] == [(calls_per_round, 2**-3)] * 2
    assert cmp.speedup == pytest.approx(2.0)
    calls = []
    with pytest.raises(ValueError, match="round_s"):
        gl.before_after(lambda: calls.append(1), lambda: calls.append(2), name="x", round_s=float("nan"))
    assert not calls


def test_round_calls_pairs_neighbouring_calls(cpu_device):
    """`round_calls=1` times one call per side and round, with no warm-up call, alternating which side goes first
    (before, after, after, before, ...): each pair of round medians is two neighbouring calls."""
    order = []
    cmp = gl.before_after(lambda: order.append("b"), lambda: order.append("a"), name="calls", min_time_s=0.01,
                          rounds=4, round_calls=1, monitor=False, device=cpu_device)
    assert order[-8:] == ["b", "a", "a", "b", "b", "a", "a", "b"]  # the rounds: no untimed call between them
    for run in (cmp.before, cmp.after):
        m = run.measurement
        assert [n for n, _ in m.windows[-4:]] == [1, 1, 1, 1] and len(m.meta["round_medians"]) == 5
        assert m.meta["round_medians"][1:] == m.times_s[-4:]


def test_time_calls_times_exactly_its_calls():
    ticks = iter(range(100))
    m = time_calls(lambda: None, 3, label="three", clock=lambda: float(next(ticks)))
    assert m.n == 3 and m.warmup_calls == 0 and m.windows == [(3, 7.0)] and m.label == "three"
    with pytest.raises(ValueError, match="calls=0"):
        time_calls(lambda: None, 0)


@pytest.mark.parametrize("kwargs, match", [(dict(round_calls=0), "round_calls=0"),
                                           (dict(round_calls=1.5), "round_calls=1.5"),
                                           (dict(round_calls=2, round_s=0.1), "give one of them")])
def test_round_calls_rejects_bad_input_before_running(kwargs, match):
    calls = []
    with pytest.raises(ValueError, match=match):
        gl.before_after(lambda: calls.append(1), lambda: calls.append(2), name="x", **kwargs)
    assert not calls


def _paired(label, times, rounds, items=None, dtype=None, peak=None, flops=None):
    m = Measurement(label, times, meta={"round_medians": rounds})
    return RunResult(label, m, items=items, item_name="tokens", dtype=dtype, peak_tflops=peak, flops=flops)


def test_unequal_work_leads_with_the_items_per_second_ratio():
    """Batch 4 -> 16: the time per call is about the same, tokens/s rose about 4x: the headline says so."""
    before = _paired("batch 4", [0.100, 0.101, 0.099] * 3, [0.100, 0.101, 0.099], items=4 * 1024)
    after = _paired("batch 16", [0.103, 0.104, 0.102] * 3, [0.103, 0.104, 0.102], items=16 * 1024)
    cmp = Comparison("batch 4 -> 16", before, after)
    assert cmp.work_differs and cmp.basis == "items/s"
    h = cmp.headline()
    assert h.value == pytest.approx(4 * 0.100 / 0.103) and h.lo > 3.5 and h.hi < 4.5
    assert not cmp.within_noise
    assert cmp.verdict.startswith("tokens/s 3.88x higher") and "within noise" not in cmp.verdict
    d = cmp.to_dict()
    assert d["ratio"] == pytest.approx(h.value) and d["ratio_basis"] == "items/s"
    assert Comparison.from_dict(json.loads(json.dumps(d))).verdict == cmp.verdict


def test_within_noise_only_when_the_interval_holds_one():
    """Overlapping quartiles, but every paired round is 1.01-1.08x faster: that is not 'within noise'."""
    before = _paired("a", [0.95, 1.00, 1.04, 1.06, 1.10], [1.010, 1.040, 1.080, 1.050, 1.030])
    after = _paired("b", [0.92, 0.96, 1.00, 1.02, 1.06], [1.000, 1.000, 1.000, 1.000, 1.000])
    cmp = Comparison("x", before, after)
    lo, hi = cmp.headline().interval
    assert lo > 1 and not cmp.within_noise and "faster" in cmp.verdict and "within noise" not in cmp.verdict
    same = Comparison("y", _paired("a", [1.0, 1.01, 0.99], [1.0, 0.98, 1.02]),
                      _paired("b", [1.0, 1.01, 0.99], [1.0, 1.02, 0.98]))
    assert same.within_noise and same.verdict.startswith("within noise")


def test_mfu_of_two_dtypes_puts_each_side_against_its_own_peak(cpu_device, monkeypatch):
    """FP32 -> BF16: each side against its own dtype's peak, and the table says so; one peak for both only when
    asked for (`peak_dtype`, where the text says why)."""
    peaks = {"fp32": 67.0, "bf16": 989.4}
    monkeypatch.setattr(type(cpu_device), "datasheet_tflops", lambda self, d: peaks.get(d))
    a = torch.randn(32, 32)
    cmp = gl.before_after(lambda: a @ a, lambda: a @ a, name="fp32 -> bf16", flops=2 * 32**3, dtype="fp32",
                          after_dtype="bf16", min_time_s=0.02, rounds=0, monitor=False, device=cpu_device)
    assert (cmp.before.peak_tflops, cmp.after.peak_tflops) == (67.0, 989.4)
    assert cmp.before.mfu == pytest.approx(2 * 32**3 / cmp.before.seconds / 67e12)
    assert "MFU (datasheet peak of each side's dtype)" in dict((k, 0) for k, _, _ in cmp.rows())
    one = gl.before_after(lambda: a @ a, lambda: a @ a, name="fp32 -> bf16", flops=2 * 32**3, dtype="fp32",
                          after_dtype="bf16", peak_dtype="bf16", min_time_s=0.02, rounds=0, monitor=False,
                          device=cpu_device)
    assert one.before.peak_tflops == one.after.peak_tflops == 989.4
    assert "MFU (datasheet BF16 peak, both sides)" in dict((k, 0) for k, _, _ in one.rows())


def test_measure_of_a_warm_function_skips_the_extra_first_call(cpu_device, fake_clock):
    calls = {"cold": 0, "warm": 0}
    for kind in calls:
        def fn(kind=kind):
            calls[kind] += 1
            fake_clock.t += 0.06  # longer than the default 0.1 s warm-up over two calls

        run = gl.measure(fn, min_time_s=0.001, monitor=False, device=cpu_device, warm=kind == "warm")
        assert run.measurement.n == 5  # the timed window is the same either way
    # cold: one call before the window, two warm-up calls, five timed; warm (the caller ran it): one warm-up
    assert calls == {"cold": 8, "warm": 6}


def test_mfu_of_a_measured_peak_warns_only_beyond_its_own_noise():
    import warnings
    near = RunResult("a", Measurement("a", [1.0]), flops=101e12, measured_peak_tflops=100.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 1% above a measured peak is the peak's own noise: no warning
        assert near.mfu_measured_peak == pytest.approx(1.01)
    far = RunResult("b", Measurement("b", [1.0]), flops=120e12, measured_peak_tflops=100.0)
    with pytest.warns(UserWarning, match="above the measured peak"):
        assert far.mfu_measured_peak == pytest.approx(1.2)


def test_before_after_shows_a_bar_over_its_rounds(cpu_device, capsys):
    """A reader waits through the interleaved rounds: a progress bar names the comparison, unless turned off."""
    kw = dict(min_time_s=0.01, rounds=2, monitor=False, device=cpu_device)
    gl.before_after(lambda: None, lambda: None, name="two no-ops", **kw)
    assert "two no-ops: interleaved rounds" in capsys.readouterr().err
    gl.before_after(lambda: None, lambda: None, name="quiet no-ops", progress=False, **kw)
    assert "quiet no-ops" not in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, match", [
    (dict(low="2"), "low='2' must be a finite number"), (dict(high=b"3"), "high=b'3'"),
    (dict(low=3, high=2), "low=3 must be <= high=2"), (dict(low=float("inf")), "low=inf")])
def test_a_claim_with_a_bad_band_fails_where_it_is_written_naming_it(kwargs, match):
    """Not at `check`, cells later: the band is refused as the Claim is made, with the claim's text and the bound."""
    with pytest.raises(ValueError, match=match) as e:
        Claim("BF16 is 2-3x faster", **kwargs)
    assert "BF16 is 2-3x faster" in str(e.value)


def test_unequal_flops_without_items_lead_with_the_flops_ratio():
    """One matmul -> two, no items: the time per call is about the same, FLOP/s doubled; not 'within noise'."""
    before = _paired("one matmul", [0.100, 0.101, 0.099] * 3, [0.100, 0.101, 0.099], flops=1e9)
    after = _paired("two matmuls", [0.101, 0.102, 0.100] * 3, [0.101, 0.102, 0.100], flops=2e9)
    cmp = Comparison("one -> two", before, after)
    assert cmp.work_differs and cmp.basis == "FLOP/s" and not cmp.within_noise
    assert cmp.headline().value == pytest.approx(2 * 0.100 / 0.101)
    assert cmp.verdict.startswith("FLOP/s 1.98x higher") and "FLOP/s ratio" in cmp._repr_html_()
    d = cmp.to_dict()
    assert d["ratio_basis"] == "FLOP/s" and d["ratio"] == pytest.approx(cmp.headline().value)
    assert Comparison.from_dict(json.loads(json.dumps(d))).verdict == cmp.verdict
    # items, where given, stay the basis; equal FLOPs stay a time comparison
    with_items = Comparison("x", _paired("a", [0.1] * 3, [0.1], items=8, flops=1e9),
                            _paired("b", [0.1] * 3, [0.1], items=8, flops=2e9))
    assert with_items.basis == "time"
    same = Comparison("y", _paired("a", [0.1] * 3, [0.1], flops=1e9), _paired("b", [0.1] * 3, [0.1], flops=1e9))
    assert same.basis == "time" and same.verdict.startswith("within noise")
