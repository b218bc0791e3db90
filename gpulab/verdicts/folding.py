"""Fold a secondary output (a sweep's table, a figure, a long print) under a one-line summary a reader opens."""
from __future__ import annotations

import base64
import html as _html
import io
from typing import Any


def _html_of(obj: Any) -> str:
    """`obj` as HTML: its own `_repr_html_`, a matplotlib figure as an inline PNG, a string as written (HTML),
    anything else as escaped text."""
    if hasattr(obj, "_repr_html_"):
        return obj._repr_html_() or ""
    if hasattr(obj, "savefig"):  # a matplotlib Figure
        buf = io.BytesIO()
        obj.savefig(buf, format="png", bbox_inches="tight")
        return f"<img src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'>"
    if isinstance(obj, str):
        return obj
    return f"<pre>{_html.escape(repr(obj))}</pre>"


class Folded:
    """Outputs folded under a summary line: shown closed in Jupyter and on an exported page."""

    def __init__(self, summary: str, objs: tuple[Any, ...]):
        self.summary, self.objs = summary, objs

    def _repr_html_(self) -> str:
        return (f"<details class='gpulab-fold'><summary>{_html.escape(self.summary)}</summary>"
                + "".join(_html_of(o) for o in self.objs) + "</details>")

    def __repr__(self) -> str:
        return f"Folded({self.summary!r}, {len(self.objs)} output{'s' * (len(self.objs) != 1)})"


def fold(*objs: Any, summary: str) -> Folded:
    """Fold `objs` (results, tables, HTML strings, matplotlib figures) under the line `summary`; display() it."""
    if not isinstance(summary, str) or not summary.strip():
        raise ValueError(f"summary={summary!r}: a one-line description of what is folded")
    return Folded(summary.strip(), objs)
