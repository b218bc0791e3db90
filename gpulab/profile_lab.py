"""Notebook 09's workloads: a slow training loop with four problems and its fixes, the guide's §8.4 tracker,
and the step tracker's overhead measured against no tracker and against the guide's.

The slow loop trains a residual MLP on float features that start on the host, the way a tabular or
embedding model is fed. Its problems, each switched off by one `LoopConfig` field:
- `read_every_step`: `loss.item()` every step (a sync that drains the GPU's queue);
- `pinned`: False copies each batch from pageable memory with a blocking `.to(device)`;
- `bf16`: False runs the matmuls in FP32 with TF32 off (no tensor cores);
- `fused`: False uses a hand-written GELU (one kernel per elementwise op) and a per-parameter AdamW loop.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .device import synchronize
from .workloads import gelu_tanh


@dataclass(frozen=True)
class LoopConfig:
    """Which of the slow loop's habits are on (see the module docstring)."""

    read_every_step: bool = True
    pinned: bool = False
    bf16: bool = False
    fused: bool = False

    def fix(self, **changes: bool) -> LoopConfig:
        return dataclasses.replace(self, **changes)


SLOW = LoopConfig()
FIXES = (("BF16 autocast (tensor cores)", dict(bf16=True)),
         ("read the loss every N steps", dict(read_every_step=False)),
         ("pinned, non-blocking copies", dict(pinned=True)),
         ("fused GELU and AdamW", dict(fused=True)))  # in the order the evidence points to them


class ResidualMLP(nn.Module):
    """`depth` residual blocks of LayerNorm -> Linear(d, 4d) -> GELU -> Linear(4d, d), then a linear head."""

    def __init__(self, d: int, depth: int, n_out: int = 16):
        super().__init__()
        for name, v in (("d", d), ("depth", depth), ("n_out", n_out)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name}={v!r} must be a positive integer")
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(depth))
        self.ups = nn.ModuleList(nn.Linear(d, 4 * d) for _ in range(depth))
        self.downs = nn.ModuleList(nn.Linear(4 * d, d) for _ in range(depth))
        self.head = nn.Linear(d, n_out)
        self.hand_written_gelu = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = gelu_tanh if self.hand_written_gelu else (lambda t: F.gelu(t, approximate="tanh"))
        for norm, up, down in zip(self.norms, self.ups, self.downs):
            x = x + down(act(up(norm(x))))
        return self.head(x)

    def flops_per_sample(self) -> int:
        """Training FLOPs per sample: 6 per weight of each matmul (forward 2, backward 4)."""
        return 6 * sum(m.weight.numel() for m in [*self.ups, *self.downs, self.head])


class SlowLoop:
    """The training loop of notebook 09 with a chosen `LoopConfig`; `fn(steps)` makes a timed call."""

    def __init__(self, model: ResidualMLP, batch: int, config: LoopConfig = SLOW, *, n_batches: int = 4,
                 device: torch.device | str | None = None, seed: int = 0):
        if not isinstance(batch, int) or batch <= 0:
            raise ValueError(f"batch={batch!r} must be a positive integer")
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model, self.batch, self.config = model, batch, config
        cuda = self.device.type == "cuda"
        g = torch.Generator().manual_seed(seed)
        d = model.ups[0].in_features
        n_out = model.head.out_features
        pin = config.pinned and cuda  # pin_memory() needs CUDA
        self.host = [(torch.randn(batch, d, generator=g), torch.randint(0, n_out, (batch,), generator=g))
                     for _ in range(n_batches)]
        if pin:
            self.host = [(x.pin_memory(), y.pin_memory()) for x, y in self.host]
        model.hand_written_gelu = not config.fused
        # fused AdamW is one kernel for all parameters (CUDA); foreach=False is a loop of ops per parameter
        opt_kw = dict(fused=True) if config.fused and cuda else dict(foreach=config.fused)
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **opt_kw)
        self.flops_per_step = model.flops_per_sample() * batch
        self._i, self.losses = 0, []

    def step(self) -> torch.Tensor:
        """One step: copy a batch in, forward, loss, backward, optimizer step. Returns the loss (on the device)."""
        c = self.config
        x, y = self.host[self._i % len(self.host)]
        self._i += 1
        x = x.to(self.device, non_blocking=c.pinned)
        y = y.to(self.device, non_blocking=c.pinned)
        self.opt.zero_grad(set_to_none=True)
        amp = c.bf16 and self.device.type == "cuda"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def run(self, steps: int) -> float:
        """`steps` steps; the slow habit reads the loss every step, the fix once at the end."""
        prec = "highest" if not self.config.bf16 else "high"  # FP32 without TF32 for the slow loop
        old = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(prec)
        try:
            total: Any = 0.0
            for _ in range(steps):
                loss = self.step()
                total = total + (loss.item() if self.config.read_every_step else loss)
            return float(total) / steps
        finally:
            torch.set_float32_matmul_precision(old)

    def fn(self, steps: int) -> Callable[[], float]:
        return lambda: self.run(steps)


# -- the guide's tracker and the overhead experiment ----------------------------------------------------

class GuideTracker:
    """The guide's §8.4 PerformanceTracker as written: synchronize and read the host clock around each step."""

    def __init__(self, model_flops_per_step: float, device_peak_flops: float):
        self.model_flops, self.peak_flops = model_flops_per_step, device_peak_flops
        self.step_times: list[float] = []
        self.start_time = 0.0

    def start_step(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.start_time = time.perf_counter()

    def end_step(self) -> dict[str, float]:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - self.start_time
        self.step_times.append(elapsed)
        achieved = self.model_flops / elapsed
        return {"step_time": elapsed, "achieved_tflops": achieved / 1e12, "mfu_percent": achieved / self.peak_flops * 100,
                "samples_per_sec": 1 / elapsed}


TRACKER_MODES = ("off", "gpulab tracker", "guide §8.4 tracker")


@dataclass
class OverheadResult:
    """Seconds per step of one loop in each tracker mode, one value per interleaved round."""

    loop: str
    steps_per_round: int
    per_step_s: dict[str, list[float]]
    guide_mfu: list[float] = dataclasses.field(default_factory=list)
    tracker_mfu: list[float] = dataclasses.field(default_factory=list)

    def overhead_pct(self, mode: str) -> list[float]:
        """Per round: (time with `mode` / time without a tracker - 1) x 100, rounds paired in order."""
        return [(m / o - 1) * 100 for m, o in zip(self.per_step_s[mode], self.per_step_s["off"])]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {m: self.overhead_pct(m) for m in TRACKER_MODES[1:]}


def tracker_overhead(step: Callable[[], Any], *, loop: str, steps: int, rounds: int, flops_per_step: float | None,
                     peak_tflops: float | None, make_tracker: Callable[[], Any]) -> OverheadResult:
    """Time `steps` calls of `step` per round in each mode, modes interleaved (ABC, CBA, ...), one sync per round.

    A round's time is its host wall time from a synchronized start to a synchronized end, over `steps`: what
    the loop costs, tracker included. `make_tracker()` returns a fresh gpulab tracker (not started).
    """
    if steps < 1 or rounds < 1:
        raise ValueError(f"steps={steps} and rounds={rounds} must be >= 1")
    out = OverheadResult(loop=loop, steps_per_round=steps, per_step_s={m: [] for m in TRACKER_MODES})
    peak = (peak_tflops or 0) * 1e12
    for r in range(rounds):
        order = TRACKER_MODES if r % 2 == 0 else TRACKER_MODES[::-1]
        for mode in order:
            synchronize()
            t0 = time.perf_counter()
            if mode == "off":
                for _ in range(steps):
                    step()
            elif mode == "gpulab tracker":
                tr = make_tracker().start()
                for _ in range(steps):
                    step()
                    tr.step()
            else:
                gt = GuideTracker(flops_per_step or 1.0, peak or 1.0)
                for _ in range(steps):
                    gt.start_step()
                    step()
                    m = gt.end_step()
            synchronize()
            out.per_step_s[mode].append((time.perf_counter() - t0) / steps)
            if mode == "gpulab tracker":
                tr.stop()
                mfu = tr.summary().get("mfu_window")
                if mfu is not None:
                    out.tracker_mfu.append(mfu)
            elif mode != "off" and peak:
                out.guide_mfu.append(m["mfu_percent"] / 100)
    return out
