"""Figures of notebooks 01, 02, 03 and 11, drawn on the CPU from the committed reference results: legends
that name every colour, labels that fit, one colour per dtype, no curve of 1-3 points, values above error bars."""
import json
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gpulab.display import plots  # noqa: E402
from gpulab.verdicts.results import comparisons  # noqa: E402

REF = Path(__file__).resolve().parents[1] / "data" / "reference" / "nvidia-h200"


@pytest.fixture(autouse=True)
def _close():
    plt.show = lambda *a, **k: None
    yield
    plt.close("all")


def _ref(name):
    return json.loads((REF / f"{name}.json").read_text())


def _cmp(ref, name):
    return next(c for c in comparisons(ref) if c.name == name)


def _overlap(a, b):
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_mfu_legend_names_both_colours():
    """01 and 02: the MFU bars are red before, teal after; the legend once had one 'this run' entry in red."""
    ref = _ref("02_tensor_cores")
    fig = plots.mfu(_cmp(ref, "matrix size: many small matmuls vs one big one"), reference=comparisons(ref))
    ax = fig.axes[0]
    legend = {t.get_text(): matplotlib.colors.to_hex(h.get_facecolor())
              for t, h in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles)}
    bar_colours = {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches}
    assert set(legend.values()) == bar_colours  # every colour named, no name for a colour not drawn
    assert legend["before (this run)"] == plots.BEFORE and legend["after (this run)"] == plots.AFTER


def test_bars_value_above_error_bar_and_plain_thousands():
    fig = plots.bars(["a", "b"], [4.48, 1230.0], ylabel="x", fmt=__import__("gpulab.measuring.text", fromlist=["sig"]).sig,
                     err=[(4.4, 4.98), None])
    ax = fig.axes[0]
    texts = {t.get_text(): t for t in ax.texts}
    assert "1,230" in texts  # three significant figures, not 1.23e+03
    assert texts["4.48"].xy[1] >= 4.98  # the value sits above the error bar's cap, not on it


def test_short_labels_stay_flat_long_ones_turn():
    flat = plots.bars(["square matmul", "hidden size", "batch size", "sequence length"], [1, 2, 3, 4], ylabel="x")
    assert all(t.get_rotation() == 0 for t in flat.axes[0].get_xticklabels())
    long = plots.bars([f"a rather long label number {i}" for i in range(6)], [1] * 6, ylabel="x")
    assert all(t.get_rotation() != 0 for t in long.axes[0].get_xticklabels())
    fig = plots.bars(["x", "y"], [1, 2], ylabel="y", label="NVML utilization.gpu", ref=[1, 2], ref_label="events")
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["NVML utilization.gpu", "events"]


def test_timeline_panel_with_a_three_point_series_draws_it_as_points():
    """A panel where one side has 3 samples and the other 10 draws the short side as bare points, not a curve."""
    from gpulab.measuring.monitor import Trace

    long = Trace(duration_s=10, series={"cpu_percent": [(i, 5.0) for i in range(10)],
                                        "nvml_util": [(i / 5, 90.0) for i in range(50)]})
    short = Trace(duration_s=3, series={"cpu_percent": [(i, 6.0) for i in range(3)],
                                        "nvml_util": [(i / 5, 95.0) for i in range(15)]})
    fig = plots.timeline(("long", long), ("short", short), metrics=("nvml_util", "cpu_percent"))
    cpu_ax = fig.axes[1]
    styles = {line.get_label(): line.get_linestyle() for line in cpu_ax.lines}
    assert styles["short"] == "None" and styles["long"] != "None"  # three samples are points, not a curve
    assert len(fig.axes[0].lines) == 2  # NVML's many samples stay curves


def test_02_one_colour_per_dtype_and_sizes_on_the_axis():
    from gpulab.lessons import tensor_cores as TC
    from gpulab.workloads.matmuls import MatmulSweep
    from gpulab.measuring.peaks import MeasuredPeaks

    ref = _ref("02_tensor_cores")
    sweep, peaks = MatmulSweep.from_dict(ref["extra"]["sweep"]), MeasuredPeaks.from_dict(ref["extra"]["peaks"])
    TC.roofline(sweep, peaks, "bf16", "t")
    ax = plt.gcf().axes[0]
    colours = {matplotlib.colors.to_hex(c.get_facecolor()[0]) for c in ax.collections}
    assert colours == {TC.COLORS["bf16"]}  # the roofline's points in BF16's colour, not one colour a size
    plt.close("all")

    class Dev:
        name = "GPU"
    TC.sweep_figures(sweep, Dev, peaks, "bf16", None)
    ax = plt.gcf().axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(n) for n in sweep.sizes]


def test_03_modes_figure_leaves_out_what_has_no_compile():
    from gpulab.lessons import fusion as F3

    ref = _ref("03_fusion")
    figs = []
    plt.show = lambda *a, **k: figs.append(plt.gcf())
    F3.modes_figure(_cmp(ref, F3.INFER_NAME), ref["extra"]["modes"], ref, "t")
    labels = [t.get_text() for t in figs[0].axes[1].get_xticklabels()]
    assert "eager" not in labels and "CUDA graph" not in labels and any(t.startswith("max-autotune") for t in labels)
    assert "1 kernel generated" in repr(F3.FirstCall(seconds=0.5, kernels=1))


def test_03_bandwidth_legend_names_every_colour():
    from gpulab.lessons import fusion as F3

    ref = _ref("03_fusion")
    figs = []
    plt.show = lambda *a, **k: figs.append(plt.gcf())
    F3.bandwidth_figure(ref["extra"]["gelu_bandwidth_gbs"], ref)
    ax = figs[0].axes[0]
    named = {matplotlib.colors.to_hex(h.get_facecolor()) for h in ax.get_legend().legend_handles
             if hasattr(h, "get_facecolor") and not isinstance(h, matplotlib.lines.Line2D)}
    assert {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches} <= named


def test_11_breakdown_legend_clear_of_the_x_label():
    class BD:
        kernel_fraction = 0.97

        def per_step_ms(self):
            return {"kernels": 65.9, "memcpy/memset": 0.5, "idle: host launching": 0.55}

    fig = plots.time_breakdown({"my step": BD()})
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    xlabel = fig.axes[0].xaxis.label.get_window_extent(r)
    legend = fig.legends[0].get_window_extent(r)
    assert not _overlap(xlabel, legend)
