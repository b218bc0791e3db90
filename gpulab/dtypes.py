"""Dtype names, their torch dtypes, and what a device can run: one source for every module."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .device import DeviceInfo

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_dtype(dtype: str, allowed: tuple[str, ...] = DTYPES, name: str = "dtype") -> str:
    """Return `dtype` normalised, or raise ValueError naming the parameter and the allowed values."""
    aliases = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
               "float8": "fp8", "float8_e4m3fn": "fp8"}
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    key = aliases.get(str(dtype).lower(), str(dtype).lower())
    if key not in allowed:
        raise ValueError(f"{name}={dtype!r} is not supported; allowed: {', '.join(allowed)}")
    return key


def torch_dtype(dtype: str | torch.dtype, allowed: tuple[str, ...] = DTYPES, name: str = "dtype") -> torch.dtype:
    """The torch dtype for a dtype name ("bf16", "half", torch.float16, ...); TF32 is FP32 storage, FP8 is E4M3.

    Raises ValueError naming the parameter and the allowed values for anything else.
    """
    key = check_dtype(dtype, allowed, name)
    if key == "fp8":
        return torch.float8_e4m3fn
    return TORCH_DTYPES[key]


def dtype_support(device: DeviceInfo, dtype: str) -> str | None:
    """None when `device` can run matmuls in `dtype` on its matrix units, else the reason it cannot."""
    dtype = check_dtype(dtype)
    if not device.is_cuda:
        return "needs a CUDA GPU with tensor cores" if dtype in ("tf32", "fp8") else None
    cap = device.capability or (0, 0)
    if dtype in ("tf32", "bf16") and cap < (8, 0):
        return f"{dtype.upper()} tensor cores arrive with Ampere (sm_80); this GPU is sm_{cap[0]}{cap[1]}"
    if dtype == "fp8":
        if cap < (8, 9):
            return f"FP8 tensor cores arrive with Ada/Hopper (sm_89+); this GPU is sm_{cap[0]}{cap[1]}"
        if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
            return "this PyTorch has no torch._scaled_mm / float8 dtypes"
    return None
