"""The course's summary page: the figure of what each lesson gained, and summary.md and summary.png written for a
run (beside a reference run when one is given). It never mixes runs: several devices, or a smoke run beside a
full-size one, each get a section of their own, said plainly in the title."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence

from ..measuring.device import host_difference
from ..measuring.files import write_text_atomic
from .run_folders import PNG_MARK, SUMMARY_MARK, check_summary_target
from .summary import (COUNTS_NOTE, agreement_section, collect, flagged, gain, headline_gains, not_a_speed_run,
                      notebook_table, summary_tables)


def _short(text: str, n: int = 40) -> str:
    if len(text) <= n:
        return text
    cut = text[: n - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut[n // 2:] else cut).rstrip(" :,-") + "…"


GAIN_COLORS = {"faster": ("#00798c", "faster (interval above 1)"),
               "noise": ("#8d8d8d", "within noise (interval holds 1)"),
               "slower": ("#b42318", "slower (interval below 1)")}


def summary_figure(results: dict[str, dict], reference: dict[str, dict] | None = None, *, per_notebook: int = 3,
                   title: str = ""):
    """What each lesson's change gained: each notebook's headline gain(s) (`headline_gains`, at most `per_notebook`)
    on a log scale, with the interval as an error bar and the reference GPU's ratio beside. Smoke or CPU runs draw a
    note instead of bars; the device self-check (00_, a control, not a change) is left out. Sized for about 900 px."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    from .page_layout import wrap_label  # two lines, not one cut short

    rows = [(nb, e, est) for nb, d in sorted(results.items()) if not nb.startswith("00_")
            for e, est in headline_gains(d)[:per_notebook]]
    fig, ax = plt.subplots(figsize=(9, 0.42 * max(len(rows), 3) + 1.6))
    if title:
        ax.set_title(title, fontsize=10)
    if not rows:
        why = {not_a_speed_run(d) for d in results.values()} - {None}
        ax.text(0.5, 0.5, "; ".join(sorted(why)) if why else "no optimisation measured", ha="center",
                va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    ys = list(range(len(rows)))[::-1]
    kinds = ["noise" if est.lo <= 1 <= est.hi else "faster" if est.value > 1 else "slower" for _, _, est in rows]
    vals = [est.value for _, _, est in rows]
    err = [[v - est.lo for v, (_, _, est) in zip(vals, rows)], [est.hi - v for v, (_, _, est) in zip(vals, rows)]]
    ax.barh(ys, vals, color=[GAIN_COLORS[k][0] for k in kinds], height=0.6)
    ax.errorbar(vals, ys, xerr=err, fmt="none", ecolor="k", elinewidth=1, capsize=3)
    handles = [Patch(color=GAIN_COLORS[k][0], label=GAIN_COLORS[k][1]) for k in GAIN_COLORS if k in kinds]
    handles.append(Line2D([], [], color="k", marker="|", linestyle="none", markersize=8, label="95% interval"))
    hi = max(est.hi for _, _, est in rows)
    right = [est.hi for _, _, est in rows]  # where each bar's value label may start
    if reference:
        refgain = {(nb, e["name"]): gain(e).value for nb, d in reference.items() for e in d.get("experiments", [])
                   if not not_a_speed_run(d)}
        pts = [(refgain[(nb, e["name"])], y) for (nb, e, _), y in zip(rows, ys) if (nb, e["name"]) in refgain]
        for i, ((nb, e, _), y) in enumerate(zip(rows, ys)):
            if (nb, e["name"]) in refgain:
                right[i] = max(right[i], refgain[(nb, e["name"])] * 1.08)
        if pts:
            ax.scatter(*zip(*pts), marker="D", s=28, color="#f2a900", edgecolor="k", zorder=3)
            handles.append(Line2D([], [], color="#f2a900", marker="D", markeredgecolor="k", linestyle="none",
                                  label="reference GPU"))
            hi = max(hi, max(p[0] for p in pts))
    for (_, _, est), y, x in zip(rows, ys, right):
        ax.text(x * 1.06, y, f"{est.value:.2f}x", va="center", fontsize=9)
    hi = max(hi, max(right))
    ax.axvline(1, color="k", lw=0.8)
    ax.set_xscale("log")
    lo = min(min(est.lo for _, _, est in rows), 1.0)
    ax.set_xlim(lo / 1.3, hi * 2.2)
    ax.xaxis.set_major_locator(FixedLocator([t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
                                             if lo / 1.3 <= t <= hi * 2.2]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_yticks(ys, [wrap_label(_short(f"{nb[:2]} {e['name']}", 68), 36) for nb, e, _ in rows], fontsize=9)
    ax.set_xlabel("gain: after/before items per second (time ratio when the work is equal), log scale", fontsize=9)
    ax.legend(handles=handles, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 0), bbox_transform=fig.transFigure,
              ncol=len(handles), frameon=False)
    ax.grid(axis="x", alpha=0.3, which="both")
    fig.tight_layout(rect=(0, 0.35 / fig.get_figheight(), 1, 1))  # the legend's line under the axis label, any height
    return fig


def device_groups(results: dict[str, dict]) -> list[tuple[str, dict[str, dict]]]:
    """(label, results) per device and size (smoke or full), in first-seen order; one plain label when alone."""
    groups: dict[tuple[str, bool], dict[str, dict]] = {}
    for nb, data in sorted(results.items()):
        name = (data.get("device") or {}).get("name") or "unknown device"
        groups.setdefault((name, bool(data.get("smoke"))), {})[nb] = data
    names = [name for name, _ in groups]
    out = []
    for (name, smoke), found in groups.items():
        size = " (smoke run)" if smoke else " (full size)" if names.count(name) > 1 else ""
        out.append((name + size, found))
    return out


def summary_title(results: dict[str, dict], groups: list[tuple[str, dict[str, dict]]]) -> str:
    """The summary's first line: its device, or every device and run it holds, each in a section of its own."""
    if len(groups) <= 1:
        return f"# gpulab summary: {groups[0][0] if groups else 'unknown device'}"
    names = {(d.get("device") or {}).get("name") for d in results.values()}
    what = f"{len(names)} devices" if len(names) > 1 else "a smoke run and a full-size run"
    return (f"# gpulab summary: {', '.join(label for label, _ in groups)} ({what}: a section each, never mixed)")


def device_sections(groups: list[tuple[str, dict[str, dict]]], reference: dict[str, dict]) -> list[str]:
    """Markdown lines: per group (a heading only when there are several), the not-a-speed-run line, the notebook
    table and the detail tables; the counts note once."""
    md: list[str] = []
    for label, found in groups or [("", {})]:
        if len(groups) > 1:
            md += [f"## {label}", ""]
        not_speed = sorted({w for d in found.values() if (w := not_a_speed_run(d))})
        if not_speed:
            md += [f"{'; '.join(not_speed)}: the timings check that the code runs; no gain, speed verdict or timing "
                   "claim is shown or judged.", ""]
        md += [notebook_table(found), ""]
        if len(groups) <= 1:
            md += [COUNTS_NOTE, ""]
        md += [summary_tables(found, reference), ""]
    if len(groups) > 1:
        md += [COUNTS_NOTE]
    return md[:-1] if md and md[-1] == "" else md


def write_summary(results_dir: Path | str, out: Path | str, *, compare: Path | str | None = None,
                  expected: Sequence[str] = (), exclude: Sequence[str] = (), problems: Sequence[str] = (),
                  heading: str = "") -> tuple[Path, Path]:
    """Write summary.md and summary.png into `out` from the result JSON files in `results_dir`; `problems` (the
    notebooks that failed in this run) are listed first, and `exclude` keeps their results out of the tables."""
    import matplotlib
    import matplotlib.pyplot as plt

    from .cpu_reference import default_compare, figure_inputs

    check_summary_target(Path(out))
    results, found_problems = collect(results_dir, expected, exclude)
    compare, chosen = default_compare(results, compare)  # a CPU run: the reference GPU's numbers beside it
    reference, ref_problems = collect(compare) if compare else ({}, [])
    groups = device_groups(results)
    device = ", ".join(name for name, _ in groups) or "unknown device"
    md = [summary_title(results, groups), ""]
    if heading:
        md += [heading, ""]
    if compare:
        md += [chosen or f"Reference: `{compare}`.", ""]
        hosts = {host_difference(d.get("device") or {}, reference[name].get("device") or {})
                 for name, d in results.items() if name in reference} - {None}
        for line in sorted(hosts):
            md += [line, ""]
        mine_host = ((results.get("00_device") or {}).get("extra") or {}).get("host")
        ref_host = ((reference.get("00_device") or {}).get("extra") or {}).get("host")
        if mine_host and ref_host:
            md += [f"Host launch speed (self-check): {mine_host['launch_us']:.3g} µs per eager kernel launch here, "
                   f"{ref_host['launch_us']:.3g} µs in the reference.", ""]
    md += device_sections(groups, reference)
    flags = flagged(results) + [f"reference {f}" for f in flagged(reference)]
    if flags:
        md += ["", "## Flagged: implausible ratios", ""] + [f"- {f}" for f in flags]
    if reference:
        md += ["", "## Verdicts beside the reference", "", agreement_section(results, reference)]
    all_problems = list(problems) + found_problems + [f"reference {p}" for p in ref_problems]
    if all_problems:
        md += ["", "## Problems", ""] + [f"- {p}" for p in all_problems]
    out = Path(out)
    md_path = write_text_atomic(out / "summary.md", "\n".join(md + ["", SUMMARY_MARK]) + "\n")
    with matplotlib.rc_context():
        fig_results, fig_reference, title = figure_inputs(results, reference, device, not_a_speed_run)
        fig = summary_figure(fig_results, fig_reference, title=title)
        buf = io.BytesIO()
        fig.savefig(buf, dpi=100, format="png", bbox_inches="tight", metadata={"Software": PNG_MARK})
        plt.close(fig)
    png = write_text_atomic(out / "summary.png", buf.getvalue())
    return md_path, png
