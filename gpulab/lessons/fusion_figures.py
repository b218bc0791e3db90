"""Notebook 03's figures and its widget: GELU's bandwidth under the copy ceiling, the training step's MFU, the
compile modes beside eager and CUDA graphs, and the GELU panel a reader re-runs."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ..measuring.text import si, sig
from .fusion import INFER_NAME, TRAIN_NAME

class _Sig(str):
    """A bar-label format that writes three significant figures without exponents (2.94, 0.331)."""

    def format(self, v: float) -> str:  # type: ignore[override]
        return sig(v)


def bandwidth_figure(bandwidth: dict[str, float], ref: dict[str, Any] | None) -> None:
    """Each GELU's useful bandwidth and the eager chain's whole traffic, under the copy ceiling (dotted); the
    reference GPU's bars beside."""
    import matplotlib.pyplot as plt

    from ..display import plots
    from ..verdicts.results import named

    useful = {k: v for k, v in bandwidth.items() if k not in ("eager_actual_traffic", "copy")}
    ref_bw = (ref or {}).get("extra", {}).get("gelu_bandwidth_gbs")
    labels = list(useful) + ["eager, all traffic"]
    tb = lambda v: None if v is None else v / 1e3  # noqa: E731  GB/s -> TB/s, the page's unit for bandwidth
    fig = plots.bars(labels, [tb(v) for v in useful.values()] + [tb(bandwidth["eager_actual_traffic"])],
                     ylabel="TB/s", title="GELU: useful bytes / time, against the copy ceiling", fmt=_Sig(),
                     colors=[plots.BEFORE] + [plots.AFTER] * (len(useful) - 1) + ["#b8b8b8"],
                     ref=[tb(named(ref_bw, k)) for k in useful] + [tb(ref_bw.get("eager_actual_traffic"))] if ref_bw
                     else None)
    from matplotlib.patches import Patch

    ax = fig.axes[0]
    line = ax.axhline(tb(bandwidth["copy"]), ls=":", color="k",
                      label=f"device copy, this run: {si(bandwidth['copy'] * 1e9, 'B/s')}")
    ax.set_ylim(0, 1.15 * max(tb(bandwidth["copy"]), ax.get_ylim()[1]))
    for t in ax.texts:  # the values sit near the copy line: keep them readable over it
        t.set_bbox(dict(facecolor="white", edgecolor="none", pad=0.6, alpha=0.85))
    handles = [Patch(color=plots.BEFORE, label="eager, this run"), Patch(color=plots.AFTER, label="fused, this run"),
               Patch(color="#b8b8b8", label="eager, all its bytes")]
    handles += [Patch(color=plots.REF, label="reference GPU")] if ref_bw else []
    ax.legend(handles=handles + [line], fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=3)
    fig.tight_layout()
    plt.show()


def mfu_figure(cmp_train: Any, ref: dict[str, Any] | None) -> None:
    """MFU of the training step, eager and compiled, with the reference GPU's bars (alone when not run here)."""
    import matplotlib.pyplot as plt

    from ..display import plots
    from ..verdicts.results import comparisons

    refc = comparisons(ref) if ref else None
    if cmp_train is not None:
        fig = plots.mfu(cmp_train, reference=refc, title="MFU of the GPT training step")
    else:
        r = next((c for c in refc or [] if c.name.startswith(TRAIN_NAME)), None)
        fig = plots.bars(["eager", "torch.compile"], [None, None], ylabel="MFU (% of dense peak)",
                         title="MFU of the GPT training step (not run here)", colors=[plots.BEFORE, plots.AFTER],
                         ref=[None if v is None else v * 100 for v in (r.before.mfu, r.after.mfu)] if r else None)
    fig.tight_layout()
    plt.show()


def _variants(cmp_graph: Any, modes: Sequence[dict[str, Any]]) -> dict[str, tuple[Any, Any]]:
    """{variant: (seconds per forward, compile seconds)}: eager and the captured graph, then each mode that ran."""
    d: dict[str, tuple[Any, Any]] = {}
    if cmp_graph is not None:
        d["eager"], d["CUDA graph"] = (cmp_graph.before.seconds, None), (cmp_graph.after.seconds, None)
    return d | {m["mode"]: (m["median_s"], m["compile_s"]) for m in modes if m.get("ok")}


def modes_figure(cmp_graph: Any, sweep: Sequence[dict[str, Any]], ref: dict[str, Any] | None, title: str) -> None:
    """Time per forward and compile time of eager, the CUDA graph and each compile mode, this run's bars beside
    the reference GPU's."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from ..display import plots
    from ..verdicts.results import comparisons

    rows = _variants(cmp_graph, sweep)
    ref_rows = _variants(next((c for c in comparisons(ref) if c.name.startswith(INFER_NAME)), None),
                         ref.get("extra", {}).get("modes", [])) if ref else {}
    if not rows and not ref_rows:
        return
    names = list(dict.fromkeys(list(rows) + list(ref_rows)))
    # eager in the notebook's eager colour, the graph and compiled modes in the fused one, as in 03's other figures
    sides = [src for src in (rows, ref_rows) if src]  # no empty slots for a side that did not run
    w = 0.8 / len(sides)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    for ax, i, ylabel, scale in ((axes[0], 0, "ms per forward", 1e3), (axes[1], 1, "compile time (s)", 1)):
        shown = [n for n in names if any(src.get(n, (None, None))[i] for src in (rows, ref_rows))]  # eager: no compile
        xs = range(len(shown))
        for k, src in enumerate(sides):
            vals = [(src.get(n, (None, None))[i] or 0) * scale for n in shown]
            colors = [plots.REF if src is ref_rows else plots.BEFORE if n == "eager" else plots.AFTER for n in shown]
            bars = ax.bar([p + (k - (len(sides) - 1) / 2) * w for p in xs], vals, w, color=colors)
            ax.bar_label(bars, labels=[sig(v) if v else "" for v in vals], fontsize=7)
        ax.set_xticks(list(xs), shown, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        handles = [Patch(color=c, label=n) for c, n, drawn in (
            (plots.BEFORE, "eager, this run", "eager" in shown and "eager" in rows),
            (plots.AFTER, "graph or compiled, this run", bool(rows)), (plots.REF, "reference GPU", bool(ref_rows)))
            if drawn]
        ax.legend(handles=handles, fontsize=8)
    axes[0].set_title(title, fontsize=10)
    axes[1].set_title("first-call compile time of each mode", fontsize=10)
    plt.show()


def gelu_panel(gelu: Callable[[torch.Tensor], torch.Tensor], compiled: Callable | None, device: Any,
               min_time_s: float | None, small: bool, compiled_as: str = "torch.compile") -> Any:
    """A control that times the eager GELU chain against a fused one (the compiled GELU, labelled `compiled_as`, or
    F.gelu) at a size the reader picks; each new size is a recompile for torch.compile."""
    import torch.nn.functional as F

    from ..display.widgets import control_panel
    from ..verdicts.experiment import before_after

    def gelu_at(elements: int, fused: str) -> Any:
        t = torch.randn(int(elements), device=device)
        after = (lambda: compiled(t)) if fused == compiled_as and compiled is not None else \
            (lambda: F.gelu(t, approximate="tanh"))
        return before_after(lambda: gelu(t), after, name=f"GELU, {si(int(elements))} elements",
                            before_label="eager chain", after_label=fused, min_time_s=min_time_s or 0.3, monitor=False)

    sizes = [1 << 12, 1 << 16, 1 << 20] + ([] if small else [1 << 24, 1 << 26])
    return control_panel(gelu_at, elements=sizes, fused=[compiled_as, "F.gelu"])
