"""How an exported page reads and prints: a headline figure for its key results box, the parameters cell folded,
and a print stylesheet that gives the width of A4 to the lesson (no prompt column, narrow margins, compact
code and tables, code wrapped at the page's edge, figures at most two thirds of the width, a note where a
folded table is to be read)."""
from __future__ import annotations

import base64
import html as _html
import io
from typing import Any

# Code wraps at the page's edge instead of running off it; at 7 pt it takes no more pages than it did cut at 7.5
# (the H200 pages of 01 and 03: 11 A4 pages either way, 12 wrapped at 7.5 pt).
# What a folded table says on paper, where nothing opens: where to read it. Printed open, the claims table
# alone added two A4 pages to a page (01: 12 -> 14) and the reference table one: past the 12 a page may take.
PRINT_NOTES = {
    "gpulab-claims": "on paper: every claim and its verdict are in this page's HTML and the run's summary.md",
    "gpulab-reference": "on paper: in this page's HTML, and in the run's summary.md with --compare",
    "gpulab-fold": "on paper: in this page's HTML",
}

PRINT_CSS = """@media print {
  @page { size: A4; margin: 10mm; }
  .jp-InputPrompt, .jp-OutputPrompt { display: none !important; }
  .jp-Cell { padding: 2px 0 !important; }
  .jp-RenderedHTMLCommon { font-size: 9.5pt; }
  .jp-RenderedHTMLCommon table { font-size: 8pt; }
  .jp-InputArea-editor pre, .highlight pre, .jp-OutputArea-output pre { font-size: 7pt !important;
    line-height: 1.15 !important; }
  pre, .highlight pre, .jp-OutputArea-output pre { white-space: pre-wrap !important;
    overflow-wrap: anywhere !important; }
  .jp-OutputArea-output img { max-width: 65% !important; height: auto; }
""" + "".join(f"  details.{c}:not([open]) > summary::after {{ content: \" ({note})\"; font-style: italic; }}\n"
              for c, note in PRINT_NOTES.items()) + "}"


def add_print_css(page: str) -> str:
    """`page` with the print stylesheet at the end of its head (a page without a head gets it first)."""
    block = f"<style>{PRINT_CSS}</style>"
    return page.replace("</head>", block + "</head>", 1) if "</head>" in page else block + page


def fold_parameters(nb) -> None:
    """Turn the cell tagged `parameters` into a folded block: its values matter to who reruns the page, not to
    who reads it, and at twenty lines it would fill the first page."""
    import nbformat

    for i, cell in enumerate(nb.cells):
        if cell.get("cell_type") == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            src = "".join(cell.source) if isinstance(cell.source, list) else cell.source
            n = sum(1 for line in src.splitlines() if line.strip() and not line.lstrip().startswith("#"))
            nb.cells[i] = nbformat.v4.new_markdown_cell(
                f"<details><summary>Parameters ({n}; <code>-p NAME VALUE</code> sets one, None: the size for "
                f"this device)</summary><pre>{_html.escape(src)}</pre></details>")
            return


def _metric(side: dict) -> tuple[str, float] | None:
    """What a side of a headline moved: its throughput, else its time per call (ms)."""
    if side.get("throughput"):
        return f"{side.get('item_name') or 'items'}/s", float(side["throughput"])
    if side.get("median_ms"):
        return "time per call (ms)", float(side["median_ms"])
    return None


def value_text(value: float, what: str) -> str:
    """A bar's value in its own unit: a time per call in ms ("0.200 ms", never "200 m" of a millisecond), a
    throughput with an SI prefix ("2.27 M")."""
    from ..measuring.text import si, sig

    return f"{sig(value)} ms" if what.endswith("(ms)") else si(value)


def wrap_label(text: str, width: int = 18) -> str:
    """A tick label on lines of at most about `width` characters, broken at spaces (a longer word stays whole):
    "torch.compile (mode=default)" -> "torch.compile\n(mode=default)", so no label runs off the figure's edge."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)) or text


def headline_figure(experiments: list[dict[str, Any]], gains: list[Any]):
    """A small figure of the headline experiments, one row each: what moved (throughput or time per call) and the
    MFU where both sides have one, before vs after, titled with the ratio and its interval; None when no experiment
    has numbers on both sides."""
    import textwrap

    rows = []
    for e, g in zip(experiments, gains):
        b, a = ((e.get(s) or {}).get("summary") or {} for s in ("before", "after"))
        mb, ma = _metric(b), _metric(a)
        if not (mb and ma) or mb[0] != ma[0]:
            continue
        mfu = (b["mfu"], a["mfu"]) if b.get("mfu") is not None and a.get("mfu") is not None else None
        rows.append((e, g, b, a, mb[0], (mb[1], ma[1]), mfu))
    if not rows:
        return None
    from matplotlib.figure import Figure  # not pyplot: drawn off-screen, never shown in the kernel

    fig = Figure(figsize=(7.5, 1.5 * len(rows)), dpi=110, layout="constrained")
    for (e, g, b, a, what, vals, mfu), sub in zip(rows, fig.subfigures(len(rows), 1, squeeze=False)[:, 0]):
        lo, hi = sorted((g.lo, g.hi))
        title = f"{e.get('name', '')}: {e.get('verdict') or f'{g.value:.3g}x'} (interval {lo:.3g}x-{hi:.3g}x)"
        sub.suptitle("\n".join(textwrap.wrap(title, 95)), fontsize=8, weight="bold", x=0.01, ha="left")
        ax_m, ax_u = sub.subplots(1, 2, width_ratios=(3, 2))
        labels = [wrap_label(b.get("label") or "before"), wrap_label(a.get("label") or "after")]
        colors = ["#b0b0b0", "#2b7bba"]
        panels = [(ax_m, what, vals, lambda v: value_text(v, what))]
        if mfu:
            panels.append((ax_u, "MFU (%)", [100 * m for m in mfu], lambda v: f"{v:.3g}%"))
        else:
            ax_u.set_axis_off()
        for ax, name, vs, fmt in panels:
            ax.barh([1, 0], vs, color=colors)
            ax.set_yticks([1, 0], labels if ax is ax_m else ["", ""], fontsize=8)
            ax.set_title(name, fontsize=8, loc="left")
            for y, v in zip([1, 0], vs):
                ax.text(v, y, f" {fmt(v)}", va="center", fontsize=7)
            ax.set_xlim(0, max(vs) * 1.35 or 1)
            ax.set_xticks([])  # each bar carries its value: no axis numbers (nor an offset such as "1e11")
            ax.spines[["top", "right"]].set_visible(False)
    return fig


def headline_figure_png(experiments: list[dict[str, Any]], gains: list[Any]) -> bytes | None:
    """`headline_figure` as PNG bytes (None when there is nothing to draw)."""
    fig = headline_figure(experiments, gains)
    if fig is None:
        return None
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def compress_png(data: bytes, colors: int = 256) -> bytes:
    """A PNG re-encoded with a palette of `colors` colours; the original when that is not smaller."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        img.load()
        rgb = img.convert("RGB")
    out = io.BytesIO()
    rgb.quantize(colors=colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        out, format="PNG", optimize=True)
    return out.getvalue() if out.tell() < len(data) else data


FIGURE_COLORS = 32  # charts are a few flat colours and their antialiased edges: 32 keep text and lines clean


def headline_figure_html(experiments: list[dict[str, Any]], gains: list[Any]) -> str:
    """The headline figure as an inline image (empty when there is nothing to draw or no matplotlib)."""
    try:
        png = headline_figure_png(experiments, gains)
    except ImportError:
        return ""
    if png is None:
        return ""
    png = compress_png(png, FIGURE_COLORS)
    alt = _html.escape("; ".join(e.get("name", "") for e in experiments))
    return f"<img alt='{alt}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
