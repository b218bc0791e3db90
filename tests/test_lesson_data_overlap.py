"""Notebook 05's scaffolding on the CPU: its smoke sizes, its claims as data, the verdicts on what it measured (with
fakes of the GPU-only runs), and the tables, sentences and figures that report it."""
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import pytest
import torch

import gpulab as gl
from gpulab.verdicts.claims import SMOKE_NOTE
from gpulab.measuring.estimates import Estimate
from gpulab.measuring.device import DeviceInfo
from gpulab.verdicts.lesson import _as_spec
from gpulab.tools import dataloading as dl
from gpulab.lessons import data_overlap as L
from gpulab.workloads import image_feeds
from _notebook_run import parameters_cell

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent
GPU = DeviceInfo(kind="cuda", name="pretend GPU", capability=(9, 0))
PIPELINE = [k for k in ("four_vs_zero", "half_cores", "past_half", "rule_of_thumb", "eight_vs_four", "rule_util",
                        "rule_cpu", "sawtooth", "wait_ratio", "prefetch_factor")]


def _parameters() -> dict:
    return parameters_cell("05_data_overlap")


def _lesson(device, smoke=True, **params):
    return gl.lesson("05_data_overlap", _parameters() | {"SMOKE": smoke} | params, claims=L.CLAIMS, device=device,
                     show=False)


@pytest.fixture
def gpu_lesson():
    """A lesson on a pretend GPU at full sizes: for the verdicts a GPU run reaches."""
    return _lesson(GPU, smoke=False)


def _run(rate, spread=0.02, nvml=None, cpu=50.0, gpm=None, busy=None):
    """A fake RunResult of a fed loop: window rate with its spread, monitor means, NVML quartiles as +-5."""
    metrics = {"nvml_util": nvml, "cpu_percent": cpu, "gpm_sm_active": gpm}
    trace = SimpleNamespace(estimate=lambda m: None if metrics.get(m) is None
                            else Estimate(metrics[m], metrics[m] - 5, metrics[m] + 5))
    return SimpleNamespace(throughput=rate, items=64, seconds=64 / (1.1 * rate), metric=metrics.get,
                           measurement=SimpleNamespace(iqr=0.1 * 64 / rate),
                           throughput_estimate=lambda: Estimate(rate, rate * (1 - spread), rate * (1 + spread)),
                           trace=trace, flops=None, peak_tflops=None,
                           profile=SimpleNamespace(busy_fraction=busy) if busy is not None else None)


def _util(rates_by_workers, **kw):
    return [(w, _run(r, **kw)) for w, r in rates_by_workers.items()]


def _rates(util):
    return {w: r.throughput_estimate() for w, r in util}


def _starts():
    return image_feeds.EpochStarts(num_workers=2, batch_size=8, batches_per_epoch=4,
                          first_batch_s={"respawn": [0.5, 0.2, 0.22, 0.21], "persistent": [0.5, 0.01, 0.012, 0.011]})


def test_claims_are_valid_specs_and_keep_the_contracts_texts():
    specs = [_as_spec(c) for c in L.CLAIMS]
    assert len({s.key for s in specs}) == len(specs)
    contract = json.loads((ROOT / "tests" / "data" / "notebook_contract.json").read_text())["05_data_overlap"]
    assert sorted(s.text for s in specs) == sorted(contract["claims"])
    assert all(("cuda" in s.needs and "full" in s.needs) for s in specs if s.key in PIPELINE)


def test_why_not_names_the_gpu_or_the_smoke_sizes(cpu_device, gpu_lesson):
    assert L.why_not(_lesson(cpu_device, smoke=False)) == L.NO_GPU
    assert L.why_not(_lesson(GPU, smoke=True)) == L.SMOKE_WHY
    assert L.why_not(gpu_lesson) is None


def test_cpu_lesson_records_every_claim_with_a_reason(cpu_device, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    les = _lesson(cpu_device)
    util = _util({0: 100.0, 1: 180.0, 2: 200.0}, cpu=60.0)
    rates, rows = L.utilization_rows(util)
    cmp_feed = SimpleNamespace(before=_run(100.0), after=_run(200.0))
    wait_b, wait_a = Estimate(0.02, 0.018, 0.022), Estimate(0.004, 0.003, 0.005)
    claims = (L.check_workers(les, rates, cores=2, rule_of_thumb=2) + L.check_rules(les, util, rows, rates, 2)
              + [L.check_sawtooth(les, cmp_feed)] + L.check_data_wait(les, wait_b, wait_a, 2)
              + [L.check_prefetch_factor(les, Estimate(1.01, 0.99, 1.03), 2), L.check_persistent(les, _starts(), 2)]
              + [L.check_gpu_only(les, k, None, None) for k in ("pin_copy", "pin_loop", "prefetcher")])
    by_key = dict(zip(["four_vs_zero", "half_cores", "past_half", "rule_of_thumb", "eight_vs_four", "rule_util",
                       "rule_cpu", "sawtooth", "wait_ratio", "wait_ms", "prefetch_factor", "persistent", "pin_copy",
                       "pin_loop", "prefetcher"], claims))
    assert all(by_key[k].verdict == "not tested" and by_key[k].note == L.NO_GPU for k in PIPELINE if k != "wait_ratio")
    assert by_key["wait_ratio"].verdict == "not comparable"  # another system's number, on any machine
    assert by_key["pin_copy"].note == by_key["prefetcher"].note == "needs a CUDA GPU; see the reference run"
    assert by_key["wait_ms"].verdict == "not comparable" and by_key["wait_ms"].measured == pytest.approx(4.0)
    # A smoke run judges no timing claim: the respawn-time ratio is recorded as not tested, saying why.
    assert by_key["persistent"].verdict == "not tested" and by_key["persistent"].note == SMOKE_NOTE
    rest = L.record_the_rest(les, rows, rates, Estimate(2.0, 1.9, 2.1), 2, 8)
    assert [c.verdict for c in rest] == ["not comparable", "not tested", "not comparable", "not comparable",
                                         "not tested", "confirmed"]
    assert rest[0].measured == 60.0 and "at most, over the counts swept" in rest[0].note
    assert rest[3].measured == pytest.approx(100 * 8 / 200.0) and "with 2 workers" in rest[3].note  # no 4: the most
    assert rest[5].evidence == "definition" and rest[5].measured == 8
    assert not les.pending()
    data = json.loads(Path(les.save()).read_text())
    assert len(data["claims"]) == len(L.CLAIMS) and data["smoke"] is True


def test_worker_claims_on_a_gpu_judge_the_tables_shape(gpu_lesson):
    rates = _rates(_util({0: 100.0, 1: 180.0, 2: 300.0, 4: 500.0, 8: 505.0}, spread=0.01))
    four, half, past, thumb, eight = L.check_workers(gpu_lesson, rates, cores=8, rule_of_thumb=8)
    assert four.verdict == "confirmed" and four.measured == pytest.approx(5.0)
    assert four.measurement == "utilization_by_workers" and four.note == L.PIPE
    assert half.measured == pytest.approx(0.5) and half.verdict == "confirmed"  # the knee: 4 of 8 cores
    assert past.measured == pytest.approx(1.01) and past.verdict == "confirmed"
    assert thumb.measured == pytest.approx(1.0)
    assert eight.measured == pytest.approx(1.0) and eight.verdict == "refuted"  # 1% against 5-10%
    few = L.check_workers(_lesson(GPU, smoke=False), _rates(_util({0: 100.0, 1: 150.0, 2: 160.0})), cores=2,
                          rule_of_thumb=2)
    assert [c.verdict for c in few] == ["not tested", "not tested", "not tested", "confirmed", "not tested"]
    assert few[0].note == "needs at least 4 cores; this host has 2" and few[4].note.startswith("needs at least 8")


def test_the_conditional_rules_are_tested_only_where_their_condition_holds(gpu_lesson):
    util = [(0, _run(100.0, nvml=20.0)), (4, _run(400.0, nvml=50.0)), (8, _run(440.0, nvml=60.0, cpu=95.0))]
    rates, rows = L.utilization_rows(util)
    u, c = L.check_rules(gpu_lesson, util, rows, rates, cores=8)
    assert u.verdict == "confirmed" and u.measured == pytest.approx(1.1) and "NVML at 4 workers 50.0%" in u.note
    assert c.measured == pytest.approx(400 / 440) and "8 workers: host CPU 95.0%" in c.note  # 4 / 8 workers
    calm = [(0, _run(100.0, nvml=20.0)), (4, _run(400.0, nvml=80.0)), (8, _run(440.0, nvml=90.0))]
    rates, rows = L.utilization_rows(calm)
    u, c = L.check_rules(_lesson(GPU, smoke=False), calm, rows, rates, cores=8)
    assert u.verdict == c.verdict == "not tested"
    assert "condition does not hold: NVML reads 80.0% [75.0%, 85.0%]" in u.note and "host CPU at most 50.0%" in c.note
    u, _ = L.check_rules(_lesson(GPU, smoke=False), calm, rows, rates, cores=4)
    assert u.note == "needs 8 cores and NVML utilization at 4 workers"


def test_sixteen_workers_and_8_workers_at_prefetch_4_are_read_as_the_guide_states_them(gpu_lesson):
    """C16: twice the cores' workers / the cores', paired (3.0 s -> 3.2 s on 8 cores: below 1x); C17: the host CPU
    of 8 workers at prefetch_factor 4, the fed pair's factor-4 side, beside 002's 60-80%."""
    util = _util({0: 100.0, 4: 400.0, 8: 440.0}, cpu=70.0)
    rates, rows = L.utilization_rows(util)
    rest = L.record_the_rest(gpu_lesson, rows, rates, Estimate(2.0, 1.9, 2.1), 8, 64,
                             twice_over_all=Estimate(0.93, 0.90, 0.96), cores=16, pf4_cpu=75.5, pf_workers=8)
    by = {c.key.split(".")[-1]: c for c in rest}
    assert by["sixteen_workers"].verdict == "confirmed" and "32 workers on 16 cores / 16 workers" in \
        by["sixteen_workers"].note
    assert by["cpu_usage"].measured == 75.5 and "with 8 workers, prefetch_factor 4" in by["cpu_usage"].note
    none_ran = L.record_the_rest(gpu_lesson, rows, rates, Estimate(2.0, 1.9, 2.1), 8, 64)
    assert [c.verdict for c in none_ran if c.key.endswith("sixteen_workers")] == ["not tested"]


def test_the_cpu_rule_note_agrees_with_the_readings_it_gives(gpu_lesson):
    """Above 90% at some count: never "the condition never holds"; it decreases to the next count that ran."""
    util = [(0, _run(100.0)), (2, _run(300.0, cpu=60.0)), (3, _run(330.0, cpu=97.4)), (6, _run(340.0, cpu=99.0))]
    rates, rows = L.utilization_rows(util)
    c = L.check_rule_cpu(gpu_lesson, rows, rates)  # half of 3 is 1, not swept: the next smaller count, 2
    assert c.measured == pytest.approx(300 / 330) and "3 workers: host CPU 97.4%" in c.note and "to 2 workers" in c.note
    first = [(0, _run(100.0)), (1, _run(300.0, cpu=97.4))]
    rates, rows = L.utilization_rows(first)
    c = L.check_rule_cpu(gpu_lesson, rows, rates)
    assert c.verdict == "not tested" and "holds at 1 worker (host CPU 97.4%)" in c.note and "never" not in c.note
    calm = [(0, _run(100.0)), (4, _run(300.0, cpu=85.0))]
    rates, rows = L.utilization_rows(calm)
    assert "host CPU at most 85.0%" in L.check_rule_cpu(gpu_lesson, rows, rates).note
    # the H200 reference: no workers read 98.1% (the main process's threads), every count with workers far less
    threads = [(0, _run(490.0, cpu=98.1)), (1, _run(500.0, cpu=7.5)), (16, _run(5000.0, cpu=60.0))]
    rates, rows = L.utilization_rows(threads)
    note = L.check_rule_cpu(gpu_lesson, rows, rates).note
    assert "at most 60.0% over the counts swept; 98.1% with none, where there are none to decrease" in note


def test_gpu_claims_on_the_fed_loops_pinned_memory_and_the_prefetcher(gpu_lesson):
    cmp_feed = SimpleNamespace(before=_run(100.0, nvml=30.0, busy=0.3), after=_run(500.0, nvml=90.0))
    saw = L.check_sawtooth(gpu_lesson, cmp_feed)
    assert saw.verdict == "confirmed" and saw.interval == (25, 35) and "profiler busy fraction 30.0%" in saw.note
    assert "fed: 90.0%" in saw.note
    ratio, ms = L.check_data_wait(gpu_lesson, Estimate(0.045, 0.044, 0.046), Estimate(0.008, 0.0079, 0.0081), 4)
    assert ratio.measurement == "starved vs fed" and ratio.verdict == ms.verdict == "not comparable"
    pf = L.check_prefetch_factor(gpu_lesson, Estimate(1.1, 1.05, 1.15), 4)
    assert pf.verdict == "confirmed" and pf.note.startswith("4 workers")
    no_effect = L.check_prefetch_factor(gpu_lesson, Estimate(1.0, 0.97, 1.03), 4)  # a deeper queue, the same rate
    assert no_effect.verdict == "refuted" and "5% bar is ours" in no_effect.note
    copy = SimpleNamespace(verdict="2.00x faster", estimate=lambda: Estimate(2.0, 1.9, 2.1))
    loop = SimpleNamespace(verdict="inconclusive", estimate=lambda: Estimate(1.0, 0.98, 1.02))
    c1, c2 = [L.check_gpu_only(gpu_lesson, k, c, c, c.verdict) for k, c in (("pin_copy", copy), ("pin_loop", loop))]
    assert c1.verdict == "confirmed" and c1.note == "2.00x faster" and c2.verdict == "inconclusive"
    pre = L.check_gpu_only(gpu_lesson, "prefetcher", object(), Estimate(1.02, 1.01, 1.03), "the copy is 5% of a step")
    assert pre.verdict == "confirmed" and pre.note == "the copy is 5% of a step"
    no_nvml = L.check_sawtooth(gpu_lesson, SimpleNamespace(before=_run(100.0), after=_run(500.0)))
    assert no_nvml.note == "NVML utilization not available on this GPU"


def test_a_smoke_run_on_a_gpu_says_the_sizes_are_too_small():
    les = _lesson(GPU, smoke=True)
    copy = SimpleNamespace(verdict="faster", estimate=lambda: Estimate(2.0, 1.9, 2.1))
    claims = [L.check_gpu_only(les, k, copy, copy) for k in ("pin_copy", "pin_loop")] + [
        L.check_gpu_only(les, "prefetcher", object(), Estimate(1.1, 1.0, 1.2)),
                                                L.check_prefetch_factor(les, Estimate(1.1, 1.0, 1.2), 2)]
    assert all(c.verdict == "not tested" and c.note == L.SMOKE_WHY for c in claims)


def test_figures_draw_on_the_cpu_path(tmp_path):
    import matplotlib.pyplot as plt

    class Images:
        paths = []

        def __getitem__(self, i):
            return torch.zeros(3, 8, 8), i

    L.samples_figure(Images())
    sweep = SimpleNamespace(rows=[dict(num_workers=w, pin_memory=False, samples_per_s=100.0 * (w + 1)) for w in (0, 1)])
    pred = dict(load_s_per_batch=0.1, step_s_per_batch=0.02, cores=2)
    ref = {"extra": {"dataloader_sweep": {"rows": [dict(num_workers=0, pin_memory=False, samples_per_s=90.0)]}}}
    L.sweep_figure(sweep, [0, 1], (False,), pred, 8, gpu=False, ref=ref)
    _, rows = L.utilization_rows(_util({0: 100.0, 1: 200.0}))
    L.utilization_figure(rows, [0, 1], gpu=False)
    L.epoch_figure(_starts(), 2)
    plt.close("all")


def test_paired_all_over_half_decides_the_claims_about_that_pair(gpu_lesson):
    """Two separately timed rates with wide spreads leave the pair's claims open; the interleaved ratio decides them
    (and can come out either way)."""
    rates = _rates(_util({0: 100.0, 1: 180.0, 2: 300.0, 4: 500.0, 8: 900.0, 16: 1000.0}, spread=0.12))
    open_ = L.check_workers(gpu_lesson, rates, cores=16, rule_of_thumb=8)
    assert [c.verdict for c in open_[1:4]] == ["inconclusive"] * 3
    more = L.check_workers(_lesson(GPU, smoke=False), rates, cores=16, rule_of_thumb=8,
                           all_over_half=Estimate(1.11, 1.08, 1.15))
    half, past, thumb = more[1:4]
    assert past.verdict == "refuted" and past.side == "higher" and past.note == L.PAIRED
    assert half.measured == pytest.approx(1.0) and tuple(half.interval) == (1.0, 1.0) and half.verdict == "refuted"
    assert thumb.measured == pytest.approx(1 / 1.11) and thumb.interval[1] == pytest.approx(1 / 1.08)
    assert thumb.verdict == "refuted" and thumb.note == L.PAIRED_THUMB and "1 / (all cores'" in thumb.note
    same = L.check_workers(_lesson(GPU, smoke=False), rates, cores=16, rule_of_thumb=8,
                           all_over_half=Estimate(1.01, 0.99, 1.03))
    assert [c.verdict for c in same[1:4]] == ["confirmed", "confirmed", "confirmed"]
    assert same[1].measured == pytest.approx(0.5) and same[1].interval[1] <= 0.5


def test_paired_knee_keeps_the_sweep_where_the_pair_is_undecided():
    est = Estimate(8, 4, 16)
    rates = {4: Estimate(1, 1, 1), 8: Estimate(1, 1, 1), 16: Estimate(1, 1, 1)}
    assert L.paired_knee(est, rates, Estimate(1.05, 1.0, 1.1), half=8, cores=16) is est
    assert L.paired_knee(est, rates, None, half=8, cores=16) is est
    assert L.paired_knee(est, rates, Estimate(1.2, 1.1, 1.3), half=8, cores=16).interval == (16, 16)
    # a second H100 run: one slow sweep window at 8 workers put the knee surely at 16, while the pair could not tell
    sure16 = Estimate(16, 16, 16)
    widened = L.paired_knee(sure16, rates, Estimate(1.054, 0.996, 1.204), half=8, cores=16)
    assert widened.value == 16 and widened.interval == (8, 16)


def test_paired_four_over_zero_decides_the_headline_ratio_either_way(gpu_lesson):
    """4 vs 0 workers from two wide sweep rates is open; the interleaved ratio decides it, on either side."""
    rates = _rates(_util({0: 100.0, 1: 180.0, 2: 300.0, 4: 450.0, 8: 900.0, 16: 1000.0}, spread=0.12))
    assert L.check_workers(gpu_lesson, rates, cores=16, rule_of_thumb=8)[0].verdict == "inconclusive"
    low = L.check_workers(_lesson(GPU, smoke=False), rates, cores=16, rule_of_thumb=8,
                          four_over_zero=Estimate(3.5, 3.4, 3.6), four_note="paired")[0]
    assert (low.verdict, low.side, low.note) == ("refuted", "lower", "paired")
    inside = L.check_workers(_lesson(GPU, smoke=False), rates, cores=16, rule_of_thumb=8,
                             four_over_zero=Estimate(4.9, 4.7, 5.1))[0]
    assert inside.verdict == "confirmed" and inside.measured == pytest.approx(4.9)


def test_tables_and_scaling_say_what_ran():
    util = _util({0: 100.0, 2: 400.0, 4: 410.0}, cpu=70.0)
    rates, rows = L.utilization_rows(util)
    assert rows[0]["samples_per_s_interval"] == [pytest.approx(98.0), pytest.approx(102.0)]
    assert rows[0]["median_call_samples_per_s"] == pytest.approx(110.0) and rows[0]["mfu"] is None
    thr = {w: r.throughput for w, r in util}
    assert L.worker_scaling(thr, rates, cores=4, need=2) == dict(
        knee_95=2, knee_95_interval=[2, 4], best=4, half_cores=2, cores=4, predicted=2,
        throughput={"0": 100.0, "2": 400.0, "4": 410.0})
    assert L.table(["a", "b"], [[1, "2 ms"]]) == "| a | b |\n|---|---|\n| 1 | 2 ms |"
    les = _lesson(GPU, smoke=False)
    assert L.image_dir(les) == gl.results.data_dir() / "images"
    assert L.image_dir(_lesson(GPU, smoke=True)) == Path(tempfile.gettempdir()) / "gpulab-smoke-images"


def test_the_case_studys_45_to_8_ms_is_not_comparable_anywhere(gpu_lesson):
    """Another system's numbers (issue: one rule for other systems): never confirmed or refuted, ours beside."""
    ratio, ms = L.check_data_wait(gpu_lesson, Estimate(0.12, 0.11, 0.13), Estimate(0.0004, 0.0003, 0.0005), 16)
    assert ratio.verdict == ms.verdict == "not comparable"
    assert ratio.measured == pytest.approx(300.0) and ms.measured == pytest.approx(0.4)
    assert "120 ms starved" in ms.note and "16 workers" in ratio.note


def test_every_claim_quotes_the_guide():
    for spec in map(_as_spec, L.CLAIMS):  # verbatim in the guide: tests/test_technique_in_cells.py
        assert spec.quote and spec.source, spec.key


def test_the_paired_worker_claims_keep_their_pairs():
    """All against half, 4 workers against none and prefetch_factor 2 -> 4 are judged on intervals of interleaved
    window pairs: 6 rounds, more (up to 12, 16, 16) only where those leave the claim undecided and only for a bounded
    time (15 s a pair), so the notebook stays within its four minutes on a many-core host (where one round of all the cores'
    workers, or one starved window, takes seconds), and an interval that says inconclusive where the ratio sits near
    its band's edge. The starved pair times one batch per call: a window needs at least four calls."""
    cells = (Path(__file__).parents[1] / "notebooks" / "05_data_overlap.ipynb").read_text()
    assert "EARLY = dict(min_rounds=6, budget_s=15.0) if lesson.gpu else {}" in cells
    assert 'decided=M.settles(lesson, \\"past_half\\", feeds.paired_ratio)' in cells
    assert 'decided=M.settles(lesson, \\"four_vs_zero\\")' in cells and "batches_per_call=1, **PAIR" in cells
    assert 'decided=M.settles(lesson, \\"prefetch_factor\\", feeds.paired_ratio)' in cells
    assert "rounds=12 if lesson.gpu else 2, pair_interval=\\\"t\\\"))" in cells
    assert "rounds=16 if lesson.gpu else 2), headline=True)" in cells
    assert "all_over_half = feeds.paired_ratio(cmp_workers)" in cells and "pf_gain = feeds.paired_ratio(cmp_pf)" in cells
    assert "t-interval" in L.PAIRED


def test_busy_intervals_merge_and_draw():
    """The sawtooth is drawn from a trace's busy intervals: overlapping kernels merge, gaps stay gaps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpulab.tools.traces import union_spans

    assert union_spans([(0.5, 0.6), (0.0, 0.2), (0.1, 0.3)]) == [(0.0, 0.3), (0.5, 0.6)]
    L.busy_idle_figure({"starved": [(0.0, 0.1), (0.9, 1.0)], "fed": [(0.0, 0.5), (0.5, 1.0)], "empty": []},
                       "GPU kernels", 4)
    plt.close("all")


def test_feed_takes_a_prefetcher_class_of_ones_own():
    """`Feed(prefetch=SomeClass)` iterates SomeClass(batches, device) on CUDA; off CUDA it is the plain loop."""
    import torch

    from gpulab.tools import feeds

    seen = []
    feed = feeds.Feed(feeds.cycle([(torch.ones(2, 3), torch.zeros(2))]), lambda x, y: seen.append(x.shape), "cpu",
                      prefetch=lambda batches, device: batches)
    feed.run(3)
    assert feed.prefetch is False and seen == [torch.Size([2, 3])] * 3 and feed.samples == 6
