"""Notebook 07 (mixed precision): its claims as data, the judging a cell would repeat, its tables and its figures.
The step in each precision, the matmul, AdamW and the attention op are written out in the notebook's cells; nothing
here times anything or writes a paragraph."""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

import torch

from ..verdicts.claims import Claim
from ..measuring.estimates import Estimate
from ..measuring.text import pct, power_of_two, ratio, si, sig
from ..workloads.training import Table, effective_mantissa_bits, format_info, loss_gap_estimate, smooth

TENSOR_CORES = ("cuda", "bf16")  # a CUDA GPU with TF32 and BF16 tensor cores: compute capability 8.0 or newer
RTX = "002 is a Gemma-1B fine-tune on an RTX 3090 (TF32 peak = FP32 peak there): another model and GPU"
G71, G72, G73 = "guide §7.1", "guide §7.2", "guide §7.3"

CLAIMS: list[dict[str, Any]] = [
    dict(key="format_table", text="Guide §7.3's format table: rows that agree with torch.finfo", low=4, high=4,
         unit="rows", source=G73, evidence="definition",
         quote="Format | Exp Bits | Mantissa Bits | Range      | Precision"),
    dict(key="bf16_exponent", text="BF16 has FP32's 8 exponent bits (the same range)", low=8, high=8, unit="bits",
         source=G72, evidence="definition", quote="Same exponent range as FP32 (8 bits)"),
    dict(key="tf32_mantissa", text="TF32 keeps 10 mantissa bits (FP32's range, FP16's precision)", low=10, high=10,
         unit="bits", source=G73, quote="Slightly lower precision (10 mantissa bits vs 23)"),
    dict(key="bf16_mantissa", text="BF16 keeps 7 mantissa bits, FP16 10 (BF16 is less precise)", low=7, high=7,
         unit="bits", source=G72, quote="Slightly less precise than FP16 (7 mantissa bits vs 10)"),
    dict(key="tf32_default", text="TF32 is enabled by default for FP32 matmuls (1 = on, 0 = off)", low=1, high=1,
         unit="", source=G73, evidence="definition", quote="Enabled by default on Ampere+, but can control:"),
    dict(key="tf32_8x", text="TF32 is 8x faster than FP32 (matmul)", low=7, high=9, source=G73, needs=TENSOR_CORES,
         quote="8× faster than FP32 (uses Tensor Cores)"),  # ±1x around the A100's datasheet 8x
    dict(key="tf32_20_30", text="TF32 gives a 20-30% matmul speedup", low=20, high=30, unit="% gain",
         source="002 optimization review", needs=TENSOR_CORES, quote="20-30% matmul speedup"),
    # Convergence: bands of ±2%, widened at run time to FP32's seed gap when that is larger (check_convergence).
    dict(key="same_fp16", text="Same convergence as FP32 with AMP (FP16 + loss scaling) (final loss within tolerance)",
         low=-2.0, high=2.0, unit="%", source=G71, quote="Same convergence as FP32 (with proper loss scaling)",
         timed=False),
    dict(key="bf16_no_scaler", text="BF16 needs no loss scaling (no scaler, final loss within tolerance)",
         low=-2.0, high=2.0, unit="%", source=G72, quote="No loss scaling required (handles large gradients)",
         timed=False),
    dict(key="fp16_needs_scaler",
         text="FP16 needs loss scaling: without a scaler its final loss ends more than the tolerance above FP32's",
         low=2.0, unit="%", source=G71, quote="# Scale loss to prevent underflow", timed=False),
    dict(key="amp_speed", text="AMP (FP16 autocast + GradScaler) trains 2-3x faster than FP32 (PyTorch's default)",
         low=2, high=3, source=G71, needs=TENSOR_CORES, quote="2-3× faster training (Tensor Cores)"),
    dict(key="amp_memory", text="AMP (FP16 autocast) cuts training memory by 50%", low=45, high=55, unit="%",
         source=G71, needs=("cuda",), quote="50% memory reduction (FP16 activations)", timed=False),
    dict(key="bf16_002", text="BF16: 40-50% memory, 1.5-2x speed (002's RTX 3090 run)", low=1.5, high=2,
         source="002 optimization review", needs=TENSOR_CORES, quote="40-50% memory, 1.5-2x speed"),
    dict(key="mp_003", text="Mixed precision: 2.3 ms -> 1.1 ms, 2.1x (003's relevance scorer)", low=1.96, high=2.24,
         source="003 profiling notes", needs=TENSOR_CORES, quote="Mixed precision: 2.3ms → 1.1ms (2.1× speedup)"),
    dict(key="fused_adamw", text="Fused AdamW: 5-10% optimizer speedup (1.05-1.10x)", low=1.05, high=1.10,
         source="002 optimization review", needs=("cuda",), quote="5-10% optimizer speedup"),
    dict(key="sdpa", text="SDPA flash attention: 30-50% attention speedup (1.3-1.5x)", low=1.3, high=1.5,
         source="002 optimization review", needs=("cuda",), quote="30-50% attention speedup"),
]

# One name and one colour per precision, in every figure of the notebook.
LABELS = {"fp32": "FP32", "tf32": "TF32", "fp16": "FP16 + scaler", "fp16_noscale": "FP16, no scaler",
          "bf16": "BF16 autocast", "fp16_autocast": "FP16 autocast", "bf16_weights": "BF16 weights", "bf16_master": "BF16 weights + FP32 master"}
COLORS = {"fp32": "#4d4d4d", "tf32": "#8c564b", "fp16": "#1f77b4", "fp16_noscale": "#d62728", "bf16": "#2ca02c",
          "fp16_autocast": "#17becf",
          "bf16_weights": "#9467bd", "bf16_master": "#ff7f0e"}
# Guide §7.3's table, as the guide prints it.
GUIDE_73 = {"fp32": dict(exp=8, mant=23, range=3.4e38, digits=7), "tf32": dict(exp=8, mant=10, range=3.4e38, digits=3),
            "bf16": dict(exp=8, mant=7, range=3.4e38, digits=2), "fp16": dict(exp=5, mant=10, range=65504, digits=3)}


AMP_MODES = {torch.bfloat16: "bf16", torch.float16: "fp16_autocast"}


def amp_mode(dtype: torch.dtype) -> str:
    """The mode key of an autocast step that ran in `dtype` (read back from inside autocast)."""
    if dtype not in AMP_MODES:
        raise ValueError(f"AMP_DTYPE={dtype}; allowed: torch.bfloat16, torch.float16")
    return AMP_MODES[dtype]


def dtype_name(dtype: torch.dtype) -> str:
    """gpulab's name of a 16-bit torch dtype: "bf16" or "fp16"."""
    return "bf16" if dtype == torch.bfloat16 else "fp16"


def round_spread(cmp: Any) -> Estimate:
    """The speedup with an interval that holds its interval and every interleaved round's ratio: a claim at a
    band edge is judged on the spread of its own repeats, not on the median's narrow interval alone."""
    from ..verdicts.run_result import window_pair_ratios

    est = cmp.estimate()
    pairs = window_pair_ratios(cmp.before, cmp.after) if hasattr(cmp, "before") else []
    return Estimate(est.value, min([est.lo, *pairs]), max([est.hi, *pairs]))


def tf32_switches() -> dict[str, str]:
    """PyTorch's TF32 switches as they are now: call it before anything touches them to read the defaults."""
    return {"torch.backends.cuda.matmul.allow_tf32": str(torch.backends.cuda.matmul.allow_tf32),
            "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
            "torch.backends.cudnn.allow_tf32": str(torch.backends.cudnn.allow_tf32)}


def _pct(x: Any) -> Estimate:
    """A speedup (a Comparison or an Estimate of a ratio) as "% faster"."""
    est = x.estimate() if hasattr(x, "estimate") else x
    return est.map(lambda r: (r - 1) * 100)



def format_rows(device: Any) -> list[dict[str, Any]]:
    """One row per format: the guide's §7.3 entry beside torch.finfo's, the mantissa bits a matmul keeps here,
    and whether the guide's row agrees (its 'digits' are the whole digits of (mantissa bits + 1)·log10 2)."""
    rows = []
    for name, g in GUIDE_73.items():
        f = format_info(name)
        agrees = (f.exponent_bits == g["exp"] and f.mantissa_bits == g["mant"]
                  and abs(f.max - g["range"]) / g["range"] < 0.01 and math.floor(f.digits) == g["digits"])
        rows.append(dict(format=name.upper(), exp=f"{g['exp']} / {f.exponent_bits}",
                         mant=f"{g['mant']} / {f.mantissa_bits}", measured_bits=effective_mantissa_bits(name, device),
                         range=f"{g['range']:.3g} / {f.max:.3g}", smallest_normal=f.smallest_normal,
                         smallest_subnormal=f.smallest_subnormal, eps=f.eps,
                         digits=f"{g['digits']} / {f.digits:.2f}", agrees="yes" if agrees else "NO"))
    return rows


def formats_table(rows: list[dict[str, Any]]) -> Table:
    """The guide's §7.3 table against torch.finfo and the matmul's measured bits."""
    g, cols = "{:.3g}", [("format", "format"), ("exp", "exponent bits (guide / torch)"),
                         ("mant", "mantissa bits (guide / torch)"), ("measured_bits", "mantissa bits a matmul keeps here"),
                         ("range", "max (guide / torch)"), ("smallest_normal", "smallest normal"),
                         ("smallest_subnormal", "smallest subnormal"), ("eps", "eps"),
                         ("digits", "digits (guide / (m+1)·log10 2)"), ("agrees", "row agrees")]
    return Table(rows, [(k, h, g if k in ("smallest_normal", "smallest_subnormal", "eps") else str) for k, h in cols])


def check_formats(lesson: Any, rows: list[dict[str, Any]]) -> list[Claim]:
    """Judge the table's rows, BF16's exponent and the mantissa bits read off a matmul (TF32 needs tensor cores)."""
    bits = {r["format"].lower(): r["measured_bits"] for r in rows}
    out = [lesson.check("format_table", sum(r["agrees"] == "yes" for r in rows), "exponent, mantissa, range, digits"),
           lesson.check("bf16_exponent", format_info("bf16").exponent_bits, "torch.finfo")]
    out.append(lesson.check("tf32_mantissa", bits["tf32"], "read off a matmul here") if bits["tf32"] is not None
               else lesson.untested("tf32_mantissa", "TF32 exists only on NVIDIA tensor cores (Ampere or newer)"))
    out.append(lesson.check("bf16_mantissa", bits["bf16"], f"read off a matmul here; FP16 kept {bits['fp16']} bits"))
    return out


def tf32_ratio(device: Any) -> dict[str, Any]:
    """Datasheet dense TF32 over FP32 here and on the RTX 3090 of 002's review (None where unknown)."""
    from ..measuring.device import lookup_peaks

    def r(spec: Any) -> float | None:
        t = spec.tflops if spec else {}
        return t["tf32"] / t["fp32"] if "tf32" in t and "fp32" in t else None

    here = device.datasheet_peaks if device is not None and device.is_cuda else None
    return {"here": r(here), "rtx_3090": r(lookup_peaks("RTX 3090")), "device": here.model if here else "none"}


def check_tf32_matmul(lesson: Any, cmp: Any, ratios: dict[str, Any]) -> list[Claim]:
    """The guide's 8x judged on the matmul; 002's 20-30% shown beside it (an RTX 3090 figure)."""
    if not lesson.testable("tf32_8x"):
        return [lesson.check("tf32_8x", None), lesson.check("tf32_20_30", None)]
    here, rtx = (ratio(ratios[k]) if ratios[k] else "unknown" for k in ("here", "rtx_3090"))
    note = f"datasheet dense TF32/FP32: {here} on {ratios['device']}, {rtx} on the RTX 3090"
    spread = round_spread(cmp)
    note += "; interval: the median's, widened to every timed round's ratio"
    return [lesson.check("tf32_8x", spread, note, measurement="matmul_fp32_tf32"),
            lesson.not_comparable("tf32_20_30", _pct(cmp), f"{RTX}; {note}", measurement="matmul_fp32_tf32")]



def final_loss(losses: list[float]) -> float:
    """Mean loss of the last 10% of steps (at least one)."""
    return statistics.fmean(losses[-max(1, len(losses) // 10):])


def tolerance(fp32: list[float], fp32_seed1: list[float]) -> tuple[float, float]:
    """(tolerance, seed gap) in %: the gap between FP32's two seeds' final losses, and max(2%, that gap)."""
    seed_gap = abs(final_loss(fp32_seed1) / final_loss(fp32) - 1) * 100
    return max(2.0, seed_gap), seed_gap


CONVERGENCE = {"same_fp16": "fp16", "bf16_no_scaler": "bf16", "fp16_needs_scaler": "fp16_noscale"}


def check_convergence(lesson: Any, losses: dict[str, list[float]], tol: float, skipped: dict[str, str],
                      amp: str = "bf16") -> list[Claim]:
    """Each convergence claim on its mode's loss gap to FP32, its band ±`tol` (or above `tol`); with `amp` (the
    autocast step's mode) other than "bf16", the BF16 claim is not tested: this run measures that mode."""
    out = []
    for key, mode in CONVERGENCE.items():
        spec = lesson.spec(key)
        band = dict(low=tol) if spec.high is None else dict(low=-tol, high=tol)
        claim = dataclasses.replace(spec, **band).new(lesson.name)
        if mode == "bf16" and amp != "bf16":
            claim.untestable(f"this run measures {LABELS[amp]}")
        elif mode in losses:
            claim.check(loss_gap_estimate(losses[mode], losses["fp32"]), measurement=f"loss_gap_{mode}",
                        note=f"{len(losses['fp32'])} steps, same batches; tolerance ±max(2%, FP32's seed gap)")
        else:
            claim.untestable(skipped.get(mode, "mode not run"))
        out.append(lesson.result.claim(claim))
    return out


def mode_rows(runs: dict[str, Any], losses: dict[str, list[float]], peak_gb: dict[str, float | None]) -> list[dict]:
    """One row per mode: speed from its timed run (MFU against the one BF16 yardstick), memory and final loss."""
    fp32_loss = final_loss(losses["fp32"])
    rows = []
    for m, run in runs.items():
        mem = peak_gb.get(m)
        rows.append(dict(key=m, mode=LABELS[m], step_s=run.seconds, tokens_per_s=run.items / run.seconds,
                         speedup=runs["fp32"].seconds / run.seconds, tflops=run.tflops, mfu=run.mfu,
                         nvml=run.metric("nvml_util"), tensor_active=run.metric("gpm_tensor_active"),
                         peak_gb=mem, mem_saved=None if mem is None or not peak_gb.get("fp32") else
                         (1 - mem / peak_gb["fp32"]) * 100,
                         final_loss=final_loss(losses[m]), loss_gap=(final_loss(losses[m]) / fp32_loss - 1) * 100))
    return rows


def signed_pct(v: float) -> str:
    """A loss gap in percent at three significant figures, as its verdict writes it: +31.2%, -0.643%, 0%."""
    return ("+" if v > 0 else "") + pct(v, 1)


def modes_table(rows: list[dict[str, Any]]) -> Table:
    """Every mode's step time, throughput, MFU, memory and final loss."""
    return Table(rows, [("mode", "mode", None), ("step_s", "step", lambda v: si(v, "s")),
                        ("tokens_per_s", "tokens/s", lambda v: si(v)), ("speedup", "vs FP32", ratio),
                        ("tflops", "achieved", lambda v: si(v * 1e12, "FLOP/s")), ("mfu", "MFU (BF16 peak)", pct),
                        ("nvml", "GPU busy (NVML)", lambda v: pct(v, 1)),
                        ("tensor_active", "tensor cores active", lambda v: pct(v, 1)),
                        ("peak_gb", "peak memory", lambda v: si(v * 1e9, "B")),
                        ("mem_saved", "memory saved vs FP32", lambda v: pct(v, 1)),
                        ("final_loss", "final loss", sig), ("loss_gap", "loss vs FP32", signed_pct)])


def check_steps(lesson: Any, rows: list[dict[str, Any]], cmps: dict[str, Any], amp: str = "bf16") -> list[Claim]:
    """§7.1's speed over FP32 as PyTorch runs it by default (TF32 off; the speedup over TF32 in the note), §7.1's
    memory, and 002's and 003's figures shown beside our nearest measurement (other systems). `cmps`: each mode
    over FP32 and "tf32_<mode>" over TF32 (missing where a mode did not run); `amp`: the autocast step's mode."""
    by = {r["key"]: r for r in rows}
    if not lesson.testable("amp_speed"):
        mem = [lesson.check("amp_memory", by["fp16"]["mem_saved"] if "fp16" in by else None)]
        return [lesson.check("amp_speed", None), *mem, lesson.check("bf16_002", None), lesson.check("mp_003", None)]
    name = LABELS[amp]
    amp_ms = si(by[amp]["step_s"], "s")
    bf16 = (lesson.not_comparable("bf16_002", cmps[amp], f"{RTX}; ours: {name} over FP32 (PyTorch's default), "
                                  f"{ratio(cmps[f'tf32_{amp}'].speedup)} over TF32; memory saved "
                                  f"{pct(by[amp]['mem_saved'], 1)}", measurement=f"step_fp32_{amp}")
            if amp == "bf16" else lesson.untested("bf16_002", f"this run measures {name}"))
    return [
        lesson.check("amp_speed", cmps["fp16"], measurement="step_fp32_fp16",
                     note=f"baseline FP32 at PyTorch's default (TF32 off); over TF32: "
                          f"{ratio(cmps['tf32_fp16'].speedup)} ({name}: {ratio(cmps[amp].speedup)} over FP32, "
                          f"{ratio(cmps[f'tf32_{amp}'].speedup)} over TF32)"),
        lesson.check("amp_memory", by["fp16"]["mem_saved"], "peak allocated memory of a training run vs FP32"),
        bf16,
        lesson.not_comparable("mp_003", cmps[amp], "a component of 003's relevance scorer on its own GPU; "
                              f"ours: {name} over FP32, {amp_ms} per step", measurement=f"step_fp32_{amp}"),
    ]


def small_gradient_rows(small: dict[str, list[float]], fp32: list[float], under: Any) -> list[dict[str, Any]]:
    """One row per small-gradient run: final loss, its gap to FP32's (no multiplier), gradients FP16 zeroed."""
    zeroed = {"fp16_noscale": "fp16_noscale", "fp16": "fp16_scaled"}
    return [dict(mode=LABELS[m], final_loss=final_loss(ls), gap=(final_loss(ls) / final_loss(fp32) - 1) * 100,
                 zeroed=under.row(zeroed[m])["param_grads_zeroed"] if m in zeroed else None) for m, ls in small.items()]


def small_gradient_table(rows: list[dict[str, Any]]) -> Table:
    """The small-gradient runs against FP32 without the multiplier."""
    return Table(rows, [("mode", "mode (loss x multiplier)", None), ("final_loss", "final loss", sig),
                        ("gap", "vs FP32 without multiplier", signed_pct),
                        ("zeroed", "parameter gradients zeroed (one batch)", pct)])


def check_adamw(lesson: Any, cmp_opt: Any) -> Claim:
    """002's fused-AdamW figure, judged on the optimizer step alone: an op-level expectation, not 002's run."""
    return lesson.check("fused_adamw", cmp_opt.estimate() if lesson.gpu else None, "ours: AdamW.step() alone on this "
                        "GPT's parameters, fused=True over foreach (PyTorch's default on a GPU)",
                        measurement="adamw_foreach_fused")


def check_sdpa(lesson: Any, cmp_attn: Any) -> Claim:
    """002's SDPA figure, judged on the attention op alone (forward + backward): an op-level expectation."""
    return lesson.check("sdpa", cmp_attn.estimate() if lesson.gpu else None, "ours: the attention op alone, forward + "
                        "backward at this GPT's shapes, against softmax(QK^T/sqrt(d))V written out",
                        measurement="attention_manual_sdpa")


def _logy(ax: Any) -> None:
    """A log loss axis with plain numbers (2.5, 3, 4) rather than powers of ten."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis(FuncFormatter(lambda v, _: f"{v:.3g}"))


def loss_figure(losses: dict[str, list[float]], seed1: list[float], title: str = "") -> Any:
    """Top: every mode's loss curve. Below: each one's smoothed distance to FP32's in percent, the unit of the
    verdicts, inside the grey band of FP32's two seeds and between the tolerance lines; a curve far outside (FP16
    without a scaler) leaves the scale and is named with its final gap, so that it does not flatten the rest."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, layout="constrained")  # full width on the page
    steps = range(1, len(losses["fp32"]) + 1)
    k = max(1, len(seed1) // 20)
    base = smooth(losses["fp32"], k)

    def gap(ys: list[float]) -> list[float]:
        return [(x / y - 1) * 100 for x, y in zip(smooth(ys, k), base)]

    tol = tolerance(losses["fp32"], seed1)[0]
    band = [abs(v) for v in gap(seed1)]
    a.plot(steps, seed1, color=COLORS["fp32"], ls=":", lw=1, label="FP32, seed 1")
    b.fill_between(steps, [-v for v in band], band, color="#bbb", alpha=0.5, label="FP32 seed 0 vs seed 1")
    ends = {m: (final_loss(ys) / final_loss(losses["fp32"]) - 1) * 100 for m, ys in losses.items()}
    off = [m for m in losses if abs(ends[m]) > 2.5 * tol]  # the final gap a verdict reads: far outside
    lim = 1.1 * max([2.5 * tol, *band] + [abs(v) for m, ys in losses.items() if m not in off for v in gap(ys)])
    for m, ys in losses.items():
        a.plot(steps, ys, color=COLORS[m], lw=1.2, label=LABELS[m])
        if m != "fp32":
            b.plot(steps, gap(ys), color=COLORS[m], lw=1.2, label=LABELS[m])
    _logy(a)
    a.set(ylabel="training loss", title=title or "loss curves: same weights, same batches")
    b.axhline(0, color="k", lw=0.8)
    for y in (-tol, tol):
        b.axhline(y, color="k", lw=0.8, ls="--", label=f"tolerance ±{tol:.3g}%" if y > 0 else None)
    b.set_ylim(-lim, lim)
    for i, m in enumerate(off):  # named inside the frame, in its colour, with the gap its verdict reads
        b.text(0.99, 0.96 - 0.09 * i, f"{LABELS[m]}: off the scale, ends {ends[m]:+.3g}%", transform=b.transAxes,
               color=COLORS[m], fontsize=9, va="top", ha="right", bbox=dict(fc="white", ec="none", alpha=0.8))
    b.set(xlabel="optimizer step", ylabel=f"loss vs FP32's, % ({k}-step mean)",
          title="distance to FP32's curve (the verdicts' unit)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    # One legend under both panels, in a size the page can show (two 7-point legends were unreadable).
    handles, labels = a.get_legend_handles_labels()
    extra_h, extra_l = b.get_legend_handles_labels()
    keep = [i for i, lb in enumerate(extra_l) if lb not in labels]  # the band and the tolerance
    fig.legend(handles + [extra_h[i] for i in keep], labels + [extra_l[i] for i in keep], loc="outside lower center",
               ncols=4, fontsize=9, frameon=False)
    return fig


PANELS = [("speedup", 1, "speedup over FP32 (x)", "training step: speedup over FP32", ratio),
          ("mfu", 100, "MFU (% of dense BF16 peak)", "MFU, one yardstick for all", lambda v: pct(v, 1)),
          ("peak_gb", 1, "peak GPU memory (GB)", "peak memory of a training run", lambda v: si(v * 1e9, "B"))]


def step_figure(rows: list[dict[str, Any]], ref_rows: list[dict[str, Any]] | None = None) -> Any:
    """One bar per precision in three panels: speedup over FP32, MFU against the dense BF16 peak, peak memory;
    the reference GPU's values as black ticks where its rows carry the same keys."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)  # stacked: full width at the page's size
    ref = {x.get("key"): x for x in ref_rows or []}
    for ax, (key, k, ylabel, title, fmt) in zip(axes, PANELS):
        vals = [r[key] * k if r[key] is not None else 0 for r in rows]
        bars = ax.bar([LABELS[r["key"]] for r in rows], vals, color=[COLORS[r["key"]] for r in rows])
        for rect, v, r in zip(bars, vals, rows):
            ax.annotate("n/a" if r[key] is None else fmt(v), (rect.get_x() + rect.get_width() / 2, v), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8)  # clear of the tick
        xs = [ref.get(r["key"], {}).get(key) for r in rows]
        if any(xs):
            ax.scatter([i for i, v in enumerate(xs) if v], [v * k for v in xs if v], marker="_", s=400, color="k",
                       label="reference GPU", zorder=3)
            ax.legend(fontsize=8)
        if not any(vals):
            ax.text(0.5, 0.6, "needs a GPU", ha="center", transform=ax.transAxes, color="#666")
        ax.set(ylabel=ylabel, title=title)
        ax.margins(y=0.15)  # room for the values above the bars and the legend
        ax.grid(axis="y", alpha=0.3)
    for t in axes[-1].get_xticklabels():  # the panels share the precisions: named once, under the last
        t.set(rotation=20, ha="right", rotation_mode="anchor", fontsize=9)
    fig.tight_layout()
    return fig


def small_gradient_figure(fp32: list[float], small: dict[str, list[float]], multiplier: float) -> Any:
    """FP32's loss curve beside the runs whose loss was multiplied by `multiplier` (losses shown unmultiplied)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    steps, times = range(1, len(fp32) + 1), power_of_two(multiplier)  # 2^-10 rather than 0.000976562
    ax.plot(steps, fp32, color=COLORS["fp32"], lw=1.2, label="FP32 (loss x 1)")
    for m, ys in small.items():
        ax.plot(steps, ys, color=COLORS[m], lw=1.2, label=f"{LABELS[m]} (loss x {times})")
    _logy(ax)
    ax.set(xlabel="optimizer step", ylabel="training loss (unmultiplied)",
           title="small gradients: the scaler keeps FP16 training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
