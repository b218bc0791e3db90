"""Notebook 07's claims as data (guide §7, the 002 review and the 003 profiling notes on mixed precision and its
neighbours), and the functions that judge each one on what the notebook measured: the format table, TF32's default
and speed, convergence against a tolerance set by seed noise, the training step's speed and memory, fused AdamW and
SDPA attention.

    lesson = gl.lesson("07_mixed_precision", globals(), full={}, claims=CLAIMS)
    check_formats(lesson, format_rows)                      # each claim recorded with its verdict

A claim's `needs` says what this run must have to test it ("cuda", "bf16": a GPU with TF32/BF16 tensor cores), so
"not tested" and its reason come from one place. Nothing here times anything.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ..claims import Claim
from .precision_lab import STEP_CLAIMS, STEP_MEASUREMENT, loss_gap_estimate, tf32_note

__all__ = ["CLAIMS", "TENSOR_CORES", "CONVERGENCE", "check_formats", "check_tf32_default", "check_tf32_matmul",
           "loss_gaps", "check_convergence", "step_measurements", "check_steps", "check_adamw", "check_sdpa"]

TENSOR_CORES = ("cuda", "bf16")  # a CUDA GPU with TF32 and BF16 tensor cores: compute capability 8.0 or newer
_GUIDE = "guide §7.1/§7.2"

# (mode, key) of the convergence claims; their band is ±the tolerance, known only once FP32's two seeds have run.
CONVERGENCE = [("fp16", "same_fp16"), ("bf16", "same_bf16"), ("bf16", "bf16_no_scaler")]

CLAIMS: list[dict[str, Any]] = [
    dict(key="format_table", text="Guide §7.3's format table: rows that agree with torch.finfo", low=4, high=4,
         unit="rows", source="guide §7.3", evidence="definition"),
    dict(key="bf16_exponent", text="BF16 has FP32's 8 exponent bits (the same range)", low=8, high=8, unit="bits",
         source="guide §7.2", evidence="definition"),
    dict(key="tf32_mantissa", text="TF32 keeps 10 mantissa bits (FP32's range, FP16's precision)", low=10, high=10,
         unit="bits", source="guide §7.3"),
    dict(key="bf16_mantissa", text="BF16 keeps 7 mantissa bits, FP16 10 (BF16 is less precise)", low=7, high=7,
         unit="bits", source="guide §7.2"),
    dict(key="tf32_default", text="TF32 is enabled by default for FP32 matmuls (1 = on, 0 = off)", low=1, high=1,
         unit="", source="guide §7.3", evidence="definition"),
    # ±1x around the A100's datasheet 8x
    dict(key="tf32_8x", text="TF32 is 8x faster than FP32 (matmul)", low=7, high=9, source="guide §7.3",
         needs=TENSOR_CORES),
    dict(key="tf32_20_30", text="TF32 gives a 20-30% matmul speedup", low=20, high=30, unit="%",
         source="002 optimization review (RTX 3090)", needs=TENSOR_CORES),
    # Bands of ±2%: the smallest tolerance; check_convergence widens them to the seed gap when that is larger.
    dict(key="same_fp16", text="Same convergence as FP32 with AMP (FP16 + loss scaling) (final loss within tolerance)",
         low=-2.0, high=2.0, unit="%", source=_GUIDE),
    dict(key="same_bf16", text="Same convergence as FP32 with BF16 autocast (final loss within tolerance)",
         low=-2.0, high=2.0, unit="%", source=_GUIDE),
    dict(key="bf16_no_scaler", text="BF16 needs no loss scaling (no scaler, final loss within tolerance)",
         low=-2.0, high=2.0, unit="%", source="guide §7.2"),
    dict(key="fp16_needs_scaler",
         text="FP16 needs loss scaling: without a scaler its final loss ends more than the tolerance above FP32's",
         low=2.0, unit="%", source=_GUIDE),
    # The training step's speed and memory: one table in precision_lab (its tests read it there).
    *[dict(key=key, text=text, low=low, high=high, unit=unit, source=source, needs=TENSOR_CORES)
      for key, text, low, high, unit, source in STEP_CLAIMS],
    dict(key="fused_adamw", text="Fused AdamW: 5-10% optimizer speedup", low=5, high=10, unit="%",
         source="002 optimization review", needs=("cuda",)),
    dict(key="sdpa", text="SDPA flash attention: 30-50% attention speedup", low=30, high=50, unit="%",
         source="002 optimization review", needs=("cuda",)),
]


def _pct(cmp: Any) -> Any:
    """A comparison's speedup as "% faster", with the interval of its interleaved rounds."""
    return cmp.estimate().map(lambda r: (r - 1) * 100)


def check_formats(lesson: Any, rows: list[dict[str, Any]], bf16_exponent_bits: int) -> list[Claim]:
    """Judge the format claims: rows of §7.3's table that agree with torch.finfo, BF16's exponent, and the
    mantissa bits a matmul keeps (TF32 only where there are tensor cores to measure it on)."""
    bad = [r["format"] for r in rows if r["agrees"] != "yes"]
    bits = {r["format"].lower(): r["measured_bits"] for r in rows}
    out = [lesson.check("format_table", 4 - len(bad), "exponent, mantissa, range, digits"),
           lesson.check("bf16_exponent", bf16_exponent_bits, "torch.finfo")]
    out.append(lesson.check("tf32_mantissa", bits["tf32"], "a count read off a matmul here") if bits["tf32"] is not None
               else lesson.untested("tf32_mantissa", "TF32 exists only on NVIDIA tensor cores (Ampere or newer)"))
    out.append(lesson.check("bf16_mantissa", bits["bf16"],
                            f"a count read off a matmul here; FP16 measured {bits['fp16']} bits"))
    return out


def check_tf32_default(lesson: Any, defaults: dict[str, Any]) -> bool:
    """Judge "TF32 is on by default" on the switches read at kernel start; returns whether it is on."""
    on = (defaults["torch.backends.cuda.matmul.allow_tf32"]
          or defaults["torch.get_float32_matmul_precision()"] != "highest")
    lesson.check("tf32_default", 1.0 if on else 0.0, "a PyTorch default, the same in CPU and CUDA builds")
    return bool(on)


def check_tf32_matmul(lesson: Any, cmp: Any, ratio: dict[str, Any]) -> list[Claim]:
    """Judge TF32's matmul speedup: the guide's 8x, and 002's 20-30%, which holds only on a GPU whose datasheet
    TF32/FP32 ratio is close to the RTX 3090's (else our figure is shown beside it, not judged)."""
    if not lesson.testable("tf32_8x"):
        return [lesson.check("tf32_8x", None), lesson.check("tf32_20_30", None)]
    note = tf32_note(ratio)
    out = [lesson.check("tf32_8x", cmp, note, measurement="matmul_fp32_tf32")]
    if ratio["comparable"]:
        out.append(lesson.check("tf32_20_30", _pct(cmp), note, measurement="matmul_fp32_tf32"))
    else:
        out.append(lesson.not_comparable("tf32_20_30", _pct(cmp), "an RTX 3090 figure: " + note
                                         + "; the gain follows the ratio", measurement="matmul_fp32_tf32"))
    return out


def loss_gaps(curves: dict[str, Any], modes: list[str]) -> dict[str, Any]:
    """Each mode's signed % gap to FP32's final loss, with the quartiles of its per-step gaps (FP32 itself left out)."""
    return {m: loss_gap_estimate(curves[m].losses, curves["fp32"].losses) for m in modes if m != "fp32"}


def check_convergence(lesson: Any, gaps: dict[str, Any], tolerance: float, seed_gap: float, steps: int,
                      skipped: dict[str, str]) -> list[Claim]:
    """Judge the convergence claims on the loss gaps, the band ±`tolerance` (max(2%, FP32's seed gap)); a mode that
    did not run is not tested, with the reason it was skipped."""
    how = f"{steps} steps; tolerance ±max(2%, FP32 seed gap {seed_gap:.2f}%); interval: quartiles of per-step gaps"
    plan = CONVERGENCE + [("fp16_noscale", "fp16_needs_scaler")]
    out = []
    for mode, key in plan:
        spec = lesson.spec(key)
        band = dict(low=tolerance) if spec.high is None else dict(low=-tolerance, high=tolerance)
        claim = dataclasses.replace(spec, **band).new()
        if mode in gaps:
            claim.check(gaps[mode], note=how, measurement=f"loss_gap_{mode}")
        else:
            claim.untestable(skipped.get(mode, "mode not run"))
        out.append(lesson.result.claim(claim))
    return out


def step_measurements(runs: dict[str, Any], curves: dict[str, Any], cmps: dict[str, Any],
                      cmp_tb: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The training-step claims' measurements (key -> Comparison, Estimate or %) and their notes, on a GPU that ran
    every mode (FP32, TF32, FP16, BF16 and BF16 weights)."""
    mem = memory_saved(curves, list(curves))
    vs_tf32 = {m: runs["tf32"].step_s / runs[m].step_s for m in ("fp16", "bf16")}
    over_fp32 = cmps["bf16"].speedup
    measured = {"fp16_vs_fp32": cmps["fp16"], "bf16_vs_fp32": cmps["bf16"], "mem_fp16": mem["fp16"],
                "mem_bf16": mem["bf16"], "bf16_vs_tf32": cmp_tb, "tf32_vs_fp32": cmps["tf32"], "mp_ratio_003": cmp_tb,
                "mp_ms_003": runs["bf16"].run.measurement.estimate().map(lambda s: s * 1e3)}
    notes = {"fp16_vs_fp32": f"baseline: FP32 with TF32 off (PyTorch's default); over TF32 it is {vs_tf32['fp16']:.2f}x",
             "bf16_vs_fp32": f"baseline: FP32 with TF32 off (PyTorch's default); over TF32 it is {vs_tf32['bf16']:.2f}x",
             "mem_fp16": "peak allocated memory of a training run (the allocator's peak: the same every run)",
             "mem_bf16": f"peak allocated memory vs FP32, autocast (BF16 weights save {mem['bf16_weights']:.0f}%)",
             "bf16_vs_tf32": f"baseline: TF32, as the RTX 3090 review ran; over FP32 it is {over_fp32:.2f}x",
             "tf32_vs_fp32": "the step also runs LayerNorm, softmax, the loss and AdamW, which TF32 does not speed up",
             "mp_ratio_003": f"baseline: TF32 (the guide takes TF32 as FP32's default on Ampere+); over FP32 {over_fp32:.2f}x"}
    return measured, notes


# The one step claim whose number belongs to another system: our proxy is shown beside it.
NOT_COMPARABLE_STEPS = {"mp_ms_003": "a component of 003's relevance scorer on its own GPU; our proxy: the whole BF16 "
                                     "step (ms)"}


def memory_saved(curves: dict[str, Any], modes: list[str]) -> dict[str, float]:
    """% of FP32's peak training memory each mode saves (GPU memory only: the caller passes GPU runs)."""
    return {m: (1 - curves[m].peak_memory_gb / curves["fp32"].peak_memory_gb) * 100 for m in modes}


def check_steps(lesson: Any, runs: dict[str, Any], curves: dict[str, Any], cmps: dict[str, Any],
                cmp_tb: Any) -> list[Claim]:
    """Judge the training-step speed and memory claims of §7.1, 002 and 003 (each against the baseline it used);
    without TF32/BF16 tensor cores they are not tested, with the reason from their `needs`."""
    keys = [k for k, *_ in STEP_CLAIMS]
    if not lesson.testable(keys[0]):
        return [lesson.check(k, None) for k in keys]
    measured, notes = step_measurements(runs, curves, cmps, cmp_tb)
    out = []
    for key in keys:
        mid = STEP_MEASUREMENT.get(key, key)
        if key in NOT_COMPARABLE_STEPS:
            out.append(lesson.not_comparable(key, measured[key], NOT_COMPARABLE_STEPS[key], measurement=mid))
        else:
            out.append(lesson.check(key, measured[key], notes.get(key, ""), measurement=mid))
    return out


def check_adamw(lesson: Any, cmp_opt: Any, cmp_loop: Any, n_params: int) -> Claim:
    """Judge "fused AdamW: 5-10%" on the optimizer step alone, over foreach (PyTorch's default on a GPU)."""
    return lesson.check("fused_adamw", _pct(cmp_opt), measurement="adamw_foreach_fused",
                        note=f"the optimizer step alone, {n_params / 1e6:.0f} M parameters; baseline: foreach, "
                             f"PyTorch's default on a GPU (over the for-loop: {cmp_loop.speedup:.2f}x)")


def check_sdpa(lesson: Any, cmp_attn: Any, dtype: str, shape: tuple[int, int, int, int]) -> Claim:
    """Judge "SDPA flash attention: 30-50%" on the attention op alone, forward and backward."""
    b, h, t, d = shape
    return lesson.check("sdpa", _pct(cmp_attn), measurement="attention_manual_sdpa",
                        note=f"the attention op alone, forward + backward, {dtype.upper()} autocast, "
                             f"{b} x {h} heads x {t} tokens x {d}")
