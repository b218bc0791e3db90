"""Notebook 08 (the case study): its claims as data, the proxies they are judged on, the reference match, figures.

The guide's §8 (and 000's, 002's and 003's case-study numbers) were measured on other systems: their absolute
utilization, MFU, times and speedups are "not comparable" here, shown beside our nearest measurement. What is
judged: the course's own floors for the optimized loop, the lesson that utilization alone cannot tell a slow loop
from a fast one, the direction of each of the guide's four steps on our loop, and the loss check.
"""
from __future__ import annotations

from typing import Any, Callable

from ..measuring.estimates import Estimate, difference, ratio
from ..measuring.text import pct, si, sig
from ..measuring.text import ratio as times

# One reason per other system, the same words wherever the reason is the same (the claims table groups them).
VLM = ("arr-coc's vision-language model (Qwen3-VL backbone) on 8×A100, data-starved at the start; "
       "here one GPU trains a GPT from memory")
SCORER = "arr-coc's relevance scorer on its own GPUs; here one GPU trains a GPT"
RTX = "an RTX 3090 fine-tune of Gemma-1B; here another GPU trains a GPT"
MIN_GAIN = 1.02  # the smallest tokens/s gain that counts as "speeds the loop up" (ours: the guide states none)
STEP_FIELDS = {"step1_bf16": "autocast", "step2_data": "num_workers", "step3_batch": "batch_size",
               "step4_compile": "compile"}


def _c(key, text, quote, source, low=None, high=None, unit="%", evidence="measured", **kw):
    return dict(key=key, text=text, quote=quote, source=source, low=low, high=high, unit=unit, evidence=evidence, **kw)


S8, S81, S82, S83, S84 = "guide §8", "guide §8.1", "guide §8.2", "guide §8.3", "guide §8.4"
# Judged here: arr-coc's target on our naive loop (its two halves), the course's floors, lesson and loss check (the
# guide's "Same convergence as FP32" is notebook 07's), and the direction of each of the guide's four steps.
JUDGED = [
    _c("naive_util_target", "Utilization alone cannot tell slow from fast: the naive loop already meets the 90%+ "
       "GPU utilization target", "Target: 90%+ GPU utilization with 60%+ MFU", S8, 90, None),
    _c("naive_mfu_low", "... while its MFU is under 10% of the dense BF16 peak (the target is 60%+)",
       "with 60%+ MFU", S8, None, 10),
    _c("util_flat", "NVML utilization of the naive and the optimized loop differs by less than the +5 points the "
       "guide counts as a gain (87% -> 92%)", "course lesson: utilization alone cannot tell a slow loop from a fast "
       "one", "course lesson", -5, 5, "points"),
    _c("floor_speedup", "Benchmark floor: the optimized loop is at least 10x faster than the naive one (tokens/s)",
       "course benchmark floor: the optimized loop at least 10x the naive loop's tokens/s", "course target",
       10, None, "x"),
    _c("floor_mfu", "Benchmark floor: the optimized loop reaches at least 50% MFU (datasheet dense BF16)",
       "course benchmark floor: at least 50% MFU for the optimized loop", "course target", 50, None),
    _c("step1_bf16", "Step 1, BF16 mixed precision, speeds the loop up (tokens/s gain >= 1.02x)",
       "Precision: Running in FP32 (no Tensor Cores!)", S82 + " (direction)", MIN_GAIN, None, "x"),
    _c("step2_data", "Step 2, more DataLoader workers + pinned memory, speed the loop up (tokens/s gain >= 1.02x)",
       "Increase workers for A100 (fast GPU needs fast data)", S82 + " (direction)", MIN_GAIN, None, "x"),
    _c("step3_batch", "Step 3, a larger batch, speeds the loop up (tokens/s gain >= 1.02x)",
       "better kernel efficiency", S82 + " (direction)", MIN_GAIN, None, "x"),
    _c("step4_compile", "Step 4, torch.compile, speeds the loop up (tokens/s gain >= 1.02x)",
       "Compile model for kernel fusion", S82 + " (direction)", MIN_GAIN, None, "x"),
    _c("same_loss", "The optimized loop converges like the naive FP32 one (loss within ±2% after the same steps)",
       "course check: the speed is not bought with wrong math (the final loop's loss within ±2% of the naive "
       "loop's after the same steps)", "course check", -2, 2, timed=False),
    _c("a100_peak", "A100 BF16 dense peak: 312 TFLOP/s (the tracker's yardstick)",
       "device_peak_flops=312e12      # A100 BF16", S84, 312, 312, "TFLOP/s", "datasheet"),
]
# Measured on another system: (key, text, quote, source, low, high, unit, our proxy, why).
OTHER = [
    ("util_start", "GPU utilization starts at 65% (baseline)", "# GPU Utilization: 65% (poor)", S81, 60, 70, "%",
     "util:first", VLM),
    ("idle_data", "Baseline: 35% of the time idle, waiting for data",
     "Data loading: 35% idle time waiting for CPU (need more workers)", S81, 30, 40, "%", "idle:first", VLM),
    ("mem_util_start", "Baseline memory-controller utilization 48%", "# Memory Utilization: 48%", S81, 43, 53, "%",
     "mem_util:first", VLM),
    ("memory_start", "Baseline uses only 40% of GPU memory", "Batch size: Only using 40% of GPU memory (can increase)",
     S81, 35, 45, "%", "memory_share:first", VLM),
    ("mfu_start", "MFU ~22% before optimization", "# MFU estimate: ~22% (very low)", S81, 19, 25, "%", "mfu:first",
     VLM),
    ("util_bf16", "BF16 mixed precision: GPU util 65% -> 78% (+13 points)",
     "# Result: GPU util 65% → 78% (Tensor Cores engaged!)", S82, 10, 16, "points", "delta:autocast", VLM),
    ("util_data", "More workers + pinned memory: GPU util 78% -> 87% (+9 points)",
     "# Result: GPU util 78% → 87% (reduced data starvation)", S82, 6, 12, "points", "delta:num_workers", VLM),
    ("util_batch", "Larger batch: GPU util 87% -> 92% (+5 points)",
     "# Result: GPU util 87% → 92% (better kernel efficiency)", S82, 3, 7, "points", "delta:batch_size", VLM),
    ("memory_batch8", "Batch 8 per GPU uses 75% of GPU memory", "# New: batch_size: 8 (per GPU, uses 75% of 80GB)",
     S82, 70, 80, "%", "memory_share:last", VLM),
    ("compile_speedup", "torch.compile: 15-25% speedup", "# First iteration slow (compilation), then 15-25% speedup",
     S82, 1.15, 1.25, "x", "gain:compile", VLM),
    ("util_compile", "torch.compile: GPU util 92% -> 95% (+3 points)",
     "# Result: GPU util 92% → 95% (fused kernels, CUDA graphs)", S82, 1, 5, "points", "delta:compile", VLM),
    ("util_end", "GPU utilization reaches 95% (optimized)", "# GPU Utilization: 95% (excellent!)", S83, 92, 98, "%",
     "util:last", VLM),
    ("mem_util_end", "Memory-controller utilization 72% (optimized)", "# Memory Utilization: 72%", S83, 67, 77, "%",
     "mem_util:last", VLM),
    ("throughput", "Throughput 3.75x faster (12 -> 45 samples/s; 18 h -> 4.8 h per epoch)",
     "# Training throughput: 45 samples/s (3.75× faster)", S83, 3.5, 4.0, "x", "speedup", VLM),
    ("memory_growth", "Memory 32 GB -> 58 GB (1.8x)", "Memory Usage            | 32 GB    | 58 GB     | Better "
     "utilization", S83, 1.7, 1.9, "x", "memory_ratio", VLM),
    ("tflop_step", "5.1 TFLOP per training step (forward + backward)", "# 5.1 TFLOPs (fwd+bwd)", S84, 4.6, 5.6,
     "TFLOP", "tflop_per_step", VLM),
    ("util_000", "GPU utilization 65% -> 88% (optimized)", "- GPU Utilization: 65% → 88% (+35% relative)",
     "000 summary", 85, 91, "%", "util:last", SCORER),
    ("mfu_000_before", "MFU ~18% before", "- MFU: ~18% → ~32% (+78% relative)", "000 summary", 15, 21, "%",
     "mfu:first", SCORER),
    ("mfu_000_after", "MFU ~32% after", "- MFU: ~18% → ~32% (+78% relative)", "000 summary", 29, 35, "%",
     "mfu:last", SCORER),
    ("iteration_000", "1.6x iteration speedup (450 ms -> 280 ms; 12.6 h -> 7.8 h)",
     "- Iteration Time: 450ms → 280ms (1.6× speedup)", "000 summary", 1.5, 1.7, "x", "speedup", SCORER),
    ("tensor_000_before", "Tensor Core active 45% before", "- Tensor Core Active: 45% → 75% (+67% relative)",
     "000 summary", 40, 50, "%", "tensor:first", SCORER),
    ("tensor_000_after", "Tensor Core active 75% after", "- Tensor Core Active: 45% → 75% (+67% relative)",
     "000 summary", 70, 80, "%", "tensor:last", SCORER),
    # 003's case-study numbers (85 ms -> 34 ms, 62% -> 89%, and its three per-fix speedups) are judged in 09, 05,
    # 03 and 07, and §8.3's "MFU estimate: ~58% (good for multi-GPU VLM)" in 10: one verdict per sentence.
    ("rtx_4x", "~4x faster than baseline after all optimizations", "Expected speedup: ~4x faster than baseline.",
     "002 optimization review", 3.5, 4.5, "x", "speedup", RTX),
]
CLAIMS = JUDGED + [_c(k, t, q, s, lo, hi, u, "arithmetic" if k == "tflop_step" else "measured")
                   for k, t, q, s, lo, hi, u, _, _ in OTHER]
PROXY = {k: (proxy, why) for k, *_, proxy, why in OTHER}

# What must be equal for the reference run's numbers to be this run's model and loop (issue: n_layer alone is not).
SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "seq_len", "vocab_size", "naive_batch", "batch_size", "grad_accum",
              "workers", "fused_loss", "bf16_weights", "compile")


def same_shape(ref: dict[str, Any] | None, params: dict[str, Any]) -> bool:
    """Whether a reference result trained the same GPT with the same loop as `params` (this run's sizes): every
    one of SHAPE_KEYS equal (keys compared case-insensitively: older results record them lower-case), and the
    reference a full-size run. A key missing on either side is a mismatch."""
    if not ref or ref.get("smoke"):
        return False
    theirs = {k.lower(): v for k, v in (ref.get("params") or {}).items()}
    ours = {k.lower(): v for k, v in params.items()}
    return all(k in theirs and k in ours and theirs[k] == ours[k] for k in SHAPE_KEYS)


def step_with(steps: list[Any], field: str) -> tuple[Any, Any]:
    """The waterfall step that changed `field` and the one before it, or (None, None)."""
    for i in range(1, len(steps)):
        if field in steps[i].config.changes_from(steps[i - 1].config):
            return steps[i], steps[i - 1]
    return None, None


# The judged gain whose interval sits at its bar on the reference H200 (torch.compile: 1.01-1.04x against 1.02x): its
# two steps keep every round. The other gains and floors clear their bars by 10% or more (1.26x [1.25, 1.27] and
# 1.14x [1.13, 1.15] against 1.02x; 12.6x [12.5, 12.7] against 10x; 4.5% MFU against 10%) with windows that agreed to
# within 1.4%: two rounds (three windows, their range) still clear them.
NEAR_BAR = ("compile",)


def waterfall_rounds(configs: list[tuple[str, Any]], rounds: int) -> list[int]:
    """Further timed windows per waterfall step: `rounds` for the two steps of a judged gain near its bar
    (NEAR_BAR), at most 2 for the other steps a verdict reads (the naive and the last step; each judged step and the
    step before it), at most 1 elsewhere (two windows: their range is the table's interval). On an H200 a round of a
    0.35-0.55 s step is four steps (one warm-up, three timed): 8 rounds on every step took about 70 s of the
    notebook's 4 minutes, most of it on intervals no verdict reads or that clear their bars many times over."""
    judged_fields = {f for k, f in STEP_FIELDS.items() if k not in NOT_JUDGED_HERE}
    read, near = {0, len(configs) - 1}, set()
    for field in judged_fields:
        i = next((i for i in range(1, len(configs)) if field in configs[i][1].changes_from(configs[i - 1][1])), None)
        if i is not None:
            read |= {i - 1, i}
            near |= {i - 1, i} if field in NEAR_BAR else set()
    return [rounds if i in near else min(rounds, 2) if i in read else min(rounds, 1) for i in range(len(configs))]


class Proxies:
    """This run's measured quantities by name ("util:first", "gain:compile", "speedup"...), each an Estimate or
    None, with the measurement id that claims sharing it record."""

    def __init__(self, steps: list[Any], device_memory_gb: float | None = None):
        if not steps:
            raise ValueError("steps must hold at least the naive and the final configuration")
        self.steps, self.first, self.last, self.device_memory_gb = steps, steps[0], steps[-1], device_memory_gb

    def util(self, s: Any, metric: str = "nvml_util") -> Estimate | None:
        trace = getattr(s.run, "trace", None)
        return trace.estimate(metric) if trace is not None else None

    def gain(self, field: str) -> Estimate | None:
        s, p = step_with(self.steps, field)
        return ratio(s.tokens_per_s_estimate(), p.tokens_per_s_estimate()) if s is not None else None

    def mfu_pct(self, s: Any) -> Estimate | None:
        est = s.mfu_estimate()
        return est.map(lambda v: v * 100) if est else None

    def memory_share(self, s: Any) -> Estimate | None:
        if not (s.peak_memory_gb and self.device_memory_gb):
            return None
        return Estimate.exact(100 * s.peak_memory_gb / self.device_memory_gb)

    def get(self, key: str) -> tuple[Estimate | None, str]:
        kind, _, arg = key.partition(":")
        which = {"first": self.first, "last": self.last}
        s = which.get(arg)
        first, last = self.first, self.last

        def delta():
            a, b = step_with(self.steps, arg)
            return difference(self.util(a), self.util(b)) if a is not None else None

        table: dict[str, Callable[[], Estimate | None]] = {
            "speedup": lambda: ratio(last.tokens_per_s_estimate(), first.tokens_per_s_estimate()),
            "memory_ratio": lambda: (Estimate.exact(last.peak_memory_gb / first.peak_memory_gb)
                                     if last.peak_memory_gb and first.peak_memory_gb else None),
            "util": lambda: self.util(s), "mem_util": lambda: self.util(s, "nvml_mem_util"),
            "tensor": lambda: self.util(s, "gpm_tensor_active"), "mfu": lambda: self.mfu_pct(s),
            "idle": lambda: (lambda u: u.map(lambda v: 100 - v) if u else None)(self.util(s)),
            "gain": lambda: self.gain(arg), "delta": delta, "memory_share": lambda: self.memory_share(s),
            "util_ends": lambda: difference(self.util(last), self.util(first)),
            "tflop_per_step": lambda: Estimate.exact(last.config.flops_per_token() * last.config.tokens_per_step
                                                     / 1e12)}
        if kind not in table:
            raise ValueError(f"unknown proxy {key!r}")
        return table[kind](), {"idle": "util"}.get(kind, kind) + (f":{arg}" if arg else "")


JUDGED_PROXY = {"naive_util_target": "util:first", "naive_mfu_low": "mfu:first", "util_flat": "util_ends",
                "floor_speedup": "speedup", "floor_mfu": "mfu:last"} | {k: f"gain:{f}" for k, f in STEP_FIELDS.items()}


# Waterfall steps that this loop cannot judge, and why: the guide's step would have to be able to come out either way.
NOT_JUDGED_HERE = {
    "step2_data": "this loop's data already sits in memory (byte tokens of a text in RAM, sliced into windows), so "
                  "the GPU hardly waits on loading and more workers could not come out faster; the step is measured "
                  "above, and loading is judged where it can matter, in notebook 05",
}


def judge_waterfall(lesson: Any, steps: list[Any], *, device_memory_gb: float | None = None,
                    compile_error: str | None = None) -> list[Any]:
    """Record every waterfall claim on `lesson`: the judged ones (JUDGED_PROXY) checked, or not tested where this
    run lacks the GPU or the step; the other systems' numbers not comparable, our proxy beside each. Returns the
    judged claims, for the verdict lines under the waterfall."""
    px, out = Proxies(steps, device_memory_gb), []
    for key, proxy in JUDGED_PROXY.items():
        est, mid = px.get(proxy)
        if key in NOT_JUDGED_HERE:
            out.append(lesson.untested(key, NOT_JUDGED_HERE[key]))
        elif not lesson.gpu:
            out.append(lesson.untested(key, "needs a CUDA GPU; see the reference run"))
        elif est is None:
            why = ("torch.compile did not run here" + (f": {compile_error}" if compile_error else "")
                   if key == "step4_compile" else "not measured in this run")
            out.append(lesson.untested(key, why))
        else:
            out.append(lesson.check(key, est, "tokens/s over the timed windows; NVML and MFU intervals: quartiles "
                                    "of the window's samples", measurement=mid))
    from ..measuring.device import lookup_peaks

    a100 = lookup_peaks("A100-SXM4-80GB")
    lesson.check("a100_peak", a100.tflops.get("bf16") if a100 else None, "gpulab's datasheet table")
    for key, (proxy, why) in PROXY.items():
        est, mid = px.get(proxy)
        lesson.not_comparable(key, est, why if lesson.gpu else why + "; our proxy measured on a CPU",
                              measurement=mid if est is not None else None)
    return out


WATERFALL_COLUMNS = [
    ("step", "#", None), ("label", "change", None), ("step_ms", "time/step", lambda v: si(v / 1e3, "s")),
    ("tokens_per_step", "tokens/step", si), ("tokens_per_s", "tokens/s", si),
    ("tokens_per_s_interval", "tokens/s interval", lambda v: f"{si(v[0])}–{si(v[1])}"),
    ("gain", "vs previous", times), ("cumulative", "vs naive", times),  # 12.6x, as in the verdicts
    ("mfu_bf16_peak", "MFU (BF16 peak)", pct), ("matmul_dtype", "matmul dtype", None),
    ("mfu_own_peak", "MFU (own dtype peak)", pct), ("nvml_util", "GPU busy (NVML)", lambda v: pct(v, 1)),
    ("gpm_sm_active", "SM active (GPM)", lambda v: pct(v, 1)),
    ("gpm_tensor_active", "tensor active (GPM)", lambda v: pct(v, 1)),
    ("peak_memory_gb", "peak memory", lambda v: si(v * 1e9, "B")), ("first_step_s", "first step", lambda v: si(v, "s"))]


def waterfall_rows(steps: list[Any]) -> list[dict[str, Any]]:
    """One row per waterfall step: its measurements, its gain over the step before and over the naive loop, and
    its change as the PyTorch lines it amounts to (`code`, from the two configurations that ran)."""
    from ..workloads.training.as_code import change_as_code

    rows = []
    for i, s in enumerate(steps):
        r = s.row()
        r["step"] = i
        r["gain"] = s.tokens_per_s / steps[i - 1].tokens_per_s if i else None
        r["cumulative"] = s.tokens_per_s / steps[0].tokens_per_s
        r["code"] = change_as_code(steps[i - 1].config, s.config) if i else []
        rows.append(r)
    return rows


def stages_code_html(rows: list[dict[str, Any]]) -> str:
    """Each waterfall stage beside the PyTorch its change amounts to (the rows of `waterfall_rows`)."""
    import html

    e = html.escape
    body = "".join(
        f"<tr><td style='text-align:left'>{e(r['label'])}</td><td style='text-align:left'>"
        + ("<br>".join(f"<code>{e(line)}</code>" for line in r["code"]) or "the loop of section 3, as written")
        + "</td></tr>" for r in rows)
    return ("<table><tr><th style='text-align:left'>stage</th><th style='text-align:left'>its change, as PyTorch "
            f"(from the configurations that ran)</th></tr>{body}</table>")


def waterfall_figures(steps: list[Any], ref: dict[str, Any] | None, *, matches: bool, device_name: str) -> None:
    """Tokens/s after each change and MFU after each change, the reference GPU's beside only when `matches`
    (same_shape): a reference of another model or loop would be compared with the wrong numbers."""
    import matplotlib.pyplot as plt

    from ..display import plots

    ref_rows = (ref or {}).get("extra", {}).get("waterfall", []) if matches else []
    width = plots.waterfall([(s.label, s.tokens_per_s) for s in steps], ref=[(r["label"], r["tokens_per_s"])
                                                                          for r in ref_rows] or None,
                            title=f"tokens/s after each change ({device_name})").get_figwidth()
    plt.show()
    if steps[0].mfu is None:  # no datasheet peak on a CPU: no MFU bars to draw
        return
    ref_mfu = {r["label"]: r.get("mfu_bf16_peak") for r in ref_rows}
    labels = [s.label for s in steps]
    ref_vals = [100 * ref_mfu[lb] if ref_mfu.get(lb) is not None else None for lb in labels] if ref_rows else None
    fig = plots.bars(labels, [100 * s.mfu for s in steps], ylabel="MFU (% of dense BF16 peak)",
                     title="MFU after each change (one yardstick: the BF16 peak)",
                     colors=[plots.BEFORE] + [plots.AFTER] * (len(steps) - 1),  # the tokens/s chart's colours
                     legend=[(f"this run: {labels[0]}", plots.BEFORE), ("this run: after each change", plots.AFTER)],
                     ref=ref_vals, fmt=sig)  # 4.41, as in the table
    fig.set_size_inches(width, 4)  # as wide as the tokens/s chart
    fig.tight_layout()
    plt.show()


def loss_figure(naive_losses: list[float], final_losses: list[float]) -> None:
    """The two loss curves of the written-out steps, one line each (no per-step markers)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from ..display import plots

    fig, ax = plt.subplots(figsize=(7, 3.4))
    steps = range(1, len(naive_losses) + 1)
    ax.plot(steps, naive_losses, label="naive step (FP32)", color=plots.BEFORE)  # colours as in the bars
    ax.plot(steps, final_losses, label="final step (BF16 autocast, compiled)", color=plots.AFTER, ls="--")
    ax.set(xlabel="optimizer step", ylabel="training loss", title="same weights, same batches: the loss")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.show()
