"""The training loop itself: the model, the Trainer (one step at a time) and `train_steps`."""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections import OrderedDict
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader

from ...measuring.device import as_torch_device, float32_matmul_precision, get_device
from ..fused_loss import fused_kernel_available, kernel_status
from ..models import GPT
from ..text_data import TokenDataset
from .config import _STREAM_LENGTH, AUTOCAST_DTYPES, PARAM_DTYPES, TrainConfig, describe
from .result import TrainResult

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


_INITIAL_STATES: OrderedDict[tuple, dict[str, torch.Tensor]] = OrderedDict()
KEEP_INITIAL_STATES = 2  # a model's unpadded and padded weights (notebook 08's waterfall uses both)


def initial_state(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """The initial weights of `cfg`'s GPT as a CPU FP32 state dict, from cfg.seed: the same on every device.

    Cached per shape, vocabulary and seed (the last KEEP_INITIAL_STATES): a 0.4 B-parameter GPT takes seconds to
    initialise, and a waterfall builds it a dozen times. Shared tensors: never write to them. With pad_vocab the
    real rows are exactly the unpadded model's."""
    key = (dataclasses.astuple(cfg.model), cfg.vocab_size, cfg.seed)
    if key in _INITIAL_STATES:
        _INITIAL_STATES.move_to_end(key)
        return _INITIAL_STATES[key]
    if cfg.vocab_size != cfg.model.vocab_size:
        state = dict(initial_state(cfg.replace(pad_vocab=False)))
        extra = torch.randn(cfg.vocab_size - cfg.model.vocab_size, cfg.model.n_embd,
                            generator=torch.Generator().manual_seed(cfg.seed + 1)) * 0.02
        state["wte.weight"] = state["lm_head.weight"] = torch.cat([state["wte.weight"], extra])  # tied
    else:
        with torch.random.fork_rng(devices=[]):  # the weights from cfg.seed; the caller's RNG left as it was
            torch.manual_seed(cfg.seed)
            state = {k: v.detach() for k, v in GPT(cfg.model).state_dict().items()}
    _INITIAL_STATES[key] = state
    while len(_INITIAL_STATES) > KEEP_INITIAL_STATES:
        _INITIAL_STATES.popitem(last=False)
    return state


def build_model(cfg: TrainConfig, device: Any = None) -> GPT:
    """The GPT for `cfg` on `device` (default: the CPU), with `initial_state(cfg)`'s weights.

    The module is built on `device` directly and the weights are copied in, so a GPU model costs no CPU
    initialisation once its weights are known. The global RNGs are left seeded with cfg.seed.
    """
    attn = "sdpa" if cfg.attn == "cudnn" else cfg.attn  # the same module; the step picks cuDNN's kernel
    state = initial_state(cfg)
    with torch.device(as_torch_device(device) if device is not None else torch.device("cpu")):
        model = GPT(cfg.model_config(), attn=attn, fused_loss=cfg.fused_loss)  # its random init is overwritten
    model.load_state_dict(state)
    torch.manual_seed(cfg.seed)
    return model


def _param_groups(params: list[torch.Tensor], weight_decay: float) -> list[dict[str, Any]]:
    decay = [p for p in params if p.dim() >= 2]  # matrices and embeddings; not LayerNorm weights or biases
    no_decay = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Trainer:
    """A GPT, its AdamW, its data stream and one `step()` = one optimizer step, as `cfg` says.

    `reset()` restores the initial weights, data stream and optimizer state without rebuilding (a compiled model is
    not compiled again). Use as a context manager, or call `close()`."""

    def __init__(self, cfg: TrainConfig, tokens: torch.Tensor, device: Any = None):
        if not isinstance(cfg, TrainConfig):
            raise ValueError("cfg must be a TrainConfig")
        self.cfg = cfg
        self.device = as_torch_device(device)
        self.notes: list[str] = []
        if self.device.type == "cuda":
            self._mem_base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._init_state = initial_state(cfg)  # shared, read only: reset() and the master copies start from it
        self.model = build_model(cfg, self.device).to(dtype=PARAM_DTYPES[cfg.param_dtype])
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

    Pass `tokens` for a fresh Trainer, or a `trainer` (reset first, so a compiled model is reused). Step time is
    the median after `warmup_steps` (default: the first 10%)."""
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
