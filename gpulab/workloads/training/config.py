"""The training loop's configuration: one field per optimization, and the case study's and the
mixed-precision lesson's sequences of configurations."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


from ...measuring.dtypes import torch_dtype
from ...measuring.flops import transformer_flops_per_token
from ..models import GPTConfig
from ..text_data import pad_vocab_size

AUTOCAST_DTYPES = {k: torch_dtype(k) for k in ("bf16", "fp16")}  # the choices for TrainConfig.autocast
PARAM_DTYPES = {k: torch_dtype(k) for k in ("fp32", "bf16")}  # ... and for TrainConfig.param_dtype
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
        fused_loss: the lm_head matmul and the cross-entropy in one pass (`gpulab.workloads.fused_loss`): the forward
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

    The optional steps (cuDNN attention, the fused loss, BF16 weights) come with their flags. The vocabulary is
    padded before compiling so the model is compiled once. Labels carry no sizes, so runs of different sizes line up."""
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


def halve_batch(cfg: TrainConfig) -> TrainConfig | None:
    """The same tokens per step in half-size micro-batches (for an out-of-memory retry), or None at 1."""
    if cfg.batch_size < 2 or cfg.batch_size % 2:
        return None
    return cfg.replace(batch_size=cfg.batch_size // 2, grad_accum=cfg.grad_accum * 2)
