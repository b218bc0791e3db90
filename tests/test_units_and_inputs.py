"""Units are never silently mixed, and inputs that would give a wrong number without a word are refused."""
from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch

import gpulab as gl
from gpulab import tracker as tk
from gpulab.verdicts.claims import Claim
from gpulab.measuring.device import DeviceInfo
from gpulab.measuring.monitor import Monitor

CPU = DeviceInfo(kind="cpu", name="test CPU")


def test_mfu_is_a_fraction_that_a_percent_claim_converts():
    """Item 6: gl.mfu returns 0.45; a "40-60%" claim reads 45%, not "0.450%, refuted: lower"."""
    value = gl.mfu(0.45e12, 1.0, 1.0)
    assert value == pytest.approx(0.45)
    c = Claim("MFU is 40-60%", low=40, high=60, unit="%").check(value)
    assert c.measured == pytest.approx(45.0) and c.verdict == "confirmed" and "fraction" in c.note
    assert Claim("MFU", low=40, high=60, unit="%").check(value, interval=(0.44, 0.46)).interval == \
        pytest.approx((44.0, 46.0))
    assert Claim("MFU share", low=0.4, high=0.6, unit="").check(value).measured == pytest.approx(0.45)


@pytest.mark.parametrize("variant", ["X", "×", " x ", "times"])
def test_speed_units_are_normalised(variant):
    """Item 7: "X" or "×" is "x": a timed unit, not tested in a smoke run."""
    c = Claim("2x faster", low=2, unit=variant)
    assert c.unit == "x" and c.is_timed and c.expected == ">= 2x"


@pytest.mark.parametrize("bad", ["%%", "% faster", "2x", 3])
def test_a_variant_unit_is_refused_naming_the_allowed_ones(bad):
    with pytest.raises(ValueError, match=r"unit=.*'x', '%', '% gain'"):
        Claim("faster", low=2, unit=bad)


def test_monitor_stop_after_its_with_block_changes_nothing():
    """Item 8: a second stop() must not stretch the trace."""
    with Monitor(CPU, poll_s=0.02) as mon:
        time.sleep(0.05)
    duration, series = mon.trace.duration_s, {k: list(v) for k, v in mon.trace.series.items()}
    time.sleep(0.1)
    assert mon.stop() is mon.trace
    assert mon.trace.duration_s == duration and mon.trace.series == series


@pytest.mark.parametrize("items", [-5, float("nan"), float("inf"), "8"])
def test_tracker_refuses_a_negative_or_non_finite_item_count(items):
    """Item 9: step(items=-5) reported -312 samples/s."""
    t = tk.track(device=CPU, printer=lambda s: None)
    with pytest.raises(ValueError, match="items="):
        t.step(items=items)
    t.step(items=0)


def test_benchmark_refuses_a_callable_returning_a_generator_or_coroutine():
    """Item 10: gl.benchmark(lambda: gen()) timed creating a generator."""
    def gen():
        yield sum(range(1000))

    async def coro():
        return 1

    for fn in (lambda: gen(), lambda: coro()):
        with pytest.raises(ValueError, match="returns a generator or coroutine"):
            gl.benchmark(fn, min_time_s=0.01, warmup_s=0.0)
    assert gl.benchmark(lambda: list(gen()), min_time_s=0.01, warmup_s=0.0).median > 0


def test_before_after_says_when_a_side_changed_torchs_global_state():
    """Weak: an `after` that sets torch to 1 thread slows the before side's later rounds: the Comparison says so."""
    threads = torch.get_num_threads()
    x = torch.randn(16, 16)

    def after():
        torch.set_num_threads(1)
        return x @ x

    try:
        torch.set_num_threads(2)  # a known start: an earlier test may have left torch at 1 thread already
        cmp = gl.before_after(lambda: x @ x, after, name="threads", monitor=False, min_time_s=0.01, rounds=2,
                              device=CPU, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert any("global state changed" in n and "threads" in n for n in cmp.notes), cmp.notes
    same = gl.before_after(lambda: x @ x, lambda: x @ x, name="same", monitor=False, min_time_s=0.01, rounds=2,
                           device=CPU, progress=False)
    assert not any("global state" in n for n in same.notes)


def test_readme_says_how_to_add_a_package_without_replacing_the_cpu_torch():
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "timm" in text and "--extra-index-url https://download.pytorch.org/whl/cpu" in text
