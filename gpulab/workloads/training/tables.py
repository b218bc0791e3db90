"""Small display helpers for training results: a smoothed curve and an HTML table."""
from __future__ import annotations

import html
import math
from typing import Any



# ---------------------------------------------------------------- small display helpers

def smooth(values: list[float], k: int = 10) -> list[float]:
    """Trailing moving average over up to `k` values (the first points average what there is)."""
    if k < 1:
        raise ValueError(f"k={k!r} must be >= 1")
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= k:
            acc -= values[i - k]
        out.append(acc / min(i + 1, k))
    return out


class Table:
    """Rows of dicts shown as an HTML table (and as text); `columns` are (key, header, format) triples.

    A format is a str.format pattern ("{:.1f}", "{:.1%}") or a callable; None values show as "n/a".
    """

    def __init__(self, rows: list[dict[str, Any]], columns: list[tuple[str, str, Any]], title: str = ""):
        self.rows, self.columns, self.title = rows, columns, title

    def _cell(self, row: dict[str, Any], key: str, fmt: Any) -> str:
        v = row.get(key)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "n/a"
        if callable(fmt):
            return str(fmt(v))
        return fmt.format(v) if fmt else str(v)

    def __repr__(self) -> str:
        lines = [self.title] if self.title else []
        lines.append(" | ".join(h for _, h, _ in self.columns))
        lines += [" | ".join(self._cell(r, k, f) for k, _, f in self.columns) for r in self.rows]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(self._cell(r, k, f))}</td>" for k, _, f in self.columns)
                       + "</tr>" for r in self.rows)
        title = f"<b>{html.escape(self.title)}</b>" if self.title else ""
        return f"<div>{title}<table><tr>{head}</tr>{body}</table></div>"
