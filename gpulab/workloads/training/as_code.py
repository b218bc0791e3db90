"""What a change between two TrainConfigs amounts to in plain PyTorch: the lines a reader would write in their own
loop, one per changed field, so a waterfall of configurations reads as code."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ...measuring.dtypes import TORCH_DTYPES
from ..text_data import pad_vocab_size
from .config import TrainConfig


def _autocast(v: str | None, c: TrainConfig) -> str:
    if v is None:
        return "# no torch.autocast: matmuls run in the weights' dtype"
    return f'with torch.autocast(device_type="cuda", dtype={TORCH_DTYPES[v]}): loss = model(x, y)'


def _attn(v: str, c: TrainConfig) -> str:
    if v == "manual":
        return "att = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(mask, -inf).softmax(-1); y = att @ v"
    call = "F.scaled_dot_product_attention(q, k, v, is_causal=True)"
    return call if v == "sdpa" else f"with sdpa_kernel(SDPBackend.CUDNN_ATTENTION): y = {call}"


def _param_dtype(v: str, c: TrainConfig) -> str:
    return "model.to(torch.bfloat16)  # weights, activations, gradients" if v == "bf16" else "model.float()"


def _master(v: bool, c: TrainConfig) -> str:
    if not v:
        return "# AdamW updates the weights in their own dtype"
    return ("master = [p.detach().float() for p in model.parameters()]  # AdamW steps these FP32 copies, "
            "then copies them back into the BF16 weights")


def _sync(v: bool, c: TrainConfig) -> str:
    return "losses.append(loss.item())  # a CPU-GPU sync every step" if v else \
        "losses.append(loss.detach())  # no .item(): read once at the end"


def _compile(v: bool, c: TrainConfig) -> str:
    return f'model = torch.compile(model, mode="{c.compile_mode}")' if v else "# eager: no torch.compile"


def _pad(v: bool, c: TrainConfig) -> str:
    n = c.model.vocab_size
    return (f"GPTConfig(vocab_size={pad_vocab_size(n)})  # {n} padded to a multiple of 64" if v
            else f"GPTConfig(vocab_size={n})")


# One entry per field a stage changes; any other field shows as the TrainConfig argument it is.
_AS_CODE: dict[str, Callable[[Any, TrainConfig], str]] = {
    "batch_size": lambda v, c: f"DataLoader(ds, batch_size={v}, ...)",
    "grad_accum": lambda v, c: (f"for micro_batch in range({v}): (loss / {v}).backward()  # then one opt.step()"
                                if v > 1 else "loss.backward(); opt.step()  # every batch"),
    "seq_len": lambda v, c: f"x, y = x[:, :{c.seq}], y[:, :{c.seq}]",
    "tf32": lambda v, c: f'torch.set_float32_matmul_precision("{"high" if v else "highest"}")',
    "autocast": _autocast,
    "grad_scaler": lambda v, c: ("scaler = torch.amp.GradScaler(); scaler.scale(loss).backward(); scaler.step(opt)"
                                 if v else "loss.backward(); opt.step()  # no loss scaling"),
    "param_dtype": _param_dtype,
    "master_weights": _master,
    "fused_adamw": lambda v, c: f"torch.optim.AdamW(model.parameters(), lr=lr, fused={v})",
    "attn": _attn,
    "sync_every_step": _sync,
    "num_workers": lambda v, c: f"DataLoader(ds, ..., num_workers={v})",
    "pin_memory": lambda v, c: ('DataLoader(ds, ..., pin_memory=True); x = x.to("cuda", non_blocking=True)' if v
                                else 'x = x.to("cuda")  # from pageable memory'),
    "compile": _compile,
    "compile_mode": lambda v, c: f'model = torch.compile(model, mode="{v}")',
    "pad_vocab": _pad,
    "fused_loss": lambda v, c: ("loss = linear_cross_entropy(h, model.lm_head.weight, y)  # lm_head + loss in one pass"
                                if v else "loss = F.cross_entropy(model.lm_head(h).flatten(0, 1), y.flatten())"),
}


def change_as_code(before: TrainConfig, after: TrainConfig) -> list[str]:
    """The PyTorch lines that turn loop `before` into loop `after`, one per field that differs (in the fields'
    order); compile_mode shows on its own only when a compiled loop changes its mode."""
    lines = []
    for f in dataclasses.fields(TrainConfig):
        old, new = getattr(before, f.name), getattr(after, f.name)
        if old == new or (f.name == "compile_mode" and (before.compile != after.compile or not after.compile)):
            continue  # the mode shows in compile's own line, and means nothing without compile
        to_code = _AS_CODE.get(f.name)
        lines.append(to_code(new, after) if to_code else f"TrainConfig(..., {f.name}={new!r})")
    return lines
