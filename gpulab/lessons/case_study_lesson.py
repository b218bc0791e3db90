"""Notebook 08's tables, figures and report sentences: what the case study shows, not what it measures.

The measuring stays in the notebook (the waterfall loop, the naive-vs-optimized comparison, the loss check) and in
`gpulab.training`; these functions only turn its results into tables, figures and sentences.
"""
from __future__ import annotations

import warnings
from typing import Any

from IPython.display import Markdown, display

from .. import training as T

# Smoke sizes: the same code on a tiny GPT, never GPT-2 small on a CPU.
SMOKE_SIZES = dict(N_LAYER=2, N_HEAD=2, N_EMBD=64, SEQ_LEN=64, VOCAB_SIZE=300, NAIVE_BATCH=4, BATCH_SIZE=8,
                   GRAD_ACCUM=2, WORKERS=1, STEP_SECONDS=0.1, LOSS_STEPS=10, CORPUS_BYTES=300_000)
NOT_GPU = "needs a CUDA GPU; see the reference run"
# The case study's GPT at full size (its parameters cell says the same; notebook 09 profiles this loop): GPT-2
# small's depth, heads, context and vocabulary at twice its width, so its matmuls and 128-wide attention heads are
# big enough for a Hopper GPU's tensor cores.
MODEL_SHAPE = dict(n_layer=12, n_head=12, n_embd=1536, block_size=1024, vocab_size=50257)
FINAL_BATCH = dict(batch_size=32, grad_accum=2, num_workers=4)
CONFIG_FIELDS = ["tf32", "autocast", "fused_adamw", "attn", "batch_size", "grad_accum", "sync_every_step",
                 "num_workers", "pin_memory", "pad_vocab", "fused_loss", "param_dtype", "master_weights", "compile"]
WATERFALL_COLUMNS = [
    ("step", "#", None), ("label", "change", None), ("config", "configuration", None), ("step_ms", "ms/step", "{:,.1f}"),
    ("tokens_per_step", "tokens/step", "{:,}"), ("tokens_per_s", "tokens/s", "{:,.0f}"),
    ("tokens_per_s_interval", "tokens/s interval", lambda v: f"{v[0]:,.0f}–{v[1]:,.0f}"),
    ("gain", "vs previous", "{:.2f}x"), ("cumulative", "vs naive", "{:.2f}x"),
    ("mfu_bf16_peak", "MFU (BF16 peak)", "{:.1%}"), ("matmul_dtype", "matmul dtype", None),
    ("mfu_own_peak", "MFU (own dtype peak)", "{:.1%}"), ("nvml_util", "GPU busy (NVML)", "{:.0f}%"),
    ("gpm_sm_active", "SM active (GPM)", "{:.0f}%"), ("gpm_tensor_active", "tensor active (GPM)", "{:.0f}%"),
    ("peak_memory_gb", "peak GB", "{:.1f}"), ("first_step_s", "first step s", "{:.1f}")]
STAGE_COLUMNS = [("label", "step", None), ("step_ms", "ms/step", "{:,.1f}"), ("tokens_per_s", "tokens/s", "{:,.0f}"),
                 ("mfu_bf16_peak", "MFU (BF16 peak)", "{:.1%}"), ("nvml_util", "GPU busy (NVML)", "{:.0f}%"),
                 ("peak_memory_gb", "peak GB", "{:.1f}")]


def params(ns: dict[str, Any], do_compile: bool) -> dict[str, Any]:
    """The sizes and switches this run used, as the result JSON records them."""
    keys = ("ROUNDS", "N_LAYER", "N_HEAD", "N_EMBD", "SEQ_LEN", "VOCAB_SIZE", "NAIVE_BATCH", "BATCH_SIZE", "GRAD_ACCUM",
            "WORKERS", "STEP_SECONDS", "LOSS_STEPS", "CORPUS_BYTES", "COMPILE_MODE", "FUSED_LOSS", "BF16_WEIGHTS")
    return {k.lower(): ns[k] for k in keys} | {"compile": do_compile}


def config_table(naive: Any, final: Any, text: str, tokens: Any, model_cfg: Any) -> Any:
    """The naive and the final configuration side by side, field by field."""
    return T.Table([{"field": f, "naive": str(getattr(naive, f)), "final": str(getattr(final, f))} for f in CONFIG_FIELDS],
                   [("field", "TrainConfig field", None), ("naive", "naive loop", None), ("final", "final loop", None)],
                   title=f"{len(text) / 1e6:.1f} MB of text, {tokens.numel():,} tokens; "
                         f"{T.gpt_num_params(model_cfg) / 1e6:.1f} M parameters")


def flops_report(formula: float, counted: float, naive: Any, seq_len: int, n_layer: int, n_embd: int) -> Markdown:
    """The formula's FLOPs beside FlopCounterMode's, and what counting attention as causal would change."""
    causal_share = 6 * n_layer * n_embd * seq_len / naive.flops_per_token()
    return Markdown(
        f"Formula: **{formula / 1e9:,.1f} GFLOP** per {seq_len}-token sequence ({naive.flops_per_token() / 1e6:,.0f} "
        f"MFLOP per token); FlopCounterMode: **{counted / 1e9:,.1f} GFLOP** (ratio {counted / formula:.3f}). Every MFU "
        "below uses the formula's count, the same for every configuration (the padded vocabulary's extra rows are "
        "work, not useful work, so they are not counted). Counting attention as causal (what a flash kernel actually "
        f"computes) would lower every MFU by {causal_share:.1%} of its value.")


def waterfall_rows(steps: list[Any]) -> list[dict[str, Any]]:
    """One row per waterfall step: its measurements, its gain over the step before and over the naive loop."""
    rows = []
    for i, s in enumerate(steps):
        r = s.row()
        r["step"] = i
        r["gain"] = s.tokens_per_s / steps[i - 1].tokens_per_s if i else None
        r["cumulative"] = s.tokens_per_s / steps[0].tokens_per_s
        rows.append(r)
    return rows


def waterfall_table(rows: list[dict[str, Any]]) -> Any:
    return T.Table(rows, WATERFALL_COLUMNS, title="the waterfall (each row adds its change to all the rows above)")


def waterfall_figures(steps: list[Any], ref: dict[str, Any] | None, *, same_shape: bool, device_name: str,
                      gpu: bool) -> None:
    """Tokens/s after each change (beside the reference GPU's), MFU after each change, and utilization at
    three levels (NVML, GPM SM and tensor activity, MFU)."""
    import matplotlib.pyplot as plt

    from ..display import plots

    ref_rows = (ref or {}).get("extra", {}).get("waterfall", [])
    ref_pairs = [(r["label"], r["tokens_per_s"]) for r in ref_rows]
    plots.waterfall([(s.label, s.tokens_per_s) for s in steps], ref=ref_pairs if same_shape else None,
                    title=f"tokens/s after each change ({device_name})")
    plt.show()
    if ref_pairs and not same_shape:
        plots.waterfall(ref_pairs, title=f"the reference GPU's waterfall ({ref['device']['name']}, full size)")
        plt.show()
    labels = [s.label for s in steps]
    ref_mfu = {r["label"]: None if r.get("mfu_bf16_peak") is None else r["mfu_bf16_peak"] * 100 for r in ref_rows}
    mfu = [None if s.mfu is None else s.mfu * 100 for s in steps]
    fig = plots.bars(labels, mfu, ylabel="MFU (% of datasheet dense BF16 peak)",
                     title="MFU after each change (one yardstick: BF16 peak)",
                     ref=[ref_mfu.get(label) for label in labels] if same_shape else None)
    if not gpu:
        fig.axes[0].text(0.5, 0.8, "no MFU on a CPU: no datasheet peak", ha="center", transform=fig.axes[0].transAxes)
    plt.show()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # on a CPU the plot has no series: the text below says why
        fig = plots.sweep(list(range(len(steps))), {
            "GPU busy, NVML (%)": [s.run.metric("nvml_util") for s in steps],
            "SM active, GPM (%)": [s.run.metric("gpm_sm_active") for s in steps],
            "tensor active, GPM (%)": [s.run.metric("gpm_tensor_active") for s in steps],
            "MFU, BF16 peak (%)": mfu}, xlabel="waterfall step (# in the table)", ylabel="%",
            title="utilization at three levels after each change")
    if not gpu:
        fig.axes[0].text(0.5, 0.8, "NVML, GPM and MFU need a CUDA GPU", ha="center", transform=fig.axes[0].transAxes)
    plt.show()


def step_report(steps: list[Any]) -> Markdown:
    """What each change did to tokens/s, MFU and NVML busy, and what the compile cost once."""
    lines = []
    for i in range(1, len(steps)):
        s, p = steps[i], steps[i - 1]
        util = s.run.metric("nvml_util")
        lines.append(f"- **{s.label}**: {p.tokens_per_s:,.0f} → {s.tokens_per_s:,.0f} tokens/s "
                     f"({s.tokens_per_s / p.tokens_per_s:.2f}×)"
                     + (f", MFU {p.mfu:.1%} → {s.mfu:.1%}" if s.mfu is not None else "")
                     + (f", NVML busy {util:.0f}%" if util is not None else "")
                     + "".join(f"; {n}" for n in s.notes if n not in p.notes))
    comp = next((s for s in steps if s.config.compile), None)
    return Markdown(
        f"From the naive loop's {steps[0].tokens_per_s:,.0f} tokens/s to the last step's {steps[-1].tokens_per_s:,.0f}: "
        f"**{steps[-1].tokens_per_s / steps[0].tokens_per_s:.1f}×**. Step by step:\n\n" + "\n".join(lines)
        + (f"\n\nThe compile itself is not in the step times: the first compiled step took {comp.first_step_s:.1f} s "
           f"against {comp.step_s * 1e3:.0f} ms for a compiled step afterwards, about {comp.setup_s:.0f} s paid once."
           if comp else ""))


def comparison_figures(cmp: Any, ref: dict[str, Any] | None) -> None:
    """Utilization over time and MFU, naive loop against optimized loop (the reference GPU's bars beside)."""
    import matplotlib.pyplot as plt

    from ..display import plots
    from ..results import comparisons

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a CPU run has no utilization series: the panels say so
        plots.timeline(cmp, title="utilization over time: naive loop vs optimized loop")
    plt.show()
    plots.mfu(cmp, title="MFU: naive vs optimized (BF16 datasheet peak)", reference=comparisons(ref) if ref else None)
    plt.show()


def loss_report(slow: Any, fast: Any, reference_cfg: Any, final_cfg: Any, loss_steps: int, loss_gap: float) -> None:
    """The two loss curves, the two configurations, and whether the speed cost the math."""
    import matplotlib.pyplot as plt

    from ..display import plots

    plots.sweep(list(range(1, loss_steps + 1)), {"naive arithmetic": slow.losses, "final loop": fast.losses},
                xlabel="optimizer step", ylabel="training loss", title="same weights, same data: the loss")
    plt.show()
    display(Markdown(f"*naive arithmetic*: {T.describe(reference_cfg)}  \n*final loop*: {T.describe(final_cfg)}"))
    display(Markdown(
        f"After {loss_steps} steps ({loss_steps * final_cfg.tokens_per_step:,} tokens): naive arithmetic "
        f"**{slow.final_loss:.4f}**, final loop **{fast.final_loss:.4f}**, {loss_gap:.2f}% apart "
        + ("(within the 2% we allow: the speed did not cost the math)." if loss_gap <= 2 else
           "(outside 2%: look at which change moved the loss before trusting the speed).")
        + f" Time for these steps: {sum(slow.step_times_s):.1f} s with the naive arithmetic, "
          f"{sum(fast.step_times_s):.1f} s with the final loop."))


def utilization_story(px: Any, steps: list[Any], device_name: str, gpu: bool) -> Markdown:
    """The case study's lesson in this run's numbers: NVML busy against MFU, naive and final."""
    if not gpu:
        return Markdown("The speed and utilization claims need a GPU: not tested on a CPU. The loss check above is a "
                        "real measurement here, and the other systems' numbers are shown beside this run's proxies.")

    def fmt(e: Any, f: str = "{:.0f}") -> str:
        return "n/a" if e is None else f"{f.format(e.value)} [{f.format(e.lo)}, {f.format(e.hi)}]"

    u0, u1 = px.util(steps[0]), px.util(steps[-1])
    m0, m1 = px.mfu_pct(steps[0]), px.mfu_pct(steps[-1])
    return Markdown(
        f"On {device_name} the naive loop reads **{fmt(u0)}%** busy on NVML at **{fmt(m0, '{:.1f}')}%** MFU; the final "
        f"loop **{fmt(u1)}%** at **{fmt(m1, '{:.1f}')}%**, {fmt(px.speedup(), '{:.1f}')}× the tokens per second. "
        + ("NVML barely moves while MFU climbs: the naive loop was already 'busy' by NVML's definition, just busy "
           "doing slow FP32 arithmetic. " if u0 and u0.value > 85 else "")
        + "The guide's case study had a data-starved 8-GPU job where utilization itself was the problem; a single GPU "
        f"training a {T.gpt_num_params(steps[-1].config.model) / 1e6:,.0f} M-parameter model from memory is "
        "compute-bound from the start, so its gains come from "
        "precision, kernels and fusion rather than from keeping the GPU fed.")
