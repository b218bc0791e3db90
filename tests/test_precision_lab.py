import math

import pytest
import torch

from gpulab.lessons import precision_lab as P
from gpulab.claims import Estimate
from gpulab.device import DeviceInfo, lookup_peaks
from gpulab.workloads import GPTConfig


def test_optimizer_step_fns_update_every_variant_alike():
    cfg = GPTConfig.smoke(vocab_size=64, block_size=16, n_embd=32)
    fns = P.optimizer_step_fns(cfg, "cpu")
    assert set(fns) == set(P.OPTIMIZER_VARIANTS)
    before = {k: [p.detach().clone() for g in f.__self__.param_groups for p in g["params"]] for k, f in fns.items()}
    for f in fns.values():
        f()
    after = {k: [p.detach() for g in f.__self__.param_groups for p in g["params"]] for k, f in fns.items()}
    deltas = {k: [a - b for a, b in zip(after[k], before[k])] for k in fns}
    for k in fns:  # each variant moved its own copy, by the same AdamW update
        assert any(d.abs().max() > 0 for d in deltas[k])
        for d, ref in zip(deltas[k], deltas["for-loop"]):
            torch.testing.assert_close(d, ref, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("kwargs, name", [(dict(variants=("adam",)), "variants"), (dict(variants="fused"), "variants")])
def test_optimizer_step_fns_rejects_bad_variants(kwargs, name):
    with pytest.raises(ValueError, match=name):
        P.optimizer_step_fns(GPTConfig.smoke(), "cpu", **kwargs)


def test_manual_attention_matches_sdpa():
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(P.manual_attention(q, k, v), ref, rtol=1e-5, atol=1e-5)


def test_attention_fns_run_forward_and_backward():
    manual, sdpa = P.attention_fns(2, 2, 16, 8, "cpu", dtype="fp32")
    manual()
    sdpa()
    assert P.attention_step_flops(2, 2, 16, 8) == 3 * 4 * 2 * 16**2 * 16
    with pytest.raises(ValueError, match="dtype"):
        P.attention_fns(2, 2, 16, 8, "cpu", dtype="fp8")
    with pytest.raises(ValueError, match="seq_len"):
        P.attention_fns(2, 2, 0, 8, "cpu")


def test_loss_gap_estimate_is_signed_with_per_step_quartiles():
    ref = [2.0] * 20
    run = [2.0] * 18 + [2.2, 2.0]  # last 10% = 2 steps: +10% and 0%
    est = P.loss_gap_estimate(run, ref, min_spread_steps=1)
    assert est.value == pytest.approx(5.0) and est.interval == pytest.approx((2.5, 7.5))  # quartiles of 0%, +10%
    wide = P.loss_gap_estimate(run, ref)  # the spread over the last 5 steps: 0, 0, 0, +10%, 0
    assert wide.value == pytest.approx(5.0) and wide.interval == pytest.approx((0.0, 5.0))
    lower = P.loss_gap_estimate([1.8] * 20, ref)
    assert lower.value == pytest.approx(-10.0) and lower.lo == pytest.approx(-10.0) == lower.hi
    with pytest.raises(ValueError, match="equally long"):
        P.loss_gap_estimate([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        P.loss_gap_estimate([float("nan")], [1.0])


def test_tf32_speed_ratio_says_when_a_3090_figure_carries_over():
    h100 = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", datasheet_peaks=lookup_peaks("H100 80GB HBM3"))
    r = P.tf32_speed_ratio(h100)
    assert r["here"] == pytest.approx(494.7 / 67) and r["reference"] == pytest.approx(1.0)
    assert r["comparable"] is False and "RTX 3090" in P.tf32_note(r)
    ga102 = DeviceInfo(kind="cuda", name="NVIDIA GeForce RTX 3090", datasheet_peaks=lookup_peaks("RTX 3090"))
    assert P.tf32_speed_ratio(ga102)["comparable"] is True
    unknown = P.tf32_speed_ratio(None)
    assert unknown["comparable"] is False and "unknown" in P.tf32_note(unknown)


def test_step_claims_judge_skip_and_set_aside():
    est = Estimate(1.8, 1.75, 1.85)
    measured = {"bf16_vs_tf32": est, "mp_ratio_003": est, "mp_ms_003": Estimate(20.9, 20.8, 21.0)}
    claims = {c.text: c for c in P.step_claims(measured, not_comparable={"mp_ms_003": "another model"})}
    by_key = dict(zip([k for k, *_ in P.STEP_CLAIMS], P.step_claims(measured, not_comparable={"mp_ms_003": "x"})))
    assert by_key["bf16_vs_tf32"].verdict == "confirmed" and by_key["bf16_vs_tf32"].measurement == "bf16_vs_tf32"
    assert by_key["mp_ratio_003"].verdict == "refuted" and by_key["mp_ratio_003"].side == "lower"
    assert by_key["mp_ratio_003"].measurement == "bf16_vs_tf32"  # one measurement, two claims
    assert by_key["mp_ms_003"].verdict == "not comparable" and by_key["mp_ms_003"].measured == pytest.approx(20.9)
    assert by_key["fp16_vs_fp32"].verdict == "not tested"
    assert len(claims) == len(P.STEP_CLAIMS)
    assert all(c.verdict == "not tested" and c.note == "no GPU" for c in P.step_claims(None, why_not="no GPU"))
    assert not math.isnan(by_key["bf16_vs_tf32"].interval[0])
