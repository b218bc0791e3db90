"""torch's process-wide settings that change a timing (threads, float32 matmul precision, TF32, grad mode): a
before/after comparison records them around every window and says when a side changed them."""
from __future__ import annotations

from typing import Any

import torch


def torch_state() -> dict[str, Any]:
    """The global settings a side of a comparison could change and leave changed."""
    return {"threads": torch.get_num_threads(), "float32 matmul precision": torch.get_float32_matmul_precision(),
            "grad mode": torch.is_grad_enabled(), "cuBLAS allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cuDNN allow_tf32": torch.backends.cudnn.allow_tf32}


class StateWatch:
    """Reads `torch_state()` after each window of a comparison and keeps every change with the side that made it."""

    def __init__(self) -> None:
        self.last = torch_state()
        self.changes: list[str] = []

    def after(self, side: str) -> None:
        """Record what changed while `side` ran (since the last reading)."""
        now = torch_state()
        self.changes += [f"{k} {self.last[k]!r} -> {v!r} (while the {side} side ran)" for k, v in now.items()
                         if self.last[k] != v]
        self.last = now

    def notes(self) -> list[str]:
        """One warning line for the Comparison when a setting changed, else none."""
        if not self.changes:
            return []
        return ["warning: torch's global state changed between rounds: " + "; ".join(self.changes[:6])
                + ". The two sides did not all run under the same settings, so the ratio is not the change's alone; "
                "restore such settings inside the function (try/finally)"]
