"""Notebook 07's scaffolding on the CPU: its smoke sizes, its claims as data, the verdicts on what it measured (on the
CPU, and on a pretend Ampere-or-newer GPU with fake runs for the GPU-only branches), and the tables, sentences and
figures that report it."""
import json
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import pytest

import gpulab as gl
from gpulab import training as T
from gpulab.claims import Estimate
from gpulab.device import DeviceInfo
from gpulab.lessons import precision_claims as C
from gpulab.lessons import precision_lab as P
from gpulab.lessons import precision_lesson as L
from _notebook_run import parameters_cell

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent
NAME = "07_mixed_precision"
ALL_MODES = list(T.PRECISION_MODES)


def _parameters() -> dict:
    return parameters_cell(NAME)


def _lesson(device, smoke=True):
    ns = _parameters() | {"SMOKE": smoke}
    lesson = gl.lesson(NAME, ns, full={}, claims=L.CLAIMS, device=device, show=False)
    L.use_sizes(lesson, ns)
    return lesson, ns


@pytest.fixture
def cpu_lesson(cpu_device):
    return _lesson(cpu_device)[0]


@pytest.fixture
def gpu_lesson():
    """A lesson on a pretend Hopper GPU at full sizes: every need of every claim is met."""
    return _lesson(DeviceInfo(kind="cuda", name="pretend GPU", capability=(9, 0)), smoke=False)[0]


def _by_text(lesson):
    return {c.text: c for c in lesson.result.claims}


def _reference_claims():
    ref = json.loads((ROOT / "data" / "reference" / "nvidia-h100-80gb-hbm3" / f"{NAME}.json").read_text())
    return {c["text"]: c for c in ref["claims"]}


def _cmp(speedup, lo=None, hi=None, tflops=(10.0, 50.0), verdict="faster"):
    est = Estimate(speedup, lo if lo is not None else speedup, hi if hi is not None else speedup)
    return SimpleNamespace(estimate=lambda: est, speedup=speedup, verdict=verdict,
                           before=SimpleNamespace(tflops=tflops[0]), after=SimpleNamespace(tflops=tflops[1]))


def _curve(losses, peak_gb=None):
    return SimpleNamespace(losses=losses, final_loss=sum(losses[-2:]) / 2, peak_memory_gb=peak_gb)


def _gpu_runs():
    """Fake timed runs and training curves of every mode, as a Hopper GPU would give them."""
    step_ms = {"fp32": 100.0, "tf32": 40.0, "fp16": 25.0, "fp16_noscale": 25.0, "bf16": 24.0, "bf16_weights": 20.0,
               "bf16_master": 22.0}
    peak = {"fp32": 10.0, "tf32": 10.0, "fp16": 7.0, "fp16_noscale": 7.0, "bf16": 7.0, "bf16_weights": 5.0,
            "bf16_master": 8.0}
    runs = {m: SimpleNamespace(step_s=ms / 1e3, run=SimpleNamespace(
        measurement=SimpleNamespace(estimate=lambda ms=ms: Estimate(ms / 1e3, ms / 1e3 * 0.99, ms / 1e3 * 1.01))))
        for m, ms in step_ms.items()}
    curves = {m: _curve([3.0, 2.5, 2.0, 2.0], peak[m]) for m in ALL_MODES}
    cmps = {m: _cmp(step_ms["fp32"] / step_ms[m]) for m in ALL_MODES[1:]}
    return runs, curves, cmps, _cmp(step_ms["tf32"] / step_ms["bf16"])


# ---------------------------------------------------------------- sizes and claims as data


def test_smoke_sizes_replace_the_full_ones_and_are_recorded(cpu_device):
    lesson, ns = _lesson(cpu_device, smoke=False)  # no GPU: smoke sizes whatever SMOKE says
    assert lesson.small and ns["N_EMBD"] == L.SMOKE_SIZES["N_EMBD"] and ns["LOSS_STEPS"] == 25
    assert list(lesson.result.params) == ["n_layer", "n_head", "n_embd", "seq_len", "vocab_size", "batch_size",
                                          "loss_steps", "time_seconds", "matmul_size", "small_grad_multiplier",
                                          "corpus_bytes", "rounds"]
    assert lesson.result.params["small_grad_multiplier"] == 2 ** -10 and lesson.result.smoke is True


def test_full_sizes_on_a_gpu_are_the_parameters_cell(gpu_lesson):
    full = _parameters()
    assert not gpu_lesson.small
    assert gpu_lesson.result.params == {k.lower(): full[k] for k in L.PARAMS}


def test_claims_are_the_contracts_texts():
    contract = json.loads((ROOT / "tests" / "data" / "notebook_contract.json").read_text())[NAME]
    assert sorted(c["text"] for c in L.CLAIMS) == sorted(contract["claims"])
    assert [c["key"] for c in L.CLAIMS if c.get("needs") == C.TENSOR_CORES][:2] == ["tf32_8x", "tf32_20_30"]
    assert all(dict(c)["needs"] == C.TENSOR_CORES for c in L.CLAIMS if c["key"] in dict.fromkeys(
        k for k, *_ in P.STEP_CLAIMS))


def test_tf32_switches_read_as_pytorch_has_them():
    s = L.tf32_switches()
    assert set(s) == {"torch.backends.cuda.matmul.allow_tf32", "torch.get_float32_matmul_precision()",
                      "torch.backends.cudnn.allow_tf32"}


def test_skipped_modes():
    assert set(L.skipped_modes(False, False, None)) == {"tf32"}
    old = L.skipped_modes(True, False, (7, 5))
    assert set(old) == {"tf32", "bf16", "bf16_weights", "bf16_master"} and "(7, 5)" in old["bf16"]
    assert L.skipped_modes(True, True, (9, 0)) == {}


# ---------------------------------------------------------------- sections 1 and 2 on the CPU


def test_formats_on_the_cpu(cpu_lesson, cpu_device):
    rows = L.format_rows(cpu_device.torch_device)
    assert [r["format"] for r in rows] == ["FP32", "TF32", "BF16", "FP16"] and all(r["agrees"] == "yes" for r in rows)
    bits = {r["format"]: r["measured_bits"] for r in rows}
    assert bits == {"FP32": 23, "TF32": None, "BF16": 7, "FP16": 10}
    L.check_formats(cpu_lesson, rows, T.format_info("bf16").exponent_bits)
    by = _by_text(cpu_lesson)
    assert by["Guide §7.3's format table: rows that agree with torch.finfo"].verdict == "confirmed"
    tf32 = by["TF32 keeps 10 mantissa bits (FP32's range, FP16's precision)"]
    assert tf32.verdict == "not tested" and "tensor cores" in tf32.note
    assert "FP16 measured 10 bits" in by["BF16 keeps 7 mantissa bits, FP16 10 (BF16 is less precise)"].note
    assert "TF32 cannot be measured" in L.formats_report(rows)
    assert "table agrees" in L.formats_table(rows)._repr_html_()


def test_tf32_default(cpu_lesson):
    off = {"torch.backends.cuda.matmul.allow_tf32": False, "torch.get_float32_matmul_precision()": "highest",
           "torch.backends.cudnn.allow_tf32": True}
    assert L.check_tf32_default(cpu_lesson, off) is False
    claim = _by_text(cpu_lesson)["TF32 is enabled by default for FP32 matmuls (1 = on, 0 = off)"]
    assert claim.verdict == "refuted" and claim.evidence == "definition"
    assert L.check_tf32_default(cpu_lesson, off | {"torch.get_float32_matmul_precision()": "high"}) is True
    assert "**off**" in L.tf32_default_report(False) and "**on**" in L.tf32_default_report(True)
    assert "value at kernel start" in L.tf32_defaults_table(off)._repr_html_()


def test_tf32_matmul_not_tested_without_tensor_cores(cpu_lesson):
    claims = L.check_tf32_matmul(cpu_lesson, _cmp(1.0), P.tf32_speed_ratio(None))
    assert [c.verdict for c in claims] == ["not tested"] * 2 and all("CUDA GPU" in c.note for c in claims)
    assert "No TF32 here" in L.tf32_matmul_report(_cmp(1.0), {}, False, "CPU", 256)


# ---------------------------------------------------------------- the GPU-only branches, with fakes


def test_tf32_matmul_on_a_gpu(gpu_lesson):
    ratio = {"here": 7.4, "reference": 1.0, "reference_gpu": "RTX 3090", "device": "H100", "comparable": False}
    c8, c20 = L.check_tf32_matmul(gpu_lesson, _cmp(5.0, 4.8, 5.2), ratio)
    assert c8.verdict == "refuted" and c8.measurement == "matmul_fp32_tf32" and "7.4x on H100" in c8.note
    assert c20.verdict == "not comparable" and c20.measured == pytest.approx(400) and "RTX 3090 figure" in c20.note
    c8, c20 = L.check_tf32_matmul(gpu_lesson, _cmp(1.25, 1.22, 1.28), ratio | {"comparable": True})
    assert c20.verdict == "confirmed" and c20.interval == pytest.approx((22, 28))
    assert "5.0×" in L.tf32_matmul_report(_cmp(5.0, 4.8, 5.2), ratio, True, "H100", 8192)


def test_step_claims_on_a_gpu_match_the_reference_run(gpu_lesson):
    runs, curves, cmps, cmp_tb = _gpu_runs()
    claims = L.check_steps(gpu_lesson, runs, curves, cmps, cmp_tb)
    ref = _reference_claims()
    assert len(claims) == len(P.STEP_CLAIMS)
    for c in claims:  # the same measurement behind each claim, and the same kind of verdict, as the H100 run
        assert c.measurement == ref[c.text]["measurement"], c.text
        assert (c.verdict == "not comparable") == (ref[c.text]["verdict"] == "not comparable"), c.text
    by = {c.text: c for c in claims}
    assert by["AMP (FP16 autocast) cuts training memory by 50%"].measured == pytest.approx(30)
    assert "BF16 weights save 50%" in by["BF16 saves 40-50% memory"].note
    assert by["Mixed precision: 1.1 ms per step after"].measured == pytest.approx(24)
    assert "over TF32 it is 1.60x" in by["AMP (FP16 autocast + GradScaler) trains 2-3x faster than FP32"].note
    report = L.speed_report(runs, curves, ALL_MODES, _cmp(5.0), cmp_tb, "H100", True, True)
    assert "**4.00×**" in report and "BF16 weights save 50%" in report and "save 20%" in report


def test_step_claims_not_tested_on_the_cpu_or_an_old_gpu(cpu_lesson):
    claims = L.check_steps(cpu_lesson, {}, {}, {}, None)
    assert [c.verdict for c in claims] == ["not tested"] * len(P.STEP_CLAIMS)
    assert all(c.note == "needs a CUDA GPU" for c in claims)
    old, _ = _lesson(DeviceInfo(kind="cuda", name="T4", capability=(7, 5)), smoke=False)
    assert all("Ampere" in c.note for c in L.check_steps(old, {}, {}, {}, None))


def test_adamw_and_sdpa(cpu_lesson, gpu_lesson):
    for lesson in (cpu_lesson, gpu_lesson):
        L.check_adamw(lesson, _cmp(1.07, 1.05, 1.09), _cmp(3.0), 95_000_000)
        L.check_sdpa(lesson, _cmp(1.4, 1.35, 1.45), "bf16", (16, 12, 512, 64))
    cpu, gpu = _by_text(cpu_lesson), _by_text(gpu_lesson)
    adam, sdpa = "Fused AdamW: 5-10% optimizer speedup", "SDPA flash attention: 30-50% attention speedup"
    assert cpu[adam].verdict == cpu[sdpa].verdict == "not tested"
    assert gpu[adam].verdict == gpu[sdpa].verdict == "confirmed"
    assert gpu[adam].measurement == "adamw_foreach_fused" and "95 M parameters" in gpu[adam].note
    assert "over the for-loop: 3.00x" in gpu[adam].note
    assert gpu[sdpa].measurement == "attention_manual_sdpa" and "16 x 12 heads x 512 tokens x 64" in gpu[sdpa].note
    assert "**1.07×**" in L.neighbours_report(_cmp(1.07), _cmp(1.4))


# ---------------------------------------------------------------- convergence and underflow


def test_convergence_band_is_the_tolerance(cpu_lesson):
    base = [3.0, 2.8, 2.6, 2.4, 2.2, 2.0, 2.0, 2.0, 2.0, 2.0]
    curves = {"fp32": _curve(base), "fp16": _curve([x * 1.01 for x in base]), "fp16_noscale": _curve(base),
              "bf16": _curve([x * 1.05 for x in base])}
    gaps = L.loss_gaps(curves, ["fp32", "fp16", "fp16_noscale", "bf16"])
    assert set(gaps) == {"fp16", "fp16_noscale", "bf16"} and gaps["fp16"].value == pytest.approx(1.0)
    claims = L.check_convergence(cpu_lesson, gaps, 3.0, 3.0, 10, {})
    assert [c.verdict for c in claims] == ["confirmed", "refuted", "refuted", "refuted"]
    assert (claims[0].low, claims[0].high) == (-3.0, 3.0) and (claims[3].low, claims[3].high) == (3.0, None)
    assert "seed gap 3.00%" in claims[0].note and claims[1].measurement == "loss_gap_bf16"
    assert "outside the ±3.0% tolerance" in L.convergence_report(curves, curves["fp32"], gaps, 3.0, 3.0, 10)


def test_convergence_of_a_skipped_mode_says_why(cpu_lesson):
    claims = L.check_convergence(cpu_lesson, {}, 2.0, 0.5, 10, {"bf16": "needs compute capability 8.0"})
    assert [c.verdict for c in claims] == ["not tested"] * 4
    assert claims[1].note == "needs compute capability 8.0" and claims[0].note == "mode not run"


def test_tolerance_and_rows():
    curves = {"fp32": _curve([2.0, 2.0], 10.0), "bf16": _curve([2.2, 2.2], 6.0)}
    assert L.tolerance(curves, _curve([2.1, 2.1])) == pytest.approx((5.0, 5.0))
    assert L.tolerance(curves, _curve([2.0, 2.0]))[0] == 2.0
    run = lambda s: SimpleNamespace(step_s=s, tokens_per_s=1 / s, mfu_own=0.5, mfu=0.1,  # noqa: E731
                                    run=SimpleNamespace(tflops=1.0, metric=lambda k: None))
    rows = L.mode_rows({"fp32": run(0.2), "bf16": run(0.1)}, curves, ["fp32", "bf16"], gpu=True)
    assert rows[1]["speedup"] == 2.0 and rows[1]["mem_saved"] == pytest.approx(40) and rows[1]["loss_gap"] == pytest.approx(10)
    assert L.mode_rows({"fp32": run(0.2)}, {"fp32": _curve([2.0], None)}, ["fp32"], gpu=False)[0]["mem_saved"] is None
    assert "MFU vs dense BF16 peak (one yardstick)" in L.modes_table(rows, 2)._repr_html_()


def _under(noscale_zeroed=0.3):
    rows = {"fp16_noscale": dict(logit_grads_zeroed=noscale_zeroed, param_grads_zeroed=0.02, grad_rel_error=0.05),
            "fp16_scaled": dict(logit_grads_zeroed=0.0, param_grads_zeroed=0.0, grad_rel_error=0.001,
                                loss_scale=65536.0)}
    return SimpleNamespace(row=lambda m: rows[m])


def test_underflow_and_small_gradient_reports():
    curves = {"fp32": _curve([2.0, 2.0]), "fp16_noscale": _curve([2.01, 2.01])}
    txt = L.underflow_report(_under(), curves, 2.0)
    assert "**30.0%**" in txt and "inside the tolerance: the gradients it loses" in txt
    assert "outside the tolerance" in L.underflow_report(_under(), curves | {"fp16_noscale": _curve([3.0, 3.0])}, 2.0)
    assert "loss curves" not in L.underflow_report(_under(), {"fp32": curves["fp32"]}, 2.0)
    small = {"fp16_noscale": _curve([2.6, 2.6]), "fp16": _curve([2.02, 2.02]), "bf16": _curve([2.04, 2.04])}
    rows = L.small_gradient_rows(small, curves, _under())
    assert [r["zeroed"] for r in rows] == [0.02, 0.0, None] and rows[0]["gap"] == pytest.approx(30)
    assert "**+30.0%**" in L.small_gradient_report(small, curves, _under(), 2 ** -10)
    assert L.small_gradient_report({"bf16": small["bf16"]}, curves, _under(), 2 ** -10) == ""
    assert "param. gradients zeroed" in L.small_gradient_table(rows)._repr_html_()


def test_setup_note_and_workload(cpu_lesson, gpu_lesson):
    assert "No CUDA GPU here" in L.setup_note(cpu_lesson) and "Full sizes" in L.setup_note(gpu_lesson)
    base = SimpleNamespace(tokens_per_step=64, flops_per_token=lambda: 1e6)
    assert "64 tokens" in L.workload_note("x" * 1000, SimpleNamespace(numel=lambda: 1000), 2_000_000, base)


def test_cpu_speed_report_names_the_slowest_mode():
    runs = {"fp32": SimpleNamespace(step_s=0.1), "fp16": SimpleNamespace(step_s=0.5)}
    txt = L.speed_report(runs, {}, ["fp32", "fp16"], None, None, "CPU", False, False)
    assert "not tested on this machine" in txt and "emulates them" in txt


def test_figures_draw_on_the_cpu(monkeypatch):
    import matplotlib.pyplot as plt
    monkeypatch.setattr(plt, "show", lambda: None)
    curves = {m: _curve([3.0, 2.5, 2.2, 2.0]) for m in ("fp32", "bf16")}
    L.loss_figures(curves, _curve([3.0, 2.6, 2.2, 2.1]), ["fp32", "bf16"], 4)
    L.small_gradient_figure(curves, {"bf16": curves["bf16"]}, 2 ** -10, 4)
    plt.close("all")
