"""gpulab.workloads.sampling (NVML readings with intervals, bursts of known busy time), and the small helpers of 01 and 02."""
import pytest

from gpulab.measuring import estimates
from gpulab.workloads import sampling, training
from gpulab.lessons import measuring as M
from gpulab.lessons import tensor_cores as TC
from gpulab.measuring.estimates import Estimate
from gpulab.measuring.device import DeviceInfo
from gpulab.verdicts.experiment import Comparison
from gpulab.verdicts.run_result import RunResult
from gpulab.measuring.monitor import Trace
from gpulab.measuring.measurement import Measurement

CPU = DeviceInfo(kind="cpu", name="test cpu")


def test_samples_estimate_is_the_mean_within_the_quartiles():
    tr = Trace(series={"nvml_util": [(0.1, 100.0), (0.2, 100.0), (0.3, 100.0), (0.4, 0.0)]})
    est = sampling.samples_estimate(tr, "nvml_util")
    assert est.value == pytest.approx(75.0)
    assert est.lo <= est.value <= est.hi and est.hi == 100.0
    assert sampling.samples_estimate(tr, "gpm_sm_active") is None
    assert sampling.samples_estimate(None, "nvml_util") is None


def test_gpm_estimate_takes_the_window_value_and_the_per_second_range():
    tr = Trace(series={"gpm_tensor_active": [(0.5, 70.0), (1.5, 90.0)]}, window={"gpm_tensor_active": 80.0})
    assert sampling.gpm_estimate(tr, "gpm_tensor_active") == Estimate(80.0, 70.0, 90.0)
    only_samples = Trace(series={"gpm_tensor_active": [(0.5, 60.0), (1.5, 60.0)]})
    assert sampling.gpm_estimate(only_samples, "gpm_tensor_active").value == 60.0
    assert sampling.gpm_estimate(Trace(), "gpm_tensor_active") is None


def test_gpm_estimate_steady_drops_the_edge_readings():
    """A sustained claim reads the steady state: the start-up and the partial last second do not count."""
    series = [(0.5, 40.0), (1.5, 86.0), (2.5, 85.0), (3.5, 87.0), (4.5, 86.0), (5.2, 95.0)]
    tr = Trace(series={"gpm_tensor_active": series}, window={"gpm_tensor_active": 80.0})
    assert sampling.gpm_estimate(tr, "gpm_tensor_active") == Estimate(80.0, 40.0, 95.0)
    assert sampling.gpm_estimate(tr, "gpm_tensor_active", steady=True) == Estimate(86.0, 85.0, 87.0)
    short = Trace(series={"gpm_tensor_active": series[:3]}, window={"gpm_tensor_active": 70.0})
    assert sampling.gpm_estimate(short, "gpm_tensor_active", steady=True) == Estimate(70.0, 40.0, 86.0)  # too few to drop


def test_ratio_and_difference_take_the_extreme_ends():
    a, b = Estimate(10, 9, 11), Estimate(2, 1, 4)
    assert estimates.ratio(a, b) == Estimate(5, 9 / 4, 11)
    assert estimates.difference(a, b) == Estimate(8, 5, 10)
    assert estimates.ratio(a, Estimate(0, 0, 1)) is None  # a denominator whose interval reaches zero


def _run(times, flops):
    return RunResult(label="x", measurement=Measurement("x", times), flops=flops)


def test_mfu_estimate_maps_the_timing_quartiles():
    run = _run([1.0, 1.0, 2.0, 2.0, 2.0], flops=100e12)  # 100 TFLOP per call
    est = M.mfu_estimate(run, peak_tflops=100)
    assert est.value == pytest.approx(50.0)  # median 2 s: 50 TFLOP/s of 100
    assert est.lo == pytest.approx(50.0) and est.hi == pytest.approx(100.0)  # q3 2 s, q1 1 s
    assert M.mfu_estimate(run, None) is None


def test_tflops_ratio_scales_the_speedup_by_the_flop_ratio():
    before, after = _run([2.0] * 5, flops=90.0), _run([1.0] * 5, flops=100.0)
    cmp = Comparison(name="align", before=before, after=after)
    est = TC.tflops_ratio(cmp)
    assert est.value == pytest.approx(2.0 * 100 / 90)
    assert est.value == pytest.approx(after.tflops / before.tflops)
    with pytest.raises(ValueError, match="flops"):
        TC.tflops_ratio(Comparison(name="x", before=_run([1.0], None), after=after))


def test_sample_period_from_the_spacing_of_nvml_samples():
    tr = Trace(series={"nvml_util": [(i / 6, 50.0) for i in range(10)]})
    est = sampling.sample_period([tr, None])
    assert est.value == pytest.approx(1 / 6)
    assert sampling.sample_period([Trace()]) is None


def test_burst_periods_pair_each_sample_with_the_true_busy_share():
    busy = [(0.0, 0.01), (0.05, 0.06), (0.10, 0.11), (0.15, 0.16)]  # 10 ms of every 50 ms: 20% busy
    samples = [(0.0, 0.0), (0.1, 25.0), (0.2, 0.0), (0.3, 100.0)]
    periods = sampling.burst_periods(samples, busy, start=0.0, end=0.2)
    assert [p[:3] for p in periods] == [(0.0, 0.1, 25.0), (0.1, 0.2, 0.0)]  # (0.2, 0.3] lies outside
    assert periods[0][3] == pytest.approx(20.0) and periods[1][3] == pytest.approx(20.0)
    run = sampling.BurstRun(burst_ms=10, gap_ms=40, busy=busy, periods=periods)
    assert run.true_busy_pct == pytest.approx(20.0)
    assert run.nvml_pct == pytest.approx(12.5)
    assert run.missed_periods == 1
    assert run.to_dict()["missed_periods"] == 1


def test_captured_share_pools_and_needs_three_periods():
    run = sampling.BurstRun(burst_ms=1, gap_ms=9, periods=[(0, 1, 10.0, 10.0), (1, 2, 20.0, 10.0), (2, 3, 0.0, 10.0),
                                                     (3, 4, 99.0, 0.0)])  # an idle period is left out
    est = sampling.captured_share([run])
    assert est.value == pytest.approx(1.0)  # 30 of 30 busy percent-seconds
    assert est.lo <= 1.0 <= est.hi
    assert sampling.captured_share([sampling.BurstRun(1, 9, periods=[(0, 1, 5.0, 10.0)])]) is None


def test_run_bursts_checks_its_input_and_needs_a_gpu():
    with pytest.raises(ValueError, match="gap_ms"):
        sampling.run_bursts(lambda: None, 1e-3, burst_ms=1, gap_ms=0, device=CPU)
    with pytest.raises(ValueError, match="CUDA"):
        sampling.run_bursts(lambda: None, 1e-3, burst_ms=1, gap_ms=9, device=CPU)
    assert "periods read as 0%" in M.bursts_html([sampling.BurstRun(1, 9)])


def test_optimised_config_is_the_case_studys_final_loop():
    from gpulab.workloads.models import GPTConfig

    model = GPTConfig(vocab_size=300, n_layer=2, n_head=2, n_embd=64, block_size=64)
    cfg = training.optimised_config(model, batch_size=8, grad_accum=2, num_workers=1, compile=False, device=CPU)
    assert (cfg.batch_size, cfg.grad_accum, cfg.num_workers) == (8, 2, 1)
    assert cfg.param_dtype == "bf16" and cfg.master_weights and cfg.fused_loss and cfg.fused_adamw
    assert cfg.attn == "sdpa" and not cfg.sync_every_step and cfg.pad_vocab and not cfg.compile
    assert training.optimised_config(model, batch_size=8, grad_accum=2, num_workers=1, compile=True, device=CPU).compile


def test_run_bursts_pairs_event_times_with_nvml_samples(monkeypatch):
    """On a fake clock that the work and the gaps advance (2 ms bursts every 10 ms for 0.6 s): a loaded host can
    neither stretch a gap nor cut the number of bursts."""
    import types

    import torch
    from gpulab import monitor
    from test_monitor import EPOCH, FAKE_GPU, FakeNVML
    from test_timing import FakeClock

    clock = FakeClock()
    clock.t = EPOCH  # NVML's sample times are epoch-based

    def wait(s):
        clock.t += s

    monkeypatch.setattr(sampling, "time", types.SimpleNamespace(time=clock, sleep=wait))
    monkeypatch.setattr(monitor, "time", types.SimpleNamespace(time=clock, perf_counter=clock, sleep=wait))

    class Event:  # CUDA events that say each burst took 2 ms
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 2.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    calls = []

    def work():
        calls.append(1)
        clock.t += 1e-3  # 1 ms of GPU work a call

    run = sampling.run_bursts(work, 1e-3, burst_ms=2, gap_ms=8, seconds=0.6, device=FAKE_GPU,
                              nvml=FakeNVML(util=20, now=clock))
    assert len(calls) == 2 * len(run.busy) + 1 and len(run.busy) == pytest.approx(60, abs=1)  # 2 calls a burst
    assert all(e - s == pytest.approx(2e-3) for s, e in run.busy)
    assert run.periods and all(v == 20.0 for _, _, v, _ in run.periods)
    assert all(run.busy[0][0] <= a < b <= run.busy[-1][1] for a, b, _, _ in run.periods)
    assert run.true_busy_pct == pytest.approx(20, abs=3)  # 2 ms of every 10 ms


def test_captured_by_pattern_gives_each_burst_pattern_its_own_ratio():
    short = sampling.BurstRun(1, 9, periods=[(i, i + 1, 8.0, 10.0 + 0.1 * (i % 3)) for i in range(9)])
    long = sampling.BurstRun(10, 40, periods=[(i, i + 1, 17.0, 18.0) for i in range(9)] + [(9, 10, 50.0, 0.0)])
    idle = sampling.BurstRun(1, 99, periods=[(0, 1, 0.0, 0.0)])
    a, b, none = sampling.captured_by_pattern([short, long, idle])
    assert a.value == pytest.approx(72 / 90.9) and a.lo <= a.value <= a.hi < 0.81  # 0.79, not the pooled 0.87
    assert b.value == pytest.approx(17 / 18) and b.lo == b.hi == pytest.approx(17 / 18)  # the idle period left out
    assert none is None
