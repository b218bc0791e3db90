"""Notebook 07's module on the CPU: its claims as data (quoted from the guide, one verdict per sentence), the sizes in
its schema, the verdicts on what a run measured (on the CPU and on a pretend Hopper GPU with fake runs), and its
tables and figures."""
import json
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import pytest

import gpulab as gl
from gpulab.measuring.estimates import Estimate
from gpulab.measuring.device import DeviceInfo
from gpulab.lessons import mixed_precision as M
from gpulab.verdicts.params import SCHEMAS
from gpulab.workloads.training import loss_gap_estimate
from _notebook_run import parameters_cell

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent
NAME = "07_mixed_precision"


def _lesson(device, smoke=True):
    ns = parameters_cell(NAME) | {"SMOKE": smoke}
    return gl.lesson(NAME, ns, claims=M.CLAIMS, device=device, show=False), ns


@pytest.fixture
def cpu_lesson(cpu_device):
    return _lesson(cpu_device)[0]


@pytest.fixture
def gpu_lesson():
    """A lesson on a pretend Hopper GPU at full sizes: every need of every claim is met."""
    return _lesson(DeviceInfo(kind="cuda", name="pretend GPU", capability=(9, 0)), smoke=False)[0]


def _cmp(speedup, lo=None, hi=None):
    est = Estimate(speedup, speedup if lo is None else lo, speedup if hi is None else hi)
    return SimpleNamespace(estimate=lambda: est, speedup=speedup)


def _by_key(lesson):
    return {c.key.split(".", 1)[1]: c for c in lesson.result.claims}


def test_sizes_come_from_the_schema(cpu_device):
    lesson, ns = _lesson(cpu_device)
    assert (ns["N_LAYER"], ns["BATCH_SIZE"], ns["LOSS_STEPS"], ns["ROUNDS"]) == (2, 2, 25, 2)
    full = {k: p.size_for(False) for k, p in SCHEMAS[NAME].items() if p.has_default}
    assert full["N_EMBD"] == 768 and full["VOCAB_SIZE"] == 50304 and full["MATMUL_ROUNDS"] == 4
    assert full["SMALL_GRAD_MULTIPLIER"] == 2**-10 and ns["SMALL_GRAD_MULTIPLIER"] == 2**-10
    assert lesson.result.params["LOSS_STEPS"] == 25


def test_claims_quote_the_guide_and_judge_each_sentence_once():
    keys = [c["key"] for c in M.CLAIMS]
    assert len(keys) == len(set(keys))
    quotes = [c["quote"] for c in M.CLAIMS]
    assert len(quotes) == len(set(quotes)), "one guide sentence, one claim"
    contract = json.loads((ROOT / "tests" / "data" / "notebook_contract.json").read_text())[NAME]
    assert sorted(c["text"] for c in M.CLAIMS) == contract["claims"]


def test_formats_and_tf32_on_the_cpu(cpu_lesson, cpu_device):
    rows = M.format_rows(cpu_device.torch_device)
    assert [r["agrees"] for r in rows] == ["yes"] * 4
    by = {c.key: c for c in M.check_formats(cpu_lesson, rows)}
    assert by["07.format_table"].verdict == "confirmed" and by["07.bf16_mantissa"].measured == 7
    assert by["07.tf32_mantissa"].verdict == "not tested"
    assert set(M.tf32_switches()) == {"torch.backends.cuda.matmul.allow_tf32",
                                      "torch.get_float32_matmul_precision()", "torch.backends.cudnn.allow_tf32"}
    assert [c.verdict for c in M.check_tf32_matmul(cpu_lesson, _cmp(1.0), M.tf32_ratio(cpu_device))] == \
        ["not tested", "not tested"]


def test_tf32_matmul_on_a_gpu(gpu_lesson):
    ratios = {"here": 7.4, "rtx_3090": 1.0, "device": "H100 SXM"}
    eight, twenty = M.check_tf32_matmul(gpu_lesson, _cmp(6.93, 6.85, 6.94), ratios)  # no rounds: the median's
    assert (eight.verdict, eight.side) == ("refuted", "lower") and "7.40x" in eight.note
    assert twenty.verdict == "not comparable" and round(twenty.measured) == 593 and "RTX 3090" in twenty.note


def test_loss_gap_tolerance_and_final_loss():
    ref = [4.0, 3.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    gap = loss_gap_estimate([x * 1.1 for x in ref], ref)
    assert gap.value == pytest.approx(10.0) and gap.lo <= gap.value <= gap.hi
    assert loss_gap_estimate([x * 0.9 for x in ref], ref).value == pytest.approx(-10.0)
    assert M.final_loss(ref) == 2.0
    assert M.tolerance(ref, [x * 1.05 for x in ref]) == (pytest.approx(5.0), pytest.approx(5.0))
    assert M.tolerance(ref, ref)[0] == 2.0
    with pytest.raises(ValueError):
        loss_gap_estimate([1.0], ref)


def test_a_loss_gap_over_half_the_steps_is_not_one_steps_swing():
    """08's check (20 steps, each on another batch): a last step 3.4% low moves the mean of the last two steps past
    the 2% line, the mean of the last ten by a third of that."""
    ref = [4.0] * 20
    run = [4.0 * 0.994] * 19 + [4.0 * 0.966]
    assert loss_gap_estimate(run, ref).value == pytest.approx(-2.0)  # last 10%: two steps
    half = loss_gap_estimate(run, ref, window=10)
    assert half.value == pytest.approx(-0.88) and half.lo >= -2 and half.hi <= 0


def test_convergence_band_is_the_tolerance_and_a_skipped_mode_says_why(cpu_lesson):
    fp32 = [3.0] * 20
    losses = {"fp32": fp32, "fp16": [3.09] * 20, "fp16_noscale": [3.3] * 20}
    by = {c.key: c for c in M.check_convergence(cpu_lesson, losses, 4.0, {"bf16": "no BF16 here"})}
    assert by["07.same_fp16"].verdict == "confirmed" and (by["07.same_fp16"].low, by["07.same_fp16"].high) == (-4, 4)
    assert by["07.fp16_needs_scaler"].verdict == "confirmed" and by["07.fp16_needs_scaler"].low == 4.0
    assert by["07.bf16_no_scaler"].verdict == "not tested" and by["07.bf16_no_scaler"].note == "no BF16 here"


def _runs():
    times = {"fp32": 0.115, "tf32": 0.0376, "fp16": 0.0240, "fp16_noscale": 0.0221, "bf16": 0.0242,
             "bf16_weights": 0.0170, "bf16_master": 0.0165}
    return {m: SimpleNamespace(seconds=t, items=8192, tflops=5.0 / t, mfu=0.005 / t, metric=lambda name: 90.0)
            for m, t in times.items()}


def _rows():
    losses = {m: [2.5] * 10 for m in M.LABELS}
    peak = {"fp32": 9.4, "tf32": 9.4, "fp16": 7.33, "fp16_noscale": 7.33, "bf16": 7.33, "bf16_weights": 4.7,
            "bf16_master": 5.46}
    return M.mode_rows(_runs(), losses, peak)


def test_mode_rows_and_table():
    rows = _rows()
    by = {r["key"]: r for r in rows}
    assert by["fp32"]["speedup"] == 1 and by["bf16"]["speedup"] == pytest.approx(0.115 / 0.0242)
    assert by["fp16"]["mem_saved"] == pytest.approx(22.0, abs=0.1) and by["bf16"]["loss_gap"] == 0
    html = M.modes_table(rows)._repr_html_()
    assert "MFU (BF16 peak)" in html and "9.40 GB" in html and "4.75x" in html


def test_step_claims_on_a_gpu(gpu_lesson):
    cmps = {"fp16": _cmp(4.79), "bf16": _cmp(4.76), "tf32_fp16": _cmp(1.56, 1.53, 1.62),
            "tf32_bf16": _cmp(1.55, 1.53, 1.62)}
    M.check_steps(gpu_lesson, _rows(), cmps)
    by = _by_key(gpu_lesson)
    # the baseline is FP32 as PyTorch runs it by default (TF32 off); the speedup over TF32 is in the note
    assert (by["amp_speed"].verdict, by["amp_speed"].side, by["amp_speed"].measured) == ("refuted", "higher", 4.79)
    assert "1.56x" in by["amp_speed"].note and "TF32" in by["amp_speed"].note
    assert (by["amp_memory"].verdict, by["amp_memory"].side) == ("refuted", "lower")
    assert by["bf16_002"].verdict == by["mp_003"].verdict == "not comparable"
    assert by["bf16_002"].measured == 4.76 and "24.2 ms" in by["mp_003"].note


def test_an_fp16_autocast_run_leaves_the_bf16_claims_untested(gpu_lesson):
    """After `AMP_DTYPE = torch.float16`, nothing about BF16 is judged on what is now an FP16 step."""
    import torch

    amp = M.amp_mode(torch.float16)
    rows = [dict(r, key=amp) if r["key"] == "bf16" else r for r in _rows()]
    cmps = {"fp16": _cmp(4.79), amp: _cmp(4.9), "tf32_fp16": _cmp(1.56), f"tf32_{amp}": _cmp(1.6)}
    M.check_steps(gpu_lesson, rows, cmps, amp)
    losses = {"fp32": [3.0] * 20, "fp16": [3.0] * 20, "fp16_noscale": [3.3] * 20, amp: [3.0] * 20}
    M.check_convergence(gpu_lesson, losses, 2.0, {}, amp)
    by = _by_key(gpu_lesson)
    for key in ("bf16_no_scaler", "bf16_002"):
        assert by[key].verdict == "not tested" and "this run measures FP16 autocast" in by[key].note
    assert by["fp16_needs_scaler"].verdict == "confirmed" and by["mp_003"].measured == 4.9
    with pytest.raises(ValueError, match="AMP_DTYPE"):
        M.amp_mode(torch.float32)


def test_tf32_claim_interval_holds_every_round():
    """A claim at a band edge stands on the spread of its own repeats: the median's interval widened to each
    interleaved round's ratio."""
    from gpulab.verdicts.experiment import Comparison
    from gpulab.verdicts.run_result import RunResult
    from gpulab.measuring.measurement import Measurement

    def run(per_call):
        return RunResult("x", Measurement("x", per_call, windows=[(1, t) for t in per_call]))

    cmp = Comparison("matmul", run([7.0, 7.1, 6.9, 7.2]), run([1.0, 1.0, 1.0, 0.96]))
    est = M.round_spread(cmp)
    assert est.lo <= 6.9 and est.hi >= 7.5 and est.lo <= est.value <= est.hi


def test_step_and_neighbour_claims_on_the_cpu(cpu_lesson):
    M.check_steps(cpu_lesson, _rows(), {})
    M.check_adamw(cpu_lesson, _cmp(3.0)), M.check_sdpa(cpu_lesson, _cmp(0.7))
    by = _by_key(cpu_lesson)
    assert all(by[k].verdict == "not tested" and by[k].note for k in ("amp_speed", "amp_memory", "bf16_002", "mp_003"))
    assert by["fused_adamw"].verdict == by["sdpa"].verdict == "not tested" and by["sdpa"].measured is None


def test_neighbours_on_a_gpu(gpu_lesson):
    adamw, sdpa = M.check_adamw(gpu_lesson, _cmp(2.8)), M.check_sdpa(gpu_lesson, _cmp(7.89))
    assert adamw.measured == pytest.approx(2.8) and sdpa.measured == pytest.approx(7.89)
    assert (adamw.verdict, adamw.side) == (sdpa.verdict, sdpa.side) == ("refuted", "higher")


def test_small_gradient_rows():
    under = SimpleNamespace(row=lambda m: {"fp16_noscale": {"param_grads_zeroed": 0.99},
                                           "fp16_scaled": {"param_grads_zeroed": 0.0}}[m])
    rows = M.small_gradient_rows({"fp16_noscale": [4.2] * 10, "fp16": [2.45] * 10, "bf16": [2.4] * 10},
                                 [2.4] * 10, under)
    assert [r["zeroed"] for r in rows] == [0.99, 0.0, None] and rows[0]["gap"] == pytest.approx(75.0)
    assert "99.0%" in M.small_gradient_table(rows)._repr_html_()


def test_figures_draw_with_one_colour_per_precision():
    import matplotlib.pyplot as plt

    losses = {m: [3.0 - 0.01 * i for i in range(40)] for m in ("fp32", "fp16", "fp16_noscale", "bf16")}
    fig = M.loss_figure(losses, [3.0 - 0.011 * i for i in range(40)])
    colours = {line.get_label(): line.get_color() for ax in fig.axes for line in ax.get_lines()}
    assert colours["FP16, no scaler"] == M.COLORS["fp16_noscale"]
    assert all(line.get_marker() in (None, "None", "") for ax in fig.axes for line in ax.get_lines())
    small = M.small_gradient_figure(losses["fp32"], {"fp16_noscale": losses["fp16_noscale"]}, 2**-10)
    line = next(l for l in small.axes[0].get_lines() if l.get_label().startswith("FP16, no scaler"))
    assert line.get_color() == M.COLORS["fp16_noscale"] and "2^-10" in line.get_label()
    speed = M.step_figure(_rows())
    assert [len(ax.patches) for ax in speed.axes] == [7, 7, 7]  # one bar per precision, each panel
    plt.close("all")
