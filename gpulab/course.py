"""The course runner: every notebook through papermill, then one summary built only from the result JSON files."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .results import ResultError, load_result, results_dir, write_json_atomic

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"


def notebooks(selection: Sequence[str] = (), folder: Path | None = None) -> list[Path]:
    """The course notebooks in order; `selection` picks by number ("01", "5") or name prefix."""
    folder = folder or NOTEBOOK_DIR
    allnb = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    if not selection:
        return allnb
    chosen = []
    for s in selection:
        key = s.zfill(2) if s.isdigit() else s
        match = [p for p in allnb if p.stem.startswith(key)]
        if not match:
            names = ", ".join(p.stem for p in allnb)
            raise ValueError(f"notebook {s!r} not found; choose from: {names}")
        chosen += [p for p in match if p not in chosen]
    return chosen


@dataclass
class NotebookRun:
    """How one notebook's headless run went."""

    notebook: str
    ok: bool
    seconds: float
    output: str
    error: str = ""


@dataclass
class CourseRun:
    """All notebook runs of one `gpulab run`, and where the summary went."""

    runs: list[NotebookRun] = field(default_factory=list)
    summary_md: Path | None = None
    summary_png: Path | None = None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runs)


def _check_parameters(nb: Path, parameters: dict[str, Any]) -> None:
    """Papermill only logs an unknown -p name and runs the full-size notebook: refuse instead."""
    import papermill as pm

    known = set(pm.inspect_notebook(str(nb)))
    unknown = set(parameters) - known
    if unknown:
        raise ValueError(f"{nb.name} has no parameter(s) {sorted(unknown)}; it takes: {sorted(known)}")


def run_course(selection: Sequence[str] = (), *, smoke: bool = False, out: Path | str | None = None,
               compare: Path | str | None = None, results: Path | str | None = None, progress: bool = True,
               timeout_s: int | None = None) -> CourseRun:
    """Run the chosen notebooks headless (one failure does not stop the rest), then write the summary."""
    import papermill as pm
    from tqdm.auto import tqdm

    chosen = notebooks(selection)
    out = Path(out or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    params = {"SMOKE": bool(smoke)}
    for nb in chosen:
        _check_parameters(nb, params)
    course = CourseRun()
    bar = tqdm(chosen, desc="notebooks", disable=not progress)
    for nb in bar:
        bar.set_postfix_str(nb.stem)
        dest = out / nb.name
        t0 = time.perf_counter()
        try:
            pm.execute_notebook(str(nb), str(dest), parameters=params, kernel_name="python3", cwd=str(nb.parent),
                                progress_bar=False, execution_timeout=timeout_s)
            course.runs.append(NotebookRun(nb.stem, True, time.perf_counter() - t0, str(dest)))
        except Exception as e:  # report and go on: one failing notebook must not stop the course
            msg = str(e).strip().splitlines()
            course.runs.append(NotebookRun(nb.stem, False, time.perf_counter() - t0, str(dest),
                                           f"{type(e).__name__}: {msg[-1] if msg else ''}"[:300]))
    write_json_atomic(out / "runs.json", [r.__dict__ for r in course.runs])
    from .device import get_device

    results = Path(results) if results else results_dir() / get_device().slug
    course.summary_md, course.summary_png = write_summary(results, out, compare=compare,
                                                          expected=[p.stem for p in chosen])
    return course


# -- summary ----------------------------------------------------------------------------------------------

def collect(folder: Path | str, expected: Sequence[str] = ()) -> tuple[dict[str, dict], list[str]]:
    """Load every result JSON in `folder`; return (results by notebook, problems), skipping bad files."""
    folder = Path(folder)
    found: dict[str, dict] = {}
    problems: list[str] = []
    for path in sorted(folder.glob("[0-9][0-9]_*.json")):
        try:
            data = load_result(path)
            found[data["notebook"]] = data
        except ResultError as e:
            problems.append(f"skipped {path.name}: {e}")
    for name in expected:
        if name not in found:
            problems.append(f"missing: no result for {name} in {folder}")
    return found, problems


def _fmt(x: float | None, fmt: str) -> str:
    return "—" if x is None else fmt.format(x)


def summary_tables(results: dict[str, dict], reference: dict[str, dict] | None = None) -> str:
    """Markdown tables of every before/after and every claim, with the reference beside when given."""
    reference = reference or {}
    ref_col = " | reference speedup" if reference else ""
    lines = ["| notebook | experiment | speedup | verdict | MFU before | MFU after | GPU busy before | GPU busy after"
             + ref_col + " |", "|" + " --- |" * (8 + bool(reference))]
    for nb, data in sorted(results.items()):
        refs = {e["name"]: e for e in reference.get(nb, {}).get("experiments", [])}
        for e in data["experiments"]:
            b, a = e["before"]["summary"], e["after"]["summary"]
            mfu = [_fmt(None if s.get("mfu") is None else s["mfu"] * 100, "{:.1f}%") for s in (b, a)]
            util = [_fmt(s.get("nvml_util"), "{:.0f}%") for s in (b, a)]
            row = f"| {nb} | {e['name']} | {e['speedup']:.2f}x | {e['verdict']} | {mfu[0]} | {mfu[1]} | {util[0]} | {util[1]}"
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
            row = f"| {nb} | {c['text']} | {c.get('expected', '')} | {_fmt(c.get('measured'), '{:.3g}')} | {c['verdict']}"
            if reference:
                r = refs.get(c["text"], {})
                row += f" | {_fmt(r.get('measured'), '{:.3g}')} | {r.get('verdict', '—')}"
            lines.append(row + " |")
    return "\n".join(lines)


def notebook_table(results: dict[str, dict]) -> str:
    """Markdown: one row per notebook with its largest gain and its claims' verdicts counted."""
    lines = ["| notebook | experiments | largest gain | claims confirmed | refuted | not tested |",
             "| --- | --- | --- | --- | --- | --- |"]
    for nb, data in sorted(results.items()):
        exps = data["experiments"]
        best = max(exps, key=lambda e: e["speedup"], default=None)
        gain = f"{best['speedup']:.2f}x: {best['name']}" if best else "—"
        verdicts = [c["verdict"] for c in data["claims"]]
        lines.append(f"| {nb} | {len(exps)} | {gain} | {verdicts.count('confirmed')} | {verdicts.count('refuted')} "
                     f"| {verdicts.count('not tested')} |")
    return "\n".join(lines)


def summary_figure(results: dict[str, dict], reference: dict[str, dict] | None = None):
    """One figure: the speedup of every before/after (log scale), reference GPU's marked beside."""
    import matplotlib.pyplot as plt

    rows = [(f"{nb[:2]} {e['name']}", e["speedup"], e["within_noise"], nb, e["name"])
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
        floor = _claim(case, "Benchmark floor: the optimized loop reaches at least 45% MFU")
        if floor:
            line += f"; the course's own target of at least 45% MFU for the optimized loop is **{floor['verdict']}**"
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
    tmp = readme.with_suffix(readme.suffix + ".tmp")
    tmp.write_text(f"{head}{start}\n{reference_section(folder)}\n{end}{tail}")
    tmp.replace(readme)
    return readme


def write_summary(results_dir: Path | str, out: Path | str, *, compare: Path | str | None = None,
                  expected: Sequence[str] = ()) -> tuple[Path, Path]:
    """Write summary.md and summary.png into `out` from the result JSON files in `results_dir`."""
    import matplotlib
    import matplotlib.pyplot as plt

    results, problems = collect(results_dir, expected)
    reference, ref_problems = collect(compare) if compare else ({}, [])
    device = next(iter(results.values()))["device"]["name"] if results else "unknown device"
    smoke = any(d.get("smoke") for d in results.values())
    md = [f"# gpulab summary: {device}{' (smoke run)' if smoke else ''}", ""]
    if compare:
        md += [f"Reference: `{compare}`.", ""]
    md += [notebook_table(results), "", summary_tables(results, reference)]
    if problems or ref_problems:
        md += ["", "## Problems", ""] + [f"- {p}" for p in problems + [f"reference {p}" for p in ref_problems]]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md_path = out / "summary.md"
    tmp = md_path.with_suffix(".md.tmp")
    tmp.write_text("\n".join(md) + "\n")
    tmp.replace(md_path)
    with matplotlib.rc_context():
        fig = summary_figure(results, reference)
        fig.suptitle(f"gpulab: what each change gained on {device}", fontsize=10)
        png = out / "summary.png"
        fig.savefig(png.with_suffix(".png.tmp"), dpi=110, format="png", bbox_inches="tight")
        png.with_suffix(".png.tmp").replace(png)
        plt.close(fig)
    return md_path, png
