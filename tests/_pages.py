"""How long an exported page prints: headless Chromium prints it to an A4 PDF, and we count its pages and the
page of its first figure (the first page that draws an image at least 100 pixels wide).

`python tests/_pages.py PAGE.html ...` prints one line a page. Needs a Chromium (Debian: `apt-get install
chromium`); without one, `find_chromium` says so.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

A4 = "<style>@page { size: A4; }</style>"
MIN_FIGURE_PX = 100  # an image narrower than this is an icon or a rule, not a figure
_OBJ = re.compile(rb"(\d+) 0 obj(.*?)endobj", re.S)
_REF = re.compile(rb"/(\w+) (\d+) 0 R")


@dataclass
class PageCount:
    """A printed page: its A4 page count and the page (1-based) of its first figure (None: no figure)."""

    pages: int
    first_figure: int | None


def find_chromium() -> str:
    """The Chromium executable; ValueError naming the package when there is none."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    raise ValueError("printing a page needs Chromium: apt-get install -y chromium (Debian) or a Chrome on PATH")


def print_pdf(html: str, pdf: Path, *, timeout_s: float = 180) -> Path:
    """Print the HTML text `html` to `pdf` as headless Chromium does, on A4 paper without header or footer."""
    page = html.replace("</head>", A4 + "</head>", 1) if "</head>" in html else A4 + html
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "page.html"
        src.write_text(page, encoding="utf-8")
        cmd = [find_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-pdf-header-footer",
               f"--user-data-dir={tmp}/profile", f"--print-to-pdf={pdf}", src.as_uri()]
        subprocess.run(cmd, check=True, capture_output=True, timeout=timeout_s)
    return pdf


def _objects(data: bytes) -> dict[int, bytes]:
    """The PDF's objects by number: each one's dictionary (streams left out)."""
    return {int(m.group(1)): m.group(2).split(b"stream", 1)[0] for m in _OBJ.finditer(data)}


def _page_order(objs: dict[int, bytes]) -> list[int]:
    """The page objects in reading order, following the page tree from its root."""
    root = next((n for n, d in objs.items() if re.search(rb"/Type /Pages\b", d) and b"/Parent" not in d), None)

    def walk(n: int) -> list[int]:
        d = objs.get(n, b"")
        if re.search(rb"/Type /Page\b", d):
            return [n]
        kids = re.search(rb"/Kids \[([^\]]*)\]", d)
        return [p for k in (re.findall(rb"(\d+) 0 R", kids.group(1)) if kids else []) for p in walk(int(k))]

    if root is None:
        return sorted(n for n, d in objs.items() if re.search(rb"/Type /Page\b", d))
    return walk(root)


def _draws_figure(objs: dict[int, bytes], n: int, seen: set[int]) -> bool:
    """Whether object `n` (a page or a form) draws an image at least MIN_FIGURE_PX wide."""
    if n in seen:
        return False
    seen.add(n)
    d = objs.get(n, b"")
    xobj = re.search(rb"/XObject <<(.*?)>>", d, re.S)
    for _, ref in _REF.findall(xobj.group(1)) if xobj else []:
        x = objs.get(int(ref), b"")
        if b"/Subtype /Image" in x:
            w = re.search(rb"/Width (\d+)", x)
            if w and int(w.group(1)) >= MIN_FIGURE_PX:
                return True
        elif b"/Subtype /Form" in x and _draws_figure(objs, int(ref), seen):
            return True
    return False


def pdf_pages(pdf: bytes) -> PageCount:
    """The page count of a PDF written by Chromium and the page of its first figure."""
    objs = _objects(pdf)
    order = _page_order(objs)
    first = next((i + 1 for i, n in enumerate(order) if _draws_figure(objs, n, set())), None)
    return PageCount(len(order), first)


def page_count(html: str | Path) -> PageCount:
    """Pages and first-figure page of an HTML page (a file, or its text) printed on A4 by headless Chromium."""
    text = Path(html).read_text(encoding="utf-8") if isinstance(html, Path) or not str(html).lstrip().startswith(
        "<") else str(html)
    with tempfile.TemporaryDirectory() as tmp:
        pdf = print_pdf(text, Path(tmp) / "page.pdf")
        return pdf_pages(pdf.read_bytes())


def main(argv: list[str] | None = None) -> int:
    """Print each page's A4 page count and the page of its first figure."""
    paths = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print("usage: python tests/_pages.py PAGE.html ...", file=sys.stderr)
        return 2
    total = 0
    for p in paths:
        c = page_count(p)
        total += c.pages
        print(f"{p.name}: {c.pages} A4 pages, first figure on page {c.first_figure or '-'}")
    if len(paths) > 1:
        print(f"{len(paths)} pages: {total} A4 pages in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
