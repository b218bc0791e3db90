import json

import pytest
import torch
import torch.nn as nn

from gpulab.tools.batchsize import BatchSizeSearch, SimulatedOutOfMemory, find_max_batch_size, grad_accumulation_matches, is_oom
from gpulab.workloads.models import MLP


def test_simulated_limit_finds_the_exact_largest_batch():
    calls = []
    res = find_max_batch_size(calls.append, memory_limit_bytes=1234, memory_fn=lambda b: b * 100,
                              device="cpu", timed_steps=2, progress=False)
    assert res.max_fitting == 12
    tried = [(r["batch_size"], r["fits"]) for r in res.tried]
    assert tried == [(1, True), (2, True), (4, True), (8, True), (16, False), (12, True), (14, False), (13, False)]
    assert set(calls) == {1, 2, 4, 8, 12}  # failing sizes never ran the step
    fitting = [r for r in res.tried if r["fits"]]
    assert res.best_throughput == max(fitting, key=lambda r: r["samples_per_s"])["batch_size"]
    assert all(r["samples_per_s"] > 0 and r["peak_mem_bytes"] is None for r in fitting)
    assert all("out of memory" in r["error"] for r in res.tried if not r["fits"])
    assert res.memory_recovered is None and "<table" in res._repr_html_()


def test_search_stops_at_max_batch_and_handles_nothing_fitting():
    res = find_max_batch_size(lambda b: None, max_batch=48, measure_throughput=False, device="cpu", progress=False)
    assert res.max_fitting == 48 and res.best_throughput is None
    assert [r["batch_size"] for r in res.tried] == [1, 2, 4, 8, 16, 32, 48]
    none = find_max_batch_size(lambda b: None, memory_limit_bytes=10, memory_fn=lambda b: 100, device="cpu",
                               progress=False)
    assert none.max_fitting is None and none.best_throughput is None


def test_real_oom_errors_are_caught_and_others_are_not():
    def step(b):
        if b > 5:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert find_max_batch_size(step, device="cpu", max_batch=64, progress=False, timed_steps=1).max_fitting == 5
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried... out of memory"))
    assert is_oom(SimulatedOutOfMemory("simulated out of memory"))
    with pytest.raises(ValueError, match="boom"):
        find_max_batch_size(lambda b: (_ for _ in ()).throw(ValueError("boom")), device="cpu", max_batch=8,
                            progress=False)


@pytest.mark.parametrize("kwargs, name", [
    (dict(start=0), "start"), (dict(max_batch=-1), "max_batch"), (dict(start=8, max_batch=4), "start"),
    (dict(memory_limit_bytes=100), "memory_fn"), (dict(memory_fn=len), "memory_limit_bytes"), (dict(memory_limit_bytes=-5, memory_fn=len), "memory_limit_bytes")])
def test_bad_arguments_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        find_max_batch_size(lambda b: None, device="cpu", progress=False, **kwargs)


def test_a_cpu_search_needs_an_explicit_cap_before_any_work():
    calls = []
    with pytest.raises(ValueError, match="max_batch is needed on 'cpu'.*swaps"):
        find_max_batch_size(calls.append, device="cpu", progress=False)
    assert calls == []
    # A simulated memory limit bounds the search by itself.
    sim = find_max_batch_size(calls.append, memory_limit_bytes=1234, memory_fn=lambda b: b * 100, device="cpu",
                              measure_throughput=False, progress=False)
    assert sim.max_fitting == 12 and sim.max_batch == 4096 and not sim.capped


def test_a_search_that_reaches_its_cap_says_larger_may_fit():
    res = find_max_batch_size(lambda b: None, max_batch=64, measure_throughput=False, device="cpu", progress=False)
    assert res.max_fitting == 64 and res.capped
    assert "stopped at the cap max_batch=64; larger may fit" in res.verdict
    assert "stopped at the cap max_batch=64; larger may fit" in res._repr_html_()
    assert "larger may fit" in repr(res)
    oom = find_max_batch_size(lambda b: None, memory_limit_bytes=1234, memory_fn=lambda b: b * 100, max_batch=64,
                              measure_throughput=False, device="cpu", progress=False)
    assert oom.max_fitting == 12 and not oom.capped and "cap" not in oom.verdict and "cap" not in oom._repr_html_()
    back = BatchSizeSearch.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back.capped and back == res
    old = BatchSizeSearch.from_dict({"max_fitting": 64, "best_throughput": None, "tried": []})  # a result from before
    assert not old.capped


class _BatchNormNet(nn.Module):
    """Global pooling, then BatchNorm on one value per channel and sample: batch 1 cannot train."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm1d(8), nn.Linear(8, 10)

    def forward(self, x):
        return self.head(self.bn(self.conv(x).mean((2, 3))))


def test_batchnorm_at_batch_1_is_skipped_with_the_reason_and_the_search_goes_on():
    torch.manual_seed(0)
    model = _BatchNormNet().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(b):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(torch.randn(b, 3, 8, 8)), torch.randint(10, (b,))).backward()
        opt.step()

    res = find_max_batch_size(step, max_batch=8, device="cpu", timed_steps=1, progress=False)
    assert [(r["batch_size"], r["fits"]) for r in res.tried] == [(1, False), (2, True), (4, True), (8, True)]
    assert "BatchNorm" in res.tried[0]["error"] and res.max_fitting == 8 and res.capped
    assert any("batch 1 skipped" in n and "BatchNorm" in n for n in res.notes)
    assert "batch 1 skipped" in res._repr_html_()
    # Any other ValueError, or BatchNorm's at a batch above 1, is the step's own bug: it is raised.
    with pytest.raises(ValueError, match="value per channel"):
        find_max_batch_size(lambda b: (_ for _ in ()).throw(ValueError("Expected more than 1 value per channel "
                                                                       "when training")),
                            start=2, max_batch=8, device="cpu", progress=False)


def test_result_round_trips_through_json():
    res = find_max_batch_size(lambda b: None, memory_limit_bytes=1234, memory_fn=lambda b: b * 100,
                              device="cpu", timed_steps=1, progress=False)
    back = BatchSizeSearch.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back == res and back.max_fitting == 12


def test_grad_accumulation_matches_one_big_batch():
    x, y = torch.randn(32, 10), torch.randint(0, 4, (32,))
    out = grad_accumulation_matches(lambda: MLP(10, 64, 4, depth=2), x, y, nn.functional.cross_entropy, 4)
    assert out["max_abs_diff"] < 1e-5 and out["matches"] and out["micro_batch_size"] == 8
    out64 = grad_accumulation_matches(lambda: MLP(10, 64, 4), x, y, nn.functional.cross_entropy, 4,
                                      dtype=torch.float64)
    assert out64["rel_diff"] < 1e-12 and out64["dtype"] == "float64"
    # BatchNorm couples the samples of a batch: accumulation is no longer the same gradient.
    bn = grad_accumulation_matches(lambda: nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.Linear(16, 4)),
                                   x, y, nn.functional.cross_entropy, 4)
    assert not bn["matches"]
    with pytest.raises(ValueError, match="micro_batches"):
        grad_accumulation_matches(lambda: MLP(10, 8, 4), x, y, nn.functional.cross_entropy, 5)


def test_sweet_spot_reads_the_guides_table_as_32():
    from gpulab.workloads.sweeps import sweet_spot
    from gpulab.measuring.estimates import Estimate

    thr = {8: 120, 16: 220, 32: 380, 64: 480}  # guide §6.2: samples/s and GB per batch size
    mem = {8: 12, 16: 18, 32: 28, 64: 45}
    exact = {k: Estimate.exact(v) for k, v in thr.items()}
    assert sweet_spot(list(thr), exact, mem) == Estimate(32, 32, 32)
    # with +-10% throughput the 16 -> 32 step (1.73x throughput for 1.56x memory) could gain less than it costs
    wide = {k: Estimate(v, 0.9 * v, 1.1 * v) for k, v in thr.items()}
    s = sweet_spot(list(thr), wide, mem)
    assert s.value == 32 and s.lo == 16 and s.hi == 32
    assert sweet_spot([8, 16], exact, {}) is None  # no memory measured (a CPU run)
    # throughput that keeps pace with memory to the end: the largest size
    assert sweet_spot([8, 16], {8: Estimate.exact(1), 16: Estimate.exact(3)}, {8: 1, 16: 2}).value == 16


def test_trace_estimate_and_difference():
    from gpulab.measuring.estimates import difference
    from gpulab.workloads.sweeps import trace_estimate
    from gpulab.measuring.estimates import Estimate
    from gpulab.verdicts.run_result import RunResult
    from gpulab.measuring.monitor import Trace
    from gpulab.measuring.measurement import Measurement

    trace = Trace(series={"nvml_util": [(0.0, 10.0), (0.2, 20.0), (0.4, 30.0), (0.6, 40.0)]},
                  window={"gpm_sm_active": 55.0})
    run = RunResult("r", Measurement("r", [1.0]), trace=trace)
    e = trace_estimate(run, "nvml_util")
    assert e.value == 25.0 and e.lo == pytest.approx(17.5) and e.hi == pytest.approx(32.5)
    assert trace_estimate(run, "gpm_sm_active") == Estimate.exact(55.0)
    assert trace_estimate(run, "cpu_percent") is None and trace_estimate(None, "nvml_util") is None
    d = difference(Estimate(90, 85, 95), e)
    assert d.value == 65 and d.lo == pytest.approx(85 - 32.5) and d.hi == pytest.approx(95 - 17.5)
    assert difference(None, e) is None


def test_run_largest_steps_down_after_an_out_of_memory():
    from gpulab.workloads.sweeps import run_largest

    tried = []

    def run(b):
        tried.append(b)
        if b > 48:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 13.05 GiB")
        return b * 2

    assert run_largest(run, [32, 64, 56, 48], device="cpu") == (48, 96)
    assert tried == [64, 56, 48]
    # the failed step's frames (and the tensors they hold) do not outlive it: no traceback is kept
    with pytest.raises(torch.cuda.OutOfMemoryError) as err:
        run_largest(run, [64], device="cpu")
    assert err.value.__traceback__ is None or all(
        f.f_code.co_name != "run" for f, _ in __import__("traceback").walk_tb(err.value.__traceback__))
    with pytest.raises(ValueError, match="boom"):
        run_largest(lambda b: (_ for _ in ()).throw(ValueError("boom")), [8], device="cpu")


def test_batch_sweep_rounds_spread_every_size_over_the_sweep():
    """Interleaved rounds after the windows, the order reversed each round, their steps in each size's timings."""
    from gpulab.workloads.sweeps import batch_sweep
    calls = []
    step = lambda b: calls.append(b)  # noqa: E731
    rows, runs = batch_sweep(step, [1, 2, 4], seq_len=8, flops_per_sequence=1e6, min_time_s=0.01, device=None,
                             progress=False, rounds=3, round_s=0.002)
    firsts = [b for i, b in enumerate(calls) if i == 0 or calls[i - 1] != b]  # each block of calls of one size
    assert firsts == [1, 2, 4, 1, 2, 4, 2, 1, 2, 4]  # windows 1 2 4, rounds 1 2 4 | 4 2 1 | 1 2 4 (a turn merges)
    for b in (1, 2, 4):
        m = runs[b].measurement
        assert m.meta["interleaved_rounds"] == 3 and len(m.round_medians) == 4
        row = next(r for r in rows if r["batch_size"] == b)
        assert row["step_ms"] == pytest.approx(m.median * 1e3)  # the row reads every step, rounds included
    plain, _ = batch_sweep(step, [1], seq_len=8, flops_per_sequence=1e6, min_time_s=0.01, progress=False)
    assert not plain[0]["oom"]


def test_utilization_rounds_alternate_and_the_rise_is_judged_over_rounds():
    from gpulab.workloads.sweeps import round_rise, utilization_rounds
    calls = []
    rows, runs, per_round = utilization_rounds(lambda b: calls.append(b), [8, 64], rounds=4, window_s=0.005,
                                               preroll_s=0.0, seq_len=4, flops_per_sequence=1e6)
    firsts = [b for i, b in enumerate(calls) if i == 0 or calls[i - 1] != b]
    assert firsts == [8, 64, 8, 64, 8]  # 8 64 | 64 8 | 8 64 | 64 8: one size runs on at each turn
    assert [r["rounds"] for r in rows] == [4, 4] and per_round == {8: [None] * 4, 64: [None] * 4}  # no NVML here
    assert runs[8].measurement.meta["interleaved_rounds"] == 4 and round_rise(per_round[8], per_round[64]) is None
    # the rise: the median of the rounds' own differences, its interval from the rounds (the range up to 8)
    est = round_rise([60, 55, None, 64, 58], [99, 98, 99, 99, 97])
    assert (est.value, est.lo, est.hi) == (39, 35, 43)  # 39, 43, (left out), 35, 39
    assert round_rise([60, None], [99, 98]) is None

    def oom_at_64(b):
        if b == 64:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
    rows, runs, per_round = utilization_rounds(oom_at_64, [8, 64], rounds=4, window_s=0.005, preroll_s=0.0,
                                               seq_len=4, flops_per_sequence=1e6)
    assert rows[1]["oom"] and not rows[0]["oom"] and set(runs) == {8} and len(per_round[8]) == 1


def test_a_sweep_point_holds_the_drift_between_its_windows():
    """The sweet spot's deciding pair as four H100 runs read it at 128 tokens: batch 64 GPU-bound at 23.8 ms, batch 32
    launched by the host in 20-24 ms depending on the moment; 64 gains more throughput than memory (1.68x) unless
    a 32-step takes under 0.84 of a 64-step. One window at 23 ms with tight steps says "surely 64"; with rounds that
    ran at other moments (19.5 ms), the interval must reach 32."""
    from gpulab.workloads.sweeps import rate_over_windows, sweet_spot
    from gpulab.verdicts.run_result import RunResult
    from gpulab.measuring.measurement import Measurement

    def run(b, windows):
        m = Measurement(f"batch {b}", [t + 1e-5 * (i % 3) for t in windows[0] for i in range(30)])
        for t in windows[1:]:
            m = m.merged(Measurement(f"batch {b}", [t + 1e-5 * (i % 3) for i in range(5)]))
        return RunResult(label=f"batch {b}", measurement=m, items=b * 128)

    mem = {32: 5.70, 64: 9.54}
    one = {32: run(32, [[0.023]]), 64: run(64, [[0.0238]])}
    rates = {b: rate_over_windows(r) for b, r in one.items()}
    assert rates[32] == one[32].throughput_estimate()  # one window: the steps' quartiles, as before
    assert tuple(vars(sweet_spot([32, 64], rates, mem)).values()) == (64, 64, 64)
    drift = {32: run(32, [[0.023], 0.0195, 0.0225, 0.024]), 64: run(64, [[0.0238], 0.0238, 0.0239, 0.0238])}
    rates = {b: rate_over_windows(r) for b, r in drift.items()}
    assert rates[32].hi == pytest.approx(32 * 128 / 0.0195, rel=1e-3) and rates[32].value == drift[32].throughput
    s = sweet_spot([32, 64], rates, mem)
    assert (s.value, s.lo, s.hi) == (64, 32, 64)  # 32 could be the sweet spot: inconclusive against 24-48


def test_the_relative_gain_is_judged_over_rounds_too():
    from gpulab.workloads.sweeps import round_gain
    # per round (high / low - 1) * 100: 25, 10, (no reading: left out), (low reads 0: left out), 0
    est = round_gain([40, 50, None, 0, 45], [50, 55, 60, 30, 45])
    assert est.value == pytest.approx(10) and (est.lo, est.hi) == pytest.approx((0, 25))
    assert round_gain([40, None], [50, 55]) is None
