"""Notebook 04's module (gpulab.lessons.sync_points): its claims as data, the overlap's hidden share, the copy
timings' estimates, the per-side trace table; the CUDA-only helpers say so on a CPU."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gpulab.measuring.estimates import Estimate
from gpulab.verdicts.lesson import lesson
from gpulab.lessons import sync_points as SP
from gpulab.verdicts.params import SCHEMAS



def test_claims_have_stable_keys_quotes_and_sources():
    keys = [c["key"] for c in SP.CLAIMS]
    assert len(keys) == len(set(keys)) and all(c["quote"] and c["source"] for c in SP.CLAIMS)
    assert "pinned" not in keys  # §5's "faster CPU→GPU transfer" is judged once, in notebook 05
    item_sync = next(c for c in SP.CLAIMS if c["key"] == "item_sync")
    assert not item_sync.get("needs")  # arr-coc's number: not comparable everywhere, never a verdict


def test_pct_faster_and_hidden_share():
    cmp = SimpleNamespace(estimate=lambda: Estimate(1.10, 1.05, 1.20))
    f = SP.pct_faster(cmp)
    assert f.value == pytest.approx(10) and f.lo == pytest.approx(5) and f.hi == pytest.approx(20)
    # serial 2 s, overlapped 1 s (speedup 2x): 1 s saved of a 1 s shorter task = 100% hidden
    h = SP.hidden_share(Estimate(2.0, 1.9, 2.1), 1.0, Estimate(1.0, 0.95, 1.05))
    assert h.value == pytest.approx(100) and h.lo < 100 < h.hi
    with pytest.raises(ValueError):
        SP.hidden_share(Estimate(2.0, 1.9, 2.1), 0.0, Estimate(1.0, 0.95, 1.05))


def test_copy_timings_estimate_their_fractions():
    c = SP.CopyTiming("pinned", host_s=1e-5, device_s=1e-3, nbytes=10**6, fractions=[0.01, 0.02, 0.03])
    assert c.gbs == pytest.approx(1.0) and c.host_fraction == pytest.approx(0.01)
    assert c.fraction_estimate().value == pytest.approx(0.02) and "gbs" in c.to_dict()
    q = SP.QueuedCopyTiming("pageable", host_s=[0.9, 1.0], queued_s=[0.8, 0.8], copy_s=[0.2, 0.2])
    assert q.waited == pytest.approx([0.9, 1.0]) and q.medians()["queued_s"] == pytest.approx(0.8)
    assert q.to_dict()["waited_median"] == pytest.approx(0.95)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_cuda_helpers_say_they_need_cuda():
    for call in (lambda: SP.copy_timing(lambda: None, 4), lambda: SP.busy_work(0.01),
                 lambda: SP.queued_copy_timing(lambda: None, lambda: None)):
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            call()


def test_trace_table_without_a_gpu_trace():
    side = SimpleNamespace(label=".item() every step", profile=None)
    html = SP.trace_table_html(SimpleNamespace(before=side, after=side))
    assert "no GPU trace here" in html and "syncs per call" in html


def test_sizes_come_from_the_schema(cpu_device):
    ns = {"SMOKE": False, "BATCH": 16}
    les = lesson("04_sync_points", ns, claims=SP.CLAIMS, device=cpu_device, show=False)  # no GPU: smoke sizes
    assert ns["BATCH"] == 16 and les.result.params_given == ["BATCH"]
    assert ns["STEPS_PER_CALL"] == 2 and ns["MIN_TIME_S"] == 0.05 and ns["MODEL"]["n_layer"] == 1
    assert les.claims["item_sync"].needs == ()
    assert ns["TRAIN_MIN_TIME_S"] == 0.05 and ns["TRAIN_ROUNDS"] == ns["CONTEXT_ROUNDS"] == 3
    assert ns["LOOP_ROUNDS"] == ns["STREAM_ROUNDS"] == 3


def test_claims_near_their_bands_keep_their_full_rounds():
    """At full size the eval loop (a claim near its band) takes 24 rounds, so that its interval (8th to 18th of the 25
    sorted ratios) drops up to seven slow rounds on either side, and as much time per side in all as 12 rounds of 3 s
    did; the two streams take 8 (on the H200, 24 read 86.2% hidden [85.3, 87.0] against an 80% bar; 8 rounds
    resampled from those keep the lower end above 84.5% in 99 draws of 100). The training loops whose claims sit near
    their bars (two .item() vs one: -4.01% [-4.01, +0.145] against 2% on the H200; zero_grad: -0.451% [-0.451, +3.34]
    against 5%) time 96 rounds of one call per side, so that their interval (39th to 59th of the 97 sorted ratios, the
    first window's included) drops up to 38 pairs that a change of host speed slowed one way; 64 resampled rounds
    put the upper ends at the bars in 5 draws of 100, 96 in 1. The two that no bar reads take 32 (the mask's 1.14x
    keeps its lower end above 1.0 in 99 draws of 100)."""
    from gpulab.measuring.estimates import median_interval
    full = {k: p.size_for(False) for k, p in SCHEMAS["04_sync_points"].items()}
    assert full["LOOP_ROUNDS"] >= 24 and full["LOOP_MIN_TIME_S"] * full["LOOP_ROUNDS"] >= 36
    assert full["STREAM_ROUNDS"] >= 8
    assert full["TRAIN_MIN_TIME_S"] < full["LOOP_MIN_TIME_S"] and full["TRAIN_ROUNDS"] >= 96
    assert 3 <= full["CONTEXT_ROUNDS"] <= full["TRAIN_ROUNDS"]
    loop = [1.09] * (full["LOOP_ROUNDS"] + 1 - 7) + [1.12, 1.13, 1.14, 1.15, 1.16, 1.17, 1.18]  # seven slow ones
    assert median_interval(loop) == (1.09, 1.09)
    stalls = [0.7 + 0.005 * i for i in range(38)]  # 38 pairs slowed each way
    ratios = [1.0] * (full["TRAIN_ROUNDS"] + 1 - 76) + stalls + [2 - r for r in stalls]
    assert median_interval(ratios) == (1.0, 1.0)
    cells = (Path(__file__).parents[1] / "notebooks" / "04_sync_points.ipynb").read_text()
    assert "rounds=TRAIN_ROUNDS, round_calls=1," in cells  # the rounds pair neighbouring calls
