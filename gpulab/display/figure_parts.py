"""Pieces the figures share: a panel with no data, a metric's name and mean in words, a figure of means where a
timeline has too few points, and bar widths."""
from __future__ import annotations

import re
from typing import Any, Sequence

import matplotlib.pyplot as plt

from ..verdicts.experiment import Comparison
from ..measuring.monitor import METRICS
from ..measuring.text import sig


MIN_TIMELINE_POINTS = 5  # fewer samples in every series of a panel: no curve, their means in the legend


def _cmp(c: Comparison | dict[str, Any]) -> Comparison:
    return c if isinstance(c, Comparison) else Comparison.from_dict(c)


def _no_data(ax, text: str, y: float = 0.5) -> None:
    ax.text(0.5, y, text, ha="center", va="center", transform=ax.transAxes, color="#666", wrap=True, fontsize=9)


def _metric_name(metric: str) -> str:
    """A metric's short name: "SM active", "host CPU"."""
    return METRICS.get(metric, metric).split(" (")[0].split(",")[0]


def _metric_words(metric: str, value: float | None) -> str:
    """A metric's mean in a legend: "SM active 6.52% (GPM)", "power 312 W"."""
    name = METRICS.get(metric, metric)
    m = re.match(r"(.*?) \((?:(.*), )?([^,()]*)\)$", name)
    if not m:
        return f"{name} {sig(value)}"
    what, reader, unit = m.groups()
    what = what.split(",")[0]  # "host CPU, mean of cores" -> "host CPU"
    return f"{what} {sig(value)}{unit if unit == '%' else ' ' + unit}" + (f" ({reader})" if reader else "")


def _means_figure(series: list, few: Sequence[str], missing: Sequence[str], traces: list, title: str):
    """A timeline with no curve in it: per series, each metric's mean over the window, as text."""
    lines = [f"{label}: " + ", ".join(_metric_words(m, tr.mean(m)) for m in few if tr.mean(m) is not None)
             for label, tr, _ in series if tr and any(tr.mean(m) is not None for m in few)]
    lines.append(f"means over the window: fewer than {MIN_TIMELINE_POINTS} samples a metric, too few for a curve "
                 "(GPM and the host CPU are read once a second)"
                 + (f"; not recorded: {', '.join(_metric_name(m) for m in missing)}" if missing else ""))
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.28 * len(lines)))
    ax.axis("off")
    colors = [c for _, tr, c in series if tr and any(tr.mean(m) is not None for m in few)] + ["#555"]
    for i, (text, color) in enumerate(zip(lines, colors)):
        ax.text(0.0, 1 - (i + 0.5) / len(lines), text, transform=ax.transAxes, va="center", ha="left",
                fontsize=9 if i < len(lines) - 1 else 7, color=color or "k")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _fits_flat(labels: Sequence[str], fig_width_in: float) -> bool:
    """Whether tick labels fit side by side unturned: the longest line of a label (at about 0.065 in a character)
    within its share of the axes' width."""
    longest = max((len(line) for t in labels for line in str(t).split("\n")), default=0)
    return longest * 0.065 <= (fig_width_in - 1.3) / max(1, len(labels))


def _row_width(n: int) -> float:
    """Inches for a chart of `n` bars in a row: 0.9 in a bar, at most 10 in, so that a page showing it about 900
    px wide keeps its 8-point labels readable (a 13 in figure shrank them to 5 px)."""
    return min(10.0, max(7.0, 0.9 * n + 2))
