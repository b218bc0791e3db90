"""Out-of-memory errors and giving memory back: one place for both."""
from __future__ import annotations

import gc

import torch

_TORCH_OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def is_oom(exc: BaseException) -> bool:
    """True for CUDA's OutOfMemoryError and for any RuntimeError saying "out of memory"."""
    return isinstance(exc, _TORCH_OOM) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def release(device: torch.device | str | None = None) -> None:
    """Collect garbage and return cached CUDA blocks to the driver (a no-op for the cache off CUDA).

    Call it outside any `except` block: by then the traceback that kept a failed step's tensors alive is gone.
    """
    gc.collect()
    if device is None or torch.device(device).type == "cuda":
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
