"""Matplotlib figures drawn only from result objects (or their loaded JSON); nothing here measures."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import matplotlib.pyplot as plt

from ..verdicts.experiment import Comparison
from ..measuring.monitor import METRICS, Trace
from ..verdicts.results import named
from ..measuring.text import ratio, si, si_count, sig
from .figure_parts import (MIN_TIMELINE_POINTS, _cmp, _fits_flat, _means_figure, _metric_name, _metric_words, _no_data,
                           _row_width)

BEFORE, AFTER, REF = "#d1495b", "#00798c", "#8d8d8d"


def timeline(*items: Comparison | dict | tuple[str, Trace],
             metrics: Sequence[str] = ("nvml_util", "gpm_sm_active", "gpm_tensor_active"), title: str = ""):
    """Utilization over time: before vs after of a comparison, or any (label, trace) pairs, one panel a metric.

    A metric with fewer than MIN_TIMELINE_POINTS samples in every series (GPM and the host CPU are read once a
    second) gets no panel: its means go in the legend. A metric not recorded is named under the panels with the
    reason; with no curve at all, the figure is those means in a few lines."""
    series: list[tuple[str, Trace | None, str]] = []
    for it in items:
        if isinstance(it, tuple):
            series.append((it[0], it[1], None))
        else:
            c = _cmp(it)
            series += [(f"{c.before.label}", c.before.trace, BEFORE), (f"{c.after.label}", c.after.trace, AFTER)]
            title = title or c.name
    traces = [tr for _, tr, _ in series if tr]
    count = {m: max([len(tr.series.get(m) or []) for tr in traces] + [0]) for m in metrics}
    has_mean = {m: any(tr.mean(m) is not None for tr in traces) for m in metrics}
    curves = [m for m in metrics if count[m] >= MIN_TIMELINE_POINTS]
    few = [m for m in metrics if m not in curves and has_mean[m]]
    missing = [m for m in metrics if m not in curves and not has_mean[m]]
    if not curves and few:  # no curve anywhere: the means in a few lines, not a frame of scattered points
        return _means_figure(series, few, missing, traces, title or "utilization timeline")
    panels = curves or list(metrics[:1])
    in_legend = few
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 1.2 + 2.1 * len(panels)), sharex=True, squeeze=False)
    for ax, metric in zip(axes[:, 0], panels):
        for label, tr, color in series:
            pts = (tr.series.get(metric) or []) if tr else []
            if not pts:
                continue
            xs, ys = zip(*pts)
            kw = {"drawstyle": "steps-post"} if metric.startswith("nvml") else {"marker": "o"}
            if len(pts) < MIN_TIMELINE_POINTS:  # a few samples are points, not a curve
                kw = {"marker": "o", "ls": "none"}
            means = [_metric_words(m, tr.mean(m)) for m in in_legend if tr.mean(m) is not None]
            ax.plot(xs, ys, color=color, label=label + (f"; mean {', '.join(means)}" if means else ""), **kw)
        if not ax.lines:
            why = next((tr.available.get(metric) for tr in traces if metric in tr.available), None)
            _no_data(ax, f"{METRICS.get(metric, metric)}: {why or 'not recorded'}")
        ax.set_ylabel(METRICS.get(metric, metric).replace(" (", "\n("), fontsize=8)
        if metric not in ("mem_used_gb", "power_w", "sm_clock_mhz"):
            ax.set_ylim(-3, 105)
        ax.grid(alpha=0.3)
    with_lines = [ax for ax in axes[:, 0] if ax.get_legend_handles_labels()[0]]
    if with_lines:
        handles, labels = with_lines[0].get_legend_handles_labels()  # above the panels: it hides no curve
        wide = max(len(t) for t in labels) > 40
        with_lines[0].legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 1.0),
                             ncols=1 if wide else min(len(labels), 3), fontsize=8, frameon=False)
    axes[-1, 0].set_xlabel("seconds since the monitor started")
    notes = []
    if in_legend:
        notes.append(f"fewer than {MIN_TIMELINE_POINTS} samples, no curve (read once a second): "
                     + ", ".join(_metric_name(m) for m in in_legend)
                     + "; their means in the legend")
    gone = [m for m in missing if m not in panels]
    if gone:
        why = {m: next((tr.available[m] for tr in traces if m in tr.available), "no sample") for m in gone}
        notes.append("not recorded: " + "; ".join(f"{_metric_name(m)} ({why[m]})" for m in gone))
    if notes:
        fig.text(0.01, 0.005, "\n".join(notes), fontsize=7, color="#555", va="bottom", ha="left", wrap=True)
    fig.suptitle(title or "utilization timeline")
    fig.tight_layout(rect=(0, 0.09 * len(notes) / len(panels), 1, 1))  # the notes' lines below the panels
    return fig


def bars(labels: Sequence[str], values: Sequence[float | None], *, ylabel: str, title: str = "",
         colors: Sequence[str] | None = None, fmt: str | Callable[[float], str] = "{:.1f}",
         ref: Sequence[float | None] | None = None, ref_label: str = "reference GPU", label: str = "this run",
         legend: Sequence[tuple[str, str]] | None = None, err: Sequence[tuple[float, float] | None] | None = None):
    """A labelled bar chart; `ref` adds the reference GPU's values beside ours.

    `fmt`: a format string or a function for the value on each bar. `label` names our bars in the legend;
    `legend` ((name, colour), ...) names each colour instead, for bars coloured by what they are. `err`: each of
    our bars' interval (lo, hi), drawn as an error bar with the value above its cap."""
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(labels) + 2), 3.4))
    text = fmt if callable(fmt) else fmt.format
    xs = range(len(labels))
    w = 0.4 if ref is not None else 0.7
    vals = [v if v is not None else 0 for v in values]
    b = ax.bar([x - (w / 2 if ref is not None else 0) for x in xs], vals, w,
               color=colors or [AFTER] * len(labels), label=label)
    errs = list(err) if err is not None else [None] * len(labels)
    for rect, v, e in zip(b, values, errs):
        x = rect.get_x() + rect.get_width() / 2
        if e is not None and v is not None:
            ax.errorbar([x], [v], yerr=[[max(0.0, v - e[0])], [max(0.0, e[1] - v)]], fmt="none", color="k",
                        capsize=3, lw=1)
        top = max(rect.get_height(), e[1] if e is not None and v is not None else 0)
        ax.annotate("n/a" if v is None else text(v), (x, top), xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom", fontsize=8)
    if ref is not None:
        r = ax.bar([x + w / 2 for x in xs], [v or 0 for v in ref], w, color=REF, label=ref_label)
        for rect, v in zip(r, ref):
            ax.annotate("n/a" if v is None else text(v), (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                        ha="center", va="bottom", fontsize=8, color="#555")
    if legend is not None:  # one entry a colour: a patch of our first bar's colour would misname the others
        from matplotlib.patches import Patch
        handles = [Patch(color=c, label=n) for n, c in legend] + ([Patch(color=REF, label=ref_label)] if ref else [])
        ax.legend(handles=handles, fontsize=8)
    elif ref is not None:
        ax.legend(fontsize=8)
    many = not _fits_flat(labels, fig.get_figwidth())
    ax.set_xticks(list(xs), labels, rotation=25 if many else 0, ha="right" if many else "center",
                  rotation_mode="anchor" if many else "default", fontsize=8 if many else None)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.12)  # room above the tallest bar for its value
    fig.tight_layout()
    return fig


def mfu(*comparisons: Comparison | dict, title: str = "MFU before vs after", reference: Iterable | None = None):
    """MFU (datasheet peak) of each side of each comparison; with `reference`, the reference GPU's beside.

    A side that several comparisons share (the same label on the same work) is drawn once, as when every fix of a
    chain is measured against the previous fix. A bar is labelled by its side alone unless two bars would then
    read the same."""
    cs = [_cmp(c) for c in comparisons]
    rs = {r.name: r for r in (_cmp(c) for c in reference)} if reference is not None else None
    entries: list[tuple[str, str, float | None, float | None, str]] = []  # (side, comparison, ours, ref, colour)
    seen: set[tuple[str, float | None, float | None]] = set()
    for c in cs:
        for side, color in (("before", BEFORE), ("after", AFTER)):
            run = getattr(c, side)
            ours = None if run.mfu is None else run.mfu * 100
            if (run.label, run.flops, run.items) in seen:
                continue  # the same side, already drawn
            seen.add((run.label, run.flops, run.items))
            r = getattr(named(rs, c.name), side, None) if rs is not None else None
            entries.append((run.label, c.name, ours, None if r is None or r.mfu is None else r.mfu * 100, color))
    names = [e[0] for e in entries]
    labels = [e[0] if names.count(e[0]) == 1 or len(cs) == 1 else f"{e[1]}: {e[0]}" for e in entries]
    vals = [e[2] for e in entries]
    colors = [e[4] for e in entries]
    fig = bars(labels, vals, ylabel="MFU (% of datasheet dense peak)", title=title, colors=colors, fmt=sig,
               ref=[e[3] for e in entries] if rs is not None else None,
               legend=[(n, c) for n, c in (("before (this run)", BEFORE), ("after (this run)", AFTER)) if c in colors])
    if all(v is None for v in vals):  # above the reference GPU's bars, where there are some
        ax = fig.axes[0]
        if rs is not None:
            ax.set_ylim(top=ax.get_ylim()[1] * 1.2)  # a band above the tallest bar for the note
        _no_data(ax, "no MFU for this run: no datasheet peak\n(CPU or unknown GPU)", y=0.5 if rs is None else 0.9)
    return fig


def speedups(*comparisons: Comparison | dict, title: str = "speedup (before time / after time)",
             reference: Iterable | None = None):
    """Speedup of each comparison, noise marked; with `reference`, the reference GPU's beside."""
    cs = [_cmp(c) for c in comparisons]
    vals = [c.speedup for c in cs]
    ref_vals = None
    if reference is not None:
        rs = {r.name: r for r in (_cmp(c) for c in reference)}
        ref_vals = [None if named(rs, c.name) is None else named(rs, c.name).speedup for c in cs]
    labels = [c.name + ("\n(within noise)" if c.within_noise else "") for c in cs]
    ests = [c.estimate() for c in cs]
    fig = bars(labels, vals, ylabel="speedup (x)", title=title, fmt=ratio, ref=ref_vals,
               err=[None if e is None or e.lo is None or e.hi is None else (e.lo, e.hi) for e in ests])
    fig.axes[0].axhline(1.0, color="k", lw=0.8)
    return fig


def sweep(x: Sequence[float], ys: dict[str, Sequence[float | None]], *, xlabel: str, ylabel: str, title: str = "",
          logx: bool = False, logy: bool = False, hlines: dict[str, float] | None = None,
          ref: dict[str, tuple[Sequence[float], Sequence[float | None]]] | None = None):
    """Lines of measured values over a swept parameter; `hlines` for ceilings, `ref` for the reference GPU's."""
    fig, ax = plt.subplots(figsize=(8, 4))
    nan = float("nan")  # a missing value breaks the line there: a curve drawn across it would show a reading
    for label, y in ys.items():
        if any(b is not None for b in y):
            ax.plot(list(x), [nan if b is None else b for b in y], marker="o", label=label)
    for label, (rx, ry) in (ref or {}).items():
        if any(b is not None for b in ry):
            ax.plot(list(rx), [nan if b is None else b for b in ry], ls="--", color=REF, alpha=0.8, marker=".",
                    label=f"{label} (reference GPU)")
    # Scales first, so that the ceiling labels sit at the final left edge.
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    for label, v in (hlines or {}).items():
        ax.axhline(v, ls=":", color="k", lw=1)
        ax.annotate(label, (ax.get_xlim()[0], v), xytext=(3, 1), textcoords="offset points", fontsize=8, va="bottom")
    if hlines and not logy:  # room above the highest ceiling for its label, inside the frame
        ax.set_ylim(top=max(ax.get_ylim()[1], 1.1 * max(hlines.values())))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:  # every value missing: say so rather than leave an empty frame
        _no_data(ax, "no value measured for any point of this sweep")
    fig.tight_layout()
    return fig


def roofline(points: Sequence[tuple[str, float, float]], *, peak_tflops: float, bandwidth_gbs: float,
             title: str = "roofline", ceiling_label: str = "measured", color: str | None = None):
    """Achieved TFLOP/s against arithmetic intensity (FLOPs/byte) under the compute and bandwidth ceilings.

    points: (label, intensity in FLOPs per byte, achieved TFLOP/s), all in `color` (one dtype's points share one
    colour; each is labelled).
    """
    if peak_tflops <= 0 or bandwidth_gbs <= 0:
        raise ValueError("peak_tflops and bandwidth_gbs must be > 0")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ridge = peak_tflops * 1e12 / (bandwidth_gbs * 1e9)
    xs = [min([p[1] for p in points] + [ridge]) / 4, max([p[1] for p in points] + [ridge]) * 4]
    grid = [xs[0] * (xs[1] / xs[0]) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(peak_tflops, x * bandwidth_gbs / 1e3) for x in grid], color="k", lw=1.5,
            label=f"{ceiling_label} ceilings: {si(peak_tflops * 1e12, 'FLOP/s')}, {si(bandwidth_gbs * 1e9, 'B/s')}")
    for label, x, y in points:
        ax.scatter([x], [y], zorder=3, color=color or AFTER)
        near_roof = y > 0.5 * min(peak_tflops, x * bandwidth_gbs / 1e3)  # above it, the label would cross the roof
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, -4) if near_roof else (4, 4),
                    va="top" if near_roof else "baseline", fontsize=8)
    ax.axvline(ridge, ls=":", color="#999")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def si_tick(y: float, _pos: int | None = None) -> str:
    """An axis tick with its SI prefix and no trailing zeros: '50 k' beside '100 k', not '50.0 k'."""
    return si_count(y)


def waterfall(steps: Sequence[tuple[str, float]], *, ylabel: str = "tokens/s", title: str = "one change at a time",
              ref: Sequence[tuple[str, float]] | None = None):
    """Throughput after each cumulative change, each bar annotated with its gain over the previous one; the
    starting point in BEFORE's colour, every change in AFTER's, both named in the legend."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    labels = [s[0] for s in steps]
    vals = [s[1] for s in steps]
    fig, ax = plt.subplots(figsize=(_row_width(len(steps)), 4))
    bars_ = ax.bar(range(len(vals)), vals, color=[BEFORE] + [AFTER] * (len(vals) - 1))
    for i, (rect, v) in enumerate(zip(bars_, vals)):
        gain = "" if i == 0 or not vals[i - 1] else f"\n{ratio(v / vals[i - 1])}"
        ax.annotate(f"{si(v)}{gain}", (rect.get_x() + rect.get_width() / 2, rect.get_height()), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
    handles = [Patch(color=BEFORE, label=f"this run: {labels[0]}" if labels else "this run")]
    if len(vals) > 1:
        handles.append(Patch(color=AFTER, label="this run: after each change"))
    if ref:
        rmap = dict(ref)
        handles.append(ax.scatter(range(len(labels)), [rmap.get(lbl) for lbl in labels], marker="_", s=400,
                                  color="k", label="reference GPU", zorder=3))
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    ax.margins(y=0.2)  # room above the tallest bar for its two-line value
    ax.yaxis.set_major_formatter(FuncFormatter(si_tick))
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def tracker_figure(tracker: Any):
    """A step tracker's live figure: GPU time per step, and MFU (or throughput) with the monitor's readings."""
    rs = tracker.records
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.2), layout="constrained")
    fig.get_layout_engine().set(wspace=0.08)  # room between the panels for the right one's y-label
    xs = [r.step for r in rs]
    a1.plot(xs, [r.gpu_ms for r in rs], color=AFTER, lw=1)
    a1.set_xlabel("step")
    a1.set_ylabel("GPU time per step (ms)")
    a1.set_ylim(0, 1.15 * max([r.gpu_ms for r in rs if r.gpu_ms is not None] + [1e-9]))  # the line off the frame
    a1.grid(alpha=0.3)
    if any(r.mfu is not None for r in rs):
        a2.plot(xs, [None if r.mfu is None else r.mfu * 100 for r in rs], color=AFTER, lw=1, label="MFU")
        a2.set_ylabel("% of peak", fontsize=9)
        a2.set_title(f"MFU against {tracker.peak_name or 'the peak'}", fontsize=9)
    elif any(r.items_per_s is not None for r in rs):
        a2.plot(xs, [r.items_per_s for r in rs], color=AFTER, lw=1, label=f"{tracker.item_name}/s")
        a2.set_ylabel(f"{tracker.item_name}/s", fontsize=9)
    else:
        _no_data(a2, "no FLOPs or items given: only the step time is tracked")
    for metric, color in (("nvml_util", BEFORE), ("gpm_sm_active", REF)):
        pts = [(r.step, getattr(r, metric)) for r in rs if getattr(r, metric) is not None]
        if pts and any(r.mfu is not None for r in rs):
            if len(pts) <= 3:  # a short loop read by a ~1 Hz monitor: 1-3 points are points, not a curve
                a2.plot(*zip(*pts), color=color, ls="none", marker="o", ms=4, label=METRICS[metric])
            else:
                a2.plot(*zip(*pts), color=color, lw=1, ls="--", label=METRICS[metric])
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    if a2.lines and any(r.mfu is not None for r in rs):  # percent: plain ticks (10, 20), not si's "10.0"
        a2.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    elif a2.lines:
        a2.yaxis.set_major_formatter(FuncFormatter(si_tick))  # 30 k samples/s, not 30000
    if a2.lines:  # from 0, as the step time: a zoomed axis makes 1% of noise look like a trend
        ys = [float(y) for ln in a2.lines for y in ln.get_ydata() if y is not None and y == y]
        a2.set_ylim(0, 1.15 * max(ys + [1e-9]))
    if len(a2.get_legend_handles_labels()[0]) > 1:  # one line: its axis label names it
        a2.legend(fontsize=7, loc="best")  # clear of the curves
    for ax in (a1, a2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    a2.set_xlabel("step")
    a2.grid(alpha=0.3)
    fig.suptitle(tracker.log_line(rs[-1]) if rs else "", fontsize=9)  # the last step, as a script's log reads it
    return fig


BREAKDOWN_COLORS = {"kernels": AFTER, "memcpy/memset": "#edae49", "idle: after a sync": BEFORE,
                    "idle: host launching": "#6a4c93", "idle: queued work waiting": REF}


def time_breakdown(breakdowns: dict[str, Any], *, title: str = "where each step's GPU time went"):
    """Stacked horizontal bars of `TimeBreakdown`s (label -> breakdown): kernels, copies and idle kinds, ms per
    step. Labels sit on the y-axis, one per row, so long names never overprint; each bar ends in its kernels'
    share of the timeline."""
    labels = list(breakdowns)
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.55 * max(1, len(labels))), layout="constrained")
    ys = list(range(len(labels)))[::-1]  # the first label on top
    lefts = [0.0] * len(labels)
    for cat, color in BREAKDOWN_COLORS.items():
        vals = [breakdowns[k].per_step_ms().get(cat, 0.0) for k in labels]
        ax.barh(ys, vals, left=lefts, color=color, label=cat, height=0.6)
        lefts = [b + v for b, v in zip(lefts, vals)]
    for y, k, total in zip(ys, labels, lefts):
        if total:
            ax.annotate(f" {breakdowns[k].kernel_fraction:.0%} kernels", (total, y), ha="left", va="center",
                        fontsize=8)
    if not any(lefts):
        _no_data(ax, "no GPU activity in these traces (no CUDA GPU)")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlabel("ms per step")
    ax.set_xlim(0, max(lefts + [1e-9]) * 1.18)
    ax.set_title(title)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, ncols=5, loc="outside lower center",
               frameon=False)  # under the x label, never over it
    ax.grid(axis="x", alpha=0.3)
    return fig


MEMORY_COLORS = {"parameters": "darkgreen", "gradients": "mediumblue", "optimizer state": "goldenrod",
                 "activations": "red", "other": "grey"}


def memory_timeline(profile: Any, *, title: str = "memory over one training step"):
    """A `StepMemoryProfile` as stacked areas by category over the step, with the peak marked."""
    fig, ax = plt.subplots(figsize=(9, 3.4))
    if not profile.times_ms:
        _no_data(ax, profile.note or "no memory timeline recorded")
        return fig
    cats = list(MEMORY_COLORS)
    ax.stackplot(profile.times_ms, *[[v / 1e9 for v in profile.by_category[c]] for c in cats],
                 labels=cats, colors=[MEMORY_COLORS[c] for c in cats], alpha=0.8, step="post")
    ax.axvline(profile.peak_ms, color="k", ls=":", lw=1)
    # The peak as a point: a spike narrower than a pixel (a temporary freed within microseconds) is not drawn by
    # the stacked areas, and the label would name a height the curve never reaches.
    ax.plot([profile.peak_ms], [profile.peak_bytes / 1e9], marker="v", ms=6, color="k", ls="none", zorder=4)
    ax.annotate(f"peak {si(profile.peak_bytes, 'B')}", (profile.peak_ms, profile.peak_bytes / 1e9),  # as in the text
                xytext=(5, -12), textcoords="offset points", fontsize=8)
    ax.set_xlabel("ms since the step began")
    ax.set_ylabel("GB")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
