"""Measured configurations: one `ConfigRun` per configuration, through gpulab's measuring harness."""
from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ...measuring.memory import is_oom
from ...measuring.estimates import Estimate
from ...measuring.device import DeviceInfo, get_device, synchronize
from ...measuring.timing import ROUND, benchmark
from ...measuring.measurement import quantiles
from .config import TrainConfig, describe, halve_batch
from .result import _deprecated
from .trainer import Trainer

@dataclass
class ConfigRun:
    """One configuration measured through gpulab's harness: its RunResult plus what the harness does not keep."""

    label: str
    config: TrainConfig
    run: Any  # gpulab.verdicts.experiment.RunResult: timing, FLOPs, MFU for its own dtype, the monitor's trace
    first_step_s: float  # the first step alone: compilation and set-up included
    peak_memory_gb: float | None
    peak_tflops_bf16: float | None
    notes: list[str] = field(default_factory=list)

    @property
    def step_s(self) -> float:
        return self.run.seconds

    def tokens_per_s_estimate(self) -> Estimate:
        """Tokens/s with its interval: over the timed windows' wall time when measured as a pipeline (the loop
        pulls from a DataLoader), else tokens per step over the median step (quartiles as the interval)."""
        est = self.run.throughput_estimate()
        if est is None:  # a run without items: the step time alone
            m = self.run.measurement
            t = self.config.tokens_per_step
            est = Estimate(t / m.median, t / m.q3, t / m.q1)
        return est

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_s_estimate().value

    def mfu_estimate(self) -> Estimate | None:
        """MFU against the datasheet dense BF16 peak, from tokens/s (and its interval)."""
        if not self.peak_tflops_bf16:
            return None
        per_token = self.config.flops_per_token() / 1e12 / self.peak_tflops_bf16
        return self.tokens_per_s_estimate().map(lambda r: r * per_token)

    @property
    def mfu_vs_bf16(self) -> float | None:
        """MFU against the datasheet dense BF16 peak, whatever dtype this configuration uses (one yardstick)."""
        est = self.mfu_estimate()
        return est.value if est else None

    mfu = mfu_vs_bf16  # the course's one yardstick: `mfu` is always against the BF16 dense peak here

    @property
    def mfu_vs_own_dtype(self) -> float | None:
        """MFU against the datasheet dense peak of this configuration's own matmul dtype."""
        own = self.run.peak_tflops
        return self.mfu_vs_bf16 * self.peak_tflops_bf16 / own if own and self.mfu_vs_bf16 is not None else None

    @property
    def mfu_own(self) -> float | None:
        """Deprecated: `mfu_vs_own_dtype`."""
        _deprecated("ConfigRun.mfu_own", "ConfigRun.mfu_vs_own_dtype")
        return self.mfu_vs_own_dtype

    @property
    def setup_s(self) -> float:
        """First step minus a steady step: compile time for a compiled model, small set-up costs otherwise."""
        return max(0.0, self.first_step_s - self.step_s)

    def row(self) -> dict[str, Any]:
        """A JSON-able summary for NotebookResult.record()."""
        tps = self.tokens_per_s_estimate()
        return {"label": self.label, "step_ms": self.step_s * 1e3, "iqr_ms": self.run.measurement.iqr * 1e3,
                "tokens_per_step": self.config.tokens_per_step, "tokens_per_s": tps.value,
                "tokens_per_s_interval": [tps.lo, tps.hi], "pipeline": self.run.pipeline,
                "tflops": self.run.tflops, "mfu_bf16_peak": self.mfu, "mfu_own_peak": self.mfu_vs_own_dtype,
                "matmul_dtype": self.config.matmul_dtype, "nvml_util": self.run.metric("nvml_util"),
                "gpm_sm_active": self.run.metric("gpm_sm_active"),
                "gpm_tensor_active": self.run.metric("gpm_tensor_active"),
                "peak_memory_gb": self.peak_memory_gb, "first_step_s": self.first_step_s, "setup_s": self.setup_s,
                "config": describe(self.config), "notes": self.notes}


def measure_config(label: str, cfg: TrainConfig, tokens: torch.Tensor, *, device: DeviceInfo | None = None,
                   min_time_s: float | None = None, monitor: bool = True, peaks: Any = None,
                   keep: bool = False, pipeline: bool = False, rounds: int = 0) -> tuple[ConfigRun, Trainer | None]:
    """Build `cfg`, time its first step alone, then measure its steps (timing + monitor).

    On CUDA out-of-memory the micro-batch is halved and the accumulation doubled until it fits (the ConfigRun's
    notes say so). `keep=True` returns the Trainer open for reuse (a compiled model). `pipeline=True` takes tokens/s
    over the windows' wall time (the loop pulls from a DataLoader); `rounds` adds further windows of a quarter of
    `min_time_s`, so the throughput has an interval rather than one window's value."""
    from ...verdicts.experiment import default_min_time, measure  # here: experiment is the harness, training a workload

    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0:
        raise ValueError(f"rounds={rounds!r} must be an int >= 0")
    dev = device or get_device()
    notes: list[str] = []
    while True:
        trainer, oom = None, None
        try:
            trainer = Trainer(cfg, tokens, dev)
            synchronize(trainer.device)
            t0 = time.perf_counter()
            trainer.step()
            synchronize(trainer.device)
            first = time.perf_counter() - t0
            run = measure(trainer.step, label=label, flops=trainer.flops_per_step, dtype=cfg.matmul_dtype,
                          items=cfg.tokens_per_step, item_name="tokens", min_time_s=min_time_s, monitor=monitor,
                          device=dev, peaks=peaks, pipeline=pipeline, warm=True)  # warm: its first step ran
            round_s = (min_time_s or default_min_time(dev)) / 4
            for _ in range(rounds):
                extra = benchmark(trainer.step, min_time_s=round_s, device=dev.torch_device, **ROUND)
                run.measurement = run.measurement.merged(extra)
            peak = trainer.peak_memory_gb()
            notes += trainer.notes
        except Exception as e:  # only out-of-memory is handled; anything else is a real error
            if not is_oom(e):
                if trainer is not None:
                    trainer.close()
                raise
            oom = f"{type(e).__name__}"
        if oom is None:
            break
        # Out of the except block: the traceback no longer pins the failed step's tensors.
        if trainer is not None:
            trainer.close()
        trainer = None
        gc.collect()
        if dev.is_cuda:
            torch.cuda.empty_cache()
        smaller = halve_batch(cfg)
        if smaller is None:
            raise RuntimeError(f"{label}: out of memory even at batch size {cfg.batch_size}")
        notes.append(f"out of memory at batch {cfg.batch_size} x {cfg.grad_accum}: retried with "
                     f"{smaller.batch_size} x {smaller.grad_accum} (same tokens per step)")
        cfg = smaller
    result = ConfigRun(label=label, config=cfg, run=run, first_step_s=first, peak_memory_gb=peak,
                       peak_tflops_bf16=dev.datasheet_tflops("bf16") if dev.is_cuda else None, notes=notes)
    if keep:
        return result, trainer
    trainer.close()
    return result, None


def per_items(run: Any, items: float, *, peak_tflops: float | None = None,
              measured_peak_tflops: float | None = None, peak_dtype: str | None = None) -> Any:
    """A RunResult rescaled to `items` per call, so a Comparison's speedup is the ratio of tokens per second.

    `peak_tflops` (and `measured_peak_tflops`) replace the peak its MFU is taken against, as in `with_peak`, e.g.
    the BF16 peak (`peak_dtype="bf16"`) for an FP32 run so both sides share one yardstick."""
    from ...measuring.measurement import Measurement

    if not run.items:
        raise ValueError("run has no items per call to rescale from")
    if not items > 0:
        raise ValueError(f"items={items!r} must be > 0")
    k = items / run.items
    m = run.measurement
    meas = Measurement(label=m.label, times_s=[t * k for t in m.times_s], timer=m.timer,
                       warmup_calls=m.warmup_calls, meta={**m.meta, "rescaled_from_items": run.items, "factor": k},
                       windows=[(n, s * k) for n, s in m.windows])  # n calls of k times the items: k times the time
    if m.round_medians:
        meas.meta["round_medians"] = [t * k for t in m.round_medians]
    scaled = dataclasses.replace(run, measurement=meas, items=items, flops=run.flops * k if run.flops else None)
    return with_peak(scaled, peak_tflops, measured_peak_tflops, peak_dtype=peak_dtype)


def with_peak(run: Any, peak_tflops: float | None, measured_peak_tflops: float | None = None, *,
              peak_dtype: str | None = None) -> Any:
    """The same RunResult with its MFU taken against `peak_dtype`'s peak `peak_tflops` (e.g. the BF16 dense peak
    for an FP32 or TF32 run, so every precision is measured with one yardstick). None keeps the run's own peak.

    `peak_dtype` is required with a peak: the table's MFU row names the peak its numbers are divided by."""
    from ...measuring.dtypes import DTYPES, check_dtype

    if peak_tflops is None:
        peak_dtype = run.peak_dtype
    elif peak_dtype is None:
        raise ValueError(f"peak_dtype is required with peak_tflops={peak_tflops!r}: the dtype whose peak it is "
                         f"({', '.join(DTYPES)})")
    else:
        peak_dtype = check_dtype(peak_dtype, name="peak_dtype")
    return dataclasses.replace(run, peak_tflops=run.peak_tflops if peak_tflops is None else peak_tflops,
                               measured_peak_tflops=(run.measured_peak_tflops if measured_peak_tflops is None
                                                     else measured_peak_tflops),
                               peak_dtype=peak_dtype if peak_dtype != run.dtype else None)


def loss_gap_estimate(losses: list[float], reference: list[float], window: int | None = None,
                      min_spread_steps: int = 5) -> Estimate:
    """Signed gap of a run's final loss to a reference run's on the same batches, in % of the reference.

    The gap of the means of the last `window` steps (default: the last 10%), its interval the quartiles of the
    step-by-step gaps over the last max(window, `min_spread_steps`) steps: a window of one step gives no spread."""
    if not losses or len(losses) != len(reference):
        raise ValueError(f"losses ({len(losses)}) and reference ({len(reference)}) must be non-empty and equally long")
    k = max(1, len(losses) // 10) if window is None else window
    if k < 1 or min_spread_steps < 1:
        raise ValueError(f"window={k} and min_spread_steps={min_spread_steps} must be positive")
    n = min(len(losses), max(k, min_spread_steps))
    a, b = losses[-n:], reference[-n:]
    if not all(math.isfinite(x) for x in a + b) or min(b) <= 0:
        raise ValueError("losses must be finite and the reference losses positive")
    value = (statistics.fmean(a[-k:]) / statistics.fmean(b[-k:]) - 1) * 100
    q1, _, q3 = quantiles([(x / y - 1) * 100 for x, y in zip(a, b)])
    return Estimate(value, min(q1, value), max(q3, value))


def optimised_config(model: Any, *, batch_size: int, grad_accum: int, num_workers: int, compile: bool,
                     device: DeviceInfo | None = None) -> TrainConfig:
    """The course's optimised training loop (notebook 08's final configuration) for a GPT of shape `model`; 01
    judges "40-60% MFU: good transformer training" on it."""
    from .config import waterfall_configs
    from .trainer import cudnn_attention_available

    device = device or get_device()
    naive = TrainConfig(model=model, batch_size=batch_size)
    cudnn = cudnn_attention_available(device.torch_device)[0] if device.is_cuda else False
    steps = waterfall_configs(naive, batch_size=batch_size, grad_accum=grad_accum, num_workers=num_workers,
                              compile=compile, cudnn_attention=cudnn, fused_loss=True, bf16_weights=True)
    return steps[-1][1]


def measure_optimised(config: TrainConfig, tokens: Any, *, device: DeviceInfo | None = None, min_time_s: float = 2.0,
                      peaks: Any = None) -> tuple[ConfigRun, str]:
    """Time `config` (measure_config); if torch.compile fails on this machine, the same loop uncompiled.

    Returns (the run, a note: "" or the sentence saying the compile failed and the loop ran uncompiled).
    """
    try:
        return measure_config("optimised loop", config, tokens, device=device, min_time_s=min_time_s,
                              peaks=peaks)[0], ""
    except Exception as e:  # a missing compiler or Triton must not stop the notebook
        if not config.compile:
            raise
        note = f"torch.compile failed here ({type(e).__name__}), so the loop runs uncompiled. "
        return measure_config("optimised loop", config.replace(compile=False), tokens, device=device,
                              min_time_s=min_time_s, peaks=peaks)[0], note
