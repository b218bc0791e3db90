"""Figures of 06-09 and 11 as the H100 pages showed them (issue 26, second look): a line drawn across a missing
reading, 07's loss distance flattened by one curve, 08's 13-inch charts, percent ticks written as "10.0"."""
import math
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg", force=True)

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from gpulab.display import plots  # noqa: E402
from gpulab.tools.tracker import StepRecord  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_a_sweep_line_breaks_where_a_reading_is_missing():
    """06: GPM read nothing at batch 16 and 64 (n/a in the table), and the line ran straight across both."""
    fig = plots.sweep([8, 16, 32, 64, 128], {"SM active": [17.0, None, 42.0, None, 77.0]}, xlabel="batch",
                      ylabel="%", ref={"SM active": ([8, 16], [20.0, None])})
    ours, ref = fig.axes[0].lines
    assert [math.isnan(y) for y in ours.get_ydata()] == [False, True, False, True, False]
    assert math.isnan(ref.get_ydata()[1])


def _tracker(**kw):
    rs = [StepRecord(step=1 + 7 * i, gpu_ms=10.5, **kw) for i in range(10)]
    return SimpleNamespace(records=rs, peak_name="the BF16 peak", item_name="tokens", log_line=lambda r: "step")


def test_tracker_percent_ticks_are_plain_and_throughput_ticks_keep_si():
    """09 and 11: the MFU panel's ticks read "10.0", "2.00" (si's three figures, meant for 30 k samples/s)."""
    fig = plots.tracker_figure(_tracker(mfu=0.04, nvml_util=52.0))
    fig.canvas.draw()
    ticks = [t.get_text() for t in fig.axes[1].get_yticklabels() if t.get_text()]
    assert ticks and not any(t.endswith(".0") or t.endswith(".00") for t in ticks), ticks
    fig = plots.tracker_figure(_tracker(items_per_s=2.46e5))
    fig.canvas.draw()
    assert any(t.get_text().endswith(" k") for t in fig.axes[1].get_yticklabels())


def test_07_loss_distance_is_in_percent_with_the_tolerance_and_names_a_curve_off_the_scale():
    """07: FP16 without a scaler (+31%) set the distance panel's scale; six curves and the seed band sat in a
    sliver around zero."""
    from gpulab.lessons import mixed_precision as M

    n = 60
    fp32 = [3.0 - 0.01 * i for i in range(n)]
    losses = {"fp32": fp32, "fp16": [x * 1.005 for x in fp32], "bf16": [x * 0.996 for x in fp32],
              "fp16_noscale": [x * 1.31 for x in fp32]}
    fig = M.loss_figure(losses, [x * 1.002 for x in fp32])
    fig.canvas.draw()
    dist = fig.axes[1]
    lo, hi = dist.get_ylim()
    assert -10 < lo < -2 and 2 < hi < 10  # the 2% tolerance and the in-tolerance curves fill the panel
    texts = [t.get_text() for t in dist.texts]
    assert texts == ["FP16, no scaler: off the scale, ends +31%"]
    assert any(ln.get_label() == "tolerance ±2%" for ln in dist.lines)
    assert fig.get_figwidth() <= 9.5  # stacked at the page's width, not 12 in side by side
    colours = {ln.get_label(): ln.get_color() for ax in fig.axes for ln in ax.get_lines()}
    assert colours["FP16, no scaler"] == M.COLORS["fp16_noscale"]


def test_08_charts_fit_the_page_and_write_three_significant_figures(monkeypatch):
    """08: twelve bars drew a 12.8 in (tokens/s) and a 15.2 in (MFU) figure, shown at ~900 px: 5 px labels; the
    MFU bars read "4.4" beside the table's 4.41%, the table "12.55x" beside the verdict's 12.6x."""
    from gpulab.lessons import case_study as CS

    steps = [SimpleNamespace(label=f"+ change {i}", tokens_per_s=16_000.0 * (1 + i), mfu=0.0441 * (1 + i))
             for i in range(12)]
    figs = []
    monkeypatch.setattr(plt, "show", lambda: figs.append(plt.gcf()))
    CS.waterfall_figures(steps, None, matches=False, device_name="a GPU")
    assert [f.get_figwidth() for f in figs] == [10.0, 10.0]
    assert "4.41" in [t.get_text() for t in figs[1].axes[0].texts]
    fmt = {key: f for key, _, f in CS.WATERFALL_COLUMNS}
    assert fmt["cumulative"](12.551) == "12.6x" and fmt["gain"](1.0) == "1.00x"
    assert "\n12.6x" in plots.waterfall([("a", 1.0), ("b", 12.551)]).axes[0].texts[1].get_text()


def test_06_mfu_stays_visible_where_it_coincides_with_tensor_activity(monkeypatch):
    """06 on the H100: MFU and GPM's tensor activity were the same line, and the solid red hid the solid blue."""
    from gpulab.lessons import batch_size as M

    rows = [dict(batch_size=b, samples_per_s=100.0 * b, mfu=0.003 * b, nvml_util=20.0 + b, gpm_sm_active=10.0 + b,
                 gpm_tensor_active=0.3 * b, peak_mem_gb=0.1 * b, cpu_percent=None, oom=False) for b in (1, 2, 4, 8)]
    lesson = SimpleNamespace(gpu=True, reference=None, device=SimpleNamespace(memory_gb=85.0))
    figs = []
    monkeypatch.setattr(plt, "show", lambda: figs.extend(plt.figure(n) for n in plt.get_fignums()))
    M.sweep_figures(SimpleNamespace(ok=rows, seq_len=128), lesson, None, None)
    ax = figs[1].axes[0]  # throughput, utilization, memory
    assert ax.get_title() == "utilization"
    lines = {ln.get_label(): ln for ln in ax.lines}
    mfu, tensor = lines["MFU (%)"], lines["tensor active, GPM (%)"]
    assert mfu.get_linestyle() == "--" and mfu.get_zorder() > tensor.get_zorder()
    assert mfu.get_markersize() < tensor.get_markersize()  # the circles beneath still show
    legend = {t.get_text(): h for t, h in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles)}
    assert legend["MFU (%)"].get_linestyle() == "--"


def test_a_memory_peak_narrower_than_a_pixel_is_marked():
    """11 on the H100: the label said "peak 5.39 GB" over areas that stopped at 4.8 GB, the peak a temporary
    freed within a microsecond."""
    from gpulab.tools.traces import StepMemoryProfile

    times = [0.0, 5.0, 10.771, 10.772, 10.773, 20.0]
    act = [0, 4_000_000_000, 4_000_000_000, 5_000_000_000, 4_000_000_000, 0]
    cats = {"parameters": [100] * 6, "gradients": [0] * 6, "optimizer state": [0] * 6, "activations": act,
            "other": [0] * 6}
    fig = plots.memory_timeline(StepMemoryProfile("cuda:0", times, cats))
    marks = [ln for ln in fig.axes[0].lines if len(ln.get_xdata()) == 1 and ln.get_marker() not in ("None", "")]
    assert len(marks) == 1
    assert (marks[0].get_xdata()[0], marks[0].get_ydata()[0]) == pytest.approx((10.772, 5.0000001))
    assert fig.axes[0].get_ylim()[1] > 5.0


def test_si_ticks_drop_trailing_zeros_so_neighbours_read_alike():
    from gpulab.display.plots import si_tick
    assert [si_tick(v) for v in (0, 50e3, 100e3, 150e3, 2.5e6, 1.25e6)] == ["0", "50 k", "100 k", "150 k", "2.5 M",
                                                                            "1.25 M"]


def test_tracker_draws_one_to_three_monitor_readings_as_points_not_a_curve():
    """09: the loop ran about a second, NVML and GPM read at its last two records, and each was drawn as a
    dashed stub of a curve beside 150 steps of MFU."""
    rs = [StepRecord(step=1 + 7 * i, gpu_ms=5.9, mfu=0.28, nvml_util=99.0 if i >= 8 else None,
                     gpm_sm_active=50.0 if i >= 8 else None) for i in range(10)]
    fig = plots.tracker_figure(SimpleNamespace(records=rs, peak_name="the BF16 peak", item_name="samples",
                                               log_line=lambda r: "step"))
    lines = {ln.get_label(): ln for ln in fig.axes[1].lines}
    for name in ("GPU busy (NVML, %)", "SM active (GPM, %)"):
        assert lines[name].get_linestyle() == "None" and lines[name].get_marker() == "o"
    assert lines["MFU"].get_linestyle() == "-"
    fig = plots.tracker_figure(_tracker(mfu=0.04, nvml_util=52.0))  # every record read: a curve
    assert {ln.get_label(): ln.get_linestyle() for ln in fig.axes[1].lines}["GPU busy (NVML, %)"] == "--"
