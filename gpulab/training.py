"""A configurable GPT training loop: one field per optimization, so a notebook can switch them on one at a time.

    cfg = TrainConfig(model=GPTConfig.gpt2_small(vocab_size=50257))   # the defaults are the naive loop
    fast = cfg.replace(tf32=True, autocast="bf16", fused_adamw=True, attn="sdpa", sync_every_step=False)
    res = train_steps(fast, steps=50, tokens=tokens)                  # step time, tokens/s, MFU, memory, losses

`TrainConfig()` is deliberately naive: FP32, the hand-written attention, a small batch, `.item()` every step,
no DataLoader workers, no pinned memory, eager mode, GPT-2's unpadded vocabulary. `waterfall_configs()`
turns those switches on cumulatively for the case study (notebook 08); `precision_config()` gives the
mixed-precision variants of notebook 07 (FP32, TF32, FP16 with and without a GradScaler, BF16 autocast,
BF16 weights). The same seed gives the same initial weights and the same data order in every
configuration (batches are consecutive windows of one seeded stream, so 4 x 16 sequences per step and
8 x 8 sequences per step see the same data).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import html
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader

from .batchsize import is_oom
from .claims import Estimate
from .device import (DeviceInfo, as_torch_device, check_dtype, float32_matmul_precision, get_device,
                     synchronize)
from .flops import transformer_flops_per_token
from .fused_loss import fused_kernel_available, kernel_status
from .timing import benchmark
from .workloads import GPT, GPTConfig, TokenDataset, pad_vocab_size

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PARAM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_STREAM_LENGTH = 10**12  # the data stream is effectively endless: windows at seeded offsets, never an epoch end


# ---------------------------------------------------------------- configuration

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class TrainConfig:
    """One GPT training loop, one field per optimization. The defaults are the naive loop.

    Attributes:
        model: the GPT's shape (vocab_size as the tokenizer has it; `pad_vocab` rounds it up).
        batch_size: sequences per forward/backward (the micro-batch).
        grad_accum: micro-batches per optimizer step (gradients are averaged over them).
        seq_len: tokens per sequence; None means model.block_size.
        tf32: FP32 matmuls on TF32 tensor cores (torch.set_float32_matmul_precision("high")).
        autocast: None, "bf16" or "fp16": matmuls in that dtype under torch.autocast, weights stay FP32.
        grad_scaler: dynamic loss scaling (torch.amp.GradScaler); meant for autocast="fp16".
        param_dtype: "fp32" or "bf16" (weights, activations and gradients in BF16; without `master_weights`
            the AdamW state and update are BF16 too).
        master_weights: with param_dtype="bf16", AdamW updates an FP32 copy of the weights (from FP32 copies
            of the gradients) and the BF16 weights are refreshed from it after each step: mixed-precision
            training as Megatron-LM and llm.c do it, so small updates are not rounded away.
        fused_adamw: AdamW(fused=True), one kernel for the whole update; False is PyTorch's default
            implementation (foreach on a GPU).
        attn: "manual" (softmax(QKᵀ/√d)V, materializes the T×T scores), "sdpa" (fused, flash on a GPU) or
            "cudnn" (SDPA restricted to cuDNN's fused attention, which is faster than flash on Hopper;
            see `cudnn_attention_available`).
        sync_every_step: read the loss with .item() every step (a CPU-GPU sync); False keeps the losses
            as GPU tensors and reads them once at the end.
        num_workers, pin_memory: the DataLoader's worker processes and page-locked batches (pinned batches
            are copied with non_blocking=True; pinning is skipped off CUDA).
        compile: torch.compile the model (forward and backward).
        compile_mode: torch.compile's mode: "default", "reduce-overhead" (CUDA graphs), "max-autotune" or
            "max-autotune-no-cudagraphs" (GEMM autotuning and epilogue fusion: minutes of compiling).
        pad_vocab: round the vocabulary up to a multiple of 64 (50257 -> 50304); the extra rows are never
            targets, the real rows start from the same weights as the unpadded model.
        fused_loss: the lm_head matmul and the cross-entropy in one pass (`gpulab.fused_loss`): the forward
            writes the logits' gradient over the logits, so the backward has only its matmuls left (a Triton
            kernel on a CUDA GPU; the same math in PyTorch ops elsewhere; FP16 keeps the ordinary path).
        lr, warmup_steps, weight_decay, grad_clip: AdamW with linear warm-up, decay on matrices only, and
            gradient-norm clipping (None: off), as nanoGPT.
        loss_multiplier: multiplies the loss before backward (a small-gradient experiment); the recorded
            loss is the unmultiplied one.
        seed, data_seed: initial weights and data order.
    """

    model: GPTConfig = field(default_factory=lambda: GPTConfig.gpt2_small(vocab_size=50257))
    batch_size: int = 8
    grad_accum: int = 1
    seq_len: int | None = None
    tf32: bool = False
    autocast: str | None = None
    grad_scaler: bool = False
    param_dtype: str = "fp32"
    master_weights: bool = False
    fused_adamw: bool = False
    attn: str = "manual"
    sync_every_step: bool = True
    num_workers: int = 0
    pin_memory: bool = False
    compile: bool = False
    compile_mode: str = "default"
    pad_vocab: bool = False
    fused_loss: bool = False
    lr: float = 6e-4
    warmup_steps: int = 10
    weight_decay: float = 0.1
    grad_clip: float | None = 1.0
    loss_multiplier: float = 1.0
    seed: int = 0
    data_seed: int = 0

    def __post_init__(self):
        if not isinstance(self.model, GPTConfig):
            raise ValueError(f"model={self.model!r} must be a GPTConfig")
        for name in ("batch_size", "grad_accum"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive integer")
        if self.seq_len is not None and (not isinstance(self.seq_len, int) or not 1 <= self.seq_len
                                         <= self.model.block_size):
            raise ValueError(f"seq_len={self.seq_len!r} must be an integer in 1..model.block_size "
                             f"({self.model.block_size}) or None")
        if self.autocast not in (None, *AUTOCAST_DTYPES):
            raise ValueError(f"autocast={self.autocast!r} is not supported; allowed: None, bf16, fp16")
        if self.param_dtype not in PARAM_DTYPES:
            raise ValueError(f"param_dtype={self.param_dtype!r} is not supported; allowed: fp32, bf16")
        if self.param_dtype == "bf16" and self.autocast is not None:
            raise ValueError("param_dtype='bf16' already runs every op in BF16: use autocast=None with it")
        if self.master_weights and self.param_dtype != "bf16":
            raise ValueError("master_weights keeps an FP32 copy of BF16 weights: use it with param_dtype='bf16'")
        if self.grad_scaler and self.param_dtype != "fp32":
            raise ValueError("grad_scaler needs FP32 weights (it unscales FP32 gradients)")
        if self.attn not in ("manual", "sdpa", "cudnn"):
            raise ValueError(f"attn={self.attn!r} is not supported; allowed: manual, sdpa, cudnn")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode={self.compile_mode!r} is not supported; allowed: {', '.join(COMPILE_MODES)}")
        if not isinstance(self.num_workers, int) or isinstance(self.num_workers, bool) or self.num_workers < 0:
            raise ValueError(f"num_workers={self.num_workers!r} must be an integer >= 0")
        for name in ("lr", "loss_multiplier"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v > 0 or not math.isfinite(v):
                raise ValueError(f"{name}={v!r} must be a positive number")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps={self.warmup_steps!r} must be an integer >= 0")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay={self.weight_decay!r} must be >= 0")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip={self.grad_clip!r} must be > 0 or None")

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def seq(self) -> int:
        return self.seq_len or self.model.block_size

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step: batch_size x grad_accum x seq_len."""
        return self.batch_size * self.grad_accum * self.seq

    @property
    def vocab_size(self) -> int:
        """The vocabulary the model is built with (padded when `pad_vocab`)."""
        return pad_vocab_size(self.model.vocab_size, 64) if self.pad_vocab else self.model.vocab_size

    @property
    def matmul_dtype(self) -> str:
        """The dtype the matmuls run in ("fp32", "tf32", "bf16", "fp16"): it picks the peak for MFU."""
        if self.param_dtype == "bf16":
            return "bf16"
        if self.autocast:
            return self.autocast
        return "tf32" if self.tf32 else "fp32"

    def model_config(self) -> GPTConfig:
        return dataclasses.replace(self.model, vocab_size=self.vocab_size)

    def flops_per_token(self) -> float:
        """Training FLOPs per token, 6N + 12·L·H·Q·T (nanoGPT/PaLM; attention counted in full, not causal).

        N is the unpadded model's parameter count without position embeddings (the tied lm_head counted
        once): the padded rows are work the model does but not useful work, so every configuration of one
        model shares one FLOP count and MFU compares like with like.
        """
        m = self.model
        return transformer_flops_per_token(gpt_num_params(m), m.n_layer, m.n_head, m.n_embd // m.n_head, self.seq)

    def changes_from(self, other: TrainConfig) -> dict[str, tuple[Any, Any]]:
        """Fields that differ from `other`: name -> (other's value, this value)."""
        return {f.name: (getattr(other, f.name), getattr(self, f.name)) for f in dataclasses.fields(self)
                if getattr(other, f.name) != getattr(self, f.name)}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tokens_per_step"] = self.tokens_per_step
        d["matmul_dtype"] = self.matmul_dtype
        return d


def gpt_num_params(cfg: GPTConfig) -> int:
    """Parameters of GPT(cfg) without position embeddings (what GPT.num_params() returns), by formula."""
    d, L = cfg.n_embd, cfg.n_layer
    bias = 1 if cfg.bias else 0
    ln = d * (1 + bias)
    attn = 3 * d * d + 3 * d * bias + d * d + d * bias
    mlp = 4 * d * d + 4 * d * bias + 4 * d * d + d * bias
    return cfg.vocab_size * d + L * (2 * ln + attn + mlp) + ln


# ---------------------------------------------------------------- the loop

def _attention_backend(attn: str):
    """For attn="cudnn": SDPA may use only cuDNN's kernel (torch.compile traces under the same choice)."""
    if attn != "cudnn":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(SDPBackend.CUDNN_ATTENTION)


def cudnn_attention_available(device: Any = None) -> tuple[bool, str]:
    """Whether SDPA's cuDNN backend runs a small causal BF16 attention forward and backward here, and why not."""
    dev = as_torch_device(device)
    if dev.type != "cuda":
        return False, "cuDNN attention needs a CUDA GPU"
    try:
        q = torch.randn(2, 4, 128, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
        with _attention_backend("cudnn"):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
        torch.cuda.synchronize(dev)
        return True, ""
    except Exception as e:  # no cuDNN, an old cuDNN, or a GPU its fused attention does not support
        return False, f"cuDNN attention unavailable: {type(e).__name__}: {str(e).strip().splitlines()[0][:120]}"


def build_model(cfg: TrainConfig) -> GPT:
    """The GPT for `cfg`, initialised on the CPU from cfg.seed (the same weights on every device).

    With pad_vocab the real vocabulary rows are exactly the unpadded model's; the padding rows get their
    own small random values.
    """
    torch.manual_seed(cfg.seed)
    attn = "sdpa" if cfg.attn == "cudnn" else cfg.attn  # the same module; the step picks cuDNN's kernel
    model = GPT(cfg.model, attn=attn, fused_loss=cfg.fused_loss)
    if cfg.vocab_size != cfg.model.vocab_size:
        padded = GPT(cfg.model_config(), attn=attn, fused_loss=cfg.fused_loss)
        state = model.state_dict()
        extra = torch.randn(cfg.vocab_size - cfg.model.vocab_size, cfg.model.n_embd,
                            generator=torch.Generator().manual_seed(cfg.seed + 1)) * 0.02
        state["wte.weight"] = torch.cat([state["wte.weight"], extra])
        state["lm_head.weight"] = state["wte.weight"]
        padded.load_state_dict(state)
        model = padded
    return model


def _param_groups(params: list[torch.Tensor], weight_decay: float) -> list[dict[str, Any]]:
    decay = [p for p in params if p.dim() >= 2]  # matrices and embeddings; not LayerNorm weights or biases
    no_decay = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Trainer:
    """A GPT, its AdamW, its data stream and one `step()` = one optimizer step, as `cfg` says.

    `reset()` puts the same initial weights back, restarts the data stream and forgets the optimizer
    state without rebuilding (so a compiled model is not compiled again). Use as a context manager, or
    call `close()` to stop DataLoader workers and free the model.
    """

    def __init__(self, cfg: TrainConfig, tokens: torch.Tensor, device: Any = None):
        if not isinstance(cfg, TrainConfig):
            raise ValueError("cfg must be a TrainConfig")
        self.cfg = cfg
        self.device = as_torch_device(device)
        self.notes: list[str] = []
        if self.device.type == "cuda":
            self._mem_base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        model = build_model(cfg)
        self._init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.model = model.to(self.device, dtype=PARAM_DTYPES[cfg.param_dtype])
        self._params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}  # tied ones once
        # What AdamW updates: the model's own weights, or their FP32 master copies (started from the FP32 init).
        self._masters = {n: self._init_state[n].to(self.device, torch.float32, copy=True).requires_grad_()
                         for n in self._params} if cfg.master_weights else None
        self.forward = torch.compile(self.model, mode=cfg.compile_mode) if cfg.compile else self.model
        self.autocast_dtype = AUTOCAST_DTYPES.get(cfg.autocast)
        if cfg.autocast == "fp16" and self.device.type == "cpu":
            self.notes.append("FP16 autocast on a CPU runs, but slowly: CPUs have no FP16 matmul units")
        self.pin = cfg.pin_memory and self.device.type == "cuda"
        if cfg.pin_memory and not self.pin:
            self.notes.append("pin_memory skipped: pinned memory only helps (and only works) with a CUDA device")
        self.dataset = TokenDataset(tokens, cfg.seq, num_samples=_STREAM_LENGTH, seed=cfg.data_seed)
        self.loader = DataLoader(self.dataset, batch_size=cfg.batch_size, shuffle=False, drop_last=True,
                                 num_workers=cfg.num_workers, pin_memory=self.pin,
                                 persistent_workers=cfg.num_workers > 0,
                                 prefetch_factor=4 if cfg.num_workers > 0 else None)
        self._it: Iterator | None = None
        self._new_optimizer()
        self.start_data()

    # -- state ------------------------------------------------------------------------------------
    def _new_optimizer(self) -> None:
        cfg = self.cfg
        kw: dict[str, Any] = {"fused": True} if cfg.fused_adamw else {}
        groups = _param_groups(list(self._optimized().values()), cfg.weight_decay)
        self.opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, **kw)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.grad_scaler)
        self.steps_done = 0
        self._losses: list[Any] = []

    def _optimized(self) -> dict[str, torch.Tensor]:
        """The tensors AdamW updates, by name: the FP32 master copies with master_weights, else the weights."""
        return self._masters if self._masters is not None else self._params

    def start_data(self) -> None:
        """(Re)start the data stream at its first batch (persistent workers are reused, not restarted)."""
        self._it = iter(self.loader)

    def _stop_data(self) -> None:
        for it in (self._it, getattr(self.loader, "_iterator", None)):
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()
        if getattr(self.loader, "_iterator", None) is not None:
            self.loader._iterator = None
        self._it = None

    def reset(self) -> None:
        """Initial weights back, data from the start, a fresh optimizer; nothing is rebuilt or recompiled."""
        with torch.no_grad():
            self.model.load_state_dict(self._init_state)
            for name, master in (self._masters or {}).items():
                master.copy_(self._init_state[name])
        self.model.zero_grad(set_to_none=True)
        self.opt.zero_grad(set_to_none=True)
        self._new_optimizer()
        self.start_data()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def close(self) -> None:
        """Stop the DataLoader workers and drop the model, optimizer and their memory."""
        self._stop_data()
        for name in ("model", "forward", "opt", "scaler", "loader", "_init_state", "_params", "_masters"):
            if hasattr(self, name):
                setattr(self, name, None)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one step ---------------------------------------------------------------------------------
    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = next(self._it)
        return x.to(self.device, non_blocking=self.pin), y.to(self.device, non_blocking=self.pin)

    def lr_at(self, step: int) -> float:
        """Linear warm-up over `warmup_steps`, then constant."""
        w = self.cfg.warmup_steps
        return self.cfg.lr * min(1.0, (step + 1) / w) if w else self.cfg.lr

    def step(self) -> None:
        """One optimizer step: grad_accum forward/backward passes, clipping, AdamW; the loss is recorded."""
        cfg = self.cfg
        with float32_matmul_precision("high" if cfg.tf32 else "highest"), _attention_backend(cfg.attn):
            total = None
            for _ in range(cfg.grad_accum):
                x, y = self._next_batch()
                with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.bfloat16,
                                    enabled=self.autocast_dtype is not None):
                    loss = self.forward(x, y)[1]  # drop the logits now: they are the largest activation
                self.scaler.scale(loss * (cfg.loss_multiplier / cfg.grad_accum)).backward()
                total = loss.detach().float() if total is None else total + loss.detach().float()
            if self._masters is not None:
                for name, master in self._masters.items():
                    grad = self._params[name].grad
                    master.grad = None if grad is None else grad.float()
            optimized = list(self._optimized().values())
            if cfg.grad_clip is not None:
                self.scaler.unscale_(self.opt)  # clip the true gradients, not the scaled ones
                torch.nn.utils.clip_grad_norm_(optimized, cfg.grad_clip * cfg.loss_multiplier)
            lr = self.lr_at(self.steps_done)
            for g in self.opt.param_groups:
                g["lr"] = lr
            self.scaler.step(self.opt)
            self.scaler.update()
            self.opt.zero_grad(set_to_none=True)
            if self._masters is not None:
                with torch.no_grad():
                    torch._foreach_copy_(list(self._params.values()), optimized)  # FP32 -> BF16, one launch
                self.model.zero_grad(set_to_none=True)
        mean = total / cfg.grad_accum
        # The naive loop reads the loss every step (a sync: the CPU waits for the GPU to finish the step);
        # the fast one keeps it on the GPU and reads all of them once at the end.
        self._losses.append(mean.item() if cfg.sync_every_step else mean)
        self.steps_done += 1
        if cfg.fused_loss and self.steps_done == 1 and self.device.type == "cuda" \
                and not fused_kernel_available(self.device):
            self.notes.append(f"fused loss ran as {kernel_status(self.device)}: the same math, without the speed")

    def losses(self) -> list[float]:
        """Losses of the steps since the last reset (one sync for all of them)."""
        tensors = [v for v in self._losses if isinstance(v, torch.Tensor)]
        values = iter(torch.stack(tensors).tolist()) if tensors else iter(())
        return [next(values) if isinstance(v, torch.Tensor) else v for v in self._losses]

    # -- what a step costs -------------------------------------------------------------------------
    @property
    def tokens_per_step(self) -> int:
        return self.cfg.tokens_per_step

    @property
    def flops_per_step(self) -> float:
        return self.cfg.flops_per_token() * self.cfg.tokens_per_step

    def peak_memory_gb(self) -> float | None:
        """Peak GPU memory allocated since construction (or the last reset), above what was allocated before."""
        if self.device.type != "cuda":
            return None
        return (torch.cuda.max_memory_allocated(self.device) - self._mem_base) / 1e9

    def memory_gb(self) -> float | None:
        """GPU memory allocated now (weights, optimizer state, cached data) above what was allocated before."""
        if self.device.type != "cuda":
            return None
        return (torch.cuda.memory_allocated(self.device) - self._mem_base) / 1e9


# ---------------------------------------------------------------- results

@dataclass
class TrainResult:
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
    def mfu(self) -> float | None:
        """Achieved FLOP/s over the datasheet dense BF16 peak (the same yardstick for FP32 steps too)."""
        return self.tflops / self.peak_tflops_bf16 if self.peak_tflops_bf16 else None

    @property
    def mfu_own(self) -> float | None:
        """Achieved FLOP/s over the datasheet dense peak of the dtype this configuration's matmuls use."""
        return self.tflops / self.peak_tflops_own if self.peak_tflops_own else None

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
                "tflops": self.tflops, "mfu": self.mfu, "mfu_own": self.mfu_own, "matmul_dtype": self.matmul_dtype,
                "peak_memory_gb": self.peak_memory_gb, "final_loss": self.final_loss}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["summary"] = self.summary()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainResult:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def __repr__(self) -> str:
        s = self.summary()
        mfu = "n/a" if s["mfu"] is None else f"{s['mfu']:.1%}"
        mem = "n/a" if s["peak_memory_gb"] is None else f"{s['peak_memory_gb']:.2f} GB"
        loss = "n/a" if s["final_loss"] is None else f"{s['final_loss']:.4f}"
        return (f"TrainResult({self.label!r}: {self.steps} steps, {s['step_ms']:.1f} ms/step, "
                f"{s['tokens_per_s']:,.0f} tokens/s, MFU {mfu} (BF16 peak), peak memory {mem}, final loss {loss})")

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>"


def _timed_steps(trainer: Trainer, steps: int) -> tuple[list[float], str]:
    """Run `steps` steps, timing each: CUDA events on a GPU (no sync between steps), else perf_counter."""
    if trainer.device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        for s, e in zip(starts, ends):
            s.record()
            trainer.step()
            e.record()
        torch.cuda.synchronize(trainer.device)
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)], "cuda events"
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        trainer.step()
        times.append(time.perf_counter() - t)
    return times, "perf_counter"


def train_steps(cfg: TrainConfig, steps: int, *, tokens: torch.Tensor | None = None, device: Any = None,
                trainer: Trainer | None = None, label: str = "", warmup_steps: int | None = None,
                progress: bool = False) -> TrainResult:
    """Train `steps` optimizer steps of `cfg` from its initial weights and return what they cost and reached.

    Pass `tokens` (a 1-D tensor of token ids) to build a fresh Trainer, or an existing `trainer` (it is
    reset first, so a compiled model is reused). The loss curve is synced once at the end unless the config
    reads it every step. Step time is the median after `warmup_steps` (default: the first 10%, at least 1).
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a positive integer")
    if trainer is None and tokens is None:
        raise ValueError("pass tokens (to build a Trainer) or a trainer")
    own = trainer is None
    tr = Trainer(cfg, tokens, device) if own else trainer
    if not own:
        if tr.cfg != cfg:
            raise ValueError("trainer.cfg differs from cfg")
        tr.reset()
    dev = get_device() if tr.device.type == "cuda" else None
    try:
        if progress and steps > 1:
            from tqdm.auto import tqdm
            bar = tqdm(total=steps, desc=label or "training", leave=False)
            times: list[float] = []
            timer = "perf_counter"
            chunk = max(1, steps // 20)
            while len(times) < steps:
                t, timer = _timed_steps(tr, min(chunk, steps - len(times)))
                times += t
                bar.update(len(t))
            bar.close()
        else:
            times, timer = _timed_steps(tr, steps)
        losses = tr.losses()
        peak = tr.peak_memory_gb()
        notes = list(tr.notes)
    finally:
        if own:
            tr.close()
    w = max(1, steps // 10) if warmup_steps is None else warmup_steps
    return TrainResult(label=label or describe(cfg), config=cfg.to_dict(), step_times_s=times, losses=losses,
                       tokens_per_step=cfg.tokens_per_step, flops_per_token=cfg.flops_per_token(),
                       matmul_dtype=cfg.matmul_dtype,
                       peak_tflops_bf16=dev.datasheet_tflops("bf16") if dev else None,
                       peak_tflops_own=dev.datasheet_tflops(cfg.matmul_dtype) if dev else None,
                       peak_memory_gb=peak, device=dev.name if dev else "cpu", timer=timer,
                       warmup_steps=min(w, steps - 1), notes=notes)


def describe(cfg: TrainConfig) -> str:
    """A short label: precision, attention, batch, and which other switches are on."""
    prec = {"fp32": "FP32", "tf32": "TF32", "bf16": "BF16", "fp16": "FP16"}[cfg.matmul_dtype]
    if cfg.param_dtype == "bf16":
        prec = "BF16 weights" + (" + FP32 master" if cfg.master_weights else "")
    elif cfg.autocast:
        prec += " autocast" + (" + scaler" if cfg.grad_scaler else "")
    parts = [prec, f"{cfg.attn} attn", f"batch {cfg.batch_size}" + (f"x{cfg.grad_accum}" if cfg.grad_accum > 1 else "")]
    parts += [name for on, name in ((cfg.fused_adamw, "fused AdamW"), (not cfg.sync_every_step, "no syncs"),
                                    (cfg.num_workers > 0, f"{cfg.num_workers} worker{'s' if cfg.num_workers > 1 else ''}"),
                                    (cfg.pin_memory, "pinned"), (cfg.pad_vocab, "padded vocab"),
                                    (cfg.fused_loss, "fused loss"), (cfg.compile, "compiled")) if on]
    return ", ".join(parts)


# ---------------------------------------------------------------- the case study's waterfall (notebook 08)

def waterfall_configs(naive: TrainConfig, *, batch_size: int, grad_accum: int, num_workers: int,
                      compile: bool = True, cudnn_attention: bool = False,
                      compile_mode: str = "default", fused_loss: bool = True,
                      bf16_weights: bool = True) -> list[tuple[str, TrainConfig]]:
    """The case study's steps, each adding one change to the previous: (label, config) from naive to fast.

    Order: TF32, BF16 autocast, fused AdamW, SDPA attention, a larger batch with gradient accumulation,
    no per-step .item(), DataLoader workers + pinned memory, the padded vocabulary, cuDNN attention (with
    `cudnn_attention`, where `cudnn_attention_available` says it runs), the fused lm_head + cross-entropy
    (with `fused_loss`), BF16 weights and activations with FP32 master weights in place of autocast (with
    `bf16_weights`), torch.compile.
    The vocabulary is padded before compiling so the model is compiled once, not twice. Labels do not
    carry sizes (describe(config) does), so runs of different sizes line up step by step.
    """
    steps = [("naive FP32", naive)]

    def add(label: str, **changes: Any) -> None:
        steps.append((label, steps[-1][1].replace(**changes)))

    add("+ TF32", tf32=True)
    add("+ BF16 autocast", autocast="bf16")
    add("+ fused AdamW", fused_adamw=True)
    add("+ SDPA attention", attn="sdpa")
    add("+ larger batch, grad accum", batch_size=batch_size, grad_accum=grad_accum)
    add("+ no per-step .item()", sync_every_step=False)
    add("+ DataLoader workers, pinned" if num_workers else "+ pinned memory", num_workers=num_workers,
        pin_memory=True)
    if not naive.pad_vocab and pad_vocab_size(naive.model.vocab_size) != naive.model.vocab_size:
        add("+ vocab padded to 64x", pad_vocab=True)
    if cudnn_attention:
        add("+ cuDNN attention", attn="cudnn")
    if fused_loss:
        add("+ fused lm_head + loss", fused_loss=True)
    if bf16_weights:
        add("+ BF16 weights, FP32 master", autocast=None, param_dtype="bf16", master_weights=True)
    if compile:
        add("+ torch.compile", compile=True, compile_mode=compile_mode)
    return steps


def matched_reference(naive: TrainConfig, final: TrainConfig) -> TrainConfig:
    """The naive loop's numerics (FP32, manual attention, eager, unpadded) on the final loop's data per step.

    Micro-batches of the naive size, accumulated to the final config's sequences per optimizer step, so
    both see the same sequences in the same order and take the same number of optimizer steps: what
    differs is only the arithmetic.
    """
    total = final.batch_size * final.grad_accum
    micro = math.gcd(naive.batch_size, total)
    return naive.replace(batch_size=micro, grad_accum=total // micro, seq_len=final.seq_len, seed=final.seed,
                         data_seed=final.data_seed, lr=final.lr, warmup_steps=final.warmup_steps,
                         sync_every_step=False)


def halve_batch(cfg: TrainConfig) -> TrainConfig | None:
    """The same tokens per step in half-size micro-batches (for an out-of-memory retry), or None at 1."""
    if cfg.batch_size < 2 or cfg.batch_size % 2:
        return None
    return cfg.replace(batch_size=cfg.batch_size // 2, grad_accum=cfg.grad_accum * 2)


@dataclass
class ConfigRun:
    """One configuration measured through gpulab's harness: its RunResult plus what the harness does not keep."""

    label: str
    config: TrainConfig
    run: Any  # gpulab.experiment.RunResult: timing, FLOPs, MFU for its own dtype, the monitor's trace
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
    def mfu(self) -> float | None:
        """Against the datasheet dense BF16 peak, whatever dtype this configuration uses (one yardstick)."""
        est = self.mfu_estimate()
        return est.value if est else None

    @property
    def mfu_own(self) -> float | None:
        """Against the datasheet dense peak of this configuration's own matmul dtype."""
        own = self.run.peak_tflops
        return self.mfu * self.peak_tflops_bf16 / own if own and self.mfu is not None else None

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
                "tflops": self.run.tflops, "mfu_bf16_peak": self.mfu, "mfu_own_peak": self.mfu_own,
                "matmul_dtype": self.config.matmul_dtype, "nvml_util": self.run.metric("nvml_util"),
                "gpm_sm_active": self.run.metric("gpm_sm_active"),
                "gpm_tensor_active": self.run.metric("gpm_tensor_active"),
                "peak_memory_gb": self.peak_memory_gb, "first_step_s": self.first_step_s, "setup_s": self.setup_s,
                "config": describe(self.config), "notes": self.notes}


def measure_config(label: str, cfg: TrainConfig, tokens: torch.Tensor, *, device: DeviceInfo | None = None,
                   min_time_s: float | None = None, monitor: bool = True, peaks: Any = None,
                   keep: bool = False, pipeline: bool = False, rounds: int = 0) -> tuple[ConfigRun, Trainer | None]:
    """Build `cfg`, time its first step alone, then measure its steps with gpulab.measure (timing + monitor).

    On CUDA out-of-memory the micro-batch is halved and the gradient accumulation doubled (same tokens per
    step) until it fits; the returned ConfigRun's config and notes say so. With keep=True the Trainer is
    returned open for reuse (e.g. a compiled model), else it is closed and None is returned.
    `pipeline=True` takes tokens/s over the timed windows' wall time (the loop pulls from a DataLoader);
    `rounds` adds that many further timed windows of a quarter of `min_time_s` each, so the throughput has
    an interval (the spread of the window rates) rather than one window's single value.
    """
    from .experiment import default_min_time, measure  # here: experiment is the harness, training a workload

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
                          device=dev, peaks=peaks, pipeline=pipeline)
            round_s = (min_time_s or default_min_time(dev)) / 4
            for _ in range(rounds):
                extra = benchmark(trainer.step, min_time_s=round_s, warmup_s=0, device=dev.torch_device)
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
              measured_peak_tflops: float | None = None) -> Any:
    """A RunResult rescaled to `items` per call (e.g. the same tokens for a naive and a fast step).

    Steps of different batch sizes do different work per call; scaling each timing by items / run.items
    puts both on "seconds per N tokens", so a Comparison's speedup is the ratio of tokens per second.
    `peak_tflops` (and `measured_peak_tflops`) replace the peak its MFU is taken against, e.g. the BF16
    peak for an FP32 run so both sides share one yardstick. The monitor trace is kept as it was.
    """
    from .timing import Measurement

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
    return dataclasses.replace(run, measurement=meas, items=items, flops=run.flops * k if run.flops else None,
                               peak_tflops=peak_tflops if peak_tflops is not None else run.peak_tflops,
                               measured_peak_tflops=(measured_peak_tflops if measured_peak_tflops is not None
                                                     else run.measured_peak_tflops))


def with_peak(run: Any, peak_tflops: float | None, measured_peak_tflops: float | None = None) -> Any:
    """The same RunResult with its MFU taken against `peak_tflops` (e.g. the BF16 dense peak for an FP32 or
    TF32 run, so every precision is measured with one yardstick). None keeps the run's own peak."""
    return dataclasses.replace(run, peak_tflops=run.peak_tflops if peak_tflops is None else peak_tflops,
                               measured_peak_tflops=(run.measured_peak_tflops if measured_peak_tflops is None
                                                     else measured_peak_tflops))


# ---------------------------------------------------------------- mixed precision (notebook 07)

PRECISION_MODES = {
    "fp32": "FP32 (PyTorch's default: TF32 off for matmuls)",
    "tf32": "TF32 matmuls (FP32 storage)",
    "fp16": "FP16 autocast + GradScaler",
    "fp16_noscale": "FP16 autocast, no GradScaler",
    "bf16": "BF16 autocast",
    "bf16_weights": "BF16 weights, grads and AdamW state",
    "bf16_master": "BF16 weights + FP32 master weights",
}


def precision_config(mode: str, base: TrainConfig | None = None) -> TrainConfig:
    """`base` (default: SDPA attention, fused AdamW, no per-step sync) switched to one precision mode.

    Modes: fp32, tf32, fp16 (autocast + GradScaler), fp16_noscale, bf16 (autocast), bf16_weights,
    bf16_master (BF16 weights and activations, AdamW on an FP32 copy of the weights).
    """
    if mode not in PRECISION_MODES:
        raise ValueError(f"mode={mode!r} is not supported; allowed: {', '.join(PRECISION_MODES)}")
    base = base or TrainConfig(attn="sdpa", fused_adamw=True, sync_every_step=False)
    plain = base.replace(tf32=False, autocast=None, grad_scaler=False, param_dtype="fp32")
    return {"fp32": plain, "tf32": plain.replace(tf32=True),
            "fp16": plain.replace(autocast="fp16", grad_scaler=True),
            "fp16_noscale": plain.replace(autocast="fp16"),
            "bf16": plain.replace(autocast="bf16"),
            "bf16_weights": plain.replace(param_dtype="bf16"),
            "bf16_master": plain.replace(param_dtype="bf16", master_weights=True)}[mode]


@dataclass
class FormatInfo:
    """A floating-point format's layout and the range and precision that follow from it."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    max: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float  # gap between 1 and the next representable number

    @property
    def decimal_digits(self) -> float:
        """Significant decimal digits: (mantissa bits + 1 implicit) x log10(2)."""
        return (self.mantissa_bits + 1) * math.log10(2)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"decimal_digits": self.decimal_digits}


def format_info(name: str) -> FormatInfo:
    """Layout, range and precision of fp32, tf32, bf16 or fp16 (from torch.finfo; TF32 from its bit layout).

    TF32 is not a storage dtype: tensor cores read FP32 operands and keep 10 mantissa bits and FP32's
    8-bit exponent, so its range is FP32's and its precision FP16's.
    """
    key = check_dtype(name, ("fp32", "tf32", "bf16", "fp16"), "name")
    if key == "tf32":
        f32 = torch.finfo(torch.float32)
        return FormatInfo("tf32", 8, 10, (2 - 2**-10) * 2.0**127, f32.smallest_normal, 2.0**-126 * 2**-10, 2**-10)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[key]
    fi = torch.finfo(dt)
    mant = round(-math.log2(fi.eps))
    exp = fi.bits - 1 - mant
    return FormatInfo(key, exp, mant, float(fi.max), float(fi.smallest_normal), float(fi.smallest_normal) * fi.eps,
                      float(fi.eps))


def effective_mantissa_bits(mode: str, device: Any = None, n: int | None = None) -> int | None:
    """Mantissa bits a matmul keeps in `mode` (fp32, tf32, bf16, fp16), measured rather than looked up.

    Rows of X hold 1 + 2^-k for k = 1..30; Y = X @ I only rounds X to what the matmul unit reads (the
    products by 1 and the sums of zeros are exact). The largest k whose 1 + 2^-k survives is the number of
    mantissa bits, whatever the rounding mode. Returns None for tf32 where there are no TF32 tensor cores.
    The matrix is large (1024 on a GPU) so cuBLAS picks a tensor-core kernel, as it would for real work.
    """
    dev = as_torch_device(device)
    key = check_dtype(mode, ("fp32", "tf32", "bf16", "fp16"), "mode")
    if key == "tf32" and (dev.type != "cuda" or torch.cuda.get_device_capability(dev) < (8, 0)):
        return None
    n = n or (1024 if dev.type == "cuda" else 256)
    ks = torch.arange(n, dtype=torch.float64) % 30 + 1
    x = (1 + 2.0 ** -ks).view(n, 1).expand(n, n).contiguous().to(dev)
    dt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[key]
    eye = torch.eye(n, device=dev, dtype=dt)
    with float32_matmul_precision("high" if key == "tf32" else "highest"):
        y = (x.to(dt) @ eye).double().cpu()
    survived = (y != 1).all(dim=1)
    bits = 0
    for k in range(1, 31):
        if bool(survived[ks.cpu() == k].all()):
            bits = k
        else:
            break
    return bits


@dataclass
class UnderflowReport:
    """One backward pass of one batch in FP32, FP16 autocast without and with a loss scale: what survived."""

    rows: list[dict[str, Any]]
    loss_multiplier: float
    scale: float | None
    hist_edges: list[float]  # log2 |gradient| bin edges
    hist_logits: list[int]  # FP32 logit gradients per bin
    hist_params: list[int]  # FP32 parameter gradients per bin
    device: str = "cpu"

    def row(self, mode: str) -> dict[str, Any]:
        return next(r for r in self.rows if r["mode"] == mode)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def _repr_html_(self) -> str:
        keys = ("mode", "logit_grads_zeroed", "param_grads_zeroed", "grad_rel_error", "loss_scale")
        head = "".join(f"<th>{k.replace('_', ' ')}</th>" for k in keys)

        def fmt(k, v):
            if v is None:
                return "—"
            if k in ("logit_grads_zeroed", "param_grads_zeroed"):
                return f"{v:.2%}"
            if k == "grad_rel_error":
                return f"{v:.2e}"
            return html.escape(f"{v:g}" if isinstance(v, float) else str(v))
        body = "".join("<tr>" + "".join(f"<td>{fmt(k, r.get(k))}</td>" for k in keys) + "</tr>" for r in self.rows)
        return (f"<div><b>Gradient underflow</b> (loss x {self.loss_multiplier:g}, {self.device}; 'zeroed' = non-zero "
                f"in FP32, exactly zero here)<table><tr>{head}</tr>{body}</table></div>")


def gradient_underflow(model_cfg: GPTConfig, tokens: torch.Tensor, *, batch_size: int, seq_len: int | None = None,
                       device: Any = None, loss_multiplier: float = 1.0, init_scale: float = 2.0**16,
                       attn: str = "sdpa", seed: int = 0, bins: int = 48) -> UnderflowReport:
    """Count the gradients FP16 loses: one batch, the same weights, backward in FP32, FP16 and scaled FP16.

    For the logits' gradients (the first tensor backward produces) and the parameters' gradients, the
    fraction of elements that are non-zero in FP32 but exactly zero in FP16 autocast, and the relative
    error of the whole gradient. The scaled run multiplies the loss by `init_scale` (GradScaler's
    starting scale), halving it on overflow as GradScaler does, and divides the gradients back.
    """
    dev = as_torch_device(device)
    seq = seq_len or model_cfg.block_size
    ds = TokenDataset(tokens, seq, num_samples=batch_size, seed=seed)
    x, y = (t.to(dev) for t in torch.utils.data.default_collate([ds[i] for i in range(batch_size)]))
    cfg = TrainConfig(model=model_cfg, attn=attn, seed=seed)
    model = build_model(cfg).to(dev)

    def backward(dtype: torch.dtype | None, scale: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        captured = {}
        with torch.autocast(dev.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits, loss = model(x, y)
        logits.register_hook(lambda g: captured.setdefault("g", g.detach().clone()))
        (loss * loss_multiplier * scale).backward()
        grads = [p.grad.detach().float().clone() / scale if p.grad is not None else torch.zeros_like(p, dtype=torch.float32)
                 for p in model.parameters()]
        return captured["g"], grads

    g_logits32, g32 = backward(None, 1.0)
    flat32 = torch.cat([g.flatten() for g in g32])
    rows = [{"mode": "fp32", "logit_grads_zeroed": 0.0, "param_grads_zeroed": 0.0, "grad_rel_error": 0.0,
             "loss_scale": None, "logit_dtype": str(g_logits32.dtype).removeprefix("torch.")}]
    scale_used = None
    for mode, scale in (("fp16_noscale", 1.0), ("fp16_scaled", init_scale)):
        for _ in range(32):
            g_logits, g = backward(torch.float16, scale)
            flat = torch.cat([t.flatten() for t in g])
            if bool(torch.isfinite(flat).all()) and bool(torch.isfinite(g_logits).all()):
                break
            scale /= 2  # overflow: GradScaler would skip this step and halve the scale
        nz_l, nz_p = g_logits32 != 0, flat32 != 0
        rows.append({"mode": mode,
                     "logit_grads_zeroed": float(((g_logits == 0) & nz_l).sum() / nz_l.sum().clamp(min=1)),
                     "param_grads_zeroed": float(((flat == 0) & nz_p).sum() / nz_p.sum().clamp(min=1)),
                     "grad_rel_error": float((flat - flat32).norm() / flat32.norm().clamp(min=1e-30)),
                     "loss_scale": scale if mode == "fp16_scaled" else None,
                     "logit_dtype": str(g_logits.dtype).removeprefix("torch.")})
        if mode == "fp16_scaled":
            scale_used = scale

    def hist(t: torch.Tensor) -> list[int]:
        v = t.abs()
        v = torch.log2(v[v > 0].float())
        return torch.histc(v, bins=bins, min=-48, max=0).long().tolist()
    report = UnderflowReport(rows=rows, loss_multiplier=loss_multiplier, scale=scale_used,
                             hist_edges=[-48 + i * 48 / bins for i in range(bins + 1)],
                             hist_logits=hist(g_logits32), hist_params=hist(flat32), device=str(dev))
    del model, g_logits32, g32, flat32
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return report


def plot_underflow(report: UnderflowReport, title: str = ""):
    """Histogram of FP32 gradient magnitudes (log2) with FP16's smallest normal and subnormal numbers marked."""
    import matplotlib.pyplot as plt

    fp16 = format_info("fp16")
    edges = report.hist_edges
    centers = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
    width = edges[1] - edges[0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=False)
    for ax, counts, name in ((axes[0], report.hist_logits, "logit gradients"),
                             (axes[1], report.hist_params, "parameter gradients")):
        total = sum(counts) or 1
        below = sum(c for x, c in zip(centers, counts) if x < math.log2(fp16.smallest_subnormal))
        ax.bar(centers, counts, width=width * 0.9, color="#00798c")
        ax.axvline(math.log2(fp16.smallest_normal), color="#d1495b", ls="--", lw=1, label="FP16 smallest normal 2^-14")
        ax.axvline(math.log2(fp16.smallest_subnormal), color="#d1495b", lw=1.5, label="FP16 smallest subnormal 2^-24")
        ax.set_yscale("log")
        ax.set_xlabel("log2 |gradient| in FP32")
        ax.set_ylabel("elements")
        ax.set_title(f"{name}: {below / total:.1%} below FP16's smallest number", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title or f"gradient magnitudes (loss x {report.loss_multiplier:g})")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- small display helpers

def smooth(values: list[float], k: int = 10) -> list[float]:
    """Trailing moving average over up to `k` values (the first points average what there is)."""
    if k < 1:
        raise ValueError(f"k={k!r} must be >= 1")
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= k:
            acc -= values[i - k]
        out.append(acc / min(i + 1, k))
    return out


class Table:
    """Rows of dicts shown as an HTML table (and as text); `columns` are (key, header, format) triples.

    A format is a str.format pattern ("{:.1f}", "{:.1%}") or a callable; None values show as "n/a".
    """

    def __init__(self, rows: list[dict[str, Any]], columns: list[tuple[str, str, Any]], title: str = ""):
        self.rows, self.columns, self.title = rows, columns, title

    def _cell(self, row: dict[str, Any], key: str, fmt: Any) -> str:
        v = row.get(key)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "n/a"
        if callable(fmt):
            return str(fmt(v))
        return fmt.format(v) if fmt else str(v)

    def __repr__(self) -> str:
        lines = [self.title] if self.title else []
        lines.append(" | ".join(h for _, h, _ in self.columns))
        lines += [" | ".join(self._cell(r, k, f) for k, _, f in self.columns) for r in self.rows]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(self._cell(r, k, f))}</td>" for k, _, f in self.columns)
                       + "</tr>" for r in self.rows)
        title = f"<b>{html.escape(self.title)}</b>" if self.title else ""
        return f"<div>{title}<table><tr>{head}</tr>{body}</table></div>"
