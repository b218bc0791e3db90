"""The README's reference section: one compact table of the reference run, rewritten from its result files."""
from __future__ import annotations

from pathlib import Path

from ..verdicts.tally import count_verdicts
from ..measuring.files import write_text_atomic
from .summary import _fmt, _ratio_str, collect, headline_gains, not_a_speed_run


README_MARKERS = ("<!-- reference-summary -->", "<!-- /reference-summary -->")


def _claim(data: dict, startswith: str) -> dict | None:
    return next((c for c in data.get("claims", []) if c["text"].startswith(startswith)), None)


def check_reference_results(results: dict[str, dict], folder: Path | str) -> None:
    """Raise ValueError unless `results` are one full-size GPU run on one device: the README's reference section
    says "the reference GPU's numbers ... at full size", which a smoke or CPU run is not."""
    if not results:
        raise ValueError(f"no result JSON files in {folder}")
    bad = sorted(f"{nb} ({why})" for nb, d in results.items() if (why := not_a_speed_run(d)))
    if bad:
        raise ValueError(f"--readme needs a full-size GPU run; {folder} holds {', '.join(bad)}: the README's "
                         "reference section would present them as the reference GPU's full-size numbers")
    names = sorted({(d.get("device") or {}).get("name", "?") for d in results.values()})
    if len(names) > 1:
        raise ValueError(f"--readme needs one GPU's results; {folder} mixes {', '.join(names)}")


def reference_section(folder: Path | str) -> str:
    """Markdown for the README: one row per notebook with a link to its executed page, its headline on the
    reference GPU (the experiment the lesson marks, with its 95% interval) and its verdicts on the guide's claims;
    then the run's summary figure and the self-check's peaks. Everything comes from the result JSON in `folder` (a committed reference run)."""
    folder = Path(folder)
    results, _ = collect(folder)
    check_reference_results(results, folder)
    dev = next(iter(results.values()))["device"]
    where = folder.as_posix()
    md = [f"On the reference GPU, an {dev['name']} (full sizes; [every table]({where}/summary.md)):", "",
          "| notebook | headline [95% interval] | the guide's claims: confirmed / refuted / inconclusive |",
          "| --- | --- | --- |"]
    for nb, data in sorted(results.items()):
        if nb.startswith("00_"):
            continue
        page = folder / "html" / f"{nb}.html"
        name = f"[{nb}]({where}/html/{nb}.html)" if page.exists() else nb
        g = headline_gains(data)
        head = "; ".join(f"{_ratio_str(est)} {e['name']}" for e, est in g[:2]) if g else "—"
        n = count_verdicts(data["claims"], origin="guide")
        md.append(f"| {name} | {head} | {n['confirmed']} / {n['refuted_higher'] + n['refuted_lower']} / "
                  f"{n['inconclusive']} |")
    if (folder / "summary.png").is_file():  # the run's own figure of the same headlines, under its table
        md += ["", f"![Each notebook's headline gain on the {dev['name']}, with its 95% interval, log scale]"
               f"({where}/summary.png)"]
    peaks = ((results.get("00_device") or {}).get("extra", {}).get("measured_peaks") or {})
    if peaks.get("tflops"):
        tflops = ", ".join(f"{k.upper()} {v:,.0f}" for k, v in peaks["tflops"].items())
        md += ["", f"Its self-check (`python -m gpulab check`) measured matmul {tflops} TFLOP/s and a copy at "
               f"{_fmt(peaks.get('copy_gbs'), '{:,.0f}')} GB/s."]
    return "\n".join(md)


def update_readme(readme: Path | str, folder: Path | str) -> Path:
    """Replace the README's text between the reference-summary markers with `reference_section(folder)`.

    Refuses (ValueError, before writing anything) a folder that is not one full-size GPU run."""
    readme = Path(readme)
    section = reference_section(folder)
    text = readme.read_text()
    start, end = README_MARKERS
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"{readme} must hold one {start} ... {end} pair")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return write_text_atomic(readme, f"{head}{start}\n{section}\n{end}{tail}")
