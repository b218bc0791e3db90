"""FLOP math: pure formulas, a counter on FlopCounterMode, and MFU.

Conventions (state them, because MFU figures differ by them):
- A multiply-add is 2 FLOPs. Only matmul-like work is counted (matmul, conv, attention); elementwise ops are
  not, as in FlopCounterMode and the PaLM/nanoGPT MFU.
- Training step = forward + backward = 3x forward (backward computes two matmuls per forward matmul).
- Causal attention is counted in full (T×T scores), as nanoGPT, PaLM and FlopCounterMode do. A causal kernel
  (flash attention) skips about half of that work, so pass `causal=True` to count only what it must do.
- MFU is against a *dense* peak for the dtype the matmuls run in. A sparse peak, a TF32 peak for BF16 work or
  another GPU's peak gives a wrong MFU.
"""
from __future__ import annotations

import warnings
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from .units import Share


def _positive(**kwargs: float) -> None:
    for name, value in kwargs.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a positive number (finite, not NaN)")


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m×k) @ (k×n) matmul: 2·m·n·k."""
    _positive(m=m, n=n, k=k)
    return 2 * m * n * k


def attention_flops(batch: int, seq_len: int, d_model: int, n_layers: int = 1, *, causal: bool = False,
                    backward: bool = False) -> float:
    """FLOPs of the score (QKᵀ) and value (AV) matmuls: 4·B·T²·d per layer forward, halved when `causal`."""
    _positive(batch=batch, seq_len=seq_len, d_model=d_model, n_layers=n_layers)
    f = 4 * batch * seq_len**2 * d_model * n_layers
    f = f / 2 if causal else f
    return f * 3 if backward else f


def transformer_flops_per_token(n_params: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int, *,
                                causal: bool = False, training: bool = True) -> float:
    """FLOPs per token of a decoder transformer: 6N + 12·L·H·Q·T for a training step (nanoGPT/PaLM).

    6N: each parameter in a matmul does a multiply-add forward (2) and two backward (4); N counts the weights
    that take part in matmuls (the tied lm_head included, position embeddings not).
    12·L·H·Q·T: attention scores and values, 4·T·(H·Q) per layer per token forward, ×3 for training.
    Forward only (inference): 2N + 4·L·H·Q·T.
    """
    _positive(n_params=n_params, n_layers=n_layers, n_heads=n_heads, head_dim=head_dim, seq_len=seq_len)
    attn = 4 * n_layers * n_heads * head_dim * seq_len * (0.5 if causal else 1.0)
    dense = 2 * n_params
    mult = 3 if training else 1
    return mult * (dense + attn)


def guide_transformer_flops(batch_size: int, seq_len: int, hidden_size: int, num_layers: int,
                            vocab_size: int) -> float:
    """The guide's §1.2 formula, reproduced as written (forward only, no Q/K/V/output projections)."""
    _positive(batch_size=batch_size, seq_len=seq_len, hidden_size=hidden_size, num_layers=num_layers,
              vocab_size=vocab_size)
    attn = 4 * batch_size * seq_len**2 * hidden_size * num_layers
    ffn = 2 * batch_size * seq_len * hidden_size * (4 * hidden_size) * num_layers
    embed = 2 * batch_size * seq_len * hidden_size * vocab_size
    return attn + ffn + embed


@dataclass
class FlopCount:
    """FLOPs counted by torch.utils.flop_counter.FlopCounterMode for one call, in total and per op."""

    total: int
    by_op: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "by_op": self.by_op}

    def __repr__(self) -> str:
        ops = ", ".join(f"{k}: {v:.3g}" for k, v in sorted(self.by_op.items(), key=lambda kv: -kv[1]))
        return f"FlopCount({self.total:.4g} FLOPs; {ops})"


def count_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FlopCount:
    """Run `fn(*args, **kwargs)` once under FlopCounterMode and return the FLOPs it counted.

    Some backends count some ops as 0 (e.g. SDPA on CPU in some torch versions): check against a formula.
    """
    if not callable(fn):
        raise ValueError("fn must be callable")
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as mode:
        fn(*args, **kwargs)
    by_op: dict[str, int] = {}
    for op, n in mode.get_flop_counts().get("Global", {}).items():
        name = str(op).split(".")[1] if "." in str(op) else str(op)  # "aten.mm.default" -> "mm"
        by_op[name] = by_op.get(name, 0) + int(n)
    return FlopCount(total=int(mode.get_total_flops()), by_op=by_op)


def tflops(flops: float, seconds: float) -> float:
    """Achieved TFLOP/s."""
    _positive(flops=flops, seconds=seconds)
    return flops / seconds / 1e12


def mfu(flops: float, seconds: float, peak_tflops: float | None, *, measured_peak_tflops: float | None = None
        ) -> float | None:
    """Model FLOP/s utilization: achieved FLOP/s over `peak_tflops` (a fraction, 0.5 = 50%).

    Returns None when the peak is unknown (an unknown GPU gets no silent fallback). Warns when the achieved
    rate exceeds the measured peak or the given peak: then the FLOP count or the peak is wrong.
    """
    achieved = tflops(flops, seconds)
    if measured_peak_tflops is not None and achieved > 1.05 * measured_peak_tflops:
        warnings.warn(f"achieved {achieved:.1f} TFLOP/s is above the measured peak {measured_peak_tflops:.1f}: "
                      "the FLOP count or the peak is wrong (sparse peak? wrong dtype? causal attention counted "
                      "in full?)", stacklevel=2)
    if peak_tflops is None:
        return None
    _positive(peak_tflops=peak_tflops)
    value = achieved / peak_tflops
    if value > 1.0:
        warnings.warn(f"MFU {value:.0%} is over 100%: the FLOP count or the peak ({peak_tflops} TFLOP/s) is wrong",
                      stacklevel=2)
    return Share(value)  # a fraction of 1: a claim in percent converts it
