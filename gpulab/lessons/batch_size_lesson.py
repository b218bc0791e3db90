"""Notebook 06's scaffolding: its smoke sizes and result parameters, the guide's search trap, and the tables,
figures and sentences that report what it measured (the search, the sweep, 80% of the max, the gradient checks,
the cost of accumulating), and its widget. The claims and their verdicts live in
`gpulab.lessons.batch_size_claims` and are re-exported here, so the notebook needs one handle.

The measuring stays in the notebook (the search, the sweep, the before/afters, the gradient checks) and in the
tool `gpulab.batchsize`; nothing here times anything except the widget.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..batchsize import BatchSizeSearch, column, gpt_step_memory_estimate
from ..timing import fmt_time
from .batch_size_claims import (CLAIMS, Sweep, check_accumulation_cost, check_batch_8_64, check_eighty,
                                check_gradients, check_scaling, claims, pct, record_the_rest)
from .measuring_lesson import source

__all__ = ["FULL", "SMOKE", "SMOKE_SIZES", "CLAIMS", "claims", "Sweep", "pct", "source", "use_sizes", "params",
           "setup_note", "model_note", "guide_search_step", "run_guide_search", "search_report", "sweep_table",
           "sweep_figures", "scaling_report", "eighty_share", "eighty_record", "top_note", "eighty_report",
           "grad_table", "grad_figure", "accum_report", "mfu_figure", "one_batch", "check_scaling", "check_batch_8_64",
           "check_eighty", "check_gradients", "check_accumulation_cost", "record_the_rest"]

# gl.lesson's sizes: None in the parameters cell takes these (MIN_TIME_S None: gpulab's default, 1 s on a GPU).
FULL = dict(MIN_TIME_S=None, SIM_MEMORY_MB=8)
SMOKE = dict(MIN_TIME_S=0.05)
# At smoke sizes (SMOKE=True, or no CUDA GPU) these replace the parameters whatever they say: GPT-2 small on a CPU
# would take many minutes a step.
SMOKE_SIZES = dict(MODEL="smoke", SEQ_LEN=32, MAX_BATCH=32)
NO_GPU_NOTE = (
    "**No CUDA GPU here.** A tiny GPT trains on the CPU at smoke sizes whatever `SMOKE` says. There is no "
    "out-of-memory to hit, so the batch-size search runs against a *simulated* memory limit; GPU utilization "
    "and peak memory are not available; the GPU claims are marked *not tested*. The gradient-accumulation "
    "check is numerics, not speed, and is tested here in full. The reference GPU's results are shown at the end.")
_BATCH_AXIS = "batch size (sequences)"


def use_sizes(lesson: Any, ns: dict[str, Any]) -> None:
    """At smoke scale put the smoke model, sequence length and batch cap into the notebook's namespace."""
    lesson.use_smoke_sizes(ns, SMOKE_SIZES)
    if lesson.small:
        lesson.sizes.update(SMOKE_SIZES)


def params(ns: dict[str, Any]) -> dict[str, Any]:
    """The result JSON's `params`, under the keys the reference runs use."""
    return dict(model=ns["MODEL"], seq_len=ns["SEQ_LEN"], max_batch=ns["MAX_BATCH"], batch_sizes=ns["BATCH_SIZES"],
                accum_steps=ns["ACCUM_STEPS"], accum_batch=ns.get("ACCUM_BATCH"), dtype=ns["DTYPE"],
                min_time_s=ns["MIN_TIME_S"])


def setup_note(lesson: Any) -> str:
    """What this run can do: on a CPU, what is simulated and what stays untested."""
    return "" if lesson.gpu else NO_GPU_NOTE


def model_note(step: Any, model: str, seq_len: int, dtype: str, peak: float | None) -> str:
    """The GPT in one sentence: parameters, shape, training FLOPs per sequence, and the peak MFU is against."""
    cfg = step.config
    return (f"GPT `{model}`: {step.n_params / 1e6:.1f}M parameters, {cfg.n_layer} layers, width {cfg.n_embd}, "
            f"{seq_len} tokens per sequence; {step.flops_per_sequence() / 1e12:.3f} TFLOP of training work per "
            f"sequence; matmuls in {dtype.upper()}; MFU against "
            + (f"the datasheet dense {dtype.upper()} peak, {peak:g} TFLOP/s." if peak
               else "no peak (none known for this device)."))


# ---------------------------------------------------------------- section 2: the search


def model_that_runs_out_of_memory(x: torch.Tensor) -> torch.Tensor:
    """A fake model: every forward pass runs out of memory."""
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def guide_search_step(mid: int) -> str:
    """One step of the guide's search (§6.1): its try / except / finally, on the fake model above."""
    try:
        inputs = torch.randn(mid, 8)
        outputs = model_that_runs_out_of_memory(inputs)
        loss = outputs.sum()
        loss.backward()
        return "fits"
    except RuntimeError as e:
        if "out of memory" in str(e):
            return "OOM"
        raise e
    finally:
        del inputs, outputs, loss  # noqa: F821 - the trap: outputs and loss were never assigned


def run_guide_search(mid: int = 512) -> str:
    """What the guide's step returns after an OOM in the forward pass, or the error its cleanup raises."""
    try:
        return guide_search_step(mid)
    except NameError as e:  # UnboundLocalError is a NameError
        return f"{type(e).__name__}: {e}"


def search_report(lesson: Any, search: BatchSizeSearch, mem_start: int | None, mem_end: int | None,
                  max_batch: int, sim_memory_mb: float) -> str:
    """The largest batch and the fastest; on a GPU the allocated memory before, between and after the search."""
    maxb, fastest = search.max_fitting, search.best_throughput
    capped = " (the cap: more may fit)" if maxb == max_batch else ""
    if not lesson.gpu:
        return (f"On this CPU the search ran against a simulated {sim_memory_mb} MB device, a batch 'running out of "
                f"memory' when an estimate of its memory (`gpt_step_memory_estimate`: weights, gradients, AdamW "
                f"state, activations) exceeds it. Largest batch that fits: **{maxb}**{capped}; fastest in the search: "
                f"**{fastest}**. There is no allocator to check afterwards; on a GPU this cell shows "
                "`memory_allocated()` before and after.")
    gb = 1e9
    ooms = sum(not r["fits"] for r in search.tried)
    return (f"Largest batch that fits: **{maxb}**{capped}; fastest in the search: **{fastest}**.\n\n"
            f"| `torch.cuda.memory_allocated()` | GB |\n|---|---|\n"
            f"| before the search (weights) | {mem_start / gb:.3f} |\n"
            f"| between steps (weights + AdamW state) | {search.memory_allocated_between_steps / gb:.3f} |\n"
            f"| after the search, {ooms} out-of-memory errors later | {mem_end / gb:.3f} |\n\n"
            + ("Memory is back at its between-steps level: nothing from the failed steps is held."
               if search.memory_recovered else
               "**Memory is not back**: something still holds tensors from a failed step."))


# ---------------------------------------------------------------- section 3: the sweep


def _gb(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} GB"


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """The sweep as a Markdown table: time, throughput, MFU, three utilizations and peak memory per batch."""
    table = ("| batch | step | samples/s | tokens/s | MFU | GPU busy (NVML) | SM active (GPM) | tensor active (GPM) "
             "| peak memory |\n|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        if r["oom"]:
            table += f"| {r['batch_size']} | out of memory | | | | | | | |\n"
            continue
        table += (f"| {r['batch_size']} | {fmt_time(r['step_ms'] / 1e3)} | {r['samples_per_s']:,.1f} "
                  f"| {r['tokens_per_s']:,.0f} | {pct(r['mfu'], 100, 1)} | {pct(r['nvml_util'])} "
                  f"| {pct(r['gpm_sm_active'])} | {pct(r['gpm_tensor_active'])} | {_gb(r['peak_mem_gb'])} |\n")
    return table


def sweep_figures(ok: list[dict[str, Any]], lesson: Any, cfg: Any, *, model: str, seq_len: int, dtype: str,
                  sim_memory_mb: float) -> None:
    """Three figures over batch size: throughput, the levels of utilization, and memory; the reference beside."""
    import matplotlib.pyplot as plt

    from ..display import plots

    gpu, xs = lesson.gpu, [r["batch_size"] for r in ok]
    ref_rows = [r for r in (lesson.reference or {}).get("extra", {}).get("batch_sweep", []) if not r.get("oom")]

    def ref_line(key: str, scale: float = 1.0) -> Any:
        return ([r["batch_size"] for r in ref_rows], column(ref_rows, key, scale)) if ref_rows else None

    plots.sweep(xs, {"samples/s": column(ok, "samples_per_s")}, xlabel=_BATCH_AXIS, ylabel="samples/s", logx=True,
                ref={"samples/s": ref_line("samples_per_s")} if ref_rows else None,
                title=f"throughput vs batch size ({model}, {seq_len} tokens, {dtype})")
    plt.show()
    levels = {"MFU (%)": column(ok, "mfu", 100), "GPU busy, NVML (%)": column(ok, "nvml_util"),
              "SM active, GPM (%)": column(ok, "gpm_sm_active"),
              "tensor active, GPM (%)": column(ok, "gpm_tensor_active")}
    if not gpu:  # the only utilization a CPU run has is the host's own
        levels["host CPU (%)"] = column(ok, "cpu_percent")
    fig = plots.sweep(xs, levels, xlabel=_BATCH_AXIS, ylabel="percent", logx=True,
                      ref={"MFU (%)": ref_line("mfu", 100)} if ref_rows else None,
                      title="three levels of utilization vs batch size")
    fig.axes[0].set_ylim(-3, 105)
    if not gpu:
        fig.axes[0].text(0.5, 0.5, "no MFU or GPU utilization on a CPU: see the reference run", ha="center",
                         transform=fig.axes[0].transAxes, color="#666")
    plt.show()
    if gpu:
        mem = {"peak memory allocated (GB)": column(ok, "peak_mem_gb")}
        hl = {f"device memory, {lesson.device.memory_gb:.0f} GB": lesson.device.memory_gb}
    else:
        mem = {"estimated step memory (MB)": [gpt_step_memory_estimate(cfg, b, seq_len) / 2**20 for b in xs]}
        hl = {f"simulated limit, {sim_memory_mb} MB": sim_memory_mb}
    plots.sweep(xs, mem, xlabel=_BATCH_AXIS, ylabel="GB" if gpu else "MB", hlines=hl,
                ref={"peak memory allocated (GB)": ref_line("peak_mem_gb")} if ref_rows and gpu else None,
                title="memory vs batch size")
    plt.show()


def scaling_report(sw: Sweep, gpu: bool) -> str:
    """In words: throughput from the smallest to the largest batch, best, knee, sweet spot, NVML against MFU."""
    first, last = sw.ok[0], sw.ok[-1]
    s = sw.sweet
    return (
        f"From batch {first['batch_size']} to {last['batch_size']}, throughput goes from "
        f"{first['samples_per_s']:,.1f} to {last['samples_per_s']:,.1f} samples/s "
        f"({last['samples_per_s'] / first['samples_per_s']:.1f}x); the best is batch **{sw.best}**, and batch "
        f"**{sw.knee}** is the smallest within 10% of it. "
        + (f"The sweet spot by the guide's own reading (the last size before a bigger batch buys relatively less "
           f"throughput than it costs in memory) is batch **{s.value:g}** (between {s.lo:g} and {s.hi:g} "
           f"within the timing spread). " if s else "")
        + (f"NVML's 'GPU busy' reads {pct(first['nvml_util'])} at batch {first['batch_size']} and "
           f"{pct(last['nvml_util'])} at {last['batch_size']}, while MFU goes from {pct(first['mfu'], 100, 1)} to "
           f"{pct(last['mfu'], 100, 1)}: NVML only says a kernel was running, not how much of the GPU it used."
           if gpu and first["nvml_util"] is not None else ""))


def paired_batches(step: Callable[[int], Any], sw: Sweep, b1: int, b2: int, *, flops_per_seq: float, seq_len: int,
                   dtype: str, min_time_s: float | None, device: Any, rounds: int = 12) -> Any:
    """Batch `b1` against batch `b2` in `rounds` interleaved rounds, for a claim a few percent from its band (the
    sweep times each size once, in its own window); None off a GPU or where the sweep did not reach both."""
    if not (device.is_cuda and b1 in sw.by_b and b2 in sw.by_b):
        return None
    from ..experiment import before_after

    return before_after(lambda: step(b1), lambda: step(b2), name=f"batch {b1} vs {b2}", before_label=f"batch {b1}",
                        after_label=f"batch {b2}", flops=flops_per_seq * b1, after_flops=flops_per_seq * b2,
                        dtype=dtype, items=b1 * seq_len, after_items=b2 * seq_len, item_name="tokens",
                        min_time_s=min_time_s, device=device, rounds=rounds, kind="demonstration")


# ---------------------------------------------------------------- section 5: 80% of the max


def eighty_share(cmp80: Any, b80: int, b_top: int) -> Any:
    """Throughput at 80% over throughput at the max (tokens per second), interval from the paired rounds."""
    return cmp80.estimate().map(lambda s: s * b80 / b_top)


def eighty_record(b_top: int, b80: int, search_max: int, share80: Any, mem80: float | None,
                  memtop: float | None) -> dict[str, Any]:
    """The result JSON's `batch_80_percent`."""
    return dict(max=b_top, b80=b80, search_max=search_max, throughput_share=[share80.value, share80.lo, share80.hi],
                peak_mem_gb={"b80": mem80, "max": memtop})


def top_note(b_top: int, search_max: int) -> str:
    """Why the max here is below the search's, when a longer run ran out of memory at the top ("" if not)."""
    return ("" if b_top == search_max else f"batch {search_max} fit the search's few steps but ran out of memory in "
            f"a longer run, so the largest that ran ({b_top}) is the maximum here; ")


def eighty_report(b_top: int, b80: int, share80: Any, mem80: float | None, memtop: float | None, best: int,
                  note: str) -> str:
    """In words: the share of the max's throughput that 80% of it keeps, and the memory it saves."""
    return (f"Batch {b80} (80% of {b_top}) trains **{share80.value:.1%}** [{share80.lo:.1%}, {share80.hi:.1%}] of "
            f"batch {b_top}'s tokens per second"
            + (f", with a peak of {mem80:.1f} GB instead of {memtop:.1f} GB" if memtop else "")
            + f". The fastest batch in the sweep was {best}." + (f" Note: {note.rstrip('; ')}." if note else ""))


# ---------------------------------------------------------------- sections 6 and 7: accumulation


def grad_table(checks: dict[str, dict[str, Any]]) -> str:
    """The gradient checks as a Markdown table: same or different, relative and largest absolute difference."""
    return ("| model | batch 128 vs 4 × 32 | relative gradient difference | largest absolute difference |\n"
            "|---|---|---|---|\n"
            + "".join(f"| {k} | {'same' if v['matches'] else 'different'} | {v['rel_diff']:.2e} "
                      f"| {v['max_abs_diff']:.2e} |\n" for k, v in checks.items()))


def grad_figure(checks: dict[str, dict[str, Any]]) -> None:
    """Bars of the relative gradient difference per model, on a log scale."""
    import matplotlib.pyplot as plt

    from ..display import plots

    plots.bars([k.replace(", ", "\n") for k in checks], [v["rel_diff"] for v in checks.values()],
               ylabel="relative difference (log)", fmt="{:.1e}",
               title="gradients: one batch of 128 vs 4 accumulated micro-batches of 32")
    plt.gca().set_yscale("log")
    plt.show()


def accum_report(cmp_accum: Any, slow_est: Any, accum_steps: int, b_acc: int, mem_big: float | None,
                 mem_acc: float | None) -> str:
    """In words: how much longer accumulating takes than one batch, and the memory it saves."""
    micro = b_acc // accum_steps
    return (f"Accumulating {accum_steps} micro-batches of {micro} takes **{1 / cmp_accum.speedup:.2f}x** "
            f"[{slow_est.lo:.2f}, {slow_est.hi:.2f}] the time of one batch of {b_acc} "
            f"({'within the noise' if cmp_accum.within_noise else 'outside the noise'})"
            + (f", and peaks at {mem_acc:.1f} GB instead of {mem_big:.1f} GB ({mem_big / mem_acc:.1f}x less)."
               if mem_big else "."))


def mfu_figure(cmp_batch: Any, cmp_accum: Any, dtype: str, reference: dict[str, Any] | None) -> None:
    """MFU of both before/after experiments on one scale; the reference run's bars beside, where committed."""
    import matplotlib.pyplot as plt

    from ..display import plots
    from ..results import comparisons

    plots.mfu(cmp_batch, cmp_accum, title=f"MFU ({dtype}, datasheet peak)",
              reference=comparisons(reference) if reference else None)
    plt.show()


def one_batch(step: Callable[[int], Any], *, flops_per_seq: float, seq_len: int, dtype: str,
              min_time_s: float | None, device: Any) -> Callable[[int], Any]:
    """The widget's run: one `gl.measure` of the training step at a batch size, in one line."""
    from IPython.display import Markdown

    from ..experiment import measure

    def run(batch_size: int) -> Any:
        r = measure(lambda: step(batch_size), label=f"batch {batch_size}", flops=flops_per_seq * batch_size,
                    dtype=dtype, items=batch_size * seq_len, item_name="tokens", min_time_s=min_time_s,
                    device=device)
        return Markdown(f"batch {batch_size}: {fmt_time(r.seconds)} per step, {r.throughput / seq_len:,.1f} "
                        f"samples/s, MFU {pct(r.mfu, 100, 1)}, GPU busy (NVML) {pct(r.metric('nvml_util'))}")
    return run
