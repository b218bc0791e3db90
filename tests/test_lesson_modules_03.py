"""Notebook 03's scaffolding on the CPU: its smoke sizes, its claims as data, the verdicts on what it measured, and
the tables, sentences and figures that report it."""
import json
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import pytest
import torch

import gpulab as gl
from gpulab.claims import Estimate
from gpulab.device import DeviceInfo
from gpulab.lesson import NEEDS, _as_spec
from gpulab.lessons import compile_lab as cl
from gpulab.lessons import fusion_claims as C
from gpulab.lessons import fusion_lesson as L
from _notebook_run import parameters_cell

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent


def _parameters() -> dict:
    return parameters_cell("03_fusion")


def _lesson(device, smoke=True, **params):
    return gl.lesson("03_fusion", _parameters() | {"SMOKE": smoke} | params, full={}, claims=L.CLAIMS,
                     device=device, show=False)


@pytest.fixture
def gpu_lesson(monkeypatch, tmp_path):
    """A lesson on a pretend GPU at full sizes, every need met: for the verdicts a GPU run reaches."""
    for need in ("cuda", "full", "compiler"):
        monkeypatch.setitem(NEEDS, need, lambda lesson: None)
    return _lesson(DeviceInfo(kind="cuda", name="pretend GPU", capability=(9, 0)), smoke=False)


def _mode(name, median, q1, q3, compile_s=1.0, wall_s=10.0, ok=True, reason=""):
    return cl.ModeTiming(name, ok, compile_s=compile_s, median_s=median, q1_s=q1, q3_s=q3, wall_s=wall_s,
                         reason=reason)


def _side(seconds, kernels=None, busy=None, trace=None):
    return SimpleNamespace(seconds=seconds, profile=SimpleNamespace(kernels_per_step=kernels, busy_fraction=busy),
                           trace=trace, measurement=SimpleNamespace(estimate=lambda: Estimate(seconds, seconds,
                                                                                              seconds)))


def _cmp(before, after, est=None, verdict="faster"):
    est = est or Estimate(before.seconds / after.seconds, before.seconds / after.seconds,
                          before.seconds / after.seconds)
    return SimpleNamespace(before=before, after=after, verdict=verdict, estimate=lambda: est, name="cmp")


def test_claims_are_valid_specs_and_keep_the_contracts_texts():
    specs = [_as_spec(c) for c in L.CLAIMS]
    assert len({s.key for s in specs}) == len(specs)
    contract = json.loads((ROOT / "tests" / "data" / "notebook_contract.json").read_text())["03_fusion"]
    assert sorted(s.text for s in specs) == sorted(contract["claims"])
    assert {k for k, _, _ in C.TRAINING} <= {s.key for s in specs}


def test_use_sizes_puts_smoke_sizes_in_the_namespace_and_records_them(cpu_device):
    threads = torch.get_num_threads()
    try:
        ns = _parameters() | {"SMOKE": True}
        les = gl.lesson("03_fusion", ns, full={}, claims=L.CLAIMS, device=cpu_device, show=False)
        params = L.use_sizes(les, ns)
        assert ns["ELEMENTWISE_NUMEL"] == L.SMOKE_SIZES["ELEMENTWISE_NUMEL"] and ns["MODEL"]["n_layer"] == 2
        assert ns["MIN_TIME_S"] == ns["TRAIN_MIN_TIME_S"] == L.SMOKE_MIN_TIME_S
        assert set(params) == set(L.PARAMS) and les.result.params == params
        ns2 = _parameters() | {"SMOKE": True, "MIN_TIME_S": 0.2}  # a reader's MIN_TIME_S is kept
        L.use_sizes(gl.lesson("03_fusion", ns2, full={}, device=cpu_device, show=False), ns2)
        assert ns2["MIN_TIME_S"] == ns2["TRAIN_MIN_TIME_S"] == 0.2
        assert L.SMOKE_SIZES["MODEL"] is not ns["MODEL"]  # the notebook gets its own copy
    finally:
        torch.set_num_threads(threads)


def test_full_sizes_stay_on_a_gpu(gpu_lesson):
    ns = _parameters()
    L.use_sizes(gpu_lesson, ns)
    assert ns == _parameters()


def test_phases_lap_each_section_and_add_the_total():
    clock = L.Phases()
    assert clock.lap("a") is None
    clock.lap("b")
    d = clock.to_dict()
    assert list(d) == ["a", "b", "total"] and d["total"] >= d["a"] + d["b"] >= 0


def test_compile_skip_names_the_missing_compiler_or_the_smoke_sizes(monkeypatch):
    def les(small, missing=None):
        return SimpleNamespace(small=small, missing=lambda *needs: missing)
    assert L.compile_skip(les(False), "smoke") is None
    assert L.compile_skip(les(True), "smoke") == "smoke"
    assert L.compile_skip(les(True, "needs a compiler"), "smoke") == "needs a compiler"


def test_mode_cap_shares_out_the_budget():
    assert L.mode_cap("default", 10, 270, 90, 120) == (90, "")
    assert L.mode_cap("max-autotune", 10, 270, 90, 120) == (120, "")
    assert L.mode_cap("max-autotune", 200, 270, 90, 120) == (55, "")  # what is left after the reserve
    cap, why = L.mode_cap("default", 250, 270, 90, 120)
    assert cap is None and "250 s of the notebook's 270 s budget" in why


def test_cpu_lesson_records_every_claim_with_a_reason(cpu_device, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    monkeypatch.setitem(NEEDS, "compiler", lambda lesson: None)  # the same reasons with or without a C++ compiler
    les = _lesson(cpu_device)
    x, b, s = torch.randn(8, 16), torch.randn(16), torch.rand(16)
    traffic = cl.eager_traffic(cl.add_relu_mul, x, b, s)
    no = SimpleNamespace(ok=False, reason="no compiler here", kernels=None)
    arm = L.check_add_relu_mul(les, traffic, None, None, "smoke sizes compile only the GELU below", (x, b, s))
    assert [c.verdict for c in arm[:3]] == ["confirmed", "confirmed", "not tested"]
    assert arm[0].evidence == "arithmetic" and "smoke sizes" in arm[2].note and "needs a CUDA GPU" in arm[3].note
    gelu = L.check_gelu(les, cl.eager_traffic(cl.gelu_tanh, x.flatten()), None, None, no)
    assert gelu[0].verdict == "confirmed" and gelu[1].note == "not compiled: no compiler here"
    fusions = {"r": L.count_fusion(cl.mul_sum, (x, x), gpu=False, skip="smoke"),
               "h": L.count_fusion(cl.sin_cos, (x,), gpu=False, skip="smoke")}
    assert fusions["r"] == (2, None, "smoke")
    assert all(c.verdict == "not tested" for c in L.check_fusions(les, fusions))
    L.check_training(les, None, "smoke sizes")
    L.check_modes(les, [])
    util = L.record_the_rest(les, None)
    assert util.verdict == "not tested" and "proxy was not measured" in util.note
    assert not les.pending()
    data = json.loads(Path(les.save()).read_text())
    assert len(data["claims"]) == len(L.CLAIMS)


def test_gpu_verdicts_stand_on_the_measured_intervals(gpu_lesson):
    train = _cmp(_side(1.2, 900, 0.8), _side(1.0, 400, 0.9), est=Estimate(1.2, 1.16, 1.24))
    by_key = dict(zip(["overhead"] + [k for k, _, _ in C.TRAINING], L.check_training(gpu_lesson, train, None)))
    # arr-coc's module: judged nothing, our step's share saved (1 - 1/1.2 = 17%) shown beside it
    assert by_key["overhead"].verdict == "not comparable" and by_key["overhead"].measured == pytest.approx(100 / 6)
    assert by_key["overhead"].interval == pytest.approx((100 * (1 - 1 / 1.16), 100 * (1 - 1 / 1.24)))
    assert by_key["after_first"].verdict == "confirmed" and by_key["after_first"].interval == pytest.approx((16, 24))
    sweep = [_mode("default", 1.0e-3, 0.95e-3, 1.05e-3, compile_s=5, wall_s=20),
             _mode("reduce-overhead", 0.4e-3, 0.35e-3, 0.45e-3, compile_s=8, wall_s=25),
             _mode("max-autotune", 0.9e-3, 0.85e-3, 0.95e-3, compile_s=40, wall_s=60)]
    ro, ac, asp = L.check_modes(gpu_lesson, sweep)
    assert ro.verdict == "confirmed" and ac.verdict == "confirmed" and asp.verdict == "confirmed"
    failed = sweep[:2] + [cl.ModeTiming("max-autotune", False, reason="stopped at its budget")]
    _, ac, asp = L.check_modes(gpu_lesson, failed)
    assert ac.verdict == asp.verdict == "not tested" and "stopped at its budget" in ac.note


def test_add_relu_mul_on_a_gpu_reads_the_profile_and_shows_the_milliseconds(gpu_lesson):
    cmp = _cmp(_side(3e-3, kernels=3), _side(1e-3, kernels=1))
    traffic = SimpleNamespace(ratio=2.99, n_ops=3)
    claims = L.check_add_relu_mul(gpu_lesson, traffic, cmp, SimpleNamespace(ok=True, kernels=1, reason=""), None, ())
    assert [c.measured for c in claims[1:4]] == pytest.approx([3, 1, 3.0])
    assert claims[5].verdict == "not comparable" and claims[5].measured == pytest.approx(1.0)


def test_bandwidth_and_the_gelu_report():
    traffic = SimpleNamespace(ideal_bytes=8e6, total_bytes=72e6, ratio=9.0, n_ops=8)
    lib = _cmp(_side(10e-3), _side(1e-3))
    comp = _cmp(_side(10e-3), _side(2e-3))
    bw = L.gelu_bandwidth(traffic, lib, comp, copy_gbs=10.0)
    assert bw["eager chain"] == pytest.approx(0.8) and bw["F.gelu"] == pytest.approx(8.0)
    assert bw["torch.compile"] == pytest.approx(4.0) and bw["eager_actual_traffic"] == pytest.approx(7.2)
    text = L.gelu_report(traffic, lib, comp, SimpleNamespace(compile_s=4.0), bw)
    assert "**8 ops**" in text and "too many bytes" in text and "after about **500 calls**" in text
    assert "(F.gelu), 80% of the copy bandwidth" in text
    slow = L.gelu_report(traffic, lib, _cmp(_side(1e-3), _side(2e-3)), SimpleNamespace(compile_s=4.0), bw)
    assert "never pays off" in slow
    assert "torch.compile" not in L.gelu_bandwidth(traffic, lib, None, 10.0)


def test_reports_and_tables_say_what_ran():
    train = _cmp(_side(2e-3, 900, 0.5), _side(1e-3, None, None), est=Estimate(2.0, 1.9, 2.1), verdict="2.00x faster")
    text = L.training_report(train, SimpleNamespace(compile_s=10.0), rounds=6)
    assert "interval 1.90-2.10x over 6 rounds" in text and "900 -> n/a kernels" in text and "10,000 steps" in text
    assert "50% -> n/a" in L.graph_report(_cmp(_side(2e-3, busy=0.5), _side(1e-3)), 1e-3)
    sweep = [_mode("default", 1e-3, 0.9e-3, 1.1e-3), cl.ModeTiming("max-autotune", False, reason="skipped: budget")]
    html = L.modes_table_html(sweep)
    assert html.count("<tr>") == 3 and "skipped: budget" in html and L.modes_table_html([]) == ""
    summary = L.modes_summary(sweep, _cmp(_side(2e-3), _side(1e-3)))
    assert "**default**: 2.00x the eager speed" in summary and "max-autotune" not in summary.split("\n\n")[0]
    assert L.modes_summary(sweep, None) == "" and "**Compiler:** not available" in L.setup_note(
        SimpleNamespace(small=True, gpu=False, reference=None), False, "no c++", SimpleNamespace(copy_gbs=20.0))
    assert L.fusion_list({"r": (2, None, "smoke")}) == "- **r**: 2 kernel(s) eager, not compiled (smoke)"


def test_figures_draw_without_a_run_or_a_reference(monkeypatch):
    import matplotlib.pyplot as plt

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objs: shown.extend(objs))
    L.mfu_figure(None, None)
    L.modes_figure(None, [], None, 2, 32)
    assert "Nothing to plot" in shown[0].data
    L.modes_figure(_cmp(_side(2e-3), _side(1e-3)), [_mode("default", 1e-3, 0.9e-3, 1.1e-3)], None, 2, 32)
    L.bandwidth_figure({"eager chain": 1.0, "F.gelu": 5.0, "eager_actual_traffic": 9.0, "copy": 10.0}, None)
    plt.close("all")


def test_the_other_systems_utilization_is_not_comparable(cpu_device, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    les = _lesson(cpu_device)
    trace = SimpleNamespace(values=lambda key: [90.0, 92.0, 94.0, 96.0, 98.0])
    claim = L.record_the_rest(les, _cmp(_side(1.0), _side(0.8, trace=trace)))
    assert claim.verdict == "not comparable" and claim.measured == 94.0 and claim.interval == (92.0, 96.0)


def test_chain_bandwidth_splits_the_speedup_into_bytes_and_rates():
    """speedup = byte ratio × (fused GB/s / eager GB/s), exactly; the note prints both factors."""
    traffic = SimpleNamespace(total_bytes=6e9, ideal_bytes=2e9, ratio=3.0)
    cmp = SimpleNamespace(before=SimpleNamespace(seconds=2.0e-3), after=SimpleNamespace(seconds=0.5e-3), speedup=4.0)
    bw = L.chain_bandwidth(traffic, cmp, 4200.0)
    assert bw == {"eager": pytest.approx(3000.0), "fused": pytest.approx(4000.0), "copy": 4200.0}
    note = L.chain_bandwidth_note(traffic, cmp, bw)
    assert "3.00 × 1.33 = 4.00x" in note and "3,000 GB/s" in note and "a plain copy: 4,200 GB/s" in note
    assert "plain copy" not in L.chain_bandwidth_note(traffic, cmp, L.chain_bandwidth(traffic, cmp, None))


def test_broadcast_note_names_both_rates_and_both_speedups():
    plain, cols = SimpleNamespace(speedup=3.0), SimpleNamespace(speedup=3.9)
    note = L.broadcast_note(plain, {"eager": 4000.0, "fused": 4100.0}, cols, {"eager": 3100.0, "fused": 4050.0})
    assert "3.90x" in note and "3.00x" in note
    assert "3,100 GB/s" in note and "22% slower" in note and "1% slower" in note
    faster = L.broadcast_note(plain, {"eager": 1000.0, "fused": 1000.0}, cols, {"eager": 1100.0, "fused": 1000.0})
    assert "10% faster" in faster
