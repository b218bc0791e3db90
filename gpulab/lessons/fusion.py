"""Notebook 03 (kernel fusion and torch.compile): what a cell cannot hold. Its claims as data (each with the guide's
words), the byte counter behind "six memory passes", the ratios the compile-modes claims stand on, and the
notebook's figures and widget.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..measuring.estimates import Estimate
from ..measuring.compiler import FirstCall, first_call  # noqa: F401 (the notebook times its compiles with these)
from ..measuring.text import si, sig

__all__ = ["CLAIMS", "TRAIN_NAME", "INFER_NAME", "Traffic", "eager_traffic", "FirstCall", "first_call",
           "mode_speed_ratio", "compile_time_ratio", "compiled_label", "with_mode", "AUTOTUNE_MODE", "autotune_rows", "modes_table_html", "default_vs_eager", "bandwidth_figure", "mfu_figure", "modes_figure", "gelu_panel"]

TRAIN_NAME = "GPT training step: eager vs torch.compile"  # experiment names: the reference runs' keys
INFER_NAME = "small-batch GPT forward: eager vs CUDA graph"
_G, _NEEDS_MODES = "guide §3.1", ("cuda", "full", "compiler")
# max-autotune also turns on CUDA graphs; its no-cudagraphs twin isolates the autotuning the claim is about.
AUTOTUNE_MODE = "max-autotune-no-cudagraphs"


def compiled_label(mode: str) -> str:
    """The label of a side compiled with `mode`: "torch.compile (mode=max-autotune)"."""
    return f"torch.compile (mode={mode})"


def with_mode(name: str, mode: str) -> str:
    """An experiment's name with the compile mode that ran: "GELU: eager vs torch.compile (mode=default)"."""
    return f"{name} (mode={mode})"


def autotune_rows(ok: dict[str, dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str]:
    """(default row, autotuning row, why not) from the sweep's rows that ran: autotuning is judged on
    max-autotune-no-cudagraphs, so that the CUDA graphs max-autotune adds are not credited to it."""
    if "default" not in ok:
        return None, None, "default did not run: see the table"
    if AUTOTUNE_MODE in ok:
        return ok["default"], ok[AUTOTUNE_MODE], ""
    if "max-autotune" in ok:
        return None, None, (f"not tested: this run measures max-autotune, whose CUDA graphs would be credited to "
                            f"autotuning; add {AUTOTUNE_MODE!r} to SWEEP_MODES")
    return None, None, f"{AUTOTUNE_MODE} did not run: see the table"

# Kernel counts are exact (zero width) but measured; "~8" gets ±1 kernel; "3x" gets ±0.5x; "2.8x" and "30-50%" are
# numbers of another system (arr-coc's scorer on its own GPU), shown beside our nearest measurement, never judged.
CLAIMS = [
    dict(key="traffic", text="3 unfused elementwise ops = 6 memory operations, fused = 2: 3x fewer memory operations",
         quote="Total: 3 reads + 3 writes = 6 memory operations", source=_G, low=2.5, high=3.5, unit="x",
         evidence="arithmetic"),
    dict(key="arm_speed", text="fused add-relu-mul: 3x fewer memory operations, so ~3x faster",
         quote="Speedup: 3× fewer memory operations", source=_G, low=2.5, high=3.5, unit="x", needs=("cuda",)),
    dict(key="arm_eager_kernels", text="unfused x + bias, relu, * scale: 3 separate kernels",
         quote="Unfused: 3 separate kernels", source=_G, low=3, high=3, unit="kernels"),
    dict(key="arm_fused_kernels", text="fused by the compiler: 1 kernel", quote="Fused by compiler: 1 kernel",
         source=_G, low=1, high=1, unit="kernels", needs=("compiler",)),
    dict(key="fusion_2_8x", text="kernel fusion: 2.8x speedup (2.5 ms -> 0.9 ms)",
         quote="Kernel fusion: 2.5ms → 0.9ms (2.8× speedup)", source="003 profiling notes (arr-coc)", low=2.52,
         high=3.08, unit="x"),
    dict(key="gelu_eager_kernels", text="GELU without compile: ~8 separate kernels",
         quote="Without compile: ~8 separate kernels", source="guide §3.2", low=7, high=9, unit="kernels"),
    dict(key="gelu_fused_kernels", text="GELU with compile: 1 fused kernel", quote="With compile: 1 fused kernel",
         source="guide §3.2", low=1, high=1, unit="kernels", needs=("compiler",)),
    dict(key="gelu_speed", text="GELU with compile is 5-10x faster than without",
         quote="With compile: 1 fused kernel (5-10× faster)", source="guide §3.2", low=5, high=10, unit="x",
         needs=("cuda",)),
    dict(key="reduction", text="reduction fusion: (a * b).sum(dim=-1) in a single kernel",
         quote="After: y = (a * b).sum(dim=-1)  (fused)", source="guide §3.3", low=1, high=1, unit="kernels",
         needs=("compiler",)),
    dict(key="horizontal", text="horizontal fusion: two ops on one input in a single kernel",
         quote="After: y1, y2 = fused_kernel(x)  (read x once)", source="guide §3.3", low=1, high=1, unit="kernels",
         needs=("compiler",)),
    dict(key="overhead", text="torch.compile fusion of opponent processing: 30-50% overhead reduction",
         quote="torch.compile fusion of opponent processing (30-50% overhead reduction)",
         source="guide summary (000), arr-coc's key optimizations", low=30, high=50, unit="%"),
    dict(key="modes_potential", text="torch.compile modes: 30-100% speedup potential",
         quote="Kernel Fusion and Compilation (torch.compile modes, 30-100% speedup potential)",
         source="guide summary (000), section 3", low=30, high=100, unit="% gain", needs=("cuda",)),
    dict(key="review", text="torch.compile: 10-30% speedup", quote="Additional 10-30% speedup if stable",
         source="002 optimization review (RTX 3090)", low=10, high=30, unit="% gain"),
    dict(key="reduce_overhead", text="reduce-overhead (CUDA graphs) beats default on launch-bound work",
         quote="Mode: reduce-overhead (minimize Python overhead)", source="guide §3.2", low=1.0, unit="x",
         needs=_NEEDS_MODES),
    dict(key="autotune_compile", text="max-autotune's autotuning (max-autotune-no-cudagraphs) compiles slower than "
         "default",
         quote="slow compile", source="guide §3.2", low=1.0,
         unit="x", needs=_NEEDS_MODES),
    dict(key="autotune_speed", text="max-autotune's autotuning (max-autotune-no-cudagraphs) runs faster than default",
         quote="Mode: max-autotune (aggressive optimization", source="guide §3.2", low=1.0,
         unit="x", needs=_NEEDS_MODES),
]


# ---------------------------------------------------------------- bytes moved by an eager chain

def _nbytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor addresses (a broadcast dimension, stride 0, counts once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        n *= size if stride != 0 else 1
    return n * t.element_size()


@dataclass
class Traffic:
    """Each ATen op an eager function dispatched with the bytes it read plus wrote, and one fused kernel's bytes
    (the function's inputs read once, its outputs written once)."""

    ops: list[tuple[str, int]]
    ideal_bytes: int

    @property
    def n_ops(self) -> int:
        return len(self.ops)

    @property
    def total_bytes(self) -> int:
        return sum(b for _, b in self.ops)

    @property
    def ratio(self) -> float:
        """Eager bytes over fused bytes: how many times the memory traffic the unfused chain makes."""
        return self.total_bytes / self.ideal_bytes if self.ideal_bytes else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"ops": [list(o) for o in self.ops], "ideal_bytes": self.ideal_bytes, "n_ops": self.n_ops,
                "total_bytes": self.total_bytes, "ratio": self.ratio}

    def __repr__(self) -> str:
        return (f"Traffic({self.n_ops} ops, {si(self.total_bytes, 'B')} eager vs {si(self.ideal_bytes, 'B')} "
                f"fused: {self.ratio:.2f}x)")

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{i + 1}</td><td style='text-align:left'>aten.{n}</td><td>{si(b, 'B')}</td></tr>"
                       for i, (n, b) in enumerate(self.ops))
        return (f"<table><tr><th>#</th><th>op (one kernel each, eager)</th><th>read + written</th></tr>{rows}"
                f"<tr><td></td><td style='text-align:left'><b>eager total</b></td><td><b>{si(self.total_bytes, 'B')}"
                f"</b></td></tr><tr><td></td><td style='text-align:left'>one fused kernel (inputs once, output once)"
                f"</td><td>{si(self.ideal_bytes, 'B')}</td></tr><tr><td></td><td style='text-align:left'><b>ratio"
                f"</b></td><td><b>{self.ratio:.2f}x</b></td></tr></table>")


class _TrafficMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False):  # a view moves nothing
            tensors = [t for t in tree_flatten((args, kwargs or {}, out))[0] if isinstance(t, torch.Tensor)]
            if nbytes := sum(_nbytes(t) for t in tensors):
                self.ops.append((func.overloadpacket.__name__, nbytes))
        return out


def eager_traffic(fn: Callable[..., Any], *args: Any) -> Traffic:
    """Run `fn(*args)` eagerly once and count the ops it dispatches and the bytes each reads and writes."""
    with torch.no_grad(), _TrafficMode() as mode:
        out = fn(*args)
    seen: dict[int, int] = {}
    for t in tree_flatten((args, out))[0]:
        if isinstance(t, torch.Tensor):
            seen.setdefault(t.data_ptr(), _nbytes(t))
    return Traffic(ops=mode.ops, ideal_bytes=sum(seen.values()))


# ---------------------------------------------------------------- the compile modes, as ratios with intervals

def mode_speed_ratio(slower: dict[str, Any], faster: dict[str, Any]) -> Estimate:
    """slower time / faster time per call of two modes' rows, with the interval both sides' quartiles allow."""
    value = slower["median_s"] / faster["median_s"]
    return Estimate(value, min(slower["q1_s"] / faster["q3_s"], value), max(slower["q3_s"] / faster["q1_s"], value))


def gpu_time_ratio(slower: dict[str, Any], faster: dict[str, Any]) -> Estimate | None:
    """slower's GPU kernel time per call over faster's (rows' `gpu_s`, one per profile; the interval: the range of
    their ratios): what autotuning changes, where a launch-bound call's wall time follows the host. None without."""
    a, b = sorted(slower.get("gpu_s") or []), sorted(faster.get("gpu_s") or [])
    if not a or not b or b[0] <= 0:
        return None
    value = statistics.median(a) / statistics.median(b)
    return Estimate(value, min(a[0] / b[-1], value), max(a[-1] / b[0], value))


def compile_time_ratio(a: dict[str, Any], b: dict[str, Any], spread: float = 1.5) -> Estimate:
    """a's compile time over b's. Each is one first call, and a compile's time moves from run to run (caches,
    host load): the interval lets each be off by a factor `spread`, so the ratio by up to `spread` squared."""
    value = a["compile_s"] / b["compile_s"]
    return Estimate(value, value / spread**2, value * spread**2)


def default_vs_eager(default_row: dict[str, Any], eager_s: float) -> str:
    """One line: compiled default's time per call against eager's, and which is faster."""
    r = default_row["median_s"] / eager_s
    return (f"compiled default: {si(default_row['median_s'], 's')} per forward against eager {si(eager_s, 's')}: "
            + (f"{sig(r)}x slower than eager" if r > 1 else f"{sig(1 / r)}x faster than eager"))


def modes_table_html(sweep: Sequence[dict[str, Any]]) -> str:
    """The compile-modes sweep as a table: compile time, time per forward, kernels, GPU busy, how it was timed."""
    from ..measuring.text import pct

    rows = "".join(f"<tr><td>{m['mode']}</td><td>{si(m.get('compile_s'), 's')}</td><td>{si(m.get('median_s'), 's')}"
                   f"</td><td>{si(statistics.median(m['gpu_s']) if m.get('gpu_s') else None, 's')}</td>"
                   f"<td>{sig(m.get('kernels_per_call'))}</td><td>{pct(m.get('busy_fraction'))}</td>"
                   f"<td style='text-align:left'>{m['reason'] or m.get('timing', '')}</td></tr>" for m in sweep)
    return ("<table><tr><th>mode</th><th>compile (first call)</th><th>per forward</th><th>GPU time/forward</th>"
            "<th>kernels/call</th>"
            f"<th>GPU busy</th><th>note</th></tr>{rows}</table>") if rows else ""


# ---------------------------------------------------------------- figures and the widget

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
