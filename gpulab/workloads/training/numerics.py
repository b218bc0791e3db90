"""Number formats and gradient underflow: what each training precision can represent (notebook 07)."""
from __future__ import annotations

import dataclasses
import gc
import html
import math
from dataclasses import dataclass
from typing import Any

import torch

from ...measuring.device import as_torch_device, check_dtype, float32_matmul_precision
from ..models import GPTConfig
from ..number_formats import FormatInfo, _from_finfo, tf32_format
from ..text_data import TokenDataset
from ...measuring.dtypes import torch_dtype
from ...measuring.text import pct, power_of_two, sig
from .config import TrainConfig
from .trainer import build_model


def share(x: float) -> str:
    """A fraction as a percentage that never reads "100%" unless it is all: 8,192 of 412 M logit gradients
    surviving is 99.998%, not the 100% three significant figures round it to."""
    if x < 0.99:   # three figures cannot round it up to 100% (and pct says "< 0.001%" for the tiny ones)
        return pct(x)
    for digits in range(3, 9):
        text = pct(x, digits=digits)
        if x >= 1 or float(text[:-1].replace(",", "")) < 100:
            return text
    return "> 99.99999%"


def format_info(name: str) -> FormatInfo:
    """Layout, range and precision of fp32, tf32, bf16 or fp16: number_formats' row (torch.finfo; TF32 derived)."""
    key = check_dtype(name, ("fp32", "tf32", "bf16", "fp16"), "name")
    return tf32_format() if key == "tf32" else _from_finfo(key.upper(), torch_dtype(key))


def effective_mantissa_bits(mode: str, device: Any = None, n: int | None = None) -> int | None:
    """Mantissa bits a matmul keeps in `mode` (fp32, tf32, bf16, fp16), measured rather than looked up.

    Rows of X hold 1 + 2^-k for k = 1..30; Y = X @ I only rounds X to what the matmul unit reads, so the largest k
    whose 1 + 2^-k survives is the mantissa width. None for tf32 without TF32 tensor cores. The matrix is large
    (1024 on a GPU) so cuBLAS picks a tensor-core kernel."""
    dev = as_torch_device(device)
    key = check_dtype(mode, ("fp32", "tf32", "bf16", "fp16"), "mode")
    if key == "tf32" and (dev.type != "cuda" or torch.cuda.get_device_capability(dev) < (8, 0)):
        return None
    n = n or (1024 if dev.type == "cuda" else 256)
    ks = torch.arange(n, dtype=torch.float64) % 30 + 1
    x = (1 + 2.0 ** -ks).view(n, 1).expand(n, n).contiguous().to(dev)
    dt = torch_dtype(key, allowed=("fp32", "tf32", "bf16", "fp16"))
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
                return html.escape(share(v))
            if k == "grad_rel_error":
                return sig(v)
            if k == "mode":  # as the notebook's other tables name them, not the keys
                return {"fp32": "FP32", "fp16_noscale": "FP16, no scaler", "fp16_scaled": "FP16, loss scaled"}.get(v, v)
            return html.escape(f"{v:g}" if isinstance(v, float) else str(v))
        body = "".join("<tr>" + "".join(f"<td>{fmt(k, r.get(k))}</td>" for k in keys) + "</tr>" for r in self.rows)
        return (f"<div><b>Gradient underflow</b> (loss x {power_of_two(self.loss_multiplier)}, {self.device}; "
                f"'zeroed' = non-zero in FP32, exactly zero here)<table><tr>{head}</tr>{body}</table></div>")


def gradient_underflow(model_cfg: GPTConfig, tokens: torch.Tensor, *, batch_size: int, seq_len: int | None = None,
                       device: Any = None, loss_multiplier: float = 1.0, init_scale: float = 2.0**16,
                       attn: str = "sdpa", seed: int = 0, bins: int = 48) -> UnderflowReport:
    """Count the gradients FP16 loses: one batch, the same weights, backward in FP32, FP16 and scaled FP16.

    For the logits' and the parameters' gradients: the fraction non-zero in FP32 but zero in FP16 autocast, and the
    relative error. The scaled run multiplies the loss by `init_scale`, halving it on overflow as GradScaler does."""
    dev = as_torch_device(device)
    seq = seq_len or model_cfg.block_size
    ds = TokenDataset(tokens, seq, num_samples=batch_size, seed=seed)
    x, y = (t.to(dev) for t in torch.utils.data.default_collate([ds[i] for i in range(batch_size)]))
    cfg = TrainConfig(model=model_cfg, attn=attn, seed=seed)
    model = build_model(cfg, dev)

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


def plot_underflow(report: UnderflowReport, title: str = "", *, bar_color: str = "#00798c",
                   limit_color: str = "#d1495b"):
    """Histogram of FP32 gradient magnitudes (log2) with FP16's smallest normal and subnormal numbers marked
    (`bar_color` and `limit_color` let a notebook keep one colour per precision across its figures)."""
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
        ax.bar(centers, counts, width=width * 0.9, color=bar_color)
        ax.axvline(math.log2(fp16.smallest_normal), color=limit_color, ls="--", lw=1, label="FP16 smallest normal 2^-14")
        ax.axvline(math.log2(fp16.smallest_subnormal), color=limit_color, lw=1.5,
                   label="FP16 smallest subnormal 2^-24")
        ax.set_yscale("log")
        ax.set_xlabel("log2 |gradient| in FP32")
        ax.set_ylabel("elements")
        ax.set_title(f"{name}: {share(below / total)} below FP16's smallest number", fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(title or f"gradient magnitudes (loss x {power_of_two(report.loss_multiplier)})")
    fig.tight_layout(rect=(0, 0, 1, 0.9))  # the top tenth for the legend, under the title
    # One legend for both panels, above them: in a panel's corner it covered the logit histogram's tallest bars.
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.915), ncols=2,
               fontsize=8, frameon=False)
    return fig
