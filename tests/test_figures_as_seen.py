"""Figures of notebooks 04-06 as a reader sees them: every colour named, labels inside the frame and apart, no
curve through 1-3 samples, a bar that would only say "0 everywhere" left out and named."""
from types import SimpleNamespace

import matplotlib
import pytest

matplotlib.use("Agg", force=True)
import matplotlib.pyplot as plt  # noqa: E402

from gpulab.display import plots  # noqa: E402
from gpulab.lessons import data_overlap as DO  # noqa: E402
from gpulab.lessons import sync_points as SP  # noqa: E402
from gpulab.measuring.monitor import Trace  # noqa: E402
from test_results import make_result  # noqa: E402


@pytest.fixture(autouse=True)
def _keep_figures(monkeypatch):
    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    yield
    plt.close("all")


def _inside(fig, artist):
    fig.canvas.draw()
    box, frame = artist.get_window_extent(), fig.bbox
    return frame.x0 - 1 <= box.x0 and box.x1 <= frame.x1 + 1 and frame.y0 - 1 <= box.y0 and box.y1 <= frame.y1 + 1


def test_timeline_legend_sits_above_the_curves_and_short_series_are_points():
    """A legend in a corner hid the end of a curve; a 2-sample host-CPU series was drawn as a line."""
    long = [(i / 5, 50.0) for i in range(10)]
    before = Trace(series={"nvml_util": long, "cpu_percent": [(i, 90.0) for i in range(6)]})
    after = Trace(series={"nvml_util": long, "cpu_percent": [(1.0, 50.0), (1.2, 52.0)]})
    fig = plots.timeline(("starved", before), ("fed", after), metrics=("nvml_util", "cpu_percent"))
    nvml, cpu = fig.axes
    leg = nvml.get_legend()
    fig.canvas.draw()
    assert leg.get_window_extent().y0 >= nvml.get_window_extent().y1 - 1  # above the panel, over no curve
    assert _inside(fig, leg)
    styles = {ln.get_label(): ln.get_linestyle() for ln in cpu.lines}
    assert styles["starved"] == "-" and styles["fed"] == "None"


def test_timeline_drops_a_panel_of_few_samples_and_puts_its_means_in_the_legend():
    """04, 05, 06 and 08 drew panels that said "3 samples: too few for a curve" in place of a curve."""
    long = [(i / 5, 50.0) for i in range(10)]
    a = Trace(series={"nvml_util": long, "gpm_sm_active": [(0.5, 53.2)], "cpu_percent": [(0.5, 90.0)] * 4})
    b = Trace(series={"nvml_util": long, "cpu_percent": [(0.5, 60.0), (1.5, 62.0)]})
    fig = plots.timeline(("serial", a), ("side stream", b), metrics=("nvml_util", "gpm_sm_active", "cpu_percent"))
    assert len(fig.axes) == 1 and not fig.axes[0].texts  # NVML's curve alone, no empty panel
    labels = _legend_texts(fig.axes[0])
    assert labels[0] == "serial; mean SM active 53.2% (GPM), host CPU 90.0%"
    assert labels[1] == "side stream; mean host CPU 61.0%"  # no GPM sample: no mean claimed for it
    assert any("fewer than 5 samples" in t.get_text() for t in fig.texts)


def test_timeline_of_few_samples_everywhere_is_its_means_in_a_few_lines():
    """04's smoke page drew a frame a side with one host-CPU point at each end: no curve anywhere."""
    tr = Trace(series={"gpm_sm_active": [(0.5, 40.0)], "cpu_percent": [(0.5, 10.0), (1.5, 12.0)]})
    fig = plots.timeline(("loop", tr), ("other", None), metrics=("gpm_sm_active", "cpu_percent", "nvml_util"))
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    assert not ax.lines and texts[0] == "loop: SM active 40.0% (GPM), host CPU 11.0%"
    assert "too few for a curve" in texts[-1] and "not recorded: GPU busy" in texts[-1]
    assert fig.get_figheight() < 2


def test_timeline_names_a_metric_that_was_not_recorded_instead_of_drawing_its_panel():
    tr = Trace(series={"nvml_util": [(i / 5, 50.0) for i in range(10)]},
               available={"nvml_util": "ok", "gpm_sm_active": "GPM needs a Hopper or newer GPU"})
    fig = plots.timeline(("loop", tr), metrics=("nvml_util", "gpm_sm_active"))
    assert len(fig.axes) == 1
    assert any("SM active (GPM needs a Hopper or newer GPU)" in t.get_text() for t in fig.texts)


def test_timeline_legend_mean_is_the_tables_number():
    """04's timeline read "mean over the window: 61.8" (the two 1 s GPM samples) beside a comparison table that
    printed 72.2% (the window's whole GPM reading) for the same side and window."""
    long = [(i / 5, 50.0) for i in range(10)]
    a = Trace(series={"nvml_util": long, "gpm_sm_active": [(0.5, 50.0), (1.5, 73.6)]}, window={"gpm_sm_active": 72.2})
    b = Trace(series={"nvml_util": long, "gpm_sm_active": [(0.5, 70.0), (1.5, 76.6)]}, window={"gpm_sm_active": 73.8})
    fig = plots.timeline(("item", a), ("summed", b), metrics=("nvml_util", "gpm_sm_active"))
    text = " ".join(_legend_texts(fig.axes[0]))
    assert "item; mean SM active 72.2% (GPM)" in text and "summed; mean SM active 73.8%" in text and "61.8" not in text


def test_sweep_with_no_value_says_so():
    fig = plots.sweep([1, 2], {"x": [None, None]}, xlabel="n", ylabel="y")
    assert "no value measured" in fig.axes[0].texts[0].get_text()


def _legend_texts(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_mfu_legend_names_before_and_after():
    """Red and teal bars under a legend that named red alone ("this run")."""
    a = make_result().experiments[0]
    fig = plots.mfu(a, reference=[a])
    leg = fig.axes[0].get_legend()
    names = [t.get_text() for t in leg.get_texts()]
    assert names == ["before (this run)", "after (this run)", "reference GPU"]
    colours = [matplotlib.colors.to_hex(h.get_facecolor()) for h in leg.legend_handles]
    assert colours == [plots.BEFORE, plots.AFTER, plots.REF]


def test_speedup_labels_have_three_significant_figures_inside_the_frame():
    a = make_result(speedup=10.87).experiments[0]
    fig = plots.speedups(a, reference=[make_result(speedup=1.0).experiments[0]])
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text().endswith("x")]
    assert "10.9x" in [t.get_text() for t in labels]
    fig.canvas.draw()
    top = ax.get_window_extent().y1
    assert all(t.get_window_extent().y1 <= top for t in labels)  # the tallest bar's value clears the frame


def test_sweep_ceiling_label_is_inside_the_frame():
    fig = plots.sweep([1, 2, 4], {"GB": [1.0, 2.0, 4.0]}, xlabel="batch", ylabel="GB", hlines={"device memory": 85.0})
    ax = fig.axes[0]
    fig.canvas.draw()
    assert ax.texts[0].get_window_extent().y1 <= ax.get_window_extent().y1


def _side(mfu, busy):
    return SimpleNamespace(mfu=mfu, profile=SimpleNamespace(busy_fraction=busy))


def test_pairs_figure_leaves_out_an_all_zero_group_and_names_it():
    """A copy-only loop has no kernel in its trace: four bars of 0% GPU busy beside NVML's 91% misled."""
    cmp = lambda name, b, a: SimpleNamespace(name=name, before=_side(0.1, b), after=_side(0.2, a))  # noqa: E731
    groups = {"eval .cpu() per batch": cmp("eval", 0.42, 0.52), "pinned copy": cmp("pin", 0.0, 0.0),
              "two streams": cmp("streams", 0.52, 0.89), "two .item() vs one": cmp("twice", 0.44, 0.45)}
    SP.pairs_figure(groups, None, "busy", "GPU busy")
    fig = plt.gcf()
    ax = fig.axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert len(ticks) == 3 and not any("pinned" in t for t in ticks)
    assert "pinned copy" in fig._supxlabel.get_text()
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.get_xticklabels()]
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:]))  # tick labels apart
    assert fig.get_size_inches()[0] <= 10  # shown at about 900 px: not shrunk below readable


def test_throughput_sweep_uses_the_notebooks_colours_and_the_reference_sweep():
    """pin_memory False/True had matplotlib's default blue/orange while every later figure of 05 draws pageable
    red and pinned teal; the reference line came from another measurement (the longer windows)."""
    rows = [dict(num_workers=w, pin_memory=p, samples_per_s=100.0 * (w + 1) * (1.1 if p else 1)) for w in (0, 1)
            for p in (False, True)]
    pred = dict(load_s_per_batch=0.1, step_s_per_batch=0.02, cores=2)
    ref = {"extra": {"dataloader_sweep": {"rows": rows},
                     "utilization_by_workers": [dict(num_workers=0, samples_per_s=9000.0)]}}
    DO.sweep_figure(SimpleNamespace(rows=rows), [0, 1], (False, True), pred, 8, gpu=False, ref=ref)
    ax = plt.gcf().axes[0]
    colour = {ln.get_label(): matplotlib.colors.to_hex(ln.get_color()) for ln in ax.lines}
    assert colour["pin_memory=False"] == colour["pin_memory=False (reference GPU)"] == plots.BEFORE
    assert colour["pin_memory=True"] == colour["pin_memory=True (reference GPU)"] == plots.AFTER
    assert max(max(ln.get_ydata()) for ln in ax.lines if "reference" in ln.get_label()) < 9000


def test_search_tables_show_three_significant_figures_and_one_memory_unit():
    """05's settings table read 1127.8 samples/s and 'cpu percent'; 06's search read '2688.9 MiB' beside GB."""
    from gpulab.tools.batchsize import BatchSizeSearch
    from gpulab.tools.dataloading import DataLoaderTuning

    row = dict(num_workers=2, pin_memory=False, prefetch_factor=2, persistent_workers=True, samples_per_s=1127.8,
               seconds=0.5672, cpu_percent=13.3, batches=10)
    page = DataLoaderTuning([row], row, batch_size=64)._repr_html_()
    assert "1.13 k" in page and "567 ms" in page and "13.3%" in page and "1127.8" not in page
    assert "<th>samples/s</th>" in page and "cpu percent" not in page
    tried = [dict(batch_size=1, fits=True, samples_per_s=51.3, step_ms=19.5, peak_mem_bytes=2_819_500_000, error=None)]
    page = BatchSizeSearch(1, 1, tried)._repr_html_()
    assert "2.82 GB" in page and "19.5 ms" in page and "MiB" not in page and "<th>peak memory</th>" in page


def test_search_table_shortens_an_error_to_whole_sentences():
    """06's search cut PyTorch's out-of-memory message at 160 characters: '... Including non-PyTorch memory, this
    process h'."""
    from gpulab.tools.batchsize import BatchSizeSearch

    msg = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 16.50 GiB. GPU 0 has a total capacity of 79.18 GiB"
           " of which 5.99 GiB is free. Including non-PyTorch memory, this process h")
    tried = [dict(batch_size=86, fits=False, samples_per_s=None, step_ms=None, peak_mem_bytes=None, error=msg),
             dict(batch_size=87, fits=False, samples_per_s=None, step_ms=None, peak_mem_bytes=None,
                  error="MemoryError: " + "x" * 30 + " " + "y" * 70)]
    page = BatchSizeSearch(85, 80, tried)._repr_html_()
    assert "OutOfMemoryError: CUDA out of memory. Tried to allocate 16.50 GiB. …" in page
    assert "this process h" not in page and "y" * 70 not in page
    assert BatchSizeSearch(85, 80, tried).tried[0]["error"] == msg  # the record keeps the whole line
    assert "<td>no</td>" in page and "False" not in page  # the "fits" column in words, not Python
