"""Notebook 04's scaffolding: its smoke sizes, its section clock, and the tables, figures and sentences that report
what it measured (GPU busy time and syncs per call, the sync counts, the copies, the two-stream overlap). The claims
and their verdicts live in `gpulab.lessons.sync_claims` and are re-exported here, so the notebook needs one handle.

The measuring stays in the notebook (the loops it times, the variants it counts syncs in) and in
`gpulab.lessons.sync_lab`; nothing here times anything.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from ..claims import Estimate
from ..lesson import SectionClock
from ..timing import fmt_time
from .measuring_lesson import source
from .sync_claims import (CLAIMS, NO_DEBUG_MODE, NOT_GPU, check_copies, check_eval, check_gpu, check_item,
                          check_numpy_int, check_overlap, check_syncs, check_zero_grad, pct_faster)
from .sync_lab import hidden_share

__all__ = ["SMOKE_SIZES", "SMOKE_MIN_TIME_S", "PARAMS", "CLAIMS", "NOT_GPU", "NO_DEBUG_MODE", "Phases", "use_sizes",
           "source", "setup_note", "timeline", "gaps", "loop_report", "verdict_report", "sync_table_html",
           "profiler_syncs_html", "copy_table_html", "copy_report", "queued_table_html", "queued_report",
           "record_overlap", "overlap_report", "mfu_figure", "busy_figure", "pct_faster", "check_gpu", "check_item",
           "check_eval", "check_zero_grad", "check_syncs", "check_numpy_int", "check_copies", "check_overlap"]

# Smoke sizes (SMOKE=True, or no CUDA GPU): a one-layer GPT and small copies, so the notebook runs on a CPU in seconds.
SMOKE_SIZES = dict(MODEL=dict(vocab_size=256, n_layer=1, n_head=2, n_embd=32, block_size=32), BATCH=2,
                   STEPS_PER_CALL=2, EVAL_BATCHES=4, EVAL_BATCH=8, COPY_MB=16, OVERLAP_CHUNKS=4, OVERLAP_CHUNK_MB=8,
                   LOOP_ROUNDS=3, QUEUED_MS=2)
SMOKE_MIN_TIME_S = 0.05
PARAMS = ("MODEL", "BATCH", "STEPS_PER_CALL", "EVAL_BATCHES", "EVAL_BATCH", "COPY_MB", "OVERLAP_CHUNKS",
          "OVERLAP_CHUNK_MB", "MIN_TIME_S", "LOOP_MIN_TIME_S", "LOOP_ROUNDS", "QUEUED_MS")  # the result's params


Phases = SectionClock  # seconds per timed section, and in all: what to trim if the notebook runs long


def use_sizes(lesson: Any, ns: dict[str, Any]) -> dict[str, Any]:
    """At smoke scale (SMOKE=True, or no CUDA GPU) put the smoke sizes into the notebook's namespace; record the
    sizes used either way. A reader's MIN_TIME_S is kept, and the loops then time as long as the rest."""
    from dataclasses import replace

    lesson.use_smoke_sizes(ns, SMOKE_SIZES, min_time_s=SMOKE_MIN_TIME_S, min_time_keys=("LOOP_MIN_TIME_S",))
    if "accumulate" in lesson.claims:  # its unit names the steps per timed call, known only now
        spec = lesson.claims["accumulate"]
        lesson.claims["accumulate"] = replace(spec, unit=f"syncs per {ns['STEPS_PER_CALL']} steps")
    return lesson.record_sizes(ns, PARAMS)


def setup_note(lesson: Any) -> str:
    """What this run can show: on a CPU a sync costs nothing, and whether a reference run stands beside it."""
    lines = []
    if not lesson.gpu:
        lines.append("**No CUDA GPU.** The loops below run on the CPU at smoke sizes, but on a CPU there is no queue "
                     "of GPU work to drain and a sync costs nothing: any difference between a before and its after "
                     "here is noise or CPU-side work, and the claims stay untested. Pinned memory, streams and the "
                     "sync debug mode need CUDA and are skipped. The reference GPU's numbers are shown beside this "
                     "run's.")
    if lesson.reference is None:
        lines.append("No reference run is committed for this notebook yet, so the plots show this run alone.")
    return "\n\n".join(lines)


def timeline(cmp: Any, gpu: bool) -> None:
    """Utilization timeline of both sides of `cmp`: GPU busy (NVML), SMs busy (GPM) and the CPU that launches the
    kernels; on a CPU-only machine the CPU's panel comes first."""
    import matplotlib.pyplot as plt

    from ..display import plots
    plots.timeline(cmp, metrics=("nvml_util", "gpm_sm_active", "cpu_percent") if gpu else ("cpu_percent", "nvml_util"))
    plt.show()


def gaps(cmp: Any) -> str:
    """One line per side from the profiler trace: busy fraction, idle time and syncs per call."""
    out = []
    for side in (cmp.before, cmp.after):
        p = side.profile
        if p is None or p.busy_fraction is None:
            out.append(f"{side.label}: no GPU trace on this machine")
            continue
        wall = p.wall_ms / p.steps
        out.append(f"{side.label}: GPU busy {p.busy_fraction:.0%} of {wall:.2f} ms per call, idle "
                   f"{wall * (1 - p.busy_fraction):.2f} ms in {len(p.gaps_ms) / p.steps:,.0f} gaps, "
                   f"{p.syncs_per_step:.0f} synchronizing calls per call")
    return "\n".join(f"- {line}" for line in out)


def verdict_report(what: str, cmp: Any) -> str:
    """`what`, the comparison's verdict, and each side's GPU busy time and syncs per call."""
    return f"{what}: **{cmp.verdict}**.\n\n{gaps(cmp)}"


def loop_report(cmp_twice: Any, cmp_item: Any, steps: int) -> str:
    """Section 1's verdicts, why the second .item() is cheap, and NVML's busy against the trace's, where both exist."""
    text = (f"Reading the loss twice vs once: **{cmp_twice.verdict}**; every step vs every {steps} steps: "
            f"**{cmp_item.verdict}**.\n\n{gaps(cmp_item)}\n\n"
            "Why the two differ: the second `.item()` of the same loss finds the GPU already idle and the value ready, "
            "so it costs a tiny device-to-host copy, not a drain. The first one is the expensive kind: the CPU stops "
            "until the step's last kernel finishes, and the GPU then idles until the next step's first kernels arrive.")
    nvml = [c.metric("nvml_util") for c in (cmp_item.before, cmp_item.after)]
    busy = [c.profile.busy_fraction if c.profile else None for c in (cmp_item.before, cmp_item.after)]
    if None not in nvml and None not in busy:
        text += (f"\n\nTwo views of the same runs: NVML's \"GPU busy\" read {nvml[0]:.0f}% -> {nvml[1]:.0f}% (a sample "
                 f"period counts as busy if any kernel ran in it), the profiler trace's busy time {busy[0]:.0%} -> "
                 f"{busy[1]:.0%} (the share of wall time with a kernel actually running).")
    return text


# ---------------------------------------------------------------- section 5: finding syncs


def sync_table_html(found: dict[str, int], logging_syncs: int) -> str:
    """The synchronizing calls set_sync_debug_mode counted in one training step of each variant."""
    rows = "".join(f"<tr><td style='text-align:left'>{k}</td><td>{v}</td></tr>" for k, v in found.items())
    rows += f"<tr><td style='text-align:left'>guide §4.3 async logging (per logged step)</td><td>{logging_syncs}</td></tr>"
    return (f"<b>set_sync_debug_mode('warn'): synchronizing calls in one training step</b>"
            f"<table><tr><th>variant</th><th>syncs</th></tr>{rows}</table>")


def profiler_syncs_html(experiments: Sequence[Any], gpu: bool) -> str:
    """The profiler's synchronizing CUDA calls per timed call of each experiment ("" without GPU traces)."""
    rows = []
    for c in experiments:
        b, a = c.before.profile, c.after.profile
        if b and a and gpu:
            rows.append(f"<tr><td style='text-align:left'>{c.name}</td><td>{b.syncs_per_step:.1f} "
                        f"{dict(b.sync_calls)}</td><td>{a.syncs_per_step:.1f} {dict(a.sync_calls)}</td></tr>")
    if not rows:
        return ""
    return ("<b>Profiler: synchronizing CUDA calls per timed call</b><table><tr><th>experiment</th>"
            f"<th>before</th><th>after</th></tr>{''.join(rows)}</table>")


# ---------------------------------------------------------------- section 6: copies and streams


def copy_table_html(copy_t: dict[str, Any]) -> str:
    """Each copy's bandwidth, its time on the GPU, and how long until the call returned."""
    rows = "".join(f"<tr><td style='text-align:left'>{k}</td><td>{v.gbs:,.1f} GB/s</td>"
                   f"<td>{fmt_time(v.device_s)}</td><td>{fmt_time(v.host_s)}</td>"
                   f"<td>{v.host_fraction:.1%}</td></tr>" for k, v in copy_t.items())
    return ("<table><tr><th>copy</th><th>bandwidth</th><th>copy on the GPU</th><th>until the call returned</th>"
            f"<th>returned after (% of the copy)</th></tr>{rows}</table>")


def copy_report(cmp_pin: Any, copy_t: dict[str, Any]) -> str:
    """Pinned vs pageable, and when a non_blocking call returned from each ("" when the copies did not run)."""
    if not copy_t:
        return ""
    pnb, pgnb = copy_t["pinned_non_blocking"], copy_t["pageable_non_blocking"]
    return (f"Pinned vs pageable: **{cmp_pin.verdict}** ({copy_t['pageable'].gbs:,.1f} -> "
            f"{copy_t['pinned'].gbs:,.1f} GB/s). With `non_blocking=True` the call from pinned memory returned after "
            f"{fmt_time(pnb.host_s)}, {pnb.host_fraction:.1%} of the {fmt_time(pnb.device_s)} the copy took; from "
            f"pageable memory the same flag returned after {pgnb.host_fraction:.0%} of the copy: `non_blocking` only "
            "frees the CPU when the source is pinned.")


def queued_table_html(queued: dict[str, Any]) -> str:
    """Each copy issued behind queued work: when the call returned, the work's and the copy's GPU time."""
    rows = "".join(f"<tr><td style='text-align:left'>{k}</td>" + "".join(
        f"<td>{fmt_time(t)}</td>" for t in v.medians().values()) + f"<td>{v.estimate().value:.1%}</td></tr>"
        for k, v in queued.items())
    return ("<table><tr><th>copy behind queued work</th><th>call returned after</th><th>queued work (GPU)</th>"
            f"<th>copy (GPU)</th><th>share of (work + copy)</th></tr>{rows}</table>")


def queued_report(queued: dict[str, Any]) -> str:
    """Whether each copy waited for the work queued before it: a hidden sync, or not, or within the spread."""
    pg, pn = queued["pageable_non_blocking"], queued["pinned_non_blocking"]
    m = pg.medians()
    # What the pageable call would read had it blocked for its own copy alone, not the work queued before it.
    share_copy_only = m["copy_s"] / (m["queued_s"] + m["copy_s"])
    pe, ne = pg.estimate(), pn.estimate()
    if pe.lo > share_copy_only + 0.05:
        verdict = "it also waited for the work queued before it: a hidden sync."
    elif pe.hi < 0.9:
        verdict = "it blocked for the copy but not for the queued work."
    else:
        verdict = "whether it also waited for the queued work is within the spread of this measurement."
    return (f"From pinned memory the call returned after {ne.value:.1%} of the queued work and the copy"
            + (": the GPU was still computing, and the copy ran after it without the CPU. " if ne.hi < 0.5
               else ", so here it waited too. ") + f"From pageable memory it returned after {pe.value:.0%} "
            f"(quartiles {pe.lo:.0%}-{pe.hi:.0%}); had it blocked for the copy alone that would read "
            f"{share_copy_only:.0%}, so " + verdict)


def record_overlap(res: Any, ov: Any, cmp_ov: Any, m_copy: Any, m_comp: Any) -> Estimate:
    """The share of the shorter task (copy or compute) the side stream hid, with its interval; recorded as
    the result's `overlap` with the times it stands on."""
    shorter = min(m_copy, m_comp, key=lambda m: m.median).median_estimate()  # how well its median is known
    hidden = hidden_share(cmp_ov.estimate(), cmp_ov.after.seconds, shorter)
    res.record("overlap", dict(copy_s=m_copy.median, compute_s=m_comp.median, serial_s=cmp_ov.before.seconds,
                               hidden_pct=hidden.value, overlapped_s=cmp_ov.after.seconds,
                               hidden_interval=list(hidden.interval), matmuls_per_chunk=ov.repeats))
    return hidden


def overlap_report(ov: Any, cmp_ov: Any, m_copy: Any, m_comp: Any, hidden: Estimate) -> str:
    """Copy alone, compute alone, serial and overlapped, against the ideal max(copy, compute)."""
    t_copy, t_comp = m_copy.median, m_comp.median
    return (f"Copies alone: {fmt_time(t_copy)}; compute alone ({ov.repeats} matmul(s) per chunk): "
            f"{fmt_time(t_comp)}; serial {fmt_time(cmp_ov.before.seconds)}, overlapped "
            f"{fmt_time(cmp_ov.after.seconds)} (the ideal is {fmt_time(max(t_copy, t_comp))}). "
            f"The side stream hid **{hidden.value:.0f}%** of the shorter of the two.")


# ---------------------------------------------------------------- all the experiments side by side


def _refc(ref: dict[str, Any] | None) -> list[Any] | None:
    from ..results import comparisons
    return comparisons(ref) if ref else None


def mfu_figure(loops: Sequence[Any], ref: dict[str, Any] | None) -> None:
    """MFU of both sides of the training and eval loops, with the reference GPU's bars beside."""
    import matplotlib.pyplot as plt

    from ..display import plots
    plots.mfu(*loops, reference=_refc(ref), title="MFU of the training and eval loops")
    plt.show()


def busy_figure(comparisons: Sequence[Any], ref: dict[str, Any] | None) -> None:
    """The trace's GPU busy share of each side of each experiment that ran, the reference GPU's beside; a sentence
    when neither this run nor a reference has a trace."""
    import matplotlib.pyplot as plt
    from IPython.display import Markdown, display

    from ..display import plots
    refc = _refc(ref)
    rmap = {c.name: c for c in refc or []}
    labels, vals, refv = [], [], []
    for c in (c for c in comparisons if c is not None):
        for side, tag in ((c.before, "before"), (c.after, "after")):
            labels.append(f"{c.name.split(':')[0]}\n{side.label[:28]}")
            vals.append(None if not side.profile or side.profile.busy_fraction is None
                        else side.profile.busy_fraction * 100)
            r = getattr(rmap[c.name], tag).profile if c.name in rmap else None
            refv.append(None if not r or r.busy_fraction is None else r.busy_fraction * 100)
    if all(v is None for v in vals + refv):
        display(Markdown("*No GPU trace here and no reference run committed: nothing to compare for GPU busy time.*"))
        return
    plots.bars(labels, vals, ylabel="GPU busy, % of wall time (trace)", title="GPU busy per experiment",
               colors=[plots.BEFORE, plots.AFTER] * (len(labels) // 2), fmt="{:.0f}", ref=refv if refc else None)
    plt.show()
