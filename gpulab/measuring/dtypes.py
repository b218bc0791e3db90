"""Dtype names, their torch dtypes, and what a device can run: one source for every module."""
from __future__ import annotations

import torch

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
