"""Notebook 03's scaffolding: its smoke sizes, the tables, figures and sentences that report what it measured (bytes
moved, bandwidth, the training step, CUDA graphs and compile modes), and its widget. The claims and their verdicts
live in `gpulab.lessons.fusion_claims` and are re-exported here, so the notebook needs one handle.

The measuring stays in the notebook (the functions it compiles and times) and in `gpulab.lessons.compile_lab`;
nothing here times anything except the widget.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..lesson import SectionClock
from ..timing import fmt_time
from .compile_lab import ModeTiming
from .fusion_claims import (CLAIMS, INFER_NAME, TRAIN_NAME, check_add_relu_mul, check_fusions, check_gelu,
                            check_modes, check_training, count_fusion, other_system, record_the_rest)
from .measuring_lesson import source

__all__ = ["SMOKE_SIZES", "PARAMS", "CLAIMS", "TRAIN_NAME", "INFER_NAME", "Phases", "use_sizes", "source",
           "setup_note", "compile_skip", "check_add_relu_mul", "chain_bandwidth", "chain_bandwidth_note",
           "broadcast_note", "check_gelu", "gelu_bandwidth", "bandwidth_figure",
           "gelu_report", "count_fusion", "fusion_list", "check_fusions", "check_training", "training_report",
           "utilization_figures", "mfu_figure", "graph_report", "mode_cap", "modes_table_html", "modes_figure",
           "check_modes", "modes_summary", "gelu_panel", "other_system", "record_the_rest"]

# Smoke sizes (SMOKE=True, or no CUDA GPU): tiny tensors and a tiny GPT, so the notebook runs on a CPU in a minute.
SMOKE_SIZES = dict(ELEMENTWISE_NUMEL=1 << 18, MODEL=dict(vocab_size=512, n_layer=2, n_head=2, n_embd=64, block_size=64),
                   TRAIN_BATCH=4, INFER_BATCH=2, INFER_SEQ=32, TRAIN_ROUNDS=3)
SMOKE_MIN_TIME_S = 0.05
PARAMS = ("ELEMENTWISE_NUMEL", "MODEL", "TRAIN_BATCH", "INFER_BATCH", "INFER_SEQ", "SWEEP_MODES", "MIN_TIME_S",
          "TRAIN_MIN_TIME_S", "TRAIN_ROUNDS")  # what the result JSON records (the reference runs' keys)


Phases = SectionClock  # seconds per section, and the budget the compile-modes sweep must fit in


def use_sizes(lesson: Any, ns: dict[str, Any]) -> dict[str, Any]:
    """At smoke scale (SMOKE=True, or no CUDA GPU) put the smoke sizes into the notebook's namespace; record the
    sizes used either way. A reader's MIN_TIME_S is kept; the training step then times as long as the rest."""
    lesson.use_smoke_sizes(ns, SMOKE_SIZES, min_time_s=SMOKE_MIN_TIME_S, min_time_keys=("TRAIN_MIN_TIME_S",))
    return lesson.record_sizes(ns, PARAMS)


def setup_note(lesson: Any, compiler_ok: bool, compiler_why: str, peaks: Any) -> str:
    """What this run can do (compiler, sizes, GPU) and the copy bandwidth every elementwise kernel is held to."""
    lines = [f"**Compiler:** {'available' if compiler_ok else 'not available'} ({compiler_why})."]
    if not compiler_ok:
        lines.append("Every `torch.compile` step below is skipped with that reason; the eager measurements and the "
                     "hand-fused `F.gelu` still run.")
    if lesson.small:
        lines.append("**Smoke sizes:** tiny tensors, and only one function (the GELU) is compiled: a first compile on "
                     "a CPU takes tens of seconds. The model compile and the compile-modes sweep are skipped; the "
                     "reference GPU's numbers stand in for them.")
    if not lesson.gpu:
        lines.append("**No CUDA GPU:** kernel counts come from the ops PyTorch dispatches (each is one kernel launch "
                     "on a GPU) and from the kernels the compiler generated; CUDA graphs need a GPU, and claims about "
                     "GPU speed stay untested.")
    lines.append(f"Device copy bandwidth measured here: **{peaks.copy_gbs:,.0f} GB/s** (bytes read + written): the "
                 "ceiling for any elementwise kernel.")
    if lesson.reference is None:
        lines.append("No reference run is committed for this notebook yet, so the plots show this run alone.")
    return "\n\n".join(lines)


def compile_skip(lesson: Any, smoke_why: str) -> str | None:
    """Why a compile step is skipped in this run (no working compiler, or `smoke_why` at smoke sizes), or None when
    it runs: a first compile on a CPU takes tens of seconds, so smoke runs compile only the GELU."""
    return lesson.missing("compiler") or (smoke_why if lesson.small else None)


# ---------------------------------------------------------------- section 1: the add-relu-mul chain


def chain_bandwidth(traffic: Any, cmp: Any, copy_gbs: float | None) -> dict[str, float | None]:
    """GB/s each side of an eager-vs-fused comparison really moved (the eager ops' counted bytes over the eager
    time, one fused kernel's bytes over the fused time), beside the copy bandwidth: the result JSON's
    `arm_bandwidth_gbs`."""
    return {"eager": traffic.total_bytes / cmp.before.seconds / 1e9,
            "fused": traffic.ideal_bytes / cmp.after.seconds / 1e9, "copy": copy_gbs}


def chain_bandwidth_note(traffic: Any, cmp: Any, bandwidth: dict[str, float | None]) -> str:
    """Why the time ratio is not the byte ratio: speedup = byte ratio × (fused GB/s / eager GB/s), exactly."""
    eager, fused, copy = bandwidth["eager"], bandwidth["fused"], bandwidth["copy"]
    copy_txt = f" (a plain copy: {_gbs(copy)})" if copy else ""
    return (f"Why {cmp.speedup:.2f}x and not {traffic.ratio:.2f}x: the eager kernels moved {_gbs(eager)} and the fused "
            f"kernel {_gbs(fused)}{copy_txt}. The speedup is the byte ratio times the ratio of those two rates, "
            f"{traffic.ratio:.2f} × {fused / eager:.2f} = {traffic.ratio * fused / eager:.2f}x. How close each kernel "
            "gets to the copy rate is a property of the chip and of the kernel (PyTorch's generic eager kernels "
            "against one generated for this chain), so the second factor differs between GPUs.")


def broadcast_note(cmp_plain: Any, bw_plain: dict[str, float | None], cmp_cols: Any,
                   bw_cols: dict[str, float | None]) -> str:
    """What per-column vectors change against plain numbers: each side's streaming rate, and so the speedup."""
    def drop(new: float, old: float) -> str:
        return f"{(1 - new / old) * 100:.0f}% slower" if new < old else f"{(new / old - 1) * 100:.0f}% faster"
    e1, f1, e2, f2 = bw_plain["eager"], bw_plain["fused"], bw_cols["eager"], bw_cols["fused"]
    return (f"With per-column vectors the compiled chain is {cmp_cols.speedup:.2f}x faster than eager, against "
            f"{cmp_plain.speedup:.2f}x with plain numbers. The eager kernels streamed {_gbs(e2)} (with numbers: "
            f"{_gbs(e1)}, so {drop(e2, e1)}) and the fused kernel {_gbs(f2)} (with numbers: {_gbs(f1)}, "
            f"{drop(f2, f1)}). The difference in speedup is the eager kernels' index work, not bytes: the byte ratio "
            "is about 3 in both.")


# ---------------------------------------------------------------- section 2: the guide's GELU


def gelu_bandwidth(traffic: Any, cmp_lib: Any, cmp_gelu: Any, copy_gbs: float) -> dict[str, float]:
    """Useful GB/s of each GELU (the bytes one fused kernel must move, over its time), what the eager kernels
    really move, and the copy bandwidth: the result JSON's `gelu_bandwidth_gbs`."""
    times = {"eager chain": cmp_lib.before.seconds, "F.gelu": cmp_lib.after.seconds}
    if cmp_gelu:
        times["torch.compile"] = cmp_gelu.after.seconds
    out = {label: traffic.ideal_bytes / s / 1e9 for label, s in times.items()}
    return dict(out, eager_actual_traffic=traffic.total_bytes / cmp_lib.before.seconds / 1e9, copy=copy_gbs)


def _useful(bandwidth: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in bandwidth.items() if k not in ("eager_actual_traffic", "copy")}


def _gbs(v: float) -> str:
    return f"{v:,.0f} GB/s" if v >= 10 else f"{v:.2f} GB/s"


def bandwidth_figure(bandwidth: dict[str, float], ref: dict[str, Any] | None) -> None:
    """Bars of each GELU's useful bandwidth and the eager chain's whole traffic, under the copy ceiling (dotted);
    the reference GPU's bars beside."""
    import matplotlib.pyplot as plt

    from ..display import plots

    useful, copy = _useful(bandwidth), bandwidth["copy"]
    ref_bw = (ref or {}).get("extra", {}).get("gelu_bandwidth_gbs")
    fig = plots.bars(list(useful) + ["eager, all its traffic"], list(useful.values()) +
                     [bandwidth["eager_actual_traffic"]], ylabel="GB/s",
                     title="GELU: bandwidth reached (useful bytes / time) vs the copy ceiling",
                     fmt="{:,.0f}" if max(useful.values()) >= 10 else "{:.2f}",
                     colors=[plots.BEFORE, plots.AFTER, plots.AFTER][:len(useful)] + ["#b8b8b8"],
                     ref=[ref_bw.get(k) for k in useful] + [ref_bw.get("eager_actual_traffic")] if ref_bw else None)
    fig.axes[0].axhline(copy, ls=":", color="k")
    fig.axes[0].annotate(f"device copy {copy:,.0f} GB/s (this run)", (0, copy), fontsize=8, va="bottom")
    plt.show()


def gelu_report(traffic: Any, cmp_lib: Any, cmp_gelu: Any, compiled: Any, bandwidth: dict[str, float]) -> str:
    """In words: the eager chain's bytes and bandwidth, F.gelu and torch.compile against it, when compiling pays."""
    copy, eager_gbs = bandwidth["copy"], bandwidth["eager_actual_traffic"]
    useful = _useful(bandwidth)
    frac = eager_gbs / copy
    txt = [f"The eager chain dispatched **{traffic.n_ops} ops** and moved **{traffic.total_bytes / 1e6:,.1f} MB** "
           f"per call, {traffic.ratio:.1f}x the {traffic.ideal_bytes / 1e6:,.1f} MB one fused kernel needs. Counting "
           f"all of its traffic it reached {_gbs(eager_gbs)}, {frac:.0%} of the copy bandwidth: "
           + (f"each of its kernels streams memory well; there are just {traffic.ratio:.0f}x too many bytes."
              if frac >= 0.5 else
              "far below it, so here something other than memory traffic limits the chain (the launch cost of "
              "each small kernel, or on a CPU the arithmetic of `pow` and `tanh`).")]
    txt.append(f"`F.gelu` took {fmt_time(cmp_lib.after.seconds)} per call against "
               f"{fmt_time(cmp_lib.before.seconds)} for the chain: **{cmp_lib.verdict}**.")
    if cmp_gelu:
        t_e, t_c = cmp_gelu.before.seconds, cmp_gelu.after.seconds
        txt.append(f"`torch.compile` took {fmt_time(t_c)} per call: **{cmp_gelu.verdict}** over eager, "
                   f"and {cmp_lib.after.seconds / t_c:.2f}x the speed of the hand-written `F.gelu`.")
        if t_e > t_c:
            txt.append(f"**Compile time is a cost of its own:** the first call took {compiled.compile_s:.1f} s, as "
                       f"long as {compiled.compile_s / t_e:,.0f} eager calls. Each compiled call saves "
                       f"{fmt_time(t_e - t_c)}, so compiling pays off after about "
                       f"**{compiled.compile_s / (t_e - t_c):,.0f} calls** in this process.")
        else:
            txt.append(f"The first call took {compiled.compile_s:.1f} s to compile, and the compiled function is "
                       "not faster here, so compiling never pays off at this size on this device.")
    best = max(useful, key=useful.get)
    txt.append(f"The best version reached {_gbs(useful[best])} of useful bandwidth ({best}), "
               f"{useful[best] / copy:.0%} of the copy bandwidth.")
    return "\n\n".join(txt)


def fusion_list(fusion_k: dict[str, tuple[Any, Any, str]]) -> str:
    """One line per fusion: kernels eager and compiled (or why not compiled)."""
    return "\n".join(f"- **{k}**: {e} kernel(s) eager, " + (f"{c} compiled" if c is not None else
                                                              f"not compiled ({why})")
                     for k, (e, c, why) in fusion_k.items())


# ---------------------------------------------------------------- section 3: a GPT training step


def training_report(cmp: Any, compiled: Any, rounds: int) -> str:
    """In words: the step's speedup with its interval, kernels and busy time, and when the compile is repaid."""
    pe, pc = cmp.before.profile, cmp.after.profile
    est, saved = cmp.estimate(), cmp.before.seconds - cmp.after.seconds

    def na(v: float | None, spec: str) -> str:  # no trace counts on a CPU
        return "n/a" if v is None else format(v, spec)

    return (f"Compiling made the step **{cmp.verdict}** (interval {est.lo:.2f}-{est.hi:.2f}x over {rounds} rounds): "
            f"{fmt_time(cmp.before.seconds)} -> {fmt_time(cmp.after.seconds)}, {na(pe.kernels_per_step, ',.0f')} -> "
            f"{na(pc.kernels_per_step, ',.0f')} kernels per step, GPU busy (trace) {na(pe.busy_fraction, '.0%')} -> "
            f"{na(pc.busy_fraction, '.0%')}. The first compiled call took **{compiled.compile_s:.1f} s**; at "
            f"{fmt_time(saved)} saved per step that is repaid after about "
            f"{compiled.compile_s / max(saved, 1e-12):,.0f} steps.")


def utilization_figures(cmp: Any, gpu: bool) -> None:
    """The monitor's timeline of both sides of `cmp` (on a CPU, its own panel first)."""
    import matplotlib.pyplot as plt

    from ..display import plots

    metrics = ("nvml_util", "gpm_sm_active", "gpm_tensor_active", "cpu_percent") if gpu else ("cpu_percent",
                                                                                                "nvml_util")
    plots.timeline(cmp, title=f"utilization: {cmp.name}", metrics=metrics)
    plt.show()


def mfu_figure(cmp_train: Any, ref: dict[str, Any] | None) -> None:
    """MFU of the training step, eager and compiled, with the reference GPU's bars (alone when not run here)."""
    import matplotlib.pyplot as plt

    from ..display import plots
    from ..results import comparisons

    refc = comparisons(ref) if ref else None
    if cmp_train is not None:
        fig = plots.mfu(cmp_train, reference=refc, title="MFU of the GPT training step")
    else:
        r = next((c for c in refc or [] if c.name == TRAIN_NAME), None)
        fig = plots.bars(["eager", "torch.compile"], [None, None], ylabel="MFU (% of datasheet dense peak)",
                         title="MFU of the GPT training step (not run here)", colors=[plots.BEFORE, plots.AFTER],
                         ref=[None if v is None else v * 100 for v in (r.before.mfu, r.after.mfu)] if r else None)
        if r is None:
            fig.axes[0].text(0.5, 0.7, "the compiled training step did not run here,\nand no reference run is "
                             "committed yet", transform=fig.axes[0].transAxes, ha="center", color="#666")
    plt.show()


# ---------------------------------------------------------------- section 4: CUDA graphs and compile modes


def graph_report(cmp: Any, err: float) -> str:
    """In words: what replaying the captured graph bought, GPU busy before and after, and its largest error."""
    pe, pg = cmp.before.profile, cmp.after.profile
    busy = "n/a" if pg.busy_fraction is None else format(pg.busy_fraction, ".0%")
    return (f"Replaying the captured graph: **{cmp.verdict}** ({fmt_time(cmp.before.seconds)} -> "
            f"{fmt_time(cmp.after.seconds)} per forward), the same kernels, GPU busy (trace) "
            f"{pe.busy_fraction:.0%} -> {busy}; largest difference from eager {err:.1e}.")


def mode_cap(mode: str, elapsed_s: float, budget_s: float, mode_timeout_s: float, autotune_timeout_s: float,
             reserve_s: float = 15) -> tuple[float | None, str]:
    """(time cap, "") for one compile mode out of what is left of the notebook's budget (`reserve_s` kept for the
    cells after the sweep); (None, why) when under 20 s would be left, too little to start and compile."""
    left = budget_s - elapsed_s - reserve_s
    cap = min(autotune_timeout_s if mode.startswith("max-autotune") else mode_timeout_s, left)
    if cap < 20:
        return None, (f"skipped: {elapsed_s:.0f} s of the notebook's {budget_s:g} s budget were used, "
                      f"{max(left, 0):.0f} s left")
    return cap, ""


def modes_table_html(sweep: Sequence[ModeTiming]) -> str:
    """Each mode's row: ran, compile time, time per forward, kernels per call, GPU busy, wall time, note."""
    def cell(v: float | None, f: Callable[[float], str]) -> str:
        return "" if v is None else f(v)

    rows = "".join(
        f"<tr><td>{m.mode}</td><td>{'yes' if m.ok else 'no'}</td>"
        f"<td>{cell(m.compile_s, lambda v: f'{v:.1f} s')}</td><td>{cell(m.median_s, fmt_time)}</td>"
        f"<td>{cell(m.kernels_per_call, lambda v: f'{v:,.0f}')}</td><td>{cell(m.busy_fraction, lambda v: f'{v:.0%}')}"
        f"</td><td>{cell(m.wall_s, lambda v: f'{v:.0f} s')}</td><td style='text-align:left'>{m.reason}</td></tr>"
        for m in sweep)
    return ("<p>Each mode in its own process (compile time = first call; wall = the whole subprocess):</p><table><tr>"
            "<th>mode</th><th>ran</th><th>compile</th><th>per forward</th><th>kernels/call</th><th>GPU busy</th>"
            f"<th>wall</th><th>note</th></tr>{rows}</table>") if sweep else ""


def _variants(cmp_g: Any, modes: Sequence[dict[str, Any]]) -> dict[str, tuple[float | None, float | None]]:
    """{variant: (seconds per forward, compile seconds)}: eager and the manual graph, then each mode that ran."""
    d: dict[str, tuple[float | None, float | None]] = {}
    if cmp_g is not None:
        d["eager"], d["CUDA graph (manual)"] = (cmp_g.before.seconds, None), (cmp_g.after.seconds, None)
    for m in modes:
        if m.get("ok"):
            d[m["mode"]] = (m["median_s"], m["compile_s"])
    return d


def modes_figure(cmp_graph: Any, sweep: Sequence[ModeTiming], ref: dict[str, Any] | None, batch: int,
                 seq: int) -> None:
    """Time per forward and compile time per variant, this run's beside the reference GPU's; a sentence instead
    when there is nothing to plot."""
    import matplotlib.pyplot as plt
    from IPython.display import Markdown, display

    from ..display import plots
    from ..results import comparisons

    mine = _variants(cmp_graph, [m.to_dict() for m in sweep])
    refd = _variants(next((c for c in comparisons(ref) if c.name == INFER_NAME), None),
                     ref.get("extra", {}).get("modes", [])) if ref else {}
    names = list(dict.fromkeys(list(mine) + list(refd)))
    if not names:
        display(Markdown("*Nothing to plot for the modes: they did not run here and no reference run is committed.*"))
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    xs = range(len(names))
    for ax, i, ylabel in ((axes[0], 0, "ms per forward"), (axes[1], 1, "compile time (s)")):
        scale = 1e3 if i == 0 else 1
        mv = [mine.get(n, (None, None))[i] for n in names]
        rv = [refd.get(n, (None, None))[i] for n in names]
        ax.bar([p - 0.2 for p in xs], [(v or 0) * scale for v in mv], 0.4, color=plots.AFTER, label="this run")
        ax.bar([p + 0.2 for p in xs], [(v or 0) * scale for v in rv], 0.4, color=plots.REF, label="reference GPU")
        for p, v in zip(xs, mv):
            ax.annotate("n/a" if v is None else f"{v * scale:.3g}", (p - 0.2, (v or 0) * scale), ha="center",
                        va="bottom", fontsize=8)
        ax.set_xticks(list(xs), names, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title(f"small-batch GPT forward (batch {batch}, {seq} tokens)")
    axes[1].set_title("first-call compile (or capture) time")
    fig.tight_layout()
    plt.show()


def modes_summary(sweep: Sequence[ModeTiming], cmp_graph: Any) -> str:
    """Each mode's speed against the eager forward of `cmp_graph`, after its first call; empty when nothing ran."""
    ok = [m for m in sweep if m.ok]
    t_eager = cmp_graph.before.seconds if cmp_graph is not None else None
    if not ok or not t_eager:
        return ""
    return ("\n".join(f"- **{m.mode}**: {t_eager / m.median_s:.2f}x the eager speed, after a {m.compile_s:.1f} s "
                      "first call" for m in ok)
            + "\n\nThe summary's \"30-100%\" is checked on the training step (section 3), the work it is about; a "
            "launch-bound forward like this one is where CUDA graphs help most.")


# ---------------------------------------------------------------- try it: GELU at another size


def gelu_panel(compiled: Any, device: Any, min_time_s: float | None, small: bool) -> Any:
    """A control that times the eager GELU chain against a fused one (the compiled GELU, or F.gelu) at a size the
    reader picks; each new size is a recompile for torch.compile."""
    import torch
    import torch.nn.functional as F

    from ..display.widgets import control_panel
    from ..experiment import before_after
    from ..workloads import gelu_tanh

    def gelu_at(elements: int, fused: str) -> Any:
        t = torch.randn(int(elements), device=device)
        after = (lambda: compiled(t)) if fused == "torch.compile" and compiled.ok else \
            (lambda: F.gelu(t, approximate="tanh"))
        return before_after(lambda: gelu_tanh(t), after, name=f"GELU, {int(elements):,} elements",
                            before_label="eager chain", after_label=fused, min_time_s=min_time_s or 0.3, monitor=False)

    sizes = [1 << 12, 1 << 16, 1 << 20] + ([] if small else [1 << 24, 1 << 26])
    return control_panel(gelu_at, elements=sizes, fused=["torch.compile", "F.gelu"])
