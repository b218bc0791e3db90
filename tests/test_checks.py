"""The shared argument checks, and the library calls that use them: NaN, bools and wrong types are refused."""
import math

import pytest
import torch

from gpulab.measuring import checks
from gpulab.measuring.device import DeviceInfo, get_device
from gpulab.measuring.peaks import measure_peaks
from gpulab.measuring.monitor import Monitor


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, "1", True, None])
def test_positive_float_refuses(value):
    with pytest.raises(ValueError, match=r"min_time_s=.* must be a finite number > 0"):
        checks.positive_float("min_time_s", value)


def test_positive_float_accepts():
    assert checks.positive_float("x", 2) == 2.0 and checks.positive_float("x", None, allow_none=True) is None
    assert checks.positive_float("x", 0, allow_zero=True) == 0.0


@pytest.mark.parametrize("value", [0, -3, 1.5, math.nan, "8", True, None])
def test_positive_int_refuses(value):
    with pytest.raises(ValueError, match=r"size=.* must be an int >= 1"):
        checks.positive_int("size", value)


def test_positive_int_and_choice():
    assert checks.positive_int("n", 3) == 3 and checks.positive_int("n", 0, minimum=0) == 0
    assert checks.choice("dtype", "bf16", ("fp32", "bf16")) == "bf16"
    with pytest.raises(ValueError, match=r"dtype='int4' is not allowed; allowed: 'fp32', 'bf16'"):
        checks.choice("dtype", "int4", ("fp32", "bf16"))
    with pytest.raises(ValueError, match="allowed: True, False"):
        checks.choice("flag", 1, (True, False))  # 1 == True, but it is not a bool
    with pytest.raises(ValueError, match="non-empty list"):
        checks.sequence_of("sizes", "fp32", checks.positive_int)
    with pytest.raises(ValueError, match=r"sizes\[1\]=0 must be an int"):
        checks.sequence_of("sizes", [8, 0], checks.positive_int)


@pytest.mark.parametrize("poll_s", [math.nan, 0, -1, "1"])
def test_monitor_refuses_bad_poll_interval(poll_s, cpu_device):
    with pytest.raises(ValueError, match="poll_s="):
        Monitor(cpu_device, poll_s=poll_s)
    with pytest.raises(ValueError, match="gpm_period_s="):
        Monitor(cpu_device, gpm_period_s=math.nan)


@pytest.mark.parametrize("size", [math.nan, 1.5, 0, True])
def test_measure_peaks_refuses_bad_sizes_before_measuring(size, cpu_device):
    with pytest.raises(ValueError, match="size="):
        measure_peaks(cpu_device, size=size, refresh=True)


def test_measure_peaks_refuses_a_string_for_dtypes(cpu_device):
    with pytest.raises(ValueError, match=r"dtypes='fp32' must be a tuple"):
        measure_peaks(cpu_device, size=32, dtypes="fp32")
    p = measure_peaks(cpu_device, size=32, dtypes=["fp32"], refresh=True)
    assert set(p.tflops) == {"fp32"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_get_device_with_an_index_on_a_machine_without_a_gpu_is_an_error():
    with pytest.raises(ValueError, match="index=7 asks for CUDA device 7, but no CUDA GPU is visible"):
        get_device(7)
    with pytest.raises(ValueError, match="index=True"):
        get_device(True)


def test_cuda_device_index_out_of_range(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="index=7 but only 1 CUDA device"):
        get_device(7)


def test_cpu_is_named_by_its_processor(monkeypatch):
    import gpulab.measuring.device as device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device.Path, "read_text", lambda self, **k: "processor\t: 0\nmodel name\t: AMD  EPYC 7R13 "
                        "Processor\n" if str(self) == "/proc/cpuinfo" else "")
    assert get_device().name == "AMD EPYC 7R13 Processor"
    assert isinstance(DeviceInfo(kind="cpu", name=device.cpu_name()).name, str)
