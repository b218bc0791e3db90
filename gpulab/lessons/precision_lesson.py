"""Notebook 07's scaffolding: its smoke sizes, the tables, figures and sentences that report what it measured (the
formats, TF32's default and speed, the training step in seven precisions, FP16's lost gradients). The claims and
their verdicts live in `gpulab.lessons.precision_claims` and are re-exported here, so the notebook needs one handle.

The measuring stays in the notebook (the matmul, the training loop per precision, the optimizer and attention ops,
the small-gradient runs) and in `gpulab.training` and `gpulab.lessons.precision_lab`; nothing here times anything.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from .. import training as T
from ..experiment import Comparison
from .measuring_lesson import source
from .precision_lab import tf32_note
from .precision_claims import (CLAIMS, TENSOR_CORES, check_adamw, check_convergence, check_formats, check_sdpa,
                               check_steps, check_tf32_default, check_tf32_matmul, loss_gaps, memory_saved)

__all__ = ["SMOKE_SIZES", "PARAMS", "CLAIMS", "TENSOR_CORES", "LABELS", "source", "tf32_switches", "use_sizes",
           "setup_note", "format_rows", "formats_table", "formats_report", "check_formats", "tf32_defaults_table",
           "check_tf32_default", "tf32_default_report", "check_tf32_matmul", "tf32_matmul_report", "workload_note",
           "skipped_modes", "tolerance", "mode_rows", "modes_table", "loss_figures", "loss_gaps", "check_convergence",
           "convergence_report", "step_comparisons", "speed_figures", "memory_figures", "memory_saved", "check_steps",
           "speed_report", "check_adamw", "check_sdpa", "neighbours_report", "abs_gap", "underflow_report",
           "small_gradient_rows", "small_gradient_figure", "small_gradient_table", "small_gradient_report"]

# Smoke sizes (SMOKE=True, or no CUDA GPU): a tiny GPT and a short run, so the notebook runs on a CPU in minutes.
SMOKE_SIZES = dict(N_LAYER=2, N_HEAD=2, N_EMBD=64, SEQ_LEN=32, VOCAB_SIZE=512, BATCH_SIZE=2, LOSS_STEPS=25,
                   TIME_SECONDS=0.05, MATMUL_SIZE=256, CORPUS_BYTES=300_000)
PARAMS = ("N_LAYER", "N_HEAD", "N_EMBD", "SEQ_LEN", "VOCAB_SIZE", "BATCH_SIZE", "LOSS_STEPS", "TIME_SECONDS",
          "MATMUL_SIZE", "SMALL_GRAD_MULTIPLIER", "CORPUS_BYTES", "ROUNDS")  # the result JSON's params, lower-cased
LABELS = {"tf32": "TF32", "fp16": "FP16 + scaler", "fp16_noscale": "FP16, no scaler", "bf16": "BF16 autocast",
          "bf16_weights": "BF16 weights", "bf16_master": "BF16 weights + FP32 master"}  # experiment names
# Guide §7.3's table, as the guide prints it.
GUIDE_73 = {"fp32": dict(exp=8, mant=23, range=3.4e38, digits=7), "tf32": dict(exp=8, mant=10, range=3.4e38, digits=3),
            "bf16": dict(exp=8, mant=7, range=3.4e38, digits=2), "fp16": dict(exp=5, mant=10, range=65504, digits=3)}
MODES_COLUMNS = [("mode", "mode", None), ("step_ms", "ms/step", "{:.1f}"), ("tokens_per_s", "tokens/s", "{:,.0f}"),
                 ("speedup", "vs FP32", "{:.2f}x"), ("tflops", "TFLOP/s", "{:.1f}"),
                 ("mfu_bf16", "MFU vs dense BF16 peak (one yardstick)", "{:.1%}"),
                 ("mfu_own", "MFU vs its own dtype's dense peak", "{:.1%}"),
                 ("nvml", "GPU busy (NVML)", "{:.0f}%"), ("peak_gb", "peak memory GB", "{:.2f}"),
                 ("mem_saved", "memory saved vs FP32", "{:.0f}%"), ("final_loss", "final loss", "{:.4f}"),
                 ("loss_gap", "loss vs FP32", "{:+.2f}%")]


def tf32_switches() -> dict[str, Any]:
    """PyTorch's TF32 switches as they are now: call it before anything touches them to read the defaults."""
    return {"torch.backends.cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
            "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32}


def use_sizes(lesson: Any, ns: dict[str, Any]) -> dict[str, Any]:
    """At smoke scale (SMOKE=True, or no CUDA GPU) put the smoke sizes into the notebook's namespace, never the full
    sizes on a CPU; record the sizes used either way (lower-cased, as the result JSON has always had them)."""
    if lesson.small:  # its smoke run has always kept torch's threads
        ns.update(SMOKE_SIZES)
    return lesson.record_sizes(ns, PARAMS, lower=True)


def setup_note(lesson: Any) -> str:
    """What this run can show: everything on a GPU; on a CPU, the loss curves and the underflow, speed untested."""
    if lesson.gpu:
        return (f"Full sizes on {lesson.device.name}." if not lesson.small else
                f"Smoke sizes on {lesson.device.name}: the code runs, the numbers are too small to judge speed by.")
    return ("**No CUDA GPU here.** Everything below runs on the CPU at smoke sizes: the loss curves and the FP16 "
            "underflow are real measurements, but speed and memory claims need a GPU and are marked *not tested*; "
            "TF32 does not exist on a CPU. The reference GPU's numbers are shown at the end.")


# ---------------------------------------------------------------- section 1: the formats


def format_rows(device: Any) -> list[dict[str, Any]]:
    """One row per format: the guide's §7.3 entry beside torch.finfo's, the mantissa bits a matmul keeps here,
    and whether the guide's row agrees (its 'digits' are the whole digits of (mantissa bits + 1)·log10 2)."""
    rows = []
    for name, g in GUIDE_73.items():
        f = T.format_info(name)
        measured_bits = T.effective_mantissa_bits(name, device)
        agrees = (f.exponent_bits == g["exp"] and f.mantissa_bits == g["mant"]
                  and abs(f.max - g["range"]) / g["range"] < 0.01 and math.floor(f.decimal_digits) == g["digits"])
        rows.append(dict(format=name.upper(), exp=f"{g['exp']} / {f.exponent_bits}",
                         mant=f"{g['mant']} / {f.mantissa_bits}", measured_bits=measured_bits,
                         range=f"{g['range']:.4g} / {f.max:.4g}", smallest_normal=f.smallest_normal,
                         smallest_subnormal=f.smallest_subnormal, eps=f.eps,
                         digits=f"{g['digits']} / {f.decimal_digits:.2f}", agrees="yes" if agrees else "NO"))
    return rows


def formats_table(rows: list[dict[str, Any]]) -> T.Table:
    """The guide's §7.3 table against torch.finfo and the matmul's measured bits."""
    return T.Table(rows, [("format", "format", None), ("exp", "exponent bits (guide / torch)", None),
                          ("mant", "mantissa bits (guide / torch)", None),
                          ("measured_bits", "mantissa bits kept by a matmul here", lambda v: str(v)),
                          ("range", "max (guide / torch)", None), ("smallest_normal", "smallest normal", "{:.3g}"),
                          ("smallest_subnormal", "smallest subnormal", "{:.3g}"), ("eps", "eps (1 to next)", "{:.3g}"),
                          ("digits", "decimal digits (guide / (m+1)·log10 2)", None),
                          ("agrees", "table agrees", None)],
                   title="Guide §7.3 vs torch.finfo (TF32 from its bit layout) vs measured")


def formats_report(rows: list[dict[str, Any]]) -> str:
    """In words: whether the table agrees, what it leaves out (the smallest numbers), the bits measured here."""
    bad = [r["format"] for r in rows if r["agrees"] != "yes"]
    bits = {r["format"].lower(): r["measured_bits"] for r in rows}
    fp16, bf16 = T.format_info("fp16"), T.format_info("bf16")
    return (("The guide's §7.3 table agrees with `torch.finfo` on every row (its 'digits' are the whole digits of "
             "(mantissa bits + 1)·log10 2). " if not bad else
             f"The guide's table disagrees with `torch.finfo` for {', '.join(bad)}. ")
            + "What the table does not say: the *smallest* numbers differ even more than the largest. FP16's smallest "
            f"normal number is {fp16.smallest_normal:.3g} and its smallest subnormal {fp16.smallest_subnormal:.3g}; "
            f"BF16 and TF32 go down to {bf16.smallest_normal:.3g} like FP32. A gradient of 1e-8 is zero in FP16 "
            "and fine in BF16: that is why FP16 needs a loss scaler and BF16 does not (section 4). "
            + f"Measured in a matmul here: FP32 keeps {bits['fp32']} mantissa bits, BF16 {bits['bf16']}, "
            f"FP16 {bits['fp16']}"
            + (f", TF32 {bits['tf32']}." if bits["tf32"] is not None else
               "; TF32 cannot be measured without an NVIDIA GPU with tensor cores."))


# ---------------------------------------------------------------- section 2: TF32


def tf32_defaults_table(defaults: dict[str, Any]) -> T.Table:
    """The TF32 switches as this PyTorch started."""
    return T.Table([{"switch": k, "default here": str(v)} for k, v in defaults.items()],
                   [("switch", "switch", None), ("default here", "value at kernel start", None)],
                   title=f"PyTorch {torch.__version__}")


def tf32_default_report(on: bool) -> str:
    """In words: whether FP32 matmuls run as TF32 here without asking, and how to ask."""
    if on:
        return ("TF32 for matmuls is **on** here by default (an environment variable such as "
                "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE may have set it).")
    return ("TF32 for matmuls is **off** by default here: an FP32 model runs its matmuls at FP32 speed until you call "
            "`torch.set_float32_matmul_precision(\"high\")` (or set `torch.backends.cuda.matmul.allow_tf32 = True`). "
            "The guide's \"no code changes required\" is wrong for every PyTorch since 1.12.")


def tf32_matmul_report(cmp: Any, ratio: dict[str, Any], tensor_cores: bool, device_name: str, size: int) -> str:
    """In words: TF32's matmul speedup and its hardware reason, or why both sides ran FP32 here."""
    if not tensor_cores:
        return f"No TF32 here: both sides ran the same FP32 matmul ({cmp.verdict}), which only shows the harness working."
    est = cmp.estimate()
    return (f"On {device_name}, TF32 makes this {size}³ matmul **{est.value:.1f}×** faster than FP32 "
            f"(interval {est.lo:.2f}–{est.hi:.2f}×; {cmp.before.tflops:.0f} → {cmp.after.tflops:.0f} "
            f"TFLOP/s). The hardware reason: {tf32_note(ratio)}.")


# ---------------------------------------------------------------- section 3: the training loop


def workload_note(text: str, tokens: torch.Tensor, n_params: int, base: Any) -> str:
    """The corpus, the model and one step's tokens and FLOPs."""
    return (f"{len(text) / 1e6:.1f} MB of text, {tokens.numel():,} tokens. The GPT has {n_params / 1e6:.1f} M "
            f"parameters; a step is {base.tokens_per_step:,} tokens and "
            f"{base.flops_per_token() * base.tokens_per_step / 1e9:,.1f} GFLOP "
            f"({base.flops_per_token() / 1e6:.0f} MFLOP per token, 6N + 12·L·H·Q·T).")


def skipped_modes(gpu: bool, tensor_cores: bool, capability: Any) -> dict[str, str]:
    """The precision modes this device cannot run, each with the reason (TF32 and BF16 need Ampere or newer)."""
    if not gpu:
        return {"tf32": "TF32 exists only on NVIDIA tensor cores"}
    if not tensor_cores:
        return {m: f"needs compute capability 8.0 or newer (this GPU: {capability})"
                for m in ("tf32", "bf16", "bf16_weights", "bf16_master")}
    return {}


def tolerance(curves: dict[str, Any], fp32_seed1: Any) -> tuple[float, float]:
    """(tolerance, seed gap) in %: FP32's two seeds' final-loss gap, and max(2%, that gap)."""
    seed_gap = abs(fp32_seed1.final_loss - curves["fp32"].final_loss) / curves["fp32"].final_loss * 100
    return max(2.0, seed_gap), seed_gap


def mode_rows(runs: dict[str, Any], curves: dict[str, Any], modes: list[str], gpu: bool) -> list[dict[str, Any]]:
    """One row per mode: speed from its timed run, memory and final loss from its training run, each vs FP32."""
    rows = []
    fp32_loss, fp32_gb = curves["fp32"].final_loss, curves["fp32"].peak_memory_gb
    for mode in modes:
        r, c = runs[mode], curves[mode]
        rows.append(dict(mode=T.PRECISION_MODES[mode], step_ms=r.step_s * 1e3, tokens_per_s=r.tokens_per_s,
                         speedup=runs["fp32"].step_s / r.step_s, tflops=r.run.tflops, mfu_own=r.mfu_own,
                         mfu_bf16=r.mfu, nvml=r.run.metric("nvml_util"), peak_gb=c.peak_memory_gb,
                         mem_saved=(1 - c.peak_memory_gb / fp32_gb) * 100 if gpu else None,  # no GPU memory on a CPU
                         final_loss=c.final_loss, loss_gap=(c.final_loss - fp32_loss) / fp32_loss * 100))
    return rows


def modes_table(rows: list[dict[str, Any]], steps: int) -> T.Table:
    """Every mode's speed, MFU (two yardsticks), memory and final loss."""
    return T.Table(rows, MODES_COLUMNS,
                   title=f"{steps} steps each, same weights and data; final loss = mean of the last 10% of steps")


def loss_figures(curves: dict[str, Any], fp32_seed1: Any, modes: list[str], steps: int) -> None:
    """The loss curves, then each mode's smoothed distance to FP32's inside the band of FP32's two seeds."""
    import matplotlib.pyplot as plt

    from ..display import plots

    xs = list(range(1, steps + 1))
    plots.sweep(xs, {T.PRECISION_MODES[m]: curves[m].losses for m in modes} | {"FP32, seed 1": fp32_seed1.losses},
                xlabel="optimizer step", ylabel="training loss", logy=True,
                title="loss curves: same initial weights, same batches")
    plt.show()
    k = max(1, steps // 20)
    base_curve = T.smooth(curves["fp32"].losses, k)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    band = [abs(a - b) for a, b in zip(T.smooth(fp32_seed1.losses, k), base_curve)]
    ax.fill_between(xs, [-v for v in band], band, color="#bbb", alpha=0.5, label="FP32 seed 0 vs seed 1")
    for m in modes[1:]:
        ax.plot(xs, [a - b for a, b in zip(T.smooth(curves[m].losses, k), base_curve)], label=T.PRECISION_MODES[m])
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"loss - FP32 loss ({k}-step average)")
    ax.set_title("distance to FP32's loss curve")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    plt.show()


def convergence_report(curves: dict[str, Any], fp32_seed1: Any, gaps: dict[str, Any], tol: float, seed_gap: float,
                       steps: int) -> str:
    """In words: the tolerance and where each mode's final loss lands against it."""
    lines = [f"- **{T.PRECISION_MODES[m]}**: final loss {curves[m].final_loss:.4f}, {g.value:+.2f}% from FP32's "
             f"(per-step gaps {g.lo:+.2f}% to {g.hi:+.2f}%; "
             f"{'inside' if abs(g.value) <= tol else 'outside'} the ±{tol:.1f}% tolerance)" for m, g in gaps.items()]
    return (f"FP32's final loss is {curves['fp32'].final_loss:.4f}; with another seed {fp32_seed1.final_loss:.4f} "
            f"({seed_gap:.2f}% apart). We call a mode's convergence *the same* when its final loss is within "
            f"±max(2%, that seed gap) = **±{tol:.1f}%** of FP32's, after {steps} steps on the same "
            "batches; the interval is the spread of the step-by-step gaps over the final 10% of steps:\n\n"
            + "\n".join(lines))


def step_comparisons(res: Any, runs: dict[str, Any], modes: list[str], bf16_peak: float | None,
                     device_name: str) -> tuple[dict[str, Comparison], Comparison | None]:
    """Each mode's training step against FP32's (and BF16 against TF32, 002's baseline), built from the timed runs
    with every side's MFU against the dense BF16 peak; each recorded in `res` as an experiment."""
    one_peak = {m: T.with_peak(runs[m].run, bf16_peak) for m in modes}  # one yardstick for every precision
    cmps = {}
    for mode in modes[1:]:
        cmps[mode] = res.add(Comparison(name=f"training step FP32 -> {LABELS[mode]}", before=one_peak["fp32"],
                                        after=one_peak[mode], device=device_name, kind="optimisation",
                                        notes=["MFU against the dense BF16 datasheet peak on both sides"]))
    cmp_tb = None  # 002's baseline: the RTX 3090 review already ran TF32
    if "tf32" in modes and "bf16" in modes:
        cmp_tb = res.add(Comparison(name="training step TF32 -> BF16 autocast", before=one_peak["tf32"],
                                    after=one_peak["bf16"], device=device_name, kind="optimisation",
                                    notes=["002's baseline: TF32 already on", "MFU against the dense BF16 peak"]))
    return cmps, cmp_tb


def speed_figures(cmps: dict[str, Comparison], ref: dict[str, Any] | None) -> None:
    """Speedup over FP32 and MFU per precision, beside the reference GPU's."""
    import matplotlib.pyplot as plt

    from .. import results
    from ..display import plots

    reference = results.comparisons(ref) if ref else None
    plots.speedups(*cmps.values(), title="training step: speedup over FP32", reference=reference)
    plt.show()
    plots.mfu(*cmps.values(), title="MFU of each precision (one yardstick: the dense BF16 datasheet peak)",
              reference=reference)
    plt.show()


def memory_figures(curves: dict[str, Any], modes: list[str], ref: dict[str, Any] | None, headline: Comparison,
                   gpu: bool) -> None:
    """Peak memory per mode (the reference GPU's beside), then the monitor's timeline of the headline comparison."""
    import matplotlib.pyplot as plt

    from ..display import plots

    ref_rows = {r["mode"]: r for r in (ref or {}).get("extra", {}).get("precision_modes", [])}
    names = [T.PRECISION_MODES[m] for m in modes]
    fig = plots.bars(names, [curves[m].peak_memory_gb for m in modes], ylabel="peak GPU memory (GB)",
                     title="peak memory per training step",
                     ref=[ref_rows.get(n, {}).get("peak_gb") for n in names] if ref_rows else None, fmt="{:.2f}")
    if not gpu:
        fig.axes[0].text(0.5, 0.8, "GPU memory is not measured on a CPU", ha="center", transform=fig.axes[0].transAxes)
    plt.show()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a CPU run has no utilization series: the panels say so instead
        plots.timeline(headline, title=f"utilization: FP32 vs {headline.after.label}")
    plt.show()


def speed_report(runs: dict[str, Any], curves: dict[str, Any], modes: list[str], cmp_mm: Any, cmp_tb: Any,
                 device_name: str, gpu: bool, tensor_cores: bool) -> str:
    """In words: each precision's speed over FP32 (and BF16's over TF32) and why memory drops by what it does;
    without tensor cores, why the timings here say nothing about a GPU."""
    if gpu and tensor_cores:
        speed = {m: runs["fp32"].step_s / runs[m].step_s for m in modes}
        mem = memory_saved(curves, modes)
        return (f"On {device_name}: FP16 autocast is **{speed['fp16']:.2f}×** and BF16 autocast **{speed['bf16']:.2f}×** "
                f"faster than FP32 per step, TF32 alone **{speed['tf32']:.2f}×** (against {cmp_mm.speedup:.1f}× on a "
                "bare matmul: the step also runs LayerNorm, GELU, softmax, the loss and the optimizer, which TF32 does "
                f"not speed up). Over TF32, the baseline of 002's review, BF16 autocast is **{cmp_tb.speedup:.2f}×**. "
                f"Peak memory drops by {mem['fp16']:.0f}% with FP16 autocast and {mem['bf16']:.0f}% with BF16 "
                "autocast: autocast keeps FP32 weights, FP32 gradients and FP32 AdamW state (16 bytes per parameter) "
                "and only stores activations in 16 bits, so the saving depends on how much of the memory is "
                f"activations. BF16 weights save {mem['bf16_weights']:.0f}% because they halve those 16 bytes per "
                f"parameter as well; with an FP32 master copy for AdamW they save {mem['bf16_master']:.0f}%: the "
                "activations are BF16, but the master weights, their FP32 gradients and the AdamW state are back.")
    slowest = max(modes, key=lambda m: runs[m].step_s)
    return ("Speed and memory claims are about tensor cores and GPU memory: not tested on this machine. "
            "The timings above are real but say nothing about a GPU"
            + (f": the slowest mode here is {T.PRECISION_MODES[slowest]}, because this CPU has no FP16 "
               "matmul units and emulates them." if slowest.startswith("fp16") and not gpu else "."))


def neighbours_report(cmp_opt: Any, cmp_attn: Any) -> str:
    """In words: fused AdamW and SDPA each on its op alone, and why that is not their worth in a step."""
    return (f"Fused AdamW: **{cmp_opt.speedup:.2f}×** the default's speed on the optimizer step; SDPA: "
            f"**{cmp_attn.speedup:.2f}×** the written-out attention's. Both are the op alone: in the whole step "
            "their share of the time decides what they are worth (notebook 08 adds them one at a time).")


# ---------------------------------------------------------------- section 4: FP16 without a loss scaler


def abs_gap(curves: dict[str, Any], mode: str) -> float:
    """A mode's final loss, % away from FP32's (unsigned)."""
    return abs(curves[mode].final_loss - curves["fp32"].final_loss) / curves["fp32"].final_loss * 100


def underflow_report(under: Any, curves: dict[str, Any], tol: float) -> str:
    """In words: the gradients FP16 zeroes with and without a scaler, and whether the loss curve shows it."""
    ns, sc = under.row("fp16_noscale"), under.row("fp16_scaled")
    txt = (f"Without a scaler, **{ns['logit_grads_zeroed']:.1%}** of the logit gradients and "
           f"**{ns['param_grads_zeroed']:.2%}** of the parameter gradients that FP32 computes come out exactly zero in "
           f"FP16; the whole gradient is off by {ns['grad_rel_error']:.2%}. With the loss scaled by "
           f"{sc['loss_scale']:g}: {sc['logit_grads_zeroed']:.1%} and {sc['param_grads_zeroed']:.2%}, error "
           f"{sc['grad_rel_error']:.2%}. ")
    if "fp16_noscale" not in curves:
        return txt
    g = abs_gap(curves, "fp16_noscale")
    if g > tol:
        return txt + f"In the loss curves above, FP16 without a scaler ends {g:.2f}% away from FP32, outside the tolerance."
    return (txt + f"In the loss curves above, FP16 without a scaler ends within {g:.2f}% of FP32, inside the tolerance"
            + (": the gradients it loses belong to logits whose probabilities are already tiny, and AdamW divides each "
               "update by that parameter's own gradient history, so over these steps the loss curve does not show them "
               "missing." if ns["logit_grads_zeroed"] > 0.01 else "."))


def small_gradient_rows(small: dict[str, Any], curves: dict[str, Any], under_small: Any) -> list[dict[str, Any]]:
    """One row per small-gradient run: final loss, its gap to FP32's (no multiplier), gradients FP16 zeroed."""
    fp32 = curves["fp32"].final_loss
    return [dict(mode=T.PRECISION_MODES[m], final_loss=r.final_loss, gap=(r.final_loss - fp32) / fp32 * 100,
                 zeroed=under_small.row("fp16_noscale" if m == "fp16_noscale" else "fp16_scaled")["param_grads_zeroed"]
                 if m != "bf16" else None) for m, r in small.items()]


def small_gradient_figure(curves: dict[str, Any], small: dict[str, Any], multiplier: float, steps: int) -> None:
    """FP32's loss curve beside the small-gradient runs' (loss shown unmultiplied)."""
    import matplotlib.pyplot as plt

    from ..display import plots

    plots.sweep(list(range(1, steps + 1)), {"FP32 (loss x 1)": curves["fp32"].losses}
                | {f"{T.PRECISION_MODES[m]} (loss x {multiplier:g})": r.losses for m, r in small.items()},
                xlabel="optimizer step", ylabel="training loss (unmultiplied)", logy=True,
                title="small gradients: the scaler is what keeps FP16 training")
    plt.show()


def small_gradient_table(rows: list[dict[str, Any]]) -> T.Table:
    """The small-gradient runs against FP32 without the multiplier."""
    return T.Table(rows, [("mode", "mode (loss x multiplier)", None), ("final_loss", "final loss", "{:.4f}"),
                          ("gap", "vs FP32 without multiplier", "{:+.2f}%"),
                          ("zeroed", "param. gradients zeroed (one batch)", "{:.1%}")])


def small_gradient_report(small: dict[str, Any], curves: dict[str, Any], under_small: Any, multiplier: float) -> str:
    """In words: where FP16 ends without and with the scaler, and BF16 without one ("" if FP16 did not run)."""
    if "fp16_noscale" not in small or "fp16" not in small:
        return ""
    g_ns, g_s = (small[m].final_loss / curves["fp32"].final_loss * 100 - 100 for m in ("fp16_noscale", "fp16"))
    return (f"With gradients {1 / multiplier:g}× smaller, FP16 without a scaler loses "
            f"{under_small.row('fp16_noscale')['param_grads_zeroed']:.0%} of the parameter gradients and ends "
            f"**{g_ns:+.1f}%** from FP32's loss; the GradScaler brings it to **{g_s:+.1f}%**"
            + (f", and BF16, which has FP32's range, to "
               f"{small['bf16'].final_loss / curves['fp32'].final_loss * 100 - 100:+.1f}% without any scaler."
               if "bf16" in small else "."))
