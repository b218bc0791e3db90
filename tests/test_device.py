import os
import tempfile

import pytest
import torch

from gpulab.measuring.device import DTYPES, PEAK_TABLE, DeviceInfo, check_dtype, float32_matmul_precision, get_device, lookup_peaks, slugify
from gpulab.measuring.peaks import measure_peaks

CUDA_NAMES = {  # as torch.cuda.get_device_name reports them
    "NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA H100 PCIe": "H100 PCIe", "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200": "H200 SXM", "NVIDIA A100-SXM4-40GB": "A100 40GB", "NVIDIA A100-SXM4-80GB": "A100 80GB SXM",
    "NVIDIA A100 80GB PCIe": "A100 80GB PCIe", "NVIDIA A10": "A10", "NVIDIA L4": "L4", "NVIDIA L40S": "L40S",
    "NVIDIA GeForce RTX 3090": "GeForce RTX 3090", "NVIDIA GeForce RTX 4090": "GeForce RTX 4090",
    "Tesla T4": "T4", "Tesla V100-SXM2-16GB": "V100 SXM2", "Tesla V100-PCIE-32GB": "V100 PCIe",
    "NVIDIA A10G": "A10G", "NVIDIA L40": "L40", "NVIDIA RTX A6000": "RTX A6000",
    "NVIDIA RTX 6000 Ada Generation": "RTX 6000 Ada Generation", "NVIDIA GeForce RTX 5090": "GeForce RTX 5090",
    "NVIDIA B200": "B200", "NVIDIA GH200 480GB": "GH200 (96GB HBM3)", "NVIDIA GH200 144G HBM3e": "GH200 (144GB HBM3e)",
    "NVIDIA H200 NVL": "H200 NVL",
}
NEAR_MISSES = {  # a name that contains another entry's name must still map to its own row, or to none
    "NVIDIA A100-PCIE-40GB": "A100 40GB",  # not the A10
    "NVIDIA A10": "A10",  # not the A10G
    "NVIDIA L40S": "L40S",  # not the L40
    "NVIDIA GH200 480GB": "GH200 (96GB HBM3)",  # not the H200: another memory bandwidth
    "Quadro RTX 6000": None,  # Turing, not the RTX 6000 Ada
    "NVIDIA GB200": None,  # not the B200
    "NVIDIA GeForce RTX 5090 D": None,  # a variant with other tensor limits
}


@pytest.mark.parametrize("name, model", CUDA_NAMES.items())
def test_peak_table_matches_each_gpu_to_its_own_row(name, model):
    spec = lookup_peaks(name)
    assert spec is not None and spec.model == model
    assert spec.source and spec.bandwidth_gbs > 0
    assert set(spec.tflops) <= set(DTYPES) and "fp32" in spec.tflops


@pytest.mark.parametrize("name, model", NEAR_MISSES.items())
def test_near_misses_map_to_the_right_row(name, model):
    spec = lookup_peaks(name)
    assert (spec.model if spec else None) == model


def test_gh200_has_its_own_memory_bandwidth():
    assert lookup_peaks("NVIDIA GH200 480GB").bandwidth_gbs == 4000
    assert lookup_peaks("NVIDIA H200").bandwidth_gbs == 4800


def test_peaks_are_dense_and_ordered():
    h100 = lookup_peaks("NVIDIA H100 80GB HBM3")
    assert h100.tflops["bf16"] == pytest.approx(989.4)  # dense, not the 1979 sparse figure
    for _, spec in PEAK_TABLE:
        t = spec.tflops
        if "bf16" in t:
            assert t["bf16"] > t.get("tf32", 0) >= t["fp32"] * 0.99
        if "fp8" in t:
            assert t["fp8"] == pytest.approx(2 * t["fp16"], rel=0.05)
    assert "bf16" not in lookup_peaks("Tesla T4").tflops  # no BF16 tensor cores on Turing


def test_unknown_gpu_gets_none_not_a_fallback():
    assert lookup_peaks("NVIDIA Imaginary X9000") is None
    dev = DeviceInfo(kind="cuda", name="NVIDIA Imaginary X9000", capability=(9, 0))
    assert dev.datasheet_tflops("bf16") is None


def test_cpu_device_and_round_trip():
    dev = get_device() if not torch.cuda.is_available() else DeviceInfo(kind="cpu", name="cpu")
    assert dev.slug == "cpu" and not dev.is_cuda and dev.datasheet_tflops("bf16") is None
    h100 = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", capability=(9, 0),
                      datasheet_peaks=lookup_peaks("NVIDIA H100 80GB HBM3"))
    back = DeviceInfo.from_dict(h100.to_dict())
    assert back == h100 and back.slug == "nvidia-h100-80gb-hbm3"
    assert "989 TFLOP/s" in h100._repr_html_() and "3.35 TB/s" in h100._repr_html_()  # SI, 3 figures


def test_check_dtype():
    assert check_dtype("bfloat16") == "bf16" and check_dtype(torch.float16) == "fp16"
    with pytest.raises(ValueError, match=r"dtype='int4' is not supported; allowed: fp32, tf32, bf16, fp16, fp8"):
        check_dtype("int4")
    with pytest.raises(ValueError, match="index"):
        get_device(-1)


def test_measure_peaks_on_cpu_is_cached_and_says_what_it_skipped():
    dev = DeviceInfo(kind="cpu", name="cpu")
    p = measure_peaks(dev, size=64, dtypes=("fp32", "tf32"))
    assert p.tflops["fp32"] > 0 and "tf32" not in p.tflops
    assert any("TF32 skipped" in n for n in p.notes)
    assert measure_peaks(dev, size=64, dtypes=("fp32", "tf32")) is p
    with pytest.raises(ValueError, match="dtypes"):
        measure_peaks(dev, dtypes=("fp64",))
    with pytest.raises(ValueError, match="size"):
        measure_peaks(dev, size=0)


def test_float32_matmul_precision_restores():
    before = torch.get_float32_matmul_precision()
    with float32_matmul_precision("high"):
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == before
    with pytest.raises(ValueError, match="precision"):
        float32_matmul_precision("fast")


def test_slugify():
    assert slugify("NVIDIA GeForce RTX 4090") == "nvidia-geforce-rtx-4090"


def test_measure_peaks_is_measured_once_per_run(tmp_path, monkeypatch, cpu_device):
    """Inside one course run every notebook reads the same peak: the second call measures nothing."""
    import gpulab.measuring.peaks as d  # measured peaks live in gpulab.measuring.peaks

    monkeypatch.setenv("GPULAB_RUN_ID", "run-1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the run's shared peaks live in the temp folder
    d._PEAK_CACHE.clear()
    first = measure_peaks(cpu_device, size=32, dtypes=("fp32",))
    assert first.run_id == "run-1" and first.rounds["fp32"]
    d._PEAK_CACHE.clear()  # a new notebook: a new process
    monkeypatch.setattr(d, "search_matmul_peak", lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-measured")))
    monkeypatch.setattr(d, "copy_bandwidth_gbs", lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-measured")))
    again = measure_peaks(cpu_device, size=32, dtypes=("fp32",))
    assert again.tflops == first.tflops and again.copy_gbs == first.copy_gbs
    monkeypatch.setenv("GPULAB_RUN_ID", "run-2")  # another run measures anew
    d._PEAK_CACHE.clear()
    with pytest.raises(AssertionError, match="re-measured"):
        measure_peaks(cpu_device, size=32, dtypes=("fp32",))
    monkeypatch.setenv("GPULAB_RUN_ID", "run-1")  # the same run, hours later: the GPU may have changed since
    d._PEAK_CACHE.clear()
    for f in (tmp_path / "gpulab-peaks").iterdir():
        os.utime(f, (0, 0))
    with pytest.raises(AssertionError, match="re-measured"):
        measure_peaks(cpu_device, size=32, dtypes=("fp32",))


@pytest.mark.parametrize("kwargs", [dict(size=float("nan")), dict(size=1.5), dict(size=True), dict(dtypes="fp32")])
def test_measure_peaks_rejects_bad_sizes_and_a_bare_string(kwargs, cpu_device):
    with pytest.raises(ValueError, match="size|dtypes"):
        measure_peaks(cpu_device, **kwargs)


def test_old_peaks_name_warns_and_old_files_still_load():
    h100 = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", capability=(9, 0),
                      datasheet_peaks=lookup_peaks("NVIDIA H100 80GB HBM3"))
    with pytest.warns(DeprecationWarning, match="datasheet_peaks"):
        assert h100.peaks is h100.datasheet_peaks
    old = h100.to_dict()
    old["peaks"] = old.pop("datasheet_peaks")  # a result file written before the rename
    assert DeviceInfo.from_dict(old).datasheet_tflops("bf16") == h100.datasheet_tflops("bf16")


def test_measure_peaks_keeps_each_rounds_interval_and_shares_it_in_the_run(tmp_path, monkeypatch, cpu_device):
    """Each round of the best shape keeps a 95% interval for its median call; the peak is the best round, its
    interval the rounds' range, and the next notebook of the run reads the same."""
    import gpulab.measuring.peaks as d

    monkeypatch.setenv("GPULAB_RUN_ID", "run-iv")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    d._PEAK_CACHE.clear()
    p = measure_peaks(cpu_device, size=32, dtypes=("fp32",), rounds=3)
    r, iv = p.rounds["fp32"], p.round_intervals["fp32"]
    assert len(iv) == len(r) == 3 and all(lo <= x <= hi for x, (lo, hi) in zip(r, iv))
    assert p.tflops["fp32"] == max(r) and p.interval["fp32"] == [min(r), max(r)]
    assert p.best_round("fp32")[0] == max(r) and len(p.shape["fp32"]) == 3 and p.search["fp32"]
    d._PEAK_CACHE.clear()  # the next notebook of the run reads the same intervals
    assert measure_peaks(cpu_device, size=32, dtypes=("fp32",)).round_intervals == p.round_intervals
    assert d.MeasuredPeaks(device="x", rounds={"fp32": [1.0]}).best_round("fp32") is None


def test_the_host_cpu_is_recorded_shown_and_named_when_two_runs_differ():
    dev = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", capability=(9, 0), cpu="AMD EPYC 9654 96-Core Processor")
    assert DeviceInfo.from_dict(dev.to_dict()) == dev
    assert "host CPU" in dev._repr_html_() and "EPYC 9654" in dev._repr_html_()
    old = dev.to_dict()
    del old["cpu"]  # a file written before the host was recorded
    assert DeviceInfo.from_dict(old).cpu is None
    from gpulab.measuring.device import host_difference
    other = {**dev.to_dict(), "cpu": "Intel(R) Xeon(R) Platinum 8480+"}
    line = host_difference(dev.to_dict(), other)
    assert line and "EPYC 9654" in line and "8480+" in line and "launch-bound" in line
    assert host_difference(dev.to_dict(), dev.to_dict()) is None
    assert host_difference(dev.to_dict(), old) is None  # nothing to say without both hosts
    assert get_device().cpu  # this machine's host is always named


def test_a_reference_view_says_when_the_hosts_differ():
    from gpulab.verdicts.results import ReferenceView
    mine = {"notebook": "01_measuring", "smoke": False, "experiments": [], "claims": [],
            "device": {"name": "NVIDIA H100 80GB HBM3", "cpu": "CPU A"}}
    ref = {**mine, "device": {"name": "NVIDIA H100 80GB HBM3", "cpu": "CPU B"}}
    assert "host CPUs differ (CPU A here, CPU B in the reference)" in ReferenceView(mine, ref)._repr_html_()
    assert "host CPUs differ" not in ReferenceView(mine, mine)._repr_html_()
