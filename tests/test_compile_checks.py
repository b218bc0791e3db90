"""compile_checks on the CPU: ratios between compile modes with their intervals, sample spreads, fusion examples."""
from __future__ import annotations

import pytest
import torch

from gpulab.lessons import compile_checks as cc
from gpulab.lessons import compile_lab as cl


def _mode(name, median, q1, q3, compile_s=None, wall_s=None, ok=True):
    return cl.ModeTiming(name, ok, compile_s=compile_s, median_s=median, iqr_s=q3 - q1, q1_s=q1, q3_s=q3,
                         wall_s=wall_s)


def test_mode_speed_ratio_interval_from_both_quartiles():
    default = _mode("default", 1.0e-3, 0.95e-3, 1.05e-3)
    ro = _mode("reduce-overhead", 0.33e-3, 0.30e-3, 0.50e-3)
    e = cc.mode_speed_ratio(default, ro)
    assert e.value == pytest.approx(1.0 / 0.33)
    assert e.lo == pytest.approx(0.95 / 0.50) and e.hi == pytest.approx(1.05 / 0.30)


def test_mode_speed_ratio_falls_back_to_the_iqr_and_refuses_a_failed_mode():
    old = cl.ModeTiming("default", True, median_s=2.0, iqr_s=0.2)  # saved before quartiles were kept
    new = _mode("max-autotune", 1.0, 0.9, 1.1)
    e = cc.mode_speed_ratio(old, new)
    assert e.lo == pytest.approx(1.9 / 1.1) and e.hi == pytest.approx(2.1 / 0.9)
    with pytest.raises(ValueError, match="max-autotune"):
        cc.mode_speed_ratio(old, cl.ModeTiming("max-autotune", False, reason="stopped at its budget"))


def test_compile_time_ratio_is_bounded_by_the_subprocess_wall_times():
    ma = _mode("max-autotune", 1, 1, 1, compile_s=35.8, wall_s=52.9)
    de = _mode("default", 1, 1, 1, compile_s=7.25, wall_s=26.5)
    e = cc.compile_time_ratio(ma, de)
    assert e.value == pytest.approx(35.8 / 7.25)
    assert e.lo == pytest.approx(35.8 / 26.5) and e.hi == pytest.approx(52.9 / 7.25)
    with pytest.raises(ValueError, match="compile"):
        cc.compile_time_ratio(_mode("eager", 1, 1, 1), de)


def test_samples_estimate():
    assert cc.samples_estimate([]) is None
    assert cc.samples_estimate([50.0]).interval == (50.0, 50.0)
    e = cc.samples_estimate([90, 92, 94, 96, 98])
    assert (e.value, e.lo, e.hi) == (94, 92, 96)


def test_kernels_per_call_is_none_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU path")
    assert cc.kernels_per_call(lambda: torch.randn(8) * 2) is None


def test_fusion_examples_compute_what_the_guide_writes():
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(cl.mul_sum(a, b), (a * b).sum(-1))
    s, c = cl.sin_cos(a)
    torch.testing.assert_close(s, torch.sin(a))
    torch.testing.assert_close(c, torch.cos(a))
    assert [n for n, _ in cl.eager_traffic(cl.mul_sum, a, b).ops] == ["mul", "sum"]
    assert cl.eager_traffic(cl.sin_cos, a).n_ops == 2


def test_mode_timing_keeps_quartiles():
    m = _mode("default", 1.0, 0.9, 1.1, compile_s=2.0, wall_s=5.0)
    assert cl.ModeTiming.from_dict(m.to_dict()) == m
