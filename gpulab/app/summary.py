"""The summary of a course run, built only from result JSON files: tables, a figure, the README's section.

Verdicts are counted by kind (a refutation "higher than claimed" apart from one "lower than claimed"), a
measurement that several claims share is counted once, and "largest gain" looks only at optimisations
(a demonstration's contrast, such as tiny kernels vs one big matmul, is not a gain to adopt). Files written
before those fields existed still summarise: a missing kind is an optimisation, a missing side or evidence
counts as measured.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Sequence

from ..claims import agreement, count_verdicts
from ..results import ResultError, load_result, write_text_atomic

RESULT_GLOB = "[0-9][0-9]_*.json"


def collect(folder: Path | str, expected: Sequence[str] = (),
            exclude: Sequence[str] = ()) -> tuple[dict[str, dict], list[str]]:
    """Load every result JSON in `folder`; return (results by notebook, problems), naming each bad file.

    `exclude` names notebooks whose results must not be shown (a notebook that failed in this run).
    """
    folder = Path(folder)
    found: dict[str, dict] = {}
    problems: list[str] = []
    if not folder.is_dir():
        return found, [f"no results folder {folder}"]
    for path in sorted(folder.glob(RESULT_GLOB)):
        try:
            data = load_result(path)
        except ResultError as e:
            problems.append(f"skipped {path.name}: {str(e).removeprefix(str(path) + ': ')}")
            continue
        if data["notebook"] not in exclude:
            found[data["notebook"]] = data
    for name in expected:
        if name not in found and name not in exclude:
            problems.append(f"missing: no result for {name} in {folder}")
    return found, problems


def _fmt(x: float | None, fmt: str) -> str:
    return "—" if x is None else fmt.format(x)


def _date(data: dict) -> str:
    created = data.get("created")
    return created[:16].replace("T", " ") if isinstance(created, str) and created else "—"


def _verdict(c: dict) -> str:
    v = c.get("verdict", "—")
    return f"refuted: {c['side']} than claimed" if v == "refuted" and c.get("side") else v


def _kind(e: dict) -> str:
    return e.get("kind") or "optimisation"


def summary_tables(results: dict[str, dict], reference: dict[str, dict] | None = None) -> str:
    """Markdown tables of every before/after and every claim, with the reference beside when given."""
    reference = reference or {}
    ref_col = " | reference speedup" if reference else ""
    lines = ["| notebook | experiment | kind | speedup | verdict | MFU before | MFU after | GPU busy before "
             "| GPU busy after" + ref_col + " |", "|" + " --- |" * (9 + bool(reference))]
    for nb, data in sorted(results.items()):
        refs = {e["name"]: e for e in reference.get(nb, {}).get("experiments", [])}
        for e in data["experiments"]:
            b, a = e["before"]["summary"], e["after"]["summary"]
            mfu = [_fmt(None if s.get("mfu") is None else s["mfu"] * 100, "{:.1f}%") for s in (b, a)]
            util = [_fmt(s.get("nvml_util"), "{:.0f}%") for s in (b, a)]
            row = (f"| {nb} | {e['name']} | {_kind(e)} | {e['speedup']:.2f}x | {e.get('verdict', '—')} | {mfu[0]} "
                   f"| {mfu[1]} | {util[0]} | {util[1]}")
            if reference:
                r = refs.get(e["name"])
                row += f" | {_fmt(r['speedup'] if r else None, '{:.2f}x')}"
            lines.append(row + " |")
    ref_c = " | reference measured | reference verdict" if reference else ""
    lines += ["", "| notebook | claim | expected | measured | verdict" + ref_c + " |",
              "|" + " --- |" * (5 + 2 * bool(reference))]
    for nb, data in sorted(results.items()):
        refs = {c["text"]: c for c in reference.get(nb, {}).get("claims", [])}
        for c in data["claims"]:
            row = f"| {nb} | {c['text']} | {c.get('expected', '')} | {_fmt(c.get('measured'), '{:.3g}')} | {_verdict(c)}"
            if reference:
                r = refs.get(c["text"], {})
                row += f" | {_fmt(r.get('measured'), '{:.3g}')} | {_verdict(r) if r else '—'}"
            lines.append(row + " |")
    return "\n".join(lines)


def agreement_section(results: dict[str, dict], reference: dict[str, dict]) -> str:
    """Markdown: how this run's verdicts agree with the reference's, claim by claim (matched by notebook and
    text); the claims whose verdict differs, and first those confirmed in one run and refuted in the other."""
    r = agreement({nb: d.get("claims", []) for nb, d in results.items()},
                  {nb: d.get("claims", []) for nb, d in reference.items()})
    if not r["claims"]:
        return "No claim is in both this run and the reference."
    lines = [f"{r['same']} of {r['claims']} claims in both runs have the same verdict ({100 * r['share_same']:.1f}%); "
             f"{len(r['confirmed_vs_refuted'])} confirmed in one and refuted in the other."]
    if r["changed"]:
        lines += ["", "| notebook | claim | this run | reference |", "| --- | --- | --- | --- |"]
        mine = {(nb, c["text"]): c for nb, d in results.items() for c in d.get("claims", [])}
        theirs = {(nb, c["text"]): c for nb, d in reference.items() for c in d.get("claims", [])}
        flips = {(nb, t) for nb, t, _, _ in r["confirmed_vs_refuted"]}
        for nb, text, _, _ in sorted(r["changed"], key=lambda x: ((x[0], x[1]) not in flips, x[0])):
            mark = "**" if (nb, text) in flips else ""
            lines.append(f"| {nb} | {mark}{text}{mark} | {_verdict(mine[(nb, text)])} | {_verdict(theirs[(nb, text)])} |")
    return "\n".join(lines)


def largest_gain(data: dict) -> dict | None:
    """The optimisation with the largest speedup (demonstrations are contrasts, not gains)."""
    return max((e for e in data["experiments"] if _kind(e) == "optimisation"), key=lambda e: e["speedup"],
               default=None)


def notebook_table(results: dict[str, dict], *, dates: bool = True) -> str:
    """Markdown: one row per notebook, with its date, its largest gain and its claims' verdicts by kind.

    A measurement several claims share is counted once; claims settled by arithmetic, a datasheet or a
    definition are counted apart from measured ones.
    """
    head = ["notebook"] + (["date (UTC)"] if dates else []) + [
        "experiments", "largest gain", "confirmed", "refuted: higher than claimed", "refuted: lower than claimed",
        "inconclusive", "not comparable", "not tested", "settled without measuring"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for nb, data in sorted(results.items()):
        best = largest_gain(data)
        gain = f"{best['speedup']:.2f}x: {best['name']}" if best else "—"
        n = count_verdicts(data["claims"])
        cells = [nb] + ([_date(data)] if dates else []) + [
            str(len(data["experiments"])), gain, n["confirmed"], n["refuted_higher"], n["refuted_lower"],
            n["inconclusive"], n["not comparable"], n["not tested"], n["not_measured"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def summary_figure(results: dict[str, dict], reference: dict[str, dict] | None = None):
    """One figure: the speedup of every before/after (log scale), reference GPU's marked beside."""
    import matplotlib.pyplot as plt

    rows = [(f"{nb[:2]} {e['name']}", e["speedup"], bool(e.get("within_noise")), nb, e["name"])
            for nb, d in sorted(results.items()) for e in d["experiments"]]
    fig, ax = plt.subplots(figsize=(9, 0.32 * max(len(rows), 4) + 1.2))
    if not rows:
        ax.text(0.5, 0.5, "no experiments found", ha="center", transform=ax.transAxes)
        return fig
    ys = range(len(rows))[::-1]
    ax.barh(list(ys), [r[1] for r in rows], color=["#8d8d8d" if r[2] else "#00798c" for r in rows],
            label="this run (grey: within noise)")
    if reference:
        refmap = {(nb, e["name"]): e["speedup"] for nb, d in reference.items() for e in d["experiments"]}
        pts = [(refmap[(r[3], r[4])], y) for r, y in zip(rows, ys) if (r[3], r[4]) in refmap]
        if pts:
            ax.scatter(*zip(*pts), marker="|", s=200, color="k", label="reference GPU", zorder=3)
    ax.axvline(1, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yticks(list(ys), [r[0] for r in rows], fontsize=7)
    ax.set_xlabel("speedup (before time / after time), log scale")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3, which="both")
    fig.tight_layout()
    return fig


README_MARKERS = ("<!-- reference-summary -->", "<!-- /reference-summary -->")


def _claim(data: dict, startswith: str) -> dict | None:
    return next((c for c in data.get("claims", []) if c["text"].startswith(startswith)), None)


def reference_section(folder: Path | str) -> str:
    """Markdown for the README: whose numbers these are, the figure, the notebook table, the key measurements.

    Everything comes from the result JSON in `folder` (a committed reference run).
    """
    folder = Path(folder)
    results, _ = collect(folder)
    if not results:
        raise ValueError(f"no result JSON files in {folder}")
    dev = next(iter(results.values()))["device"]
    where = folder.as_posix()
    md = [f"These are the reference GPU's numbers, not yours: an {dev['name']} (driver {dev.get('driver')}, torch "
          f"{dev.get('torch_version')}, CUDA {dev.get('cuda_version')}), every notebook run headless at full size. "
          "The result files, the full tables (every before/after and every claim with its verdict) and the figure "
          f"are in [`{where}/`]({where}/summary.md); `python -m gpulab run --compare {where}` puts your run "
          "beside them.", "",
          f"![what each change gained on the reference GPU]({where}/summary.png)", "",
          notebook_table(results), ""]
    check = results.get("00_device")
    if check:
        ex = check.get("extra", {})
        peaks = ex.get("measured_peaks") or {}
        tflops = ", ".join(f"{k.upper()} {v:,.0f}" for k, v in (peaks.get("tflops") or {}).items())
        line = (f"- Device self-check (`python -m gpulab check`): measured matmul {tflops} TFLOP/s "
                f"({peaks.get('matmul_size', '?')}³), copy {_fmt(peaks.get('copy_gbs'), '{:,.0f}')} GB/s")
        busy, idle = _claim(check, "NVML utilization >="), _claim(check, "NVML utilization <")
        tensor = _claim(check, "GPM tensor activity")
        if busy and idle:
            line += (f"; NVML utilization {_fmt(busy.get('measured'), '{:.0f}%')} around 2 s of BF16 matmuls"
                     + (f" (GPM tensor activity {_fmt(tensor.get('measured'), '{:.0f}%')})" if tensor else "")
                     + f" and {_fmt(idle.get('measured'), '{:.0f}%')} when idle")
        if ex.get("monitor_overhead_ratio") is not None:
            line += f"; the monitor's on/off time ratio on a small training loop {ex['monitor_overhead_ratio']:.4f}"
        md.append(line + ".")
    case = results.get("08_case_study")
    rows = (case or {}).get("extra", {}).get("waterfall") or []
    if len(rows) >= 2:
        first, last = rows[0], rows[-1]
        mfu = [_fmt(None if r.get("mfu_bf16_peak") is None else r["mfu_bf16_peak"] * 100, "{:.1f}%")
               for r in (first, last)]
        line = (f"- Case study: {first['tokens_per_s']:,.0f} -> {last['tokens_per_s']:,.0f} tokens/s "
                f"({last['tokens_per_s'] / first['tokens_per_s']:.1f}x), MFU {mfu[0]} -> {mfu[1]} of the datasheet "
                "dense BF16 peak")
        floor = _claim(case, "Benchmark floor: the optimized loop reaches at least")
        if floor and floor.get("low") is not None:
            line += (f"; the course's own target of at least {floor['low']:g}% MFU for the optimized loop is "
                     f"**{floor['verdict']}**")
        md.append(line + ".")
    return "\n".join(md)


def update_readme(readme: Path | str, folder: Path | str) -> Path:
    """Replace the README's text between the reference-summary markers with `reference_section(folder)`."""
    readme = Path(readme)
    text = readme.read_text()
    start, end = README_MARKERS
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"{readme} must hold one {start} ... {end} pair")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return write_text_atomic(readme, f"{head}{start}\n{reference_section(folder)}\n{end}{tail}")


def write_summary(results_dir: Path | str, out: Path | str, *, compare: Path | str | None = None,
                  expected: Sequence[str] = (), exclude: Sequence[str] = (), problems: Sequence[str] = (),
                  heading: str = "") -> tuple[Path, Path]:
    """Write summary.md and summary.png into `out` from the result JSON files in `results_dir`.

    `problems` (e.g. the notebooks that failed in this run) are listed first under Problems; `exclude`
    keeps those notebooks' results out of the tables.
    """
    import matplotlib
    import matplotlib.pyplot as plt

    results, found_problems = collect(results_dir, expected, exclude)
    reference, ref_problems = collect(compare) if compare else ({}, [])
    device = next(iter(results.values()))["device"].get("name", "unknown device") if results else "unknown device"
    smoke = any(d.get("smoke") for d in results.values())
    md = [f"# gpulab summary: {device}{' (smoke run)' if smoke else ''}", ""]
    if heading:
        md += [heading, ""]
    if compare:
        md += [f"Reference: `{compare}`.", ""]
    md += [notebook_table(results), "", summary_tables(results, reference)]
    if reference:
        md += ["", "## Verdicts beside the reference", "", agreement_section(results, reference)]
    all_problems = list(problems) + found_problems + [f"reference {p}" for p in ref_problems]
    if all_problems:
        md += ["", "## Problems", ""] + [f"- {p}" for p in all_problems]
    out = Path(out)
    md_path = write_text_atomic(out / "summary.md", "\n".join(md) + "\n")
    with matplotlib.rc_context():
        fig = summary_figure(results, reference)
        fig.suptitle(f"gpulab: what each change gained on {device}", fontsize=10)
        buf = io.BytesIO()
        fig.savefig(buf, dpi=110, format="png", bbox_inches="tight")
        plt.close(fig)
    png = write_text_atomic(out / "summary.png", buf.getvalue())
    return md_path, png
