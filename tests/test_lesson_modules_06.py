"""Notebook 06's scaffolding on the CPU: its sizes and parameters, its claims as data, the verdicts on what it
measured (on a CPU run and on a pretend GPU run at full sizes, with fake sweeps and comparisons), and the tables,
sentences and figures that report it."""
import json
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import pytest
import torch

import gpulab as gl
from gpulab.batchsize import BatchSizeSearch, GPTTrainStep, grad_accumulation_matches
from gpulab.claims import Estimate
from gpulab.device import DeviceInfo
from gpulab.lesson import _as_spec
from gpulab.lessons import batch_size_claims as C
from gpulab.lessons import batch_size_lesson as L
from gpulab.workloads import GPTConfig
from _notebook_run import parameters_cell

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent
NAME = "06_batch_size"
GPU = DeviceInfo(kind="cuda", name="pretend GPU", capability=(9, 0), memory_gb=80.0)


def _parameters() -> dict:
    return parameters_cell(NAME)


def _lesson(device, smoke=False, **params):
    ns = _parameters() | {"SMOKE": smoke} | params
    return gl.lesson(NAME, ns, full=L.FULL, smoke=L.SMOKE, claims=L.claims(ns["ACCUM_STEPS"]), device=device,
                     show=False), ns


@pytest.fixture
def gpu_lesson(tmp_path, monkeypatch):
    """A lesson on a pretend GPU at full sizes: every claim's needs are met."""
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
    """A fake RunResult: tokens/s with a ±2% interval, and NVML samples around `nvml`."""
    return SimpleNamespace(throughput_estimate=lambda: Estimate(tokens_per_s, 0.98 * tokens_per_s,
                                                                1.02 * tokens_per_s), trace=_Trace(nvml))


# The guide's §6.2 table as a sweep (samples/s, GB, NVML %), plus batch 12, at 1024 tokens a sequence.
GUIDE = {8: (120, 12, 45), 12: (165, 15, 53), 16: (220, 18, 65), 32: (380, 28, 85), 64: (480, 45, 92)}


def _sweep(table=GUIDE, oom=(128,), seq_len=1024):
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
    return rows, runs


def _cmp(speedup, lo, hi, verdict="faster"):
    return SimpleNamespace(speedup=speedup, within_noise=False, verdict=verdict,
                           estimate=lambda: Estimate(speedup, lo, hi))


# ---------------------------------------------------------------- claims as data, sizes and parameters


def test_claims_are_valid_specs_and_keep_the_contracts_texts():
    specs = [_as_spec(c) for c in L.claims(4)]
    assert len({s.key for s in specs}) == len(specs) == 19
    contract = json.loads((ROOT / "tests" / "data" / "notebook_contract.json").read_text())[NAME]
    assert sorted(s.text for s in specs) == sorted(contract["claims"])
    numerics = {s.key for s in specs if not s.needs}
    assert numerics == {"grads_same", "batchnorm", "convergence"}  # everything else needs a GPU at full size
    assert all(s.needs == ("cuda", "full") for s in specs if s.key not in numerics)
    assert "con: 16x more forward passes" in next(c["text"] for c in L.claims(16) if c["key"] == "accum_slower")


def test_smoke_sizes_replace_the_model_and_are_recorded(cpu_device):
    threads = torch.get_num_threads()
    try:
        les, ns = _lesson(cpu_device)  # no GPU: smoke sizes whatever SMOKE says
        assert les.small and les.result.smoke is True
        L.use_sizes(les, ns)
        assert (ns["MODEL"], ns["SEQ_LEN"], ns["MAX_BATCH"]) == ("smoke", 32, 32)
        assert ns["MIN_TIME_S"] == 0.05 and ns["SIM_MEMORY_MB"] == 8 and les.sizes["MODEL"] == "smoke"
    finally:
        torch.set_num_threads(threads)


def test_full_sizes_stay_on_a_gpu_and_params_keep_the_reference_keys(gpu_lesson):
    ns = _parameters()
    L.use_sizes(gpu_lesson, ns)
    assert ns == _parameters() and not gpu_lesson.small and gpu_lesson.result.smoke is False
    ns["DTYPE"] = "bf16"
    ref = json.loads((ROOT / "data" / "reference" / "nvidia-h100-80gb-hbm3" / f"{NAME}.json").read_text())
    got = L.params(ns)
    # the full-size run records what the reference run recorded (and may add keys a later reference gains)
    assert {k: got.get(k) for k in ref["params"]} == ref["params"]


def test_the_guides_cleanup_replaces_the_oom():
    out = L.run_guide_search(512)
    assert out.startswith("UnboundLocalError") and "outputs" in out
    assert "del inputs, outputs, loss" in L.source(L.guide_search_step).data


# ---------------------------------------------------------------- reports


def test_search_report_on_a_cpu_and_on_a_gpu(cpu_lesson, gpu_lesson):
    search = BatchSizeSearch(max_fitting=32, best_throughput=16, tried=[dict(fits=True), dict(fits=False)])
    cpu = L.search_report(cpu_lesson, search, None, None, 32, 8)
    assert "simulated 8 MB" in cpu and "**32** (the cap: more may fit)" in cpu
    search = BatchSizeSearch(max_fitting=48, best_throughput=32, tried=[dict(fits=True), dict(fits=False)],
                             memory_allocated_between_steps=2_000_000_000, memory_allocated_after=2_000_000_000)
    gpu = L.search_report(gpu_lesson, search, 500_000_000, 2_000_000_000, 256, 8)
    assert "| before the search (weights) | 0.500 |" in gpu and "1 out-of-memory errors later | 2.000" in gpu
    assert "Memory is back" in gpu and "the cap" not in gpu
    search.memory_allocated_after = 3_000_000_000
    assert "**Memory is not back**" in L.search_report(gpu_lesson, search, 500_000_000, 3_000_000_000, 256, 8)


def test_sweep_table_marks_out_of_memory_rows():
    rows, _ = _sweep()
    table = L.sweep_table(rows)
    assert table.count("\n") == 2 + len(rows) and "| 128 | out of memory |" in table
    assert "| 8 | " in table and "| 45% |" in table and "| 12.0 GB |" in table and "| n/a |" in table


def test_sweep_reads_best_knee_sweet_spot_and_gains():
    sw = C.Sweep(*_sweep(), max_fitting=100, seq_len=1024)
    assert [r["batch_size"] for r in sw.ok] == [8, 12, 16, 32, 64] and sw.best == 64
    assert sw.knee == 64 and sw.sweet.value == 32  # the guide's own table gives its own sweet spot
    assert sw.gain(32, 64).value == pytest.approx(480 / 380 * 100 - 100)
    assert sw.gain(32, 128) is None and sw.nvml(128) is None and sw.get(128, "nvml_util") is None
    assert sw.scaling() == dict(best=64, knee_90=64, max_fitting=100,
                                sweet_spot=[sw.sweet.value, sw.sweet.lo, sw.sweet.hi])


def test_scaling_report_shows_nvml_only_on_a_gpu():
    sw = C.Sweep(*_sweep(), max_fitting=100, seq_len=1024)
    gpu = L.scaling_report(sw, True)
    assert "from 120.0 to 480.0 samples/s (4.0x)" in gpu and "sweet spot" in gpu and "NVML's 'GPU busy'" in gpu
    assert "NVML" not in L.scaling_report(sw, False)


def test_figures_draw_on_a_cpu_and_on_a_gpu(cpu_lesson, gpu_lesson):
    import matplotlib.pyplot as plt

    sw = C.Sweep(*_sweep(), max_fitting=100, seq_len=1024)
    for les in (cpu_lesson, gpu_lesson):
        L.sweep_figures(sw.ok, les, GPTConfig.smoke(), model="smoke", seq_len=32, dtype="fp32", sim_memory_mb=8)
    L.grad_figure({"GPT, float32": dict(rel_diff=1e-7), "CNN with BatchNorm, float32": dict(rel_diff=0.1)})
    plt.close("all")


def test_eighty_and_accumulation_sentences():
    share = L.eighty_share(_cmp(1.2, 1.1, 1.3), 80, 100)  # time ratio 1.2 at 80/100 the tokens
    assert share.value == pytest.approx(0.96) and share.lo == pytest.approx(0.88)
    rec = L.eighty_record(100, 80, 128, share, 40.0, 50.0)
    assert rec["throughput_share"] == [share.value, share.lo, share.hi] and rec["peak_mem_gb"] == {"b80": 40.0,
                                                                                                   "max": 50.0}
    note = L.top_note(100, 128)
    assert "batch 128 fit the search's few steps" in note and L.top_note(128, 128) == ""
    text = L.eighty_report(100, 80, share, 40.0, 50.0, 64, note)
    assert "**96.0%**" in text and "40.0 GB instead of 50.0 GB" in text and text.endswith("is the maximum here.")
    assert "GB" not in L.eighty_report(100, 80, share, None, None, 64, "")
    acc = L.accum_report(_cmp(0.8, 0.75, 0.85), Estimate(1.25, 1.18, 1.33), 4, 64, 30.0, 10.0)
    assert "**1.25x** [1.18, 1.33]" in acc and "4 micro-batches of 16" in acc and "(3.0x less)" in acc
    assert "(outside the noise)" in acc
    assert "GB" not in L.accum_report(_cmp(0.8, 0.75, 0.85), Estimate(1.25, 1.18, 1.33), 4, 64, None, None)


def test_model_note_and_widget_run_on_a_cpu(cpu_device):
    threads = torch.get_num_threads()
    try:
        step = GPTTrainStep(GPTConfig.smoke(), seq_len=16, device="cpu")
        note = L.model_note(step, "smoke", 16, "fp32", None)
        assert "GPT `smoke`" in note and "no peak" in note
        assert "the datasheet dense BF16 peak, 989 TFLOP/s" in L.model_note(step, "smoke", 16, "bf16", 989)
        run = L.one_batch(step, flops_per_seq=step.flops_per_sequence(), seq_len=16, dtype="fp32",
                          min_time_s=0.01, device=cpu_device)
        out = run(2).data
        assert out.startswith("batch 2:") and "samples/s" in out
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------- verdicts


def test_a_cpu_run_tests_the_numerics_and_says_why_not_for_the_rest(cpu_lesson):
    les = cpu_lesson
    sw = C.Sweep(*_sweep(), max_fitting=32, seq_len=32)
    scaling = C.check_scaling(les, sw)
    assert all(c.verdict == "not tested" and "needs a CUDA GPU" in c.note for c in scaling)
    assert C.check_batch_8_64(les, _cmp(4, 3.9, 4.1), 8, 15).note.startswith("needs a CUDA GPU")
    assert C.check_eighty(les, sw, 15, 12, Estimate(0.9, 0.8, 1.0), "").verdict == "not tested"
    torch.manual_seed(0)
    x, y = torch.randn(16, 6), torch.randint(3, (16,))
    lin = grad_accumulation_matches(lambda: torch.nn.Linear(6, 3), x, y, torch.nn.functional.cross_entropy, 4)
    bn = grad_accumulation_matches(lambda: torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                                                               torch.nn.Linear(8, 3)),
                                   x, y, torch.nn.functional.cross_entropy, 4)
    checks = {"GPT, float32": lin, "GPT, float64": lin, "CNN with BatchNorm, float32": bn}
    same, differ = C.check_gradients(les, checks)
    assert same.verdict == differ.verdict == "confirmed" and "float64 gives" in same.note
    cost = C.check_accumulation_cost(les, _cmp(0.8, 0.75, 0.85), Estimate(1.25, 1.2, 1.3), 16, 4, None, None)
    assert [c.verdict for c in cost] == ["not tested", "not tested"]
    rest = C.record_the_rest(les, sw, b_top=15, b_acc=8, mem_big=None, mem_acc=None, model="smoke")
    assert all(c.verdict == "not tested" for c in rest) and "training dynamics" in rest[0].note
    assert "needs a CUDA GPU" in rest[1].note
    assert not les.pending()
    data = json.loads(Path(les.save()).read_text())
    assert len(data["claims"]) == 19 and all(c["note"] for c in data["claims"] if c["verdict"] == "not tested")


def test_a_gpu_run_judges_every_claim_it_has_the_batches_for(gpu_lesson):
    les = gpu_lesson
    sw = C.Sweep(*_sweep(), max_fitting=100, seq_len=1024)
    util, sweet, mem, util12, speed12, gain = C.check_scaling(les, sw)
    assert util.verdict == "confirmed" and util.measured == pytest.approx(47)  # 45% -> 92%: 47 points
    assert sweet.verdict in ("confirmed", "inconclusive") and sweet.measured == 32
    assert mem.verdict == "confirmed" and mem.measured == pytest.approx(45 / 12)
    assert util12.measured == pytest.approx((53 / 45 - 1) * 100) and "throughput +38%" in util12.note
    assert "quartiles" in speed12.note and speed12.verdict != "not tested"
    # the paired rounds decide it where they ran: time ratio 0.80 at 16/12 the tokens is a 6.7% throughput gain
    paired = C.check_scaling(les, sw, _cmp(0.80, 0.79, 0.81))[4]
    assert paired.measured == pytest.approx(0.8 * 16 / 12 * 100 - 100) and "interleaved rounds" in paired.note
    assert paired.interval == pytest.approx([0.79 * 16 / 12 * 100 - 100, 0.81 * 16 / 12 * 100 - 100])
    assert paired.verdict == "confirmed"
    assert gain.measured == pytest.approx(480 / 380 * 100 - 100)
    b864 = C.check_batch_8_64(les, _cmp(4.0, 3.8, 4.2), 64, 100)
    assert b864.verdict == "confirmed" and "equal work" in b864.note
    eighty = C.check_eighty(les, sw, 64, 51, Estimate(0.97, 0.96, 0.98), "")
    assert eighty.verdict == "confirmed" and eighty.note == "interval from the paired rounds"
    slower, memory = C.check_accumulation_cost(les, _cmp(0.8, 0.75, 0.85), Estimate(1.25, 1.2, 1.3), 64, 16,
                                               30.0, 10.0)
    assert slower.verdict == "confirmed" and slower.note == "B=64; faster"
    assert memory.verdict == "confirmed" and memory.measured == pytest.approx(3.0)
    rest = C.record_the_rest(les, sw, b_top=64, b_acc=64, mem_big=30.0, mem_acc=10.0, model="gpt2_small")
    assert rest[0].verdict == "not tested"
    assert all(c.verdict == "not comparable" for c in rest[1:])
    assert rest[1].measured == 100 and "gpt2_small, 1024 tokens" in rest[1].note
    assert rest[2].measured == pytest.approx(120) and "12.0 GB" in rest[2].note
    assert "peak at batch 64 of 80 GB" in rest[5].note and rest[5].measured == 45
    assert rest[6].measured == pytest.approx(92)


def test_a_gpu_run_says_which_batch_or_reading_is_missing(gpu_lesson):
    les = gpu_lesson
    small = {b: v for b, v in GUIDE.items() if b <= 16}  # batch 32 and 64 do not fit
    sw = C.Sweep(*_sweep(small, oom=()), max_fitting=20, seq_len=1024)
    util, sweet, mem, *_ , gain = C.check_scaling(les, sw)
    assert util.verdict == mem.verdict == gain.verdict == "not tested"
    assert util.note.startswith("batch 64 not measured") and "largest in the search: 20" in util.note
    assert gain.note.startswith("batch 32, 64 not measured")
    assert C.check_batch_8_64(les, _cmp(4, 3.9, 4.1), 16, 20).note == "batch 64 does not fit (largest: 20)"
    no_nvml = C.Sweep(*_sweep({b: (s, g, None) for b, (s, g, _) in GUIDE.items()}), max_fitting=100, seq_len=1024)
    assert C.check_scaling(les, no_nvml)[0].note == "not measured on this GPU (NVML or GPM unavailable)"
    assert C.check_eighty(les, sw, 16, 16, Estimate(1, 1, 1), "").verdict == "not tested"  # 80% of 1 is 1
    memory = C.check_accumulation_cost(les, _cmp(0.8, 0.75, 0.85), Estimate(1.25, 1.2, 1.3), 16, 4, None, None)[1]
    assert memory.verdict == "not tested" and "peak memory" in memory.note
    rest = C.record_the_rest(les, sw, b_top=16, b_acc=16, mem_big=None, mem_acc=None, model="gpt2_small")
    assert rest[3].verdict == "not tested" and rest[3].note == "not measured in this run"
