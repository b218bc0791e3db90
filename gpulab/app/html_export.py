"""Executed notebooks as standalone HTML files, their figures recompressed, for readers who browse the
repository or a run folder without running anything.

Matplotlib's PNGs are flat colours on white: a 256-colour palette PNG keeps them sharp at a third or less of
the size. nbconvert does the rendering (it comes with JupyterLab).

A page is written without noise (`clean_notebook`): progress bars that have no kernel to draw them are dropped
(a widget bar would show frozen at 0%) and text bars keep their final state; any other widget becomes a short
static note; stderr (warnings) is left out; absolute paths become relative. A "key results" box built from the
notebook's result JSON opens the page. `noise` finds what is left of those problems in a page.
"""
from __future__ import annotations

import base64
import html as _html
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from ..results import write_text_atomic

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_PROGRESS = re.compile(r"\d+%\|.*\|\s*\d+(?:\.\d+)?[kM]?/\S+|\[\d\d:\d\d<"
                       r"|\d[\w.]* \[\d\d:\d\d(?::\d\d)?, [^\]]*/[^\]]*\]")  # the last: a bar with no total
_FROZEN = re.compile(r"(?<![\d.])0%\|")
_WARNING = re.compile(r"^.*\b[A-Z]\w*Warning: .*$", re.M)
_ABS_PATH = re.compile(r"(?<![\w.:/~-])/(?:work|workspace|home|root|Users|tmp|mnt|opt|scratch|usr)/[\w.@+-]+")
_RUN_PATH = re.compile(r"(?<![\w/.-])runs/[\w.-]+/")
_PRE = re.compile(r"<pre[^>]*>(.*?)</pre>", re.S)
_TAGS = re.compile(r"<[^>]+>")
_CODE_BLOCKS = re.compile(r"<(script|style)\b[^>]*>.*?</\1>", re.S | re.I)


def check_available() -> None:
    """Raise ValueError (a usage error) when nbconvert, which renders the HTML, is not installed."""
    try:
        import nbconvert  # noqa: F401
    except ImportError:
        raise ValueError("--html needs nbconvert (it comes with JupyterLab): python -m pip install nbconvert") from None


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


def compress_images(nb) -> tuple[int, int]:
    """Recompress every PNG output of `nb` in place; return the bytes (before, after)."""
    before = after = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" not in data:
                continue
            raw = base64.b64decode(data["image/png"])
            small = compress_png(raw)
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
    if result is None:
        result = find_result(ipynb)
    if result is not None:
        data = result if isinstance(result, dict) else json.loads(Path(result).read_text())
        add_key_results(nb, data)
    compress_images(nb)
    body, _ = HTMLExporter(embed_images=True).from_notebook_node(nb)
    return write_text_atomic(dest, body)


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


def widget_note(text: str) -> dict:
    """A static output in place of a widget that has no kernel: what it is and where it works."""
    kind = text.split("(", 1)[0].strip() or "widget"
    msg = (f"An interactive control ({kind}) is here when the notebook runs in Jupyter: open it there to use it.")
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/plain": msg, "text/html": f"<p><i>{_html.escape(msg)}</i></p>"}}


def clean_outputs(outputs: list) -> list:
    """A cell's outputs without noise: no stderr, no progress bar widget, a note for any other widget, text
    bars at their final state, paths made relative."""
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
            text = _text(o)
            if _PROGRESS.search(text) or re.match(r"(HBox\(children=\(HTML\(value=[^)]*\), )?(Float|Int)Progress\(",
                                                  text):
                continue  # a progress bar: without its kernel it would show frozen at 0%
            o = widget_note(text)
        elif kind in ("display_data", "execute_result"):
            for mime in ("text/plain", "text/html", "text/markdown"):
                if mime in o.get("data", {}):
                    o["data"][mime] = scrub_paths(_text(o, mime))
        elif kind == "error":
            o["traceback"] = [scrub_paths(line) for line in o.get("traceback", [])]
        out.append(o)
    return out


def clean_notebook(nb) -> None:
    """Remove the page noise from every cell of `nb` in place (`clean_outputs`; the repository and home folders
    in sources too)."""
    for cell in nb.cells:
        src = cell.get("source", "")
        cell["source"] = scrub_roots("".join(src) if isinstance(src, list) else src)
        if cell.get("cell_type") == "code":
            cell["outputs"] = clean_outputs(cell.get("outputs", []))


def find_result(ipynb: Path) -> Path | None:
    """The result JSON of an executed notebook in a run folder (<run>/results/<gpu>/<name>.json), newest first."""
    found = sorted(ipynb.parent.glob(f"results/*/{ipynb.stem}.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def key_results_html(data: dict[str, Any]) -> str:
    """A short box for the top of a page: the verdict counts, the top 3 measured claims, the largest
    optimisation (none from a smoke or CPU run), all from the notebook's result JSON."""
    from ..claims import Claim, count_verdicts
    from .summary import _ratio_str, gains, not_a_speed_run

    e = _html.escape
    n = count_verdicts(data.get("claims", []))
    names = {"confirmed": "confirmed", "refuted_higher": "refuted (higher than claimed)",
             "refuted_lower": "refuted (lower than claimed)", "inconclusive": "inconclusive",
             "not comparable": "not comparable", "not tested": "not tested",
             "not_measured": "settled without measuring"}
    counts = ", ".join(f"{v} {names[k]}" for k, v in n.items() if v) or "no claims"
    measured = [c for c in data.get("claims", []) if c.get("evidence", "measured") == "measured"
                and c.get("measured") is not None]
    order = {"refuted": 0, "confirmed": 1, "inconclusive": 2}
    top = sorted((c for c in measured if c.get("verdict") in order), key=lambda c: order[c["verdict"]])[:3]
    items = []
    for d in top:
        c = Claim.from_dict(d)
        items.append(f"<li>{e(c.text)}{f' <small><code>{e(c.key)}</code></small>' if c.key else ''}: claimed "
                     f"{e(c.expected)}, measured {e(c._measured_str())}: <b>{e(c.label)}</b></li>")
    g = gains(data)
    best = (f"{e(_ratio_str(g[0][1]))}: {e(g[0][0]['name'])}" if g else e(not_a_speed_run(data) or "none measured"))
    dev = (data.get("device") or {}).get("name", "unknown device")
    return ("<div class='gpulab-key-results' style='border:1px solid #9ab;border-radius:4px;padding:6px 12px;"
            "margin:8px 0;background:#f5f8fa'>"
            f"<b>Key results</b> of this page's run on {e(dev)}{' (smoke size)' if data.get('smoke') else ''}"
            f"<br>Claims, one count each: {e(counts)}."
            + (f"<ul>{''.join(items)}</ul>" if items else "<br>")
            + f"Largest optimisation: {best}.</div>")


def add_key_results(nb, data: dict[str, Any]) -> None:
    """Insert the key results box as a cell after the page's title cell (or first)."""
    import nbformat

    cell = nbformat.v4.new_markdown_cell(key_results_html(data))
    first = nb.cells[0] if nb.cells else None
    titled = first is not None and first.cell_type == "markdown" and "".join(first.source).lstrip().startswith("#")
    at = 1 if titled else 0
    nb.cells.insert(at, cell)


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
