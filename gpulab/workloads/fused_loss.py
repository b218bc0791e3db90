"""The language-model head and its cross-entropy in one pass over the logits.

    loss = linear_cross_entropy(hidden, lm_head.weight, targets)   # = F.cross_entropy(hidden @ W.T, targets)

For GPT-2 small the logits are the step's largest tensor (tokens x 50,304), and the ordinary path reads and
writes them several times. Here the forward computes the loss *and* the logits' gradient at once, writing it
over the logits, so the backward only has its two matmuls left. On a CUDA GPU with Triton this is one kernel
(per row an online log-sum-exp, then a sweep writing softmax minus one-hot while the row is still in L2);
elsewhere the same math in PyTorch ops, which the CPU tests check.

Limits: the mean over all targets (no ignore_index, no label smoothing); FP16 falls back to the ordinary path,
since a pre-scaled FP16 gradient underflows without a loss scaler."""
from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F

__all__ = ["linear_cross_entropy", "fused_kernel_available", "kernel_status"]


@functools.lru_cache(maxsize=1)
def _triton():
    """The Triton kernel, or None where Triton (or a CUDA build of torch) is missing."""
    try:
        import triton
        import triton.language as tl
    except Exception:  # noqa: BLE001 - CPU builds of torch ship without Triton
        return None

    # Wide blocks and many warps keep few rows in flight per SM, so the second sweep finds its row in L2; which
    # width is best depends on the GPU, so Triton times these once per vocabulary size (restoring the logits
    # between trials, since the kernel overwrites them).
    configs = [triton.Config({"BLOCK": block}, num_warps=warps)
               for block, warps in ((2048, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16))]

    @triton.autotune(configs=configs, key=["n_cols"], restore_value=["logits_ptr"])
    @triton.jit
    def ce_loss_and_grad(logits_ptr, stride, targets_ptr, loss_ptr, n_cols, scale, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride
        target = tl.load(targets_ptr + row)
        running_max = -float("inf")
        running_sum = 0.0
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
            new_max = tl.maximum(running_max, tl.max(x, 0))
            running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), 0)
            running_max = new_max
        lse = running_max + tl.log(running_sum)
        tl.store(loss_ptr + row, lse - tl.load(base + target).to(tl.float32))
        # Second sweep: the row was just read, so it comes from L2, not from HBM.
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
            grad = tl.exp(x - lse)
            grad = tl.where(cols == target, grad - 1.0, grad) * scale
            tl.store(base + cols, grad.to(logits_ptr.dtype.element_ty), mask=mask)

    return ce_loss_and_grad


_kernel_error: str | None = None  # set when the kernel failed once: later calls go straight to PyTorch ops


def _on_cuda(device: torch.device | str | None) -> bool:
    return torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()


def fused_kernel_available(device: torch.device | str | None = None) -> bool:
    """Whether the Triton kernel runs here (a CUDA device and Triton); otherwise the PyTorch-ops path is used."""
    return _on_cuda(device) and _triton() is not None and _kernel_error is None


def kernel_status(device: torch.device | str | None = None) -> str:
    """Which path `linear_cross_entropy` takes on `device`, in words (and why not the kernel, where not)."""
    if fused_kernel_available(device):
        return "the Triton kernel"
    if not _on_cuda(device):
        return "PyTorch ops (the kernel needs a CUDA GPU)"
    if _triton() is None:
        return "PyTorch ops (Triton is not installed)"
    return f"PyTorch ops (the kernel failed: {_kernel_error[:200]})"


def _loss_and_grad_torch(logits: torch.Tensor, targets: torch.Tensor, scale: float) -> torch.Tensor:
    """Reference path: per-row losses, with (softmax - onehot) * scale written over `logits`."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    losses = lse - x.gather(1, targets[:, None]).squeeze(1)
    grad = torch.exp(x - lse[:, None])
    grad[torch.arange(len(targets), device=logits.device), targets] -= 1.0
    logits.copy_(grad * scale)
    return losses


def _loss_and_grad(logits: torch.Tensor, targets: torch.Tensor, scale: float) -> torch.Tensor:
    """Per-row losses, with (softmax - onehot) * scale written over `logits`: the kernel where it runs."""
    global _kernel_error
    kernel = _triton() if logits.is_cuda and _kernel_error is None else None
    if kernel is not None:
        n_rows, n_cols = logits.shape
        losses = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        try:
            kernel[(n_rows,)](logits, logits.stride(0), targets, losses, n_cols, scale)
            return losses
        except Exception as exc:  # noqa: BLE001 - a Triton that cannot compile it: same math, slower
            _kernel_error = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"the fused cross-entropy kernel did not run ({_kernel_error[:300]}); "
                          "using PyTorch ops instead", RuntimeWarning, stacklevel=2)
    return _loss_and_grad_torch(logits, targets, scale)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, dtype):
        h, w = hidden.to(dtype), weight.to(dtype)
        logits = h @ w.t()  # private to this function, so overwriting it with its gradient is safe
        losses = _loss_and_grad(logits, targets, 1.0 / len(targets))
        ctx.save_for_backward(h, w, logits)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return losses.mean()

    @staticmethod
    def backward(ctx, grad_loss):
        h, w, grad_logits = ctx.saved_tensors
        scale = grad_loss.to(h.dtype)
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_hidden = (grad_logits @ w).mul_(scale).to(ctx.dtypes[0])
        if ctx.needs_input_grad[1]:
            grad_weight = (grad_logits.t() @ h).mul_(scale).to(ctx.dtypes[1])
        return grad_hidden, grad_weight, None, None


@torch.compiler.disable  # an opaque kernel between the compiled body and the backward; compile the rest
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T` (hidden (N, C), weight (V, C)) against int64 `targets` in [0, V),
    without keeping logits besides their gradient. Under torch.autocast the matmuls run in the autocast dtype, as
    nn.Linear's would; FP16 takes the ordinary path (see the module docstring)."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden (N, C) and weight (V, C) must share C; got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must have shape ({hidden.shape[0]},); got {tuple(targets.shape)}")
    device_type = hidden.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype
    if dtype == torch.float16:
        return F.cross_entropy(F.linear(hidden, weight), targets)
    with torch.autocast(device_type, enabled=False):
        return _LinearCrossEntropy.apply(hidden, weight, targets.long().contiguous(), dtype)
