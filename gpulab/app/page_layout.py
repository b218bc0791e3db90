"""How an exported page reads and prints: a headline figure for its key results box, the parameters cell folded,
and a print stylesheet that gives the width of A4 to the lesson (no prompt column, narrow margins, compact
code and tables, figures at most two thirds of the width)."""
from __future__ import annotations

import base64
import html as _html
import io
from typing import Any

PRINT_CSS = """@media print {
  @page { size: A4; margin: 10mm; }
  .jp-InputPrompt, .jp-OutputPrompt { display: none !important; }
  .jp-Cell { padding: 2px 0 !important; }
  .jp-RenderedHTMLCommon { font-size: 9.5pt; }
  .jp-RenderedHTMLCommon table { font-size: 8pt; }
  .jp-InputArea-editor pre, .highlight pre, .jp-OutputArea-output pre { font-size: 7.5pt !important;
    line-height: 1.2 !important; }
  .jp-OutputArea-output img { max-width: 65% !important; height: auto; }
}"""


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


def headline_figure_png(experiments: list[dict[str, Any]], gains: list[Any]) -> bytes | None:
    """A small figure of the headline experiments, one row each: what moved (throughput or time per call) and
    the MFU where both sides have one, before vs after, titled with the ratio and its interval. None when no
    experiment has numbers on both sides."""
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

    from ..measuring.text import si

    fig = Figure(figsize=(7.5, 1.35 * len(rows)), dpi=110)
    axes = fig.subplots(len(rows), 2, squeeze=False)
    for (e, g, b, a, what, vals, mfu), (ax_m, ax_u) in zip(rows, axes):
        labels = [b.get("label") or "before", a.get("label") or "after"]
        colors = ["#b0b0b0", "#2b7bba"]
        ax_m.barh([1, 0], vals, color=colors)
        ax_m.set_yticks([1, 0], labels, fontsize=8)
        ax_m.set_title(what, fontsize=8, loc="left")
        for y, v in zip([1, 0], vals):
            ax_m.text(v, y, f" {si(v)}", va="center", fontsize=7)
        ax_m.set_xlim(0, max(vals) * 1.3)
        if mfu:
            ax_u.barh([1, 0], [100 * m for m in mfu], color=colors)
            ax_u.set_yticks([1, 0], ["", ""])
            ax_u.set_title("MFU (%)", fontsize=8, loc="left")
            for y, m in zip([1, 0], mfu):
                ax_u.text(100 * m, y, f" {100 * m:.3g}%", va="center", fontsize=7)
            ax_u.set_xlim(0, max(100 * m for m in mfu) * 1.3 or 1)
        else:
            ax_u.set_axis_off()
        lo, hi = sorted((g.lo, g.hi))
        fig.text(0.01, ax_m.get_position().y1 + 0.02 / len(rows),
                 f"{e.get('name', '')}: {e.get('verdict') or f'{g.value:.3g}x'} (interval {lo:.3g}x-{hi:.3g}x)",
                 fontsize=8, weight="bold")
        for ax in (ax_m, ax_u):
            ax.tick_params(axis="x", labelsize=7)
            ax.spines[["top", "right"]].set_visible(False)
    fig.subplots_adjust(left=0.22, right=0.98, top=1 - 0.32 / len(rows), bottom=0.18 / len(rows),
                        hspace=0.9, wspace=0.12)
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
