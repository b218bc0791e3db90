"""Figures and tables of 07-09 as a reader sees them (issue 26): one bar per quantity, legends that name every
colour, values clear of whiskers, labels inside the figure, three significant figures."""
import matplotlib

matplotlib.use("Agg", force=True)

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from gpulab.display import plots  # noqa: E402
from gpulab.verdicts.experiment import Comparison
from gpulab.verdicts.run_result import RunResult  # noqa: E402
from gpulab.measuring.measurement import Measurement  # noqa: E402


def run(label, seconds):
    return RunResult(label, Measurement(label, [seconds] * 3), flops=1e12, dtype="bf16", peak_tflops=989.4)


def chain():
    """09's fixes: each measured against the previous fix's side (re-measured, so its MFU differs a little),
    and all fixes together against the same slow loop."""
    fix1 = Comparison("fix: A", run("slow loop", 0.30), run("+ A", 0.15))
    fix2 = Comparison("fix: B", run("+ A", 0.16), run("+ B", 0.14))
    total = Comparison("all fixes", run("slow loop", 0.31), run("all fixes", 0.12))
    return fix1, fix2, total


def inside(fig):
    """Every tick label, text and legend of the figure lies inside it (nothing cut off)."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    box = fig.bbox
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    shown = [t for t in ax.get_yticklabels() if lo <= t.get_position()[1] <= hi]  # ticks past the limits aren't drawn
    items = [*ax.get_xticklabels(), *shown, *ax.texts, ax.yaxis.label, ax.title]
    items += [ax.get_legend()] if ax.get_legend() else []
    for it in items:
        if it.get_visible() and (not hasattr(it, "get_text") or it.get_text()):
            e = it.get_window_extent(r)
            assert e.x0 >= box.x0 - 1 and e.x1 <= box.x1 + 1 and e.y0 >= box.y0 - 1 and e.y1 <= box.y1 + 1, it
    return True


def legend_colors(ax):
    leg = ax.get_legend()
    return {t.get_text(): to_hex(h.get_facecolor()) for t, h in zip(leg.get_texts(), leg.legend_handles)
            if hasattr(h, "get_facecolor")}


def test_mfu_draws_each_side_of_a_chain_of_fixes_once_with_short_labels():
    fig = plots.mfu(*chain(), title="MFU fix by fix")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["slow loop", "+ A", "+ B", "all fixes"]  # not "fix: B: + A", not the slow loop twice
    assert [p.get_height() for p in ax.patches] == pytest.approx([100 / 0.30 / 989.4, 100 / 0.15 / 989.4,
                                                                  100 / 0.14 / 989.4, 100 / 0.12 / 989.4])
    assert legend_colors(ax) == {"before (this run)": plots.BEFORE, "after (this run)": plots.AFTER}
    assert inside(fig)
    plt.close(fig)


def test_mfu_keeps_two_sides_of_the_same_label_on_different_work():
    """05 times a copy and a loop, both 'pageable': different work, two bars."""
    a = Comparison("copy", RunResult("pageable", Measurement("p", [0.2] * 3)),
                   RunResult("pinned", Measurement("q", [0.1] * 3)))
    b = Comparison("loop", run("pageable", 0.3), run("pinned", 0.2))
    fig = plots.mfu(a, b)
    assert len(fig.axes[0].get_xticklabels()) == 4
    plt.close(fig)


def test_bars_put_each_value_above_its_interval_and_name_every_colour():
    fig = plots.bars(["GPU-bound\nours", "GPU-bound\nguide §8.4", "launch-bound\nours", "launch-bound\nguide §8.4"],
                     [-0.2, 4.8, 0.2, -6.9], ylabel="% slower than no tracker", fmt="{:+.1f}",
                     colors=[plots.AFTER, plots.BEFORE] * 2, err=[(-0.4, 0.0), (-0.5, 10.2), (-5.6, 5.9), (-18.3, 4.4)],
                     legend=[("gpulab tracker", plots.AFTER), ("guide §8.4 tracker", plots.BEFORE)])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["-0.2", "+4.8", "+0.2", "-6.9"]
    assert [t.xy[1] for t in ax.texts] == pytest.approx([0.0, 10.2, 5.9, 4.4])  # the top of each interval
    assert all(t.get_rotation() == 0 for t in ax.get_xticklabels())  # short lines: no slanted two-line labels
    assert legend_colors(ax) == {"gpulab tracker": plots.AFTER, "guide §8.4 tracker": plots.BEFORE}
    assert inside(fig)
    plt.close(fig)


def test_waterfall_names_both_colours_and_writes_si_ticks():
    steps = [("naive FP32", 15_900.0), ("+ TF32", 48_100.0), ("+ BF16 autocast", 58_500.0)]
    fig = plots.waterfall(steps, ref=[("naive FP32", 16_000.0)])
    ax = fig.axes[0]
    assert legend_colors(ax) == {"this run: naive FP32": plots.BEFORE, "this run: after each change": plots.AFTER,
                                 "reference GPU": "#000000"}
    fig.canvas.draw()
    assert any(t.get_text().endswith(" k") for t in ax.get_yticklabels())  # 50 k, not 50000
    assert inside(fig)
    plt.close(fig)


def test_case_study_draws_the_naive_loop_in_one_colour_in_both_charts(monkeypatch):
    from gpulab.lessons import case_study as CS

    class Step:
        def __init__(self, label, tps, mfu):
            self.label, self.tokens_per_s, self.mfu = label, tps, mfu

    figs = []
    monkeypatch.setattr(plt, "show", lambda: figs.append(plt.gcf()))
    CS.waterfall_figures([Step("naive FP32", 15_900.0, 0.044), Step("+ TF32", 48_100.0, 0.133)], None,
                         matches=False, device_name="a GPU")
    assert len(figs) == 2
    firsts = [to_hex(f.axes[0].patches[0].get_facecolor()) for f in figs]
    assert firsts == [plots.BEFORE, plots.BEFORE]
    for f in figs:
        assert inside(f)
        plt.close(f)


def test_tables_beside_the_figures_write_three_significant_figures():
    from gpulab.tools.traces import TimeBreakdown
    from gpulab.measuring.text import power_of_two as _times

    assert _times(2.0**-10) == "2^-10" and _times(1.0) == "1" and _times(0.3) == "0.3"
    html = TimeBreakdown(steps=2, window_ms=659.234, ms={"kernels": 652.416, "idle: after a sync": 0.0},
                         kernels=1928)._repr_html_()
    assert "330 ms each" in html and "326 ms" in html and "99.0%" in html and "329.617" not in html


def test_tracker_log_line_writes_three_significant_figures():
    from types import SimpleNamespace

    from gpulab.tools.tracker import StepTracker

    t = SimpleNamespace(item_name="samples")
    r = SimpleNamespace(step=76, gpu_ms=8.18, items_per_s=500_971.0, tflops=201.8, mfu=0.204, nvml_util=66.0,
                        gpm_sm_active=21.0)
    line = "step 76 | 8.18 ms | 501 k samples/s | 202 TFLOP/s | MFU 20.4% | NVML 66% | SM active 21%"
    assert StepTracker.log_line(t, r) == line  # not 500,971 samples/s and 201.8 TFLOP/s
    r.gpu_ms, r.mfu = 13.51, 0.04  # two figures past ten, one lost to a fixed format: 13.51 ms, MFU 4.0%
    assert StepTracker.log_line(t, r).startswith("step 76 | 13.5 ms |") and "| MFU 4.00% |" in StepTracker.log_line(t, r)


def test_07_underflow_histogram_legend_clears_the_bars_and_never_rounds_to_all():
    """07 on the H100: the panel legend covered the logit histogram's tallest bars, and "100% below" sat over a
    bar of 8,192 logit gradients above FP16's smallest number (99.998%); the table said "100%" zeroed too."""
    from gpulab.workloads.training.numerics import UnderflowReport, plot_underflow, share

    assert share(0.9999794960021973) == "99.998%" and share(1.0) == "100%" and share(0.403) == "40.3%"
    assert share(0.0) == "0%" and share(1 - 1e-12) == "> 99.99999%"
    assert share(2.6e-9) == "< 0.001%"  # the H100 zeroed a few of 412 M gradients: the table raised ValueError
    logits = [0] * 48
    logits[18], logits[19], logits[34] = 143_475_424, 177_840_640, 8_191
    rows = [{"mode": "fp32", "logit_grads_zeroed": 0.0, "param_grads_zeroed": 0.0, "grad_rel_error": 0.0,
             "loss_scale": None},
            {"mode": "fp16_noscale", "logit_grads_zeroed": 0.99998, "param_grads_zeroed": 0.403,
             "grad_rel_error": 0.0248, "loss_scale": None},
            {"mode": "fp16_scaled", "logit_grads_zeroed": 2.6e-9, "param_grads_zeroed": 0.0, "grad_rel_error": 0.001,
             "loss_scale": 65536.0}]
    rep = UnderflowReport(rows=rows, loss_multiplier=1.0, scale=None, hist_edges=[-48.0 + i for i in range(49)],
                          hist_logits=logits, hist_params=[1] * 48, device="cuda:0")
    assert "99.998%" in rep._repr_html_() and "&lt; 0.001%" in rep._repr_html_()
    fig = plot_underflow(rep)
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["FP16 smallest normal 2^-14",
                                                                  "FP16 smallest subnormal 2^-24"]
    assert fig.axes[0].get_title().startswith("logit gradients: 99.997% below")  # 8,191 of 321 M above
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    leg = fig.legends[0].get_window_extent(r)
    for ax in fig.axes:  # above the panels and their titles, inside the figure, under its title
        assert leg.y0 >= ax.get_tightbbox(r).y1 - 1
    assert leg.y1 <= fig.bbox.y1 and leg.y1 <= fig._suptitle.get_window_extent(r).y0 + 1
    plt.close(fig)
