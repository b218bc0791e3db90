"""Notebook 03's module (gpulab.lessons.fusion): its claims as data, the byte counter, the first-call stopwatch and
its no-compiler path, the compile-modes ratios; and a reader's -p value surviving a smoke run."""
from __future__ import annotations


import pytest
import torch

from gpulab.verdicts.lesson import lesson
from gpulab.lessons import fusion as F3
from gpulab.verdicts.params import SCHEMAS



def test_claims_have_stable_keys_quotes_and_sources():
    keys = [c["key"] for c in F3.CLAIMS]
    assert len(keys) == len(set(keys))
    assert all(c["quote"] and c["source"] for c in F3.CLAIMS)
    # One guide sentence, one verdict: §8.2's "15-25%" and "92% -> 95%" are notebook 08's; the "2.8x" row is one row.
    assert not {"after_first", "utilization", "fusion_0_9ms"} & set(keys)
    # Numbers of another system are never given a "needs" that could turn them into a verdict path.
    for key in ("fusion_2_8x", "overhead", "review"):
        assert not next(c for c in F3.CLAIMS if c["key"] == key).get("needs")


def test_eager_traffic_counts_six_passes_for_plain_numbers():
    x = torch.randn(64, 32)
    t = F3.eager_traffic(lambda a, b, s: torch.relu(a + b) * s, x, 0.1, 1.5)
    assert t.n_ops == 3 and t.ratio == pytest.approx(3.0)
    assert "3.00x" in repr(t) and "ratio" in t._repr_html_()
    cols = F3.eager_traffic(lambda a, b, s: torch.relu(a + b) * s, x, torch.randn(32), torch.randn(32))
    assert 2.9 < cols.ratio < 3.1  # two small vectors barely change the bytes


def test_first_call_times_a_compile_or_says_why_not(monkeypatch):
    def broken(*args):
        raise RuntimeError("no C++ compiler found\nsecond line")

    r = F3.first_call(broken, torch.ones(2))
    assert not r.ok and r.seconds is None and "RuntimeError: no C++ compiler found" in r.error
    assert repr(r).startswith("not compiled")
    ok = F3.first_call(lambda t: t * 2, torch.ones(2))  # an eager function: times the call, generates nothing
    assert ok.ok and ok.seconds >= 0 and ok.kernels == 0


def test_mode_ratios_carry_intervals():
    default = dict(median_s=2e-3, q1_s=1.9e-3, q3_s=2.1e-3, compile_s=5.0)
    fast = dict(median_s=1e-3, q1_s=0.95e-3, q3_s=1.05e-3, compile_s=40.0)
    r = F3.mode_speed_ratio(default, fast)
    assert r.value == pytest.approx(2.0) and r.lo == pytest.approx(1.9e-3 / 1.05e-3) and r.hi > 2.0
    c = F3.compile_time_ratio(fast, default)
    assert c.value == pytest.approx(8.0) and c.lo == pytest.approx(8 / 2.25) and c.hi == pytest.approx(8 * 2.25)


def test_sizes_come_from_the_schema_and_a_readers_value_wins(cpu_device):
    ns = {"SMOKE": True, "TRAIN_BATCH": 16, **{k: None for k in ("ELEMENTWISE_NUMEL", "MODEL", "INFER_BATCH",
                                                                  "INFER_SEQ", "SWEEP_MODES", "TIME_BUDGET_S",
                                                                  "MIN_TIME_S", "TRAIN_MIN_TIME_S", "TRAIN_ROUNDS")}}
    les = lesson("03_fusion", ns, claims=F3.CLAIMS, device=cpu_device, show=False)
    assert ns["TRAIN_BATCH"] == 16 and les.result.params_given == ["TRAIN_BATCH"]
    assert ns["ELEMENTWISE_NUMEL"] == 1 << 18 and ns["MIN_TIME_S"] == 0.05 and ns["TRAIN_ROUNDS"] == 3
    assert ns["MODEL"]["n_layer"] == 2
    assert ns["COMPILE_ALL"] is False  # a CPU smoke run compiles the GELU and the training step, the rest on request


def test_section_4_model_gives_max_autotune_one_shape_less_to_tune():
    """Full size: the output layer's matmul (width x vocabulary) has the MLP's shape (width x 4 width), so
    max-autotune tunes four distinct matmul shapes, not five; section 3 keeps its own model. One layer: a second
    layer adds no shape, only matmul nodes whose fused epilogues are benchmarked again: on the H200 the notebook's
    max-autotune-no-cudagraphs compile took 66.5 s at one layer, 79.0 s at two, and a one-layer forward is still a
    run of few-microsecond kernels (10 per call, the GPU busy 2.9%: launch-bound)."""
    full = {k: p.default for k, p in SCHEMAS["03_fusion"].items()}
    infer = full["INFER_MODEL"]
    assert infer["vocab_size"] == 4 * infer["n_embd"] == 4 * full["MODEL"]["n_embd"]
    assert infer["n_layer"] == 1
    assert infer["block_size"] >= full["INFER_SEQ"] and full["COMPILE_ALL"] is True


@pytest.mark.notebook
def test_a_p_override_survives_the_smoke_run(smoke_run):
    """`-p TRAIN_BATCH 8` on top of SMOKE=True (the shared smoke run carries it: tests/conftest.py) is what ran,
    recorded as the reader's, while the other sizes took their smoke values."""
    from conftest import SMOKE_OVERRIDES

    data, _ = smoke_run("03_fusion")
    want = SMOKE_OVERRIDES["03_fusion"]["TRAIN_BATCH"]
    assert want != 4  # not the smoke size, or the test proves nothing
    assert data["params"]["TRAIN_BATCH"] == want and "TRAIN_BATCH" in data["params_given"]
    assert data["params"]["ELEMENTWISE_NUMEL"] == 1 << 18 and "ELEMENTWISE_NUMEL" not in data["params_given"]


def test_gelu_traffic_counts_eight_ops_and_nine_times_the_fused_bytes():
    from gpulab.workloads.models import gelu_tanh

    x = torch.randn(1000)
    t = F3.eager_traffic(gelu_tanh, x)
    assert t.n_ops == 8, t.ops
    assert t.ideal_bytes == 2 * 1000 * 4  # read x once, write the result once
    assert t.total_bytes == 18 * 1000 * 4  # six one-input ops (2 passes), two two-input ops (3 passes)
    assert "aten.tanh" in t._repr_html_() and t.to_dict()["n_ops"] == 8


def test_views_and_broadcasts_move_no_extra_bytes():
    x = torch.randn(32, 8)
    t = F3.eager_traffic(lambda a: a.view(-1).t() * 2, x)
    assert t.n_ops == 1 and t.total_bytes == 2 * x.numel() * 4
    assert F3._nbytes(torch.randn(8).expand(100, 8)) == 8 * 4


def test_no_compiler_is_said_not_raised(monkeypatch):
    """The degrade path the notebook keeps: without a compiler, compiler_available says why (the notebook skips
    every compile step with that reason); with a broken one, the first call's error comes back as text."""
    from gpulab.measuring import compiler

    ok, why = compiler.compiler_available("cpu")
    assert isinstance(ok, bool) and why
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    ok, why = compiler.compiler_available("cpu")
    assert not ok and "no C++ compiler" in why


def test_autotuning_is_judged_without_cuda_graphs():
    row = lambda s: dict(median_s=s, q1_s=s, q3_s=s, compile_s=10 * s)  # noqa: E731
    d, t, why = F3.autotune_rows({"default": row(1.0), "max-autotune-no-cudagraphs": row(0.9), "max-autotune": row(0.3)})
    assert t["median_s"] == 0.9 and d["median_s"] == 1.0 and not why  # the graphs' 3x is not autotuning's
    d, t, why = F3.autotune_rows({"default": row(1.0), "max-autotune": row(0.3)})
    assert t is None and why.startswith("not tested: this run measures max-autotune")
    assert "slower than eager" in F3.default_vs_eager(row(0.897e-3), 0.801e-3)
    assert "faster than eager" in F3.default_vs_eager(row(0.5e-3), 0.801e-3)
    assert F3.with_mode(F3.TRAIN_NAME, "max-autotune").endswith("(mode=max-autotune)")
    assert F3.compiled_label("reduce-overhead") == "torch.compile (mode=reduce-overhead)"
    assert "throughput" in F3.modes_table_html([dict(row(1e-3), mode="default", ok=True, reason="",
                                                     timing="throughput: 1 event pair around 100 calls")])


def test_autotuning_is_judged_on_gpu_kernel_time_not_the_launch_bound_wall_time():
    """Wall time per forward follows the host's launches; the profiles' GPU time per call is what autotuning
    changes: their median ratio, the range of the profiles' ratios as its interval."""
    default = dict(median_s=2e-3, gpu_s=[100e-6, 102e-6, 101e-6])
    tuned = dict(median_s=3e-3, gpu_s=[80e-6, 81e-6, 79e-6])  # slower on the wall clock, faster on the GPU
    r = F3.gpu_time_ratio(default, tuned)
    assert r.value == pytest.approx(101 / 80) and r.interval == pytest.approx((100 / 81, 102 / 79))
    assert F3.gpu_time_ratio(default, dict(median_s=1e-3)) is None  # no profile: no verdict (a reference row)
    assert "GPU time/forward" in F3.modes_table_html([dict(default, mode="default", ok=True, reason="")])
