"""What the pages of 01-05 showed on a second look, drawn on the CPU from the committed reference results:
no legend entry or empty slot for a reference GPU that is not there, eager in 03's eager colour, values and
headlines at three significant figures, the roofline's ridge line named, one unit for a bandwidth."""
import json
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gpulab.display import plots  # noqa: E402
from gpulab.verdicts.results import comparisons  # noqa: E402
from gpulab.measuring.text import pct, sig  # noqa: E402

REF = Path(__file__).resolve().parents[1] / "data" / "reference" / "nvidia-h200"


@pytest.fixture
def shown(monkeypatch):
    figs = []
    monkeypatch.setattr(plt, "show", lambda *a, **k: figs.append(plt.gcf()))
    yield figs
    plt.close("all")


def _ref(name):
    return json.loads((REF / f"{name}.json").read_text())


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def _colours(patches):
    return [matplotlib.colors.to_hex(p.get_facecolor()) for p in patches]


def test_04_pairs_without_a_reference_draw_no_grey_slot_and_three_figures(shown):
    """The reference page (no reference GPU beside it) named two grey colours it never drew, beside half-width
    bars with an empty slot each; its MFU values read 14 and 13 for 14.2 and 13.2."""
    from gpulab.lessons import sync_points as SP

    ref = _ref("04_sync_points")
    cs = list(comparisons(ref))
    loops = {"two .item() vs one": cs[0], ".item() vs GPU sum": cs[1]}
    SP.pairs_figure(loops, None, "mfu", "t")
    ax = shown[-1].axes[0]
    assert _legend(ax) == ["before", "after"]
    assert set(_colours(ax.patches)) == {plots.BEFORE, plots.AFTER}
    assert all(abs(p.get_width() - 0.4) < 1e-9 for p in ax.patches)  # the pair fills its slot
    values = [t.get_text() for t in ax.texts]
    assert values[0] == sig(cs[0].before.mfu * 100) and all("." in v for v in values)  # 14.0, not 14
    SP.pairs_figure(loops, ref, "mfu", "t")  # beside a reference: its two grey bars, named
    assert _legend(shown[-1].axes[0])[2:] == ["reference GPU, before", "reference GPU, after"]


def test_03_modes_figure_eager_red_no_empty_reference(shown):
    """The modes chart listed a 'reference GPU' it did not draw and drew eager in teal, 03's fused colour."""
    from gpulab.lessons import fusion as F3

    ref = _ref("03_fusion")
    cmp = next(c for c in comparisons(ref) if c.name == F3.INFER_NAME)
    F3.modes_figure(cmp, ref["extra"]["modes"], None, "t")
    times, compile_ = shown[-1].axes
    assert _legend(times) == ["eager, this run", "graph or compiled, this run"]
    assert _legend(compile_) == ["graph or compiled, this run"]  # no eager bar there: no eager entry
    assert _colours(times.patches)[0] == plots.BEFORE and set(_colours(times.patches[1:])) == {plots.AFTER}
    compile_s = [m["compile_s"] for m in ref["extra"]["modes"] if m.get("ok")]
    assert [t.get_text() for t in compile_.texts if t.get_text()] == [sig(v) for v in compile_s]  # 74.0 s, not 74
    F3.modes_figure(cmp, ref["extra"]["modes"], ref, "t")
    assert _legend(shown[-1].axes[0])[-1] == "reference GPU"


def test_03_bandwidth_in_the_pages_unit(shown):
    """Bars in GB/s (2,940) under a legend and text in TB/s (3.00 TB/s): one unit for one quantity."""
    from gpulab.lessons import fusion as F3

    ref = _ref("03_fusion")
    F3.bandwidth_figure(ref["extra"]["gelu_bandwidth_gbs"], None)
    ax = shown[-1].axes[0]
    assert ax.get_ylabel() == "TB/s" and max(p.get_height() for p in ax.patches) < 10


def test_02_roofline_legend_names_points_and_ridge(shown, monkeypatch):
    from gpulab.lessons import tensor_cores as TC
    from gpulab.workloads.matmuls import MatmulSweep
    from gpulab.measuring.peaks import MeasuredPeaks

    monkeypatch.setattr(TC, "_show", lambda: shown.append(plt.gcf()))
    ref = _ref("02_tensor_cores")
    sweep, peaks = MatmulSweep.from_dict(ref["extra"]["sweep"]), MeasuredPeaks.from_dict(ref["extra"]["peaks"])
    table = TC.roofline(sweep, peaks, "bf16", "t")
    names = _legend(shown[-1].axes[0])
    assert any(n.startswith("BF16") for n in names) and any(n.startswith("ridge point") for n in names)
    share = [p.tflops / min(peaks.tflops["bf16"], p.intensity * peaks.copy_gbs / 1e3) for p in sweep.points
             if p.dtype == "bf16"]
    assert all(f"| {pct(v)} |" in table for v in share)  # three significant figures (it read 96% for 96.5%)


def test_headlines_and_times_at_three_significant_figures():
    """'382.26x faster' and '48.94x faster' on 01 and 02; '11 ms ± 174 µs' on 03."""
    from gpulab.measuring.measurement import Speedup, fmt_time

    assert Speedup("a", "b", 382.26, False, 369.0, 394.0).verdict == "382x faster"
    assert Speedup("a", "b", 0.5, False, 0.49, 0.51).verdict == "2.00x slower"
    assert fmt_time(0.011) == "11.0 ms" and fmt_time(15e-3) == "15.0 ms" and fmt_time(1234.0) == "1,230 s"


def test_claim_band_singular_and_ratios_at_three_figures():
    """04 read 'expected >= 1 syncs per step'; 03 read 'measured 3x' and '46% [45.5, 47.5]'."""
    from gpulab.verdicts.claims import Claim

    assert Claim("t", low=1, unit="syncs per step").expected == ">= 1 sync per step"
    assert Claim("t", high=0, unit="syncs per step").expected == "<= 0 syncs per step"
    assert Claim("t", low=7, high=9, unit="kernels").expected == "7–9 kernels"
    assert "measured 3.00x" in Claim("t", low=2.5, high=3.5, unit="x").check(3.0)._repr_html_()
    c = Claim("t", low=30, high=100, unit="%").check(46.0, interval=(45.5, 47.5))
    assert c._measured_str() == "46.0% [45.5, 47.5]"
    assert Claim("t", low=3, high=3, unit="kernels").check(8)._measured_str() == "8 kernels"  # a count stays whole


def test_02_roofline_labels_stay_under_the_roof(shown, monkeypatch):
    """On the third H100 page the label of n=2048, just under the compute ceiling, was struck through by it."""
    from gpulab.lessons import tensor_cores as TC
    from gpulab.workloads.matmuls import MatmulSweep
    from gpulab.measuring.peaks import MeasuredPeaks

    monkeypatch.setattr(TC, "_show", lambda: shown.append(plt.gcf()))
    ref = _ref("02_tensor_cores")
    sweep, peaks = MatmulSweep.from_dict(ref["extra"]["sweep"]), MeasuredPeaks.from_dict(ref["extra"]["peaks"])
    TC.roofline(sweep, peaks, "bf16", "t")
    fig = shown[-1]
    ax = fig.axes[0]
    fig.canvas.draw()
    peak, bw = peaks.tflops["bf16"], peaks.copy_gbs
    labels = [t for t in ax.texts if t.get_text().isdigit()]
    assert len(labels) == len([p for p in sweep.points if p.dtype == "bf16"])
    for t in labels:
        (x0, y0), (x1, y1) = ax.transData.inverted().transform(t.get_window_extent().get_points())
        roof = min(min(peak, x * bw / 1e3) for x in (x0, x1))
        assert y1 < roof, f"label {t.get_text()} reaches {y1:.0f} TFLOP/s, over the roof at {roof:.0f}"

