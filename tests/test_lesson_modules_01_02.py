"""The lesson modules of notebooks 01 and 02 (claims as data, evidence, tables and figures), on the CPU."""
import glob
import re
from pathlib import Path

import pytest

import gpulab as gl
from gpulab.measuring.estimates import Estimate
from gpulab.verdicts.lesson import _as_spec
from gpulab.lessons import measuring as M
from gpulab.lessons import tensor_cores as TC
from gpulab.measuring.monitor import Trace
from gpulab.verdicts.params import SCHEMAS
from gpulab.workloads.sampling import BurstRun

from _notebook_run import GUIDE  # noqa: E402


def test_claims_are_valid_specs_with_unique_keys():
    for claims in (M.CLAIMS, TC.CLAIMS):
        specs = [_as_spec(c) for c in claims]
        assert len({s.key for s in specs}) == len(specs)
        assert all(s.quote and s.source for s in specs)
    keys = {c["key"] for c in M.CLAIMS}
    assert set(M.NOT_COMPARABLE) | set(M.UNTESTABLE) <= keys
    assert set(TC.UNTESTABLE) <= {c["key"] for c in TC.CLAIMS}


@pytest.mark.skipif(not GUIDE.exists(), reason="the guide's files are not on this machine")
def test_the_built_alignment_claim_quotes_the_guide_verbatim():
    """The declared claims are checked in tests/test_technique_in_cells.py; this one is built at run time."""
    text = " ".join(Path(f).read_text() for f in glob.glob(str(GUIDE / "*.txt")))
    squash = lambda s: re.sub(r"\s+", " ", s)  # noqa: E731
    c = TC.square_claim(128, 127).__dict__
    assert squash(c["quote"]) in squash(text), c["key"]


def test_sizes_live_in_the_schemas():
    for name in ("01_measuring", "02_tensor_cores"):
        sized = {k: p for k, p in SCHEMAS[name].items() if p.has_default}
        assert {"BIG_N", "MIN_TIME_S"} <= set(sized)
    assert SCHEMAS["01_measuring"]["BIG_N"].size_for(False) == 4096
    assert SCHEMAS["01_measuring"]["BIG_N"].size_for(True) == 64
    assert SCHEMAS["02_tensor_cores"]["BIG_N"].size_for(False) == 8192
    assert SCHEMAS["02_tensor_cores"]["ROUNDS"].size_for(True) == 2
    few, rounds = (SCHEMAS["02_tensor_cores"][k].size_for(False) for k in ("FEW_ROUNDS", "ROUNDS"))
    # Wide-margin comparisons (FP8 1.90x against 3.5-4.5x, alignment 4.46x and 2.62x against 1.05x on the H200) still
    # get two rounds beside the first window: three ratios, their range; the pairs near their band get more.
    assert 2 <= few < rounds


def test_02_leaves_the_tf32_8x_sentence_to_07():
    """One guide sentence, one verdict: §7.3's "8× faster than FP32" is judged in 07 (mixed precision), not in 02."""
    from gpulab.lessons import mixed_precision as MP

    quote = "8× faster than FP32 (uses Tensor Cores)"
    assert quote in {c["quote"] for c in MP.CLAIMS}
    assert quote not in {c["quote"] for c in TC.CLAIMS} and "tf32_8x" not in {c["key"] for c in TC.CLAIMS}
    assert "tf32_auto" in {c["key"] for c in TC.CLAIMS}  # the TF32 time still decides "no code change"


def test_tiny_count_refuses_unequal_flops():
    assert M.tiny_count(64, 16) == 64
    with pytest.raises(ValueError, match="TINY_SIZE"):
        M.tiny_count(64, 24)


def test_evidence_without_a_reading_gives_the_reason():
    for value, why in (M.window(None), M.bursts(None, []), M.kernels_active(None, []), M.memory_util({"copy": None}),
                       M.target_util(None, None), M.compute_types(None, None, "bf16")):
        assert value is None and why.startswith("needs")
    assert M.window(Estimate(1.0, 0.9, 1.1))[0].value == 1.0


def test_kernels_active_is_nvml_over_the_busy_share_and_can_fail():
    """Judged on NVML's reading over the events' busy share: a ratio near 1 confirms, an 'any kernel in the period'
    reading (about 5x on 20% busy bursts) refutes."""
    run = BurstRun(burst_ms=10, gap_ms=40, periods=[(0, 1, 100.0, 20.0)] * 3)
    spec = _as_spec(next(c for c in M.CLAIMS if c["key"] == "kernels_active"))
    est, note = M.kernels_active(Estimate(5.0, 4.8, 5.2), [run])
    assert spec.new().check(est).verdict.startswith("refuted") and "ours" in note
    assert spec.new().check(Estimate(1.0, 0.95, 1.05)).verdict == "confirmed"


def test_kernels_active_holds_only_if_every_burst_pattern_does():
    """A definition holds on every workload: 1 ms bursts that NVML reads at 0.78 of their busy time are not hidden by
    10 ms bursts read at 0.95 (the quartiles of all periods pooled read [0.91, 0.95] here and confirmed it)."""
    from gpulab.workloads.sampling import captured_share

    spec = _as_spec(next(c for c in M.CLAIMS if c["key"] == "kernels_active"))
    short = BurstRun(burst_ms=1, gap_ms=9, periods=[(i, i + 1, 7.8, 10.0) for i in range(3)])
    long = BurstRun(burst_ms=10, gap_ms=40, periods=[(i, i + 1, 19.0, 20.0) for i in range(3, 12)])
    est, note = M.kernels_active(captured_share([short, long]), [short, long])
    assert est.value == pytest.approx(captured_share([short, long]).value)  # the pooled ratio stays the value
    assert est.lo == pytest.approx(0.78) and est.hi == pytest.approx(0.95)
    assert spec.new().check(est).verdict == "inconclusive"
    assert "1 ms every 10 ms" in note and "0.780x" in note and "0.950x" in note
    both = [BurstRun(1, 9, periods=[(i, i + 1, 9.5, 10.0) for i in range(3)]), long]
    assert spec.new().check(M.kernels_active(captured_share(both), both)[0]).verdict == "confirmed"


def test_raw_matmul_is_judged_on_the_best_shape_with_the_range_of_its_rounds():
    """The best shape the search found, its best round; the interval covers every round, so a spread like the
    earlier H100 run's (66.2-72.6% over seven measurements of one shape) reads inconclusive, not a 0.06-point verdict."""
    from gpulab.measuring.device import DeviceInfo, lookup_peaks
    from gpulab.measuring.peaks import MeasuredPeaks

    h100 = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", capability=(9, 0),
                      datasheet_peaks=lookup_peaks("NVIDIA H100 80GB HBM3"))
    ds = h100.datasheet_tflops("bf16")
    spec = _as_spec(next(c for c in M.CLAIMS if c["key"] == "raw_matmul"))
    rounds = [760.0, 771.0, 765.0, 768.0, 772.0]
    search = [[256 * i, 4096, 4096, 700.0] for i in range(1, 80)]
    peaks = MeasuredPeaks(device=h100.name, tflops={"bf16": 768.0}, rounds={"bf16": rounds}, matmul_size=4096,
                          shape={"bf16": [2304, 4096, 4096]}, interval={"bf16": [760.0, 772.0]},
                          search={"bf16": search})
    est, note = M.raw_matmul(h100, peaks, "bf16")
    assert est.value == pytest.approx(100 * 768.0 / ds)
    assert (est.lo, est.hi) == pytest.approx((100 * 760.0 / ds, 100 * 772.0 / ds))
    assert spec.new().check(est).verdict == "confirmed"
    assert "2304x4096x4096" in note and "79 shapes" in note and "range of the rounds" in note
    spread = MeasuredPeaks(device=h100.name, tflops={"bf16": 700.0}, rounds={"bf16": [655.0, 700.0, 718.0]},
                           interval={"bf16": [655.0, 718.0]})
    assert spec.new().check(M.raw_matmul(h100, spread, "bf16")[0]).verdict == "inconclusive"
    slow = MeasuredPeaks(device=h100.name, tflops={"bf16": 640.0}, rounds={"bf16": [640.0, 630.0]})
    assert spec.new().check(M.raw_matmul(h100, slow, "bf16")[0]).verdict == "refuted"  # it can fail
    old = MeasuredPeaks.from_dict({"device": h100.name, "tflops": {"bf16": 710.6}, "matmul_size": 8192,
                                   "rounds": {"bf16": [710.6, 688.5]}})
    est, note = M.raw_matmul(h100, old, "bf16")  # peaks measured before the search: one cube, its rounds' range
    assert est.lo == pytest.approx(100 * 688.5 / ds) and "8192³" in note


def test_memory_util_is_judged_on_the_workload_where_the_readings_differ_more():
    def trace(mem, dram):
        return Trace(series={"nvml_mem_util": [(0.1, mem), (0.2, mem), (0.3, mem)],
                             "gpm_dram_bw": [(0.5, dram), (1.5, dram)]}, window={"gpm_dram_bw": dram})

    est, note = M.memory_util({"copy": trace(60.0, 90.0), "matmul": trace(5.0, 4.0)})
    assert est.value == pytest.approx(-30.0) and "judged on the copy" in note


def test_lesson_records_every_claim_on_cpu(cpu_device, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    les = gl.lesson("02_tensor_cores", {"SMOKE": True}, claims=TC.CLAIMS, device=cpu_device, show=False)
    les.claims["align_square matmul"] = TC.square_claim(128, 127)
    TC.record_the_rest(les)
    les.save()
    texts = {c.text: c.verdict for c in les.result.claims}
    assert texts["Matmul dimensions should be multiples of 8 for tensor cores (128 vs 127) (aligned ÷ misaligned "
                 "TFLOP/s)"] == "not tested"
    assert sum(v == "not comparable" for v in texts.values()) == 3  # §2.3 MFU targets; the GPT-3 row is judged in 10


def test_bad_neighbours_are_the_guides():
    assert TC.bad_neighbours(4096, 32, 1024, 768) == dict(n=4095, batch=33, hidden=770, seq=1000)


def test_tables_use_readable_numbers():
    from gpulab.measuring.measurement import Measurement

    table = TC.dtype_table({"fp32": Measurement("fp32", [2e-3] * 3), "bf16": Measurement("bf16", [2e-4] * 3)}, 1e12)
    assert "10.0x" in table and "500 TFLOP/s" in table
    html = M.counts_html({"x": (1.7e12, 5.1e12)}, "t")
    assert "1.70 TFLOP" in html and "5.10 TFLOP" in html
    assert "periods read as 0%" in M.bursts_html([BurstRun(1, 9)])


def test_tf32_is_judged_on_the_searched_shapes():
    """TF32 over FP32 from the shape search's best shape of each: medians' ratio, rounds' ranges as the interval."""
    from types import SimpleNamespace

    from gpulab.lessons import tensor_cores as TC
    peaks = SimpleNamespace(tflops={"fp32": 52.0, "tf32": 385.0},
                            interval={"fp32": [51.5, 52.5], "tf32": [380.0, 390.0]}, shape={"fp32": [8448, 4096, 4096], "tf32": [3072, 4096, 4096]})
    est, note = TC.searched_ratio(peaks, "tf32", "fp32")
    assert est.value == pytest.approx(385 / 52) and est.interval == pytest.approx((380 / 52.5, 390 / 51.5))
    assert "best TF32 shape (3072x4096x4096) against FP32's best (8448x4096x4096)" in note
    assert TC.searched_ratio(SimpleNamespace(tflops={"fp32": 1.0}, interval={}, shape={}), "tf32", "fp32") == (None, "")
