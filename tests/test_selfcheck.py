"""`python -m gpulab check` in smoke mode: every claim gets a verdict or a reason, and the file is written."""
import pytest
import torch

from gpulab.measuring.device import get_device
from gpulab.verdicts.results import load_result
from gpulab.app.selfcheck import monitor_overhead, run_check


def test_smoke_check_records_every_claim_and_saves(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    result = run_check(smoke=True)
    assert len(result.claims) == 6
    keys = [c.key for c in result.claims]  # runs and summaries match claims on their key
    assert len(set(keys)) == 6 and all(k.startswith("00.") for k in keys)
    assert all(c.quote.startswith("course check: ") for c in result.claims)  # ours, and says so
    for c in result.claims:
        assert c.verdict in ("confirmed", "refuted", "inconclusive", "not tested")
        if c.verdict == "not tested":
            assert c.note  # says why
    if not torch.cuda.is_available():  # the GPU claims say so on a CPU-only machine
        assert sum(c.verdict == "not tested" for c in result.claims) == 5
        assert all("CUDA" in c.note for c in result.claims[:5])
    # The overhead claim is measured on any device, from one run's alternating phases.
    overhead = result.claims[-1]
    assert overhead.measured is not None and overhead.verdict != "not tested"
    assert result.extra["monitor_overhead_ratio"] > 0
    saved = load_result(result.path())
    assert saved["notebook"] == "00_device" and saved["smoke"] is True
    assert [c["text"] for c in saved["claims"]] == [c.text for c in result.claims]
    host = saved["extra"]["host"]  # the host's speed, reported beside the claims (launch-bound work runs at it)
    assert host["cpu"] and host["launch_us"] > 0 and len(host["launch_us_rounds"]) == 3
    agree = saved["extra"]["timer_agreement"]  # gpulab against torch.utils.benchmark, three kinds of call
    assert set(agree) == {"tiny_add", "matmul", "gelu"}
    for t in agree.values():
        assert t["ratio"] == pytest.approx(t["gpulab_s"] / t["torch_s"]) and t["ratio"] > 0
        assert t["gpulab_mode"].startswith(("latency:", "throughput:"))  # the mode benchmark chose, recorded
    # Which mode: "auto" decides from a timing, so a loaded host may time the tiny add per call; the rule itself is
    # tested on a fake clock (test_timing.py: a fast call is timed as throughput, a slow one per call).


def test_monitor_overhead_alternates_phases():
    off, on = monitor_overhead(get_device(), phases=4, blocks=2, block_s=0.01, width=32, batch=8)
    # Phases go off, on, on, off: two of each, `blocks` timings per phase.
    assert off.n == on.n == 4
    assert off.median > 0 and on.median > 0


def test_floors_are_fractions_of_this_devices_datasheet():
    """An H200 at 687 TFLOP/s BF16 passes the floor (60% of 989); a floor of 700 once said "refuted" there."""
    from gpulab.measuring.device import DeviceInfo, lookup_peaks
    from gpulab.measuring.peaks import MeasuredPeaks
    from gpulab.app.selfcheck import floor_claims

    h200 = DeviceInfo(kind="cuda", name="NVIDIA H200", capability=(9, 0), datasheet_peaks=lookup_peaks("NVIDIA H200"))
    peaks = MeasuredPeaks(device="NVIDIA H200", tflops={"bf16": 687.0}, rounds={"bf16": [658.0, 687.0, 680.0]},
                          copy_gbs=4250.0)
    (bf16, v1, _), (copy, v2, _) = floor_claims(h200, peaks, smoke=False)
    assert bf16.check(v1).verdict == "confirmed" and bf16.low == pytest.approx(0.6 * 989.4)
    assert copy.check(v2).verdict == "confirmed" and copy.low == pytest.approx(0.7 * 4800)
    slow = MeasuredPeaks(device="NVIDIA H200", tflops={"bf16": 500.0}, rounds={"bf16": [480.0, 500.0]}, copy_gbs=2000.0)
    (bf16, v1, _), (copy, v2, _) = floor_claims(h200, slow, smoke=False)
    assert bf16.check(v1).verdict == "refuted" and copy.check(v2).verdict == "refuted"
    unknown = DeviceInfo(kind="cuda", name="NVIDIA Future GPU", capability=(12, 0), datasheet_peaks=None)
    for claim, value, why in floor_claims(unknown, peaks, smoke=False):
        assert value is None and "no datasheet entry" in why
