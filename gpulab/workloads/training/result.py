"""What a training run returns: step times, throughput, MFU, memory and losses, with their summary."""
from __future__ import annotations

import dataclasses
import html
import statistics
from dataclasses import dataclass, field
from typing import Any

from ...measuring.flops import mfu as _mfu
from ...measuring.files import JsonRecord


def _deprecated(old: str, new: str) -> None:
    import warnings

    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


@dataclass
class TrainResult(JsonRecord):
    """Steps of one configuration: step times, throughput, MFU, peak memory and the loss curve."""

    label: str
    config: dict[str, Any]
    step_times_s: list[float]
    losses: list[float]
    tokens_per_step: int
    flops_per_token: float
    matmul_dtype: str
    peak_tflops_bf16: float | None = None  # datasheet dense BF16: the one yardstick for every configuration
    peak_tflops_own: float | None = None  # datasheet dense peak of the dtype the matmuls run in
    peak_memory_gb: float | None = None
    device: str = ""
    timer: str = "perf_counter"
    warmup_steps: int = 1
    notes: list[str] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.step_times_s)

    @property
    def first_step_s(self) -> float:
        """The first step: includes compilation, cuDNN/cuBLAS set-up and allocator growth."""
        return self.step_times_s[0]

    @property
    def step_s(self) -> float:
        """Median step time after the warm-up steps."""
        steady = self.step_times_s[self.warmup_steps:] or self.step_times_s
        return statistics.median(steady)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def tflops(self) -> float:
        return self.flops_per_token * self.tokens_per_s / 1e12

    @property
    def mfu_vs_bf16(self) -> float | None:
        """Achieved FLOP/s over the datasheet dense BF16 peak (the same yardstick for FP32 steps too)."""
        return _mfu(self.tflops * 1e12, 1.0, self.peak_tflops_bf16) if self.peak_tflops_bf16 else None

    mfu = mfu_vs_bf16  # the course's one yardstick: `mfu` is always against the BF16 dense peak here

    @property
    def mfu_vs_own_dtype(self) -> float | None:
        """Achieved FLOP/s over the datasheet dense peak of the dtype this configuration's matmuls use."""
        return _mfu(self.tflops * 1e12, 1.0, self.peak_tflops_own) if self.peak_tflops_own else None

    @property
    def mfu_own(self) -> float | None:
        """Deprecated: `mfu_vs_own_dtype`."""
        _deprecated("TrainResult.mfu_own", "TrainResult.mfu_vs_own_dtype")
        return self.mfu_vs_own_dtype

    @property
    def final_loss(self) -> float | None:
        """Mean loss of the last 10% of steps (at least 1), or None without steps."""
        if not self.losses:
            return None
        k = max(1, len(self.losses) // 10)
        return statistics.fmean(self.losses[-k:])

    def summary(self) -> dict[str, Any]:
        return {"label": self.label, "steps": self.steps, "step_ms": self.step_s * 1e3,
                "first_step_ms": self.first_step_s * 1e3, "tokens_per_s": self.tokens_per_s,
                "tflops": self.tflops, "mfu": self.mfu_vs_bf16, "mfu_own": self.mfu_vs_own_dtype, "matmul_dtype": self.matmul_dtype,
                "peak_memory_gb": self.peak_memory_gb, "final_loss": self.final_loss}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["summary"] = self.summary()
        return d

    def __repr__(self) -> str:
        s = self.summary()
        mfu = "n/a" if s["mfu"] is None else f"{s['mfu']:.1%}"
        mem = "n/a" if s["peak_memory_gb"] is None else f"{s['peak_memory_gb']:.2f} GB"
        loss = "n/a" if s["final_loss"] is None else f"{s['final_loss']:.4f}"
        return (f"TrainResult({self.label!r}: {self.steps} steps, {s['step_ms']:.1f} ms/step, "
                f"{s['tokens_per_s']:,.0f} tokens/s, MFU {mfu} (BF16 peak), peak memory {mem}, final loss {loss})")

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>"
