
from _notebook_jobs import live_children
import pytest
import torch

from gpulab.workloads import sweeps as bs
from gpulab.tools import dataloading as dl
from gpulab.measuring import estimates
from gpulab.tools import feeds
from gpulab.verdicts.run_result import RunResult
from gpulab.measuring.flops import transformer_flops_per_token
from gpulab.workloads.models import GPTConfig, SmallCNN, SyntheticImageDataset, denormalize
from gpulab.workloads import image_feeds


_EARLIER: set[int] = set()


@pytest.fixture(autouse=True)
def _children_before():
    """Processes other tests left running (a notebook's kernel shutting down) are not this test's workers."""
    _EARLIER.clear()
    _EARLIER.update(p.pid for p in live_children())


def _no_live_children():
    return [p for p in live_children() if p.pid not in _EARLIER] == []


def test_worker_counts_include_half_and_all_cores():
    assert image_feeds.worker_counts(16) == [0, 1, 2, 4, 8, 16]
    assert image_feeds.worker_counts(12) == [0, 1, 2, 4, 6, 8, 12]
    assert image_feeds.worker_counts(2, extra=[2, 5]) == [0, 1, 2]  # extras above the core count are dropped
    assert image_feeds.worker_counts(1) == [0, 1]
    with pytest.raises(ValueError, match="cores"):
        image_feeds.worker_counts(0)
    assert dl.usable_cores() >= 1


def test_knee_and_throughput_tables():
    rows = [dict(num_workers=0, pin_memory=False, samples_per_s=100.0),
            dict(num_workers=2, pin_memory=False, samples_per_s=300.0),
            dict(num_workers=2, pin_memory=False, samples_per_s=320.0),  # best of a worker count is kept
            dict(num_workers=4, pin_memory=False, samples_per_s=330.0),
            dict(num_workers=4, pin_memory=True, samples_per_s=900.0)]
    thr = feeds.throughput_by_workers(rows, pin_memory=False)
    assert thr == {0: 100.0, 2: 320.0, 4: 330.0}
    assert feeds.knee(thr, 0.95) == 2 and feeds.knee(thr, 1.0) == 4 and feeds.knee({}) is None
    with pytest.raises(ValueError):
        feeds.knee(thr, 0)
    assert image_feeds.workers_to_feed(0.05, 0.01) == 5 and image_feeds.workers_to_feed(0.001, 0.01) == 1
    with pytest.raises(ValueError):
        image_feeds.workers_to_feed(0, 1)


def test_cnn_step_trains_and_flops_scale_with_pixels():
    torch.manual_seed(0)
    model = SmallCNN(width=4)
    step = image_feeds.cnn_train_step(model, "cpu")
    before = [p.detach().clone() for p in model.parameters()]
    x, y = image_feeds.random_image_batches(1, 4, 16)[0]
    step(x, y)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())  # released after the step
    f16, f32 = image_feeds.cnn_train_flops_per_sample(model, 16), image_feeds.cnn_train_flops_per_sample(model, 32)
    assert f16 > 0 and f32 / f16 == pytest.approx(4, rel=0.01)


def test_feed_runs_batches_from_a_cycle_and_a_loader(tmp_path):
    seen = []
    batches = image_feeds.random_image_batches(2, 3, 8, pin_memory=True)  # pinning is skipped without CUDA
    assert batches[0][0].is_pinned() == torch.cuda.is_available()
    with feeds.Feed(feeds.cycle(batches), lambda x, y: seen.append(len(x)), "cpu", prefetch=True) as feed:
        feed.run(5)
    assert seen == [3] * 5 and feed.samples == 15 and feed.batches == 5 and not feed.prefetch
    ds = SyntheticImageDataset(tmp_path, n_images=8, size=16)
    loader = dl.endless_loader(ds, batch_size=4, num_workers=1, pin_memory=True)
    assert loader.pin_memory is torch.cuda.is_available()
    with feeds.Feed(loader, lambda x, y: seen.append(tuple(x.shape)), "cpu") as feed:
        feed.run(3)  # more batches than one pass over the 8 images: the loader never ends
        feed.run(1)
    assert seen[-4:] == [(4, 3, 16, 16)] * 4
    assert _no_live_children()
    with pytest.raises(ValueError):
        feeds.Feed(loader, "not callable")
    with pytest.raises(ValueError):
        next(feeds.cycle([]))


def test_epoch_start_times_and_loading_time(tmp_path):
    ds = SyntheticImageDataset(tmp_path, n_images=8, size=16)
    assert image_feeds.time_batch_loading(ds, 4, batches=2) > 0
    starts = image_feeds.epoch_start_times(ds, batch_size=4, num_workers=1, epochs=3, batches_per_epoch=2)
    assert set(starts.first_batch_s) == {"respawn", "persistent"}
    assert all(len(v) == 3 and min(v) > 0 for v in starts.first_batch_s.values())
    assert starts.ratio > 0 and starts.to_dict()["later_epochs_s"]["persistent"] > 0
    assert _no_live_children()
    with pytest.raises(ValueError, match="epochs"):
        image_feeds.epoch_start_times(ds, batch_size=4, num_workers=1, epochs=1)


def test_utilization_by_workers_measures_each_count(tmp_path, cpu_device):
    ds = SyntheticImageDataset(tmp_path, n_images=8, size=16)
    step = image_feeds.cnn_train_step(SmallCNN(width=4), "cpu")
    out = feeds.utilization_by_workers(ds, step, [0, 1], batch_size=4, batches_per_call=1, flops_per_sample=1e6,
                                    min_time_s=0.02, device=cpu_device, progress=False)
    assert [w for w, _ in out] == [0, 1]
    assert all(isinstance(r, RunResult) and r.throughput > 0 and r.flops == 4e6 for _, r in out)
    assert _no_live_children()


def test_gpt_step_accumulates_and_counts_flops():
    cfg = GPTConfig.smoke()
    step = bs.GPTTrainStep(cfg, seq_len=16)
    x, y = step.batch(3)
    assert x.shape == y.shape == (3, 16) and x.is_contiguous() and y.is_contiguous()
    before = step.model.lm_head.weight.detach().clone()
    step(4)
    step(4, accum=2)
    assert not torch.equal(before, step.model.lm_head.weight)
    assert all(p.grad is None for p in step.model.parameters())
    want = transformer_flops_per_token(step.n_params, cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, 16) * 16
    assert step.flops_per_sequence() == want
    with pytest.raises(ValueError, match="accum"):
        step(4, accum=3)
    with pytest.raises(ValueError, match="seq_len"):
        bs.GPTTrainStep(cfg, seq_len=cfg.block_size + 1)
    step.close()
    assert step.model is None


def test_memory_estimate_grows_linearly_with_batch():
    cfg = GPTConfig.smoke()
    m1, m2, m4 = (bs.gpt_step_memory_estimate(cfg, b, 32) for b in (1, 2, 4))
    assert m1 < m2 < m4 and (m4 - m2) == 2 * (m2 - m1)


class _FakeStep:
    """Looks like a GPTTrainStep to batch_sweep; runs out of memory above batch 2."""

    device, seq_len = torch.device("cpu"), 8

    def flops_per_sequence(self):
        return 1e6

    def __call__(self, b):
        if b > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")


def test_batch_sweep_rows_and_oom_rows():
    rows, runs = bs.batch_sweep(_FakeStep(), [1, 2, 4], min_time_s=0.01, progress=False)
    assert [r["batch_size"] for r in rows] == [1, 2, 4] and set(runs) == {1, 2}
    assert rows[2]["oom"] and "out of memory" in rows[2]["error"] and rows[2]["samples_per_s"] is None
    assert rows[0]["tokens_per_s"] == pytest.approx(rows[0]["samples_per_s"] * 8)
    assert rows[0]["peak_mem_gb"] is None  # no allocator to ask on a CPU
    assert bs.column(rows, "samples_per_s")[2] is None
    real = bs.GPTTrainStep(GPTConfig.smoke(), seq_len=8)
    rows, _ = bs.batch_sweep(real, [1, 2], min_time_s=0.01, progress=False)
    assert all(r["samples_per_s"] > 0 and not r["oom"] for r in rows)
    calls = []
    assert bs.peak_memory_gb(lambda: calls.append(1), "cpu") is None and calls == [1]


def test_denormalize_round_trips_the_dataset_normalization(tmp_path):
    ds = SyntheticImageDataset(tmp_path, n_images=2, size=16, augment=False)
    img = denormalize(ds[0][0])
    assert img.shape == (16, 16, 3) and 0 <= img.min() and img.max() <= 1


def test_epoch_start_ratio_has_an_interval():
    s = image_feeds.EpochStarts(num_workers=2, batch_size=4, batches_per_epoch=2,
                       first_batch_s={"respawn": [1.0, 0.30, 0.20, 0.25], "persistent": [1.0, 0.10, 0.12, 0.11]})
    e = s.ratio_estimate()
    assert e.value == pytest.approx(0.25 / 0.11)
    assert e.lo <= e.value <= e.hi and e.lo == pytest.approx(0.225 / 0.115) and e.hi == pytest.approx(0.275 / 0.105)


def test_measure_feed_times_each_extra_window_for_window_s(cpu_device, monkeypatch):
    """Extra windows last `window_s` each (a bursty loader needs long ones); a bad value fails before any work.
    Timed on a fake clock that only the training step advances: no wall time, nothing a loaded host can stretch."""
    import functools

    from gpulab.verdicts import experiment
    from gpulab.measuring import timing
    from test_timing import FakeClock

    clock = FakeClock()
    monkeypatch.setattr(feeds, "benchmark", functools.partial(timing.benchmark, clock=clock))
    monkeypatch.setattr(experiment, "benchmark", functools.partial(timing.benchmark, clock=clock))

    def step(x, y):
        clock.t += 2**-9  # about 2 ms; powers of two add up exactly

    batches = image_feeds.random_image_batches(2, 3, 8)
    with feeds.Feed(feeds.cycle(batches), step, "cpu", clock=clock) as feed:
        run = feeds.measure_feed(feed, 1, label="fed", items=3, rounds=2, min_time_s=2**-5, window_s=2**-3,
                                 device=cpu_device)
        extra = run.measurement.windows[-2:]
        assert extra == [(64, 2**-3)] * 2  # window_s each, not the 8 ms of min_time_s / 4
        n = feed.batches
        with pytest.raises(ValueError, match="window_s"):
            feeds.measure_feed(feed, 1, label="fed", items=3, window_s=0, device=cpu_device)
        assert feed.batches == n  # rejected before anything ran


def test_launch_headroom_needs_cuda_tensors_and_sane_counts():
    step = image_feeds.cnn_train_step(SmallCNN(width=4), "cpu")
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        dl.launch_headroom(step, x, y)
    for bad in ({"steps": 0}, {"repeats": -1}, {"steps": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            dl.launch_headroom(step, x, y, **bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_launch_headroom_times_host_and_gpu_per_step():
    step = image_feeds.cnn_train_step(SmallCNN(width=8), "cuda")
    x, y = torch.randn(8, 3, 32, 32, device="cuda"), torch.randint(10, (8,), device="cuda")
    h = dl.launch_headroom(step, x, y, steps=2, repeats=2)
    assert h["batch"] == 8 and h["host_s"] > 0 and h["gpu_s"] > 0


def test_batch_sweep_takes_any_step_with_its_sequence_length_and_flops():
    """A step written in a notebook cell (a plain function) sweeps like a GPTTrainStep, at its own length."""
    calls = []
    rows, runs = bs.batch_sweep(lambda b: calls.append(b), [1, 4], seq_len=16, flops_per_sequence=2e6,
                                min_time_s=0.01, progress=False)
    assert set(calls) == {1, 4} and set(runs) == {1, 4}
    assert rows[1]["tokens_per_s"] == pytest.approx(rows[1]["samples_per_s"] * 16)
    assert runs[4].flops == pytest.approx(8e6) and runs[4].items == 64


def _paired(ratios, per_call=0.05, calls=10):
    """Two fed loops in paired windows whose per-call time ratios (before / after) are `ratios`."""
    from gpulab.verdicts.experiment import Comparison
    from gpulab.measuring.measurement import Measurement

    def side(label, windows):
        return RunResult(label, Measurement(label, [per_call] * calls, windows=windows), items=256, pipeline=True)
    before = side("factor 2", [(calls, calls * per_call * r) for r in ratios])
    after = side("factor 4", [(calls, calls * per_call)] * len(ratios))
    return Comparison("prefetch_factor 2 -> 4", before, after)


def test_paired_ratio_is_a_95_percent_interval_even_from_three_window_pairs():
    """Three window pairs: their range (cmp.estimate()) holds the true ratio about 75% of the time, so three pairs
    that happen to agree decide a claim; feeds.paired_ratio's t-interval holds it about 95% of the time."""
    import math
    import random
    rng = random.Random(0)
    trials, old_hits, new_hits = 400, 0, 0
    for _ in range(trials):  # true ratio 1.0; window-pair noise as in the H100 runs (about 6.5% per pair)
        cmp = _paired([math.exp(rng.gauss(0.0, 0.065)) for _ in range(3)])
        old, new = cmp.estimate(), feeds.paired_ratio(cmp)
        old_hits += old.lo <= 1.0 <= old.hi
        new_hits += new.lo <= 1.0 <= new.hi
        assert new.value == pytest.approx(old.value) and new.lo <= old.lo and new.hi >= old.hi
    assert old_hits / trials < 0.85 and new_hits / trials > 0.92
    # An earlier H100 run's three pairs (1.17, 1.04, 1.01): range [1.01, 1.17] decided nothing by a hair against
    # the 5% bar; a 95% interval from three pairs is about [0.88, 1.30].
    est = feeds.paired_ratio(_paired([1.17, 1.04, 1.01]))
    assert est.lo == pytest.approx(0.884, abs=0.01) and est.hi == pytest.approx(1.297, abs=0.01)
    assert estimates.t_quantile(0.975, 2) == pytest.approx(4.303, abs=1e-3)
    assert estimates.t_quantile(0.975, 8) == pytest.approx(2.306, abs=1e-3)
    with pytest.raises(ValueError, match="two window pairs"):
        feeds.paired_ratio(_paired([1.1]))


def test_a_comparison_on_the_t_interval_says_what_its_claim_says():
    """One pair, one verdict: a comparison made with pair_interval="t" carries paired_ratio's interval, so its
    header ("within noise" or not) and a claim judged on paired_ratio agree, and the choice survives the JSON."""
    from gpulab.verdicts.experiment import Comparison
    ratios = [0.98, 1.12, 1.15, 1.18, 1.14, 1.16]  # the median's interval (their range) holds 1; the mean log's not
    median = _paired(ratios)
    assert median.within_noise
    t = Comparison("prefetch_factor 2 -> 4", median.before, median.after, pair_interval="t")
    assert t.estimate().interval == pytest.approx(feeds.paired_ratio(median).interval)
    assert t.estimate().lo > 1.0 and not t.within_noise and "within noise" not in t.verdict
    back = Comparison.from_dict(t.to_dict())
    assert back.pair_interval == "t" and back.estimate().interval == pytest.approx(t.estimate().interval)
    with pytest.raises(ValueError, match="pair_interval"):
        Comparison("x", median.before, median.after, pair_interval="mean")
