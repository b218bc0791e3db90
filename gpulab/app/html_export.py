"""Executed notebooks as standalone HTML files, their figures recompressed, for readers who browse the
repository or a run folder without running anything.

Matplotlib's PNGs are flat colours on white: a 256-colour palette PNG keeps them sharp at a third or less of
the size. nbconvert does the rendering (it comes with JupyterLab).
"""
from __future__ import annotations

import base64
import io
from pathlib import Path

from ..results import write_text_atomic


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


def export_html(ipynb: Path | str, dest: Path | str | None = None) -> Path:
    """Write an executed notebook as one self-contained HTML file (default: beside it, .html)."""
    import nbformat
    from nbconvert import HTMLExporter

    ipynb = Path(ipynb)
    dest = Path(dest) if dest else ipynb.with_suffix(".html")
    nb = nbformat.read(str(ipynb), as_version=4)
    nb.metadata.pop("widgets", None)  # saved widget state: megabytes a static page cannot use
    compress_images(nb)
    body, _ = HTMLExporter(embed_images=True).from_notebook_node(nb)
    return write_text_atomic(dest, body)
