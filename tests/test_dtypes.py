"""One source for dtype names, torch dtypes and what a device can run."""
import pytest
import torch

from gpulab.measuring.device import DeviceInfo
from gpulab.measuring.device import dtype_support
from gpulab.measuring.dtypes import torch_dtype


def test_names_aliases_and_torch_dtypes():
    assert torch_dtype("bf16") is torch.bfloat16 and torch_dtype("half") is torch.float16
    assert torch_dtype(torch.float32) is torch.float32 and torch_dtype("tf32") is torch.float32
    with pytest.raises(ValueError, match="dtype='tf32' is not supported; allowed: fp32, bf16, fp16"):
        torch_dtype("tf32", allowed=("fp32", "bf16", "fp16"))
    with pytest.raises(ValueError, match="param_dtype='int8'"):
        torch_dtype("int8", name="param_dtype")


def test_dtype_support_says_why_not():
    cpu = DeviceInfo(kind="cpu", name="cpu")
    assert dtype_support(cpu, "fp32") is None and "CUDA" in dtype_support(cpu, "fp8")
    v100 = DeviceInfo(kind="cuda", name="Tesla V100", capability=(7, 0))
    assert "Ampere" in dtype_support(v100, "bf16")
    from gpulab.workloads import matmuls
    assert matmuls.dtype_support is dtype_support  # the matmul workloads use the one source


def test_oom_detection_has_one_home():
    from gpulab.tools import batchsize
    from gpulab.measuring import memory
    assert batchsize.is_oom is memory.is_oom
    assert memory.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 12.28 GiB"))
    assert not memory.is_oom(RuntimeError("shape mismatch"))
    memory.release("cpu")  # no CUDA: collects garbage, nothing else
