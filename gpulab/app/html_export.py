"""Executed notebooks as standalone HTML files, their figures recompressed, for readers who browse the
repository or a run folder without running anything.

Matplotlib's PNGs are flat colours on white: a 32-colour palette PNG keeps them sharp at a fraction of the size.
Of the JupyterLab stylesheet nbconvert embeds, a page keeps only the rules its own elements use (`prune_css`).
Widgets have no kernel to draw them on a page (a progress bar would show frozen at 0%): `clean_notebook` drops
them with the rest of the noise, and `noise` finds what is left of it.
"""
from __future__ import annotations

import base64
import html as _html
import json
import os
import re
from pathlib import Path
from typing import Any

from ..measuring.files import write_text_atomic
from .page_layout import FIGURE_COLORS, add_print_css, compress_png, fold_parameters
from .page_css import _CODE_BLOCKS, prune_css

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_PROGRESS = re.compile(r"\d+%\|.*\|\s*\d+(?:\.\d+)?[kM]?/\S+|\[\d\d:\d\d<"
                       r"|\d[\w.]* \[\d\d:\d\d(?::\d\d)?, [^\]]*/[^\]]*\]")  # the last: a bar with no total
_FROZEN = re.compile(r"(?<![\d.])0%\|")
_WARNING = re.compile(r"^.*\b[A-Z]\w*Warning: .*$", re.M)
_ABS_PATH = re.compile(r"(?<![\w.:/~-])/(?:work|workspace|home|root|Users|tmp|mnt|opt|scratch|usr)/[\w.@+-]+")
_RUN_PATH = re.compile(r"(?<![\w/.-])runs/[\w.-]+/")
_PRE = re.compile(r"<pre[^>]*>(.*?)</pre>", re.S)
_TAGS = re.compile(r"<[^>]+>")


def check_available() -> None:
    """Raise ValueError (a usage error) when nbconvert, which renders the HTML, is not installed."""
    try:
        import nbconvert  # noqa: F401
    except ImportError:
        raise ValueError("--html needs nbconvert (it comes with JupyterLab): python -m pip install nbconvert") from None


def compress_images(nb, colors: int = FIGURE_COLORS) -> tuple[int, int]:
    """Recompress every PNG output of `nb` in place to a palette of `colors`; return the bytes (before, after)."""
    before = after = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" not in data:
                continue
            raw = base64.b64decode(data["image/png"])
            small = compress_png(raw, colors)
            before, after = before + len(raw), after + len(small)
            data["image/png"] = base64.b64encode(small).decode()
    return before, after


def export_html(ipynb: Path | str, dest: Path | str | None = None, *,
                result: Path | str | dict | None = None) -> Path:
    """Write an executed notebook as one self-contained HTML file (default: beside it, .html), without noise
    (`clean_notebook`) and opened by a key results box from `result` (its result JSON: a path or the loaded
    dict; default: the run folder's results/<gpu>/<name>.json when there is one)."""
    import nbformat
    from nbconvert import HTMLExporter

    ipynb = Path(ipynb)
    dest = Path(dest) if dest else ipynb.with_suffix(".html")
    nb = nbformat.read(str(ipynb), as_version=4)
    nb.metadata.pop("widgets", None)  # saved widget state: megabytes a static page cannot use
    clean_notebook(nb)
    fold_parameters(nb)
    if result is None:
        result = find_result(ipynb)
    if result is not None:
        data = result if isinstance(result, dict) else json.loads(Path(result).read_text())
        add_key_results(nb, data)
    compress_images(nb)
    body, _ = HTMLExporter(embed_images=True).from_notebook_node(nb)
    return write_text_atomic(dest, add_print_css(prune_css(body)))


def _roots() -> list[tuple[str, str]]:
    """(absolute prefix, its relative replacement), longest first: the repository, the working folder, the
    home folder."""
    repo = Path(__file__).resolve().parents[2]
    pairs = {str(repo): ".", os.getcwd(): ".", str(Path.home()): "~"}
    return sorted(((k.rstrip("/"), v) for k, v in pairs.items() if len(k) > 1), key=lambda kv: -len(kv[0]))


def _shorten(m: re.Match) -> str:
    path = m.group(0)
    for anchor in ("site-packages/", "dist-packages/"):
        if anchor in path:
            return path.split(anchor, 1)[1]
    for anchor in ("/runs/", "/gpulab/", "/notebooks/", "/data/", "/tests/"):
        if anchor in path:
            return anchor[1:] + path.split(anchor, 1)[1]
    return "…/" + path.rstrip("/").rsplit("/", 1)[-1]


_ANY_ABS = re.compile(r"(?<![\w.:/~-])/(?:work|workspace|home|root|Users|tmp|mnt|opt|scratch|usr)/[^\s'\"<>,;)\]]*")


def scrub_roots(text: str) -> str:
    """`text` with the repository root and the working folder dropped and the home folder written as ~."""
    for root, rel in _roots():
        text = text.replace(root + "/", "" if rel == "." else rel + "/").replace(root, rel)
    return text


def scrub_paths(text: str) -> str:
    """`text` with absolute paths made relative: the repository root and the working folder dropped, the home
    folder as ~, a run folder's `runs/<name>/` dropped, anything else under a system folder shortened (to its part
    inside site-packages, gpulab/, notebooks/ or data/, else its name)."""
    text = _ANY_ABS.sub(_shorten, scrub_roots(text))
    return _RUN_PATH.sub("", text)


def _final_state(text: str) -> str:
    """Text as a terminal leaves it: of each line, what follows its last carriage return."""
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def _text(output: dict, mime: str = "text/plain") -> str:
    v = output.get("data", {}).get(mime, "")
    return "".join(v) if isinstance(v, list) else str(v)


NOTHING = "gpulab_nothing"  # cell metadata: its outputs said nothing a static page can show
_NOTHING_TEXT = re.compile(r"^\s*(?:<p>)?\s*(?:This run is the reference run of|No reference run is committed for)")


def _progress_bar(output: dict) -> bool:
    """Whether a widget output is a progress bar (a tqdm bar, or its HBox of FloatProgress)."""
    text = _text(output)
    return bool(_PROGRESS.search(text) or re.match(r"(HBox\(children=\(HTML\(value=[^)]*\), )?(Float|Int)Progress\(",
                                                   text))


def _says_nothing(output: dict) -> bool:
    """Whether an output only says there is nothing to show here (the reference run has no reference beside it)."""
    if output.get("output_type") not in ("display_data", "execute_result"):
        return False
    data = output.get("data", {})
    text = _text(output, "text/html") if "text/html" in data else _text(output)
    return bool(_NOTHING_TEXT.match(text)) and len(text) < 400


def clean_outputs(outputs: list) -> list:
    """A cell's outputs without noise: no stderr, no widget (a static page has no kernel to draw it), no
    "nothing to show here" note, text bars at their final state, paths made relative."""
    out = []
    for o in outputs:
        kind = o.get("output_type")
        if kind == "stream":
            if o.get("name") == "stderr":
                continue  # warnings and progress bars: nothing a reader of the page can act on
            text = _final_state("".join(o["text"]) if isinstance(o["text"], list) else o["text"])
            if not text.strip():
                continue
            o["text"] = scrub_paths(text)
        elif kind in ("display_data", "execute_result") and WIDGET_VIEW in o.get("data", {}):
            continue  # a progress bar would show frozen at 0%, a control without its kernel does nothing
        elif _says_nothing(o):
            continue
        elif kind in ("display_data", "execute_result"):
            for mime in ("text/plain", "text/html", "text/markdown"):
                if mime in o.get("data", {}):
                    o["data"][mime] = scrub_paths(_text(o, mime))
        elif kind == "error":
            o["traceback"] = [scrub_paths(line) for line in o.get("traceback", [])]
        out.append(o)
    return out


def _heading(cell) -> int:
    """The level of the heading a markdown cell opens with (## -> 2), 0 for any other cell."""
    if cell.get("cell_type") != "markdown":
        return 0
    m = re.match(r"\s*(#{1,6})\s", "".join(cell.get("source", "")))
    return len(m.group(1)) if m else 0


def _prose(cell) -> bool:
    """Whether a markdown cell says anything beyond its headings."""
    lines = "".join(cell.get("source", "")).splitlines()
    return any(line.strip() and not line.lstrip().startswith("#") for line in lines)


def drop_empty_sections(nb) -> None:
    """Remove, in place, the cells whose outputs said nothing a static page can show (a widget, "this run is the
    reference run"), and every section left with nothing under it: a heading with no prose and no cell, or
    one whose code cells all said nothing (its prose introduced what is not there)."""
    cells = list(nb.cells)
    drop: set[int] = set()
    for i, cell in enumerate(cells):
        level = _heading(cell)
        if not level:
            continue
        end = next((j for j in range(i + 1, len(cells)) if 0 < _heading(cells[j]) <= level), len(cells))
        under = cells[i + 1:end]
        code = [c for c in under if c.get("cell_type") == "code"]
        said_nothing = bool(code) and all(c.get("metadata", {}).get(NOTHING) and not c.get("outputs")
                                          for c in code)
        bare = not code and not _prose(cell) and not any(_prose(c) for c in under)
        if said_nothing or bare:
            drop.update(range(i, end))
    drop.update(i for i, c in enumerate(cells) if c.get("metadata", {}).get(NOTHING) and not c.get("outputs"))
    nb.cells = [c for i, c in enumerate(cells) if i not in drop]


def clean_notebook(nb) -> None:
    """Remove the page noise from `nb` in place: papermill's injected parameters cell, the noise of each cell's
    outputs (`clean_outputs`), the repository and home folders in sources, and the sections left with nothing
    to show (`drop_empty_sections`)."""
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    for cell in nb.cells:
        src = cell.get("source", "")
        cell["source"] = scrub_roots("".join(src) if isinstance(src, list) else src)
        if cell.get("cell_type") == "code":
            before = cell.get("outputs", [])
            cell["outputs"] = clean_outputs(before)
            if before and not cell["outputs"]:
                cell.setdefault("metadata", {})[NOTHING] = any(  # a control or a note; a bar sat on real work
                    (WIDGET_VIEW in o.get("data", {}) and not _progress_bar(o)) or _says_nothing(o) for o in before)
    drop_empty_sections(nb)


def find_result(ipynb: Path) -> Path | None:
    """The result JSON of an executed notebook in a run folder (<run>/results/<gpu>/<name>.json), newest first."""
    found = sorted(ipynb.parent.glob(f"results/*/{ipynb.stem}.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _side(e: dict, side: str) -> dict:
    return (e.get(side) or {}).get("summary") or {}


def headline_html(e: dict, gain: Any) -> str:
    """One headline experiment in a line: its name, the verdict with the ratio's interval, and what moved
    (throughput, else time per call; MFU where there is a peak), before -> after."""
    from ..measuring.text import pct, si

    esc = _html.escape
    b, a = _side(e, "before"), _side(e, "after")
    moved = []
    if b.get("throughput") and a.get("throughput"):
        moved.append(f"{a.get('item_name') or b.get('item_name') or 'items'}/s {si(b['throughput'])} -> "
                     f"{si(a['throughput'])}")
    elif b.get("median_ms") and a.get("median_ms"):
        moved.append(f"time per call {si(b['median_ms'] / 1e3, 's')} -> {si(a['median_ms'] / 1e3, 's')}")
    if b.get("mfu") is not None and a.get("mfu") is not None:
        moved.append(f"MFU {pct(b['mfu'])} -> {pct(a['mfu'])}")
    lo, hi = (gain.lo, gain.hi) if gain.value >= 1 or gain.lo <= 1 <= gain.hi else (1 / gain.hi, 1 / gain.lo)
    verdict = e.get("verdict") or f"{gain.value:.3g}x"  # in the verdict's direction: "1.14x slower", 1.13x-1.22x
    interval = f" <small>(interval {lo:.3g}x–{hi:.3g}x)</small>" if gain.lo != gain.hi else ""
    return (f"<li><b>{esc(e.get('name', ''))}</b>: <b>{esc(verdict)}</b>{interval}"
            + (f"; {esc(', '.join(moved))}" if moved else "") + "</li>")


def key_results_html(data: dict[str, Any]) -> str:
    """A short box for the top of a page, from the notebook's result JSON: its headline measurements (the
    experiments marked `"headline": true`; where none is, as in older files, the largest optimisation), then
    the claims' verdicts in one line."""
    from ..verdicts.tally import verdict_tally
    from .page_layout import headline_figure_html
    from .summary import gain, gains, not_a_speed_run

    e = _html.escape
    exps = data.get("experiments", [])
    marked = [x for x in exps if x.get("headline")] or [g[0] for g in gains(data)[:1]]  # none marked: the largest
    items = "".join(headline_html(x, gain(x)) for x in marked)
    caveat = not_a_speed_run(data)
    figure = "" if caveat else headline_figure_html(marked, [gain(x) for x in marked])
    dev = (data.get("device") or {}).get("name", "unknown device")
    return ("<div class='gpulab-key-results' style='border:1px solid #9ab;border-radius:4px;padding:6px 12px;"
            "margin:8px 0;background:#f5f8fa'>"
            f"<b>Key results</b> of this page's run on {e(dev)}{' (smoke size)' if data.get('smoke') else ''}"
            + (f"<ul style='margin:4px 0'>{items}</ul>" if items else "<br>")
            + (f"{figure}<br>" if figure else "")
            + (f"<small>{e(caveat)}.</small><br>" if caveat else "")
            + f"{e(verdict_tally(data.get('claims', [])))}.</div>")


def add_key_results(nb, data: dict[str, Any]) -> None:
    """Insert the key results box right under the page's title (the title cell's heading line), else first."""
    import nbformat

    cell = nbformat.v4.new_markdown_cell(key_results_html(data))
    first = nb.cells[0] if nb.cells else None
    if first is None or _heading(first) != 1:
        nb.cells.insert(0, cell)
        return
    title, _, rest = "".join(first.source).lstrip().partition("\n")
    first.source = title
    nb.cells[1:1] = [cell] + ([nbformat.v4.new_markdown_cell(rest.strip())] if rest.strip() else [])


def noise(page: str) -> list[str]:
    """The page noise left in an exported HTML page, one line per problem: progress bars frozen at 0%,
    widgets shown as `interactive(children=...`, warning lines, absolute paths, raw dicts over 20 lines."""
    body = _CODE_BLOCKS.sub("", page)
    body = re.sub(r"""src=(["'])data:[^"']*\1""", "", body)
    text = _html.unescape(_TAGS.sub("", body))
    found = []
    for m in _FROZEN.finditer(text):
        found.append("progress bar frozen at 0%: " + text[m.start():m.start() + 40].splitlines()[0].strip())
    found += ["widget without a kernel: " + text[m.start():m.start() + 40].splitlines()[0]
              for m in re.finditer(r"interactive\(children=", text)]
    found += ["warning: " + m.group(0).strip()[:120] for m in _WARNING.finditer(text)]
    found += ["absolute path: " + m.group(0) for m in _ABS_PATH.finditer(text)]
    found += ["run-folder path: " + m.group(0) for m in _RUN_PATH.finditer(text)]
    for m in _PRE.finditer(body):
        block = _html.unescape(_TAGS.sub("", m.group(1))).strip()
        if block.startswith(("{", "[{", "OrderedDict(", "defaultdict(")) and block.count("\n") >= 20:
            found.append(f"raw dict of {block.count(chr(10)) + 1} lines: {block[:60]!r}")
    return found
