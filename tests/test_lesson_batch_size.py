"""Notebook 06's lesson module (gpulab/lessons/batch_size.py): claims as data with the guide's words, the sweep read
by batch size, each claim's verdict on a pretend GPU and on a CPU, and the figures."""
import json
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import pytest
import torch

import gpulab as gl
from gpulab.tools.batchsize import grad_accumulation_matches
from gpulab.measuring.estimates import Estimate
from gpulab.measuring.device import DeviceInfo
from gpulab.verdicts.lesson import _as_spec
from gpulab.lessons import batch_size as M
from gpulab.workloads.models import GPTConfig
from _notebook_run import parameters_cell

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent
NAME = "06_batch_size"
GPU = DeviceInfo(kind="cuda", name="pretend GPU", capability=(9, 0), memory_gb=80.0)


def _lesson(device, smoke=False, **params):
    ns = parameters_cell(NAME) | {"SMOKE": smoke} | params
    return gl.lesson(NAME, ns, claims=M.CLAIMS, device=device, show=False), ns


@pytest.fixture
def gpu_lesson(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    return _lesson(GPU)[0]


@pytest.fixture
def cpu_lesson(cpu_device, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    threads = torch.get_num_threads()
    yield _lesson(cpu_device)[0]
    torch.set_num_threads(threads)


class _Trace:
    def __init__(self, nvml):
        self.nvml = nvml

    def estimate(self, metric):
        return None if metric != "nvml_util" or self.nvml is None else Estimate(self.nvml, self.nvml - 1, self.nvml + 1)


def _run(tokens_per_s, nvml=None):
    return SimpleNamespace(throughput_estimate=lambda: Estimate(tokens_per_s, 0.98 * tokens_per_s,
                                                                1.02 * tokens_per_s), trace=_Trace(nvml))


# The guide's §6.2 table as a sweep (samples/s, GB, NVML %), plus batch 12.
GUIDE = {8: (120, 12, 45), 12: (165, 15, 53), 16: (220, 18, 65), 32: (380, 28, 85), 64: (480, 45, 92)}


def _sweep(table=GUIDE, oom=(128,), seq_len=128):
    rows, runs = [], {}
    for b, (sps, gb, nvml) in table.items():
        rows.append(dict(batch_size=b, oom=False, step_ms=b / sps * 1e3, samples_per_s=sps,
                         tokens_per_s=sps * seq_len, mfu=0.1 + b / 1000, nvml_util=nvml,
                         gpm_sm_active=None if nvml is None else nvml - 10, gpm_tensor_active=None,
                         cpu_percent=None, peak_mem_gb=gb))
        runs[b] = _run(sps * seq_len, nvml)
    rows += [dict(batch_size=b, oom=True, step_ms=None, samples_per_s=None, tokens_per_s=None, mfu=None,
                  nvml_util=None, gpm_sm_active=None, gpm_tensor_active=None, cpu_percent=None, peak_mem_gb=None)
             for b in oom]
    return M.Sweep(rows, runs, seq_len=seq_len)


def _cmp(speedup, lo, hi, items=(1, 1), seconds=(0.08, 0.02)):
    return SimpleNamespace(speedup=speedup, within_noise=False, verdict="faster",
                           estimate=lambda: Estimate(speedup, lo, hi),
                           before=SimpleNamespace(items=items[0], seconds=seconds[0]),
                           after=SimpleNamespace(items=items[1], seconds=seconds[1]))


def test_claims_quote_the_guide_and_keep_the_contracts_texts():
    specs = [_as_spec(c) for c in M.CLAIMS]
    assert len({s.key for s in specs}) == len(specs) == 19
    contract = json.loads((ROOT / "tests" / "data" / "notebook_contract.json").read_text())[NAME]
    assert sorted(s.text for s in specs) == sorted(contract["claims"])
    numerics = {s.key for s in specs if not s.needs}
    assert numerics == {"grads_same", "batchnorm", "convergence"}
    for s in specs:  # verbatim in the guide: tests/test_technique_in_cells.py, for every lesson
        assert s.quote and s.source, s.key


def test_sizes_come_from_the_schema(cpu_device):
    threads = torch.get_num_threads()
    try:
        les, ns = _lesson(cpu_device)  # no GPU: the smoke sizes
        assert (ns["MODEL"], ns["SEQ_LEN"], ns["SWEEP_SEQ_LEN"], ns["MAX_BATCH"]) == ("smoke", 32, 16, 32)
        les, ns = _lesson(GPU)
        assert (ns["MODEL"], ns["SEQ_LEN"], ns["SWEEP_SEQ_LEN"], ns["ACCUM_STEPS"]) == ("gpt2_small", 1024, 128, 4)
    finally:
        torch.set_num_threads(threads)


def test_sweep_reads_best_knee_sweet_spot_gains_and_its_table():
    sw = _sweep()
    assert [r["batch_size"] for r in sw.ok] == [8, 12, 16, 32, 64] and sw.best == 64
    assert sw.knee == 64 and sw.sweet.value == 32  # the guide's own table gives its own sweet spot
    assert sw.gain(32, 64).value == pytest.approx(480 / 380 * 100 - 100)
    assert sw.gain(32, 128) is None and sw.nvml(128) is None and sw.get(128, "nvml_util") is None
    assert sw.scaling() == dict(best=64, knee_90=64, seq_len=128, sweet_spot=[sw.sweet.value, sw.sweet.lo, sw.sweet.hi])
    table = sw.table()
    assert table.count("\n") == 1 + len(sw.rows) and "| 128 | out of memory |" in table and "| 45.0% |" in table


def test_figures_draw_on_a_cpu_and_on_a_gpu(cpu_lesson, gpu_lesson):
    import matplotlib.pyplot as plt

    for les in (cpu_lesson, gpu_lesson):
        M.sweep_figures(_sweep(), les, GPTConfig.smoke(), 8)
    M.grad_figure({"GPT, float32": dict(rel_diff=1e-7), "CNN with BatchNorm, float32": dict(rel_diff=0.1)})
    plt.close("all")


def test_a_cpu_run_tests_the_numerics_and_says_why_not_for_the_rest(cpu_lesson):
    les, sw = cpu_lesson, _sweep()
    assert all(c.verdict == "not tested" and "needs a CUDA GPU" in c.note for c in M.check_scaling(les, sw))
    assert M.check_batch_8_64(les, _cmp(4, 3.9, 4.1), 8).note.startswith("needs a CUDA GPU")
    assert M.check_eighty(les, 15, 12, Estimate(0.9, 0.8, 1.0), "").verdict == "not tested"
    torch.manual_seed(0)
    x, y = torch.randn(16, 6), torch.randint(3, (16,))
    lin = grad_accumulation_matches(lambda: torch.nn.Linear(6, 3), x, y, torch.nn.functional.cross_entropy, 4)
    bn = grad_accumulation_matches(lambda: torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                                                               torch.nn.Linear(8, 3)),
                                   x, y, torch.nn.functional.cross_entropy, 4)
    same, differ = M.check_gradients(les, {"GPT, float32": lin, "GPT, float64": lin, "CNN with BatchNorm, float32": bn})
    assert same.verdict == differ.verdict == "confirmed" and "float64 gives" in same.note
    cost = M.check_accumulation(les, Estimate(1.25, 1.2, 1.3), 16, 4, None, None)
    assert [c.verdict for c in cost] == ["not tested", "not tested"]
    rest = M.record_the_rest(les, sw, max_fitting=32, b_top=15, mem_top=None, b_acc=8, mem_big=None, mem_acc=None,
                             seq_len=32)
    assert all(c.verdict == "not tested" for c in rest) and "training dynamics" in rest[0].note
    assert not les.pending()
    data = json.loads(Path(les.save()).read_text())
    assert len(data["claims"]) == 19 and all(c["quote"] for c in data["claims"])


def test_a_gpu_run_judges_every_claim_it_has_the_batches_for(gpu_lesson):
    les, sw = gpu_lesson, _sweep()
    util, sweet, mem, util12, speed12, gain = M.check_scaling(les, sw)
    assert util.verdict == "confirmed" and util.measured == pytest.approx(47)  # 45% -> 92%: 47 points
    assert "our sequence length 128 tokens" in util.note
    assert sweet.measured == 32 and mem.verdict == "confirmed" and mem.measured == pytest.approx(45 / 12)
    # the table's 8, 12 and 16 take about one step time (66.7, 72.7, 72.7 ms): launch-bound, so no verdict
    assert util12.verdict == speed12.verdict == "not tested" and "66.7 ms at batch 8 and 72.7 ms at 12" in util12.note
    # paired rounds: time ratio 0.80 with 16/12 the tokens per call is a 6.7% gain in tokens/s (work-normalised)
    paired = M.check_scaling(les, sw, _cmp(0.80, 0.79, 0.81, items=(12 * 128, 16 * 128), seconds=(0.08, 0.1)))[4]
    assert paired.measured == pytest.approx(0.8 * 16 / 12 * 100 - 100) and "tokens/s" in paired.note
    assert paired.verdict == "confirmed"
    assert gain.measured == pytest.approx(480 / 380 * 100 - 100) and "windows' spread" in gain.note
    # 32 -> 64 in paired rounds: time ratio 0.63 at twice the tokens per call is +26% tokens/s, inside 23-29%
    paired64 = M.check_scaling(les, sw, paired_32_64=_cmp(0.63, 0.625, 0.635, items=(32 * 128, 64 * 128),
                                                     seconds=(0.063, 0.1)))[5]
    assert paired64.measured == pytest.approx(26) and paired64.interval == pytest.approx((25, 27))
    assert paired64.verdict == "confirmed" and "at 64 / at 32 in interleaved rounds" in paired64.note
    b864 = M.check_batch_8_64(les, _cmp(4.0, 3.8, 4.2), 64, seq_len=512)
    assert b864.verdict == "confirmed" and "equal work" in b864.note
    assert "one step at 512 tokens: 10.0 ms small, 20.0 ms big (2.00x the time for 8x the work): the small step is " \
        "launch-bound" in b864.note
    eighty = M.check_eighty(les, 64, 51, Estimate(0.97, 0.96, 0.98), "")
    assert eighty.verdict == "confirmed" and "tokens/s" in eighty.note
    slower, memory = M.check_accumulation(les, Estimate(1.25, 1.2, 1.3), 64, 4, 30.0, 10.0)
    assert slower.verdict == "confirmed" and memory.measured == pytest.approx(3.0)
    rest = M.record_the_rest(les, sw, max_fitting=100, b_top=85, mem_top=60.0, b_acc=32, mem_big=30.0, mem_acc=10.0,
                             seq_len=1024)
    assert rest[0].verdict == "not tested" and all(c.verdict == "not comparable" for c in rest[1:])
    assert rest[1].measured == 100 and "1024 tokens" in rest[1].note
    assert rest[2].measured == pytest.approx(120) and "12.0 GB" in rest[2].note
    assert rest[5].measured == 60.0 and rest[6].measured == pytest.approx(92)


def test_utilization_8_64_reads_its_own_longer_run_where_it_ran(gpu_lesson):
    les, sw = gpu_lesson, _sweep()
    util = _sweep({8: (300, 3, 40), 64: (800, 30, 97)}, oom=(), seq_len=512)
    claim = M.check_scaling(les, sw, util=util)[0]
    assert claim.measured == pytest.approx(57) and claim.verdict == "confirmed"
    assert "our sequence length 512 tokens" in claim.note and "the sweep at 128 tokens read NVML 45.0% -> 92.0%" \
        in claim.note and "step 26.7 ms at 8, 80.0 ms at 64" in claim.note
    no_64 = _sweep({8: (300, 3, 40)}, oom=(64,), seq_len=512)  # batch 64 ran out of memory: the sweep decides
    assert M.check_scaling(les, sw, util=no_64)[0].measured == pytest.approx(47)


def test_a_gpu_run_says_which_batch_or_reading_is_missing(gpu_lesson):
    les = gpu_lesson
    sw = _sweep({b: v for b, v in GUIDE.items() if b <= 16}, oom=())
    util, sweet, mem, *_, gain = M.check_scaling(les, sw)
    assert util.verdict == mem.verdict == gain.verdict == "not tested"
    assert util.note.startswith("batch 64 not measured") and gain.note.startswith("batch 32, 64 not measured")
    assert M.check_batch_8_64(les, _cmp(4, 3.9, 4.1), 16).note == "this run measures batch 8 -> 16"
    assert M.check_batch_8_64(les, _cmp(4, 3.9, 4.1), 64, 4).verdict == "not tested"
    no_nvml = _sweep({b: (s, g, None) for b, (s, g, _) in GUIDE.items()})
    assert M.check_scaling(les, no_nvml)[0].note == "not measured on this GPU (NVML or GPM unavailable)"
    assert M.check_eighty(les, 1, 1, Estimate(1, 1, 1), "").verdict == "not tested"  # 80% of 1 is 1
    assert M.check_accumulation(les, Estimate(1.25, 1.2, 1.3), 16, 4, None, None)[1].verdict == "not tested"


def test_utilization_8_64_stands_on_the_rounds_differences_where_they_ran(gpu_lesson):
    les, sw = gpu_lesson, _sweep()
    util = _sweep({8: (300, 3, 60), 64: (800, 30, 99)}, oom=(), seq_len=512)
    for b in (8, 64):
        util.by_b[b]["round_values"] = [0.0] * 6
    rise = Estimate(36.0, 31.0, 44.0)  # the median of six rounds' differences and their range
    claim = M.check_scaling(les, sw, util=util, util_rise=rise)[0]
    assert (claim.measured, tuple(claim.interval)) == (36.0, (31.0, 44.0))
    assert claim.verdict == "inconclusive" and "median of 6 interleaved rounds' differences" in claim.note
    assert M.check_scaling(les, sw, util=util)[0].measured == pytest.approx(39)  # without rounds: the windows' means


def test_utilization_8_12_stands_on_the_rounds_gains_where_they_ran(gpu_lesson):
    les, sw = gpu_lesson, _sweep({**GUIDE, 12: (150, 15, 53)})  # one step of 12 takes 80 ms, of 8 66.7 ms
    from_sweep = M.check_scaling(les, sw)[3]
    assert "sweep points" in from_sweep.note and from_sweep.measured == pytest.approx((53 / 45 - 1) * 100)
    assert "the sweep read NVML 45.0% -> 53.0%, throughput +25%" in from_sweep.note
    paired = M.check_scaling(les, sw, util_gain_8_12=Estimate(26.0, 22.0, 31.0), paired_seq_len=512,
                             steps_8_12={8: 25.6, 12: 36.0})[3]
    assert (paired.measured, tuple(paired.interval)) == (26.0, (22.0, 31.0))
    assert paired.verdict == "refuted" and "interleaved rounds' gains" in paired.note
    # judged at the rounds' 512 tokens: the note names that length and its step times, not the sweep's 128
    assert "step 25.6 ms at 8, 36.0 ms at 12; our sequence length 512 tokens" in paired.note
    assert "128" not in paired.note and "the sweep read" not in paired.note


def test_the_throughput_claims_say_where_they_ran_and_what_set_the_step(gpu_lesson):
    les, sw = gpu_lesson, _sweep()
    # eight steps of 8 against one of 64, each step 20 ms: launch-bound, so the ratio is 8x by construction
    flat = M.check_batch_8_64(les, _cmp(8.0, 7.9, 8.1, seconds=(0.16, 0.02)), 64, seq_len=128)
    assert flat.verdict == "not tested" and flat.note.startswith("launch-bound at 128 tokens: one step takes 20.0 ms "
                                                                 "at batch 8 and 20.0 ms at 64 (within 10%)")
    assert "by the batch ratio, 8x, by construction; measured 8x" in flat.note
    paired = M.check_scaling(les, sw, paired_32_64=_cmp(0.63, 0.625, 0.635, items=(32 * 512, 64 * 512),
                                                              seconds=(0.063, 0.1)),
                             paired_seq_len=512)[5]
    assert "our sequence length 512 tokens" in paired.note and "interleaved rounds" in paired.note
    assert "our sequence length 128 tokens" in M.check_scaling(les, sw)[5].note  # the sweep's points: its length


def test_a_step_that_takes_the_same_time_at_both_sizes_gets_no_verdict(gpu_lesson):
    les, sw = gpu_lesson, _sweep()
    # the H200 at 512 tokens: 28.2 ms a step at 12 and at 16, so tokens/s rises by 16/12 by construction
    flat = _cmp(1.0, 0.95, 1.05, items=(12 * 512, 16 * 512), seconds=(0.0282, 0.0282))
    claim = M.check_scaling(les, sw, flat, paired_seq_len=512)[4]
    assert claim.verdict == "not tested" and claim.measured is None
    assert claim.note.startswith("launch-bound at 512 tokens: one step takes 28.2 ms at batch 12 and 28.2 ms at 16 "
                                 "(within 10%)") and "the batch ratio, 1.33x, by construction; measured +33.3%" in claim.note
    slower = _cmp(0.81, 0.805, 0.815, items=(12 * 512, 16 * 512), seconds=(0.0282, 0.0348))  # 23% longer: judged
    assert M.check_scaling(les, sw, slower, paired_seq_len=512)[4].verdict == "confirmed"
    assert M.LAUNCH_BOUND_TOLERANCE == pytest.approx(0.10)
    # 8 -> 12 on NVML rounds: their own step times decide, within 10% of each other here
    util = M.check_scaling(les, sw, util_gain_8_12=Estimate(40.8, 30.4, 50.4), paired_seq_len=512,
                           steps_8_12={8: 25.6, 12: 27.9})[3]
    assert util.verdict == "not tested" and "25.6 ms at batch 8 and 27.9 ms at 12" in util.note
    assert "NVML's busy share then grows with the kernels' own time" in util.note and "+40.8%" in util.note


def test_the_step_note_says_the_gpu_sets_both_steps_only_near_the_work_ratio(gpu_lesson):
    # the H200 at 512 tokens: 8 steps of 25.5 ms against one of 75.6 ms, 2.97x the time for 8x the work
    small = M.check_batch_8_64(gpu_lesson, _cmp(2.7, 2.4, 2.9, seconds=(8 * 0.0255, 0.0756)), 64, seq_len=512)
    assert small.verdict == "refuted" and "(2.96x the time for 8x the work): the small step is launch-bound" in small.note
    assert "the GPU sets" not in small.note
    gpu = M.check_batch_8_64(gpu_lesson, _cmp(1.07, 1.0, 1.1, seconds=(8 * 0.01, 0.075)), 64, seq_len=512)
    assert gpu.note.endswith("(7.50x the time for 8x the work): the GPU sets both step times")
