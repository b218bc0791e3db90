"""A run without a GPU shows the reference GPU's numbers beside its own, without --compare, and says so."""
import json
import shutil
from pathlib import Path

import pytest

from gpulab.app import summary
from gpulab.app import summary_page
from gpulab.app.cpu_reference import default_compare, figure_inputs
from gpulab.measuring.device import DeviceInfo
from gpulab.verdicts.results import REFERENCE_SLUG

COMMITTED = Path(__file__).resolve().parents[1] / "data" / "reference" / REFERENCE_SLUG
CPU = DeviceInfo(kind="cpu", name="cpu")


@pytest.fixture
def reference(tmp_path, monkeypatch):
    """A small reference folder: the committed reference run's 00 and 01, under a data folder of the test's own."""
    folder = tmp_path / "data" / "reference" / REFERENCE_SLUG
    folder.mkdir(parents=True)
    for name in ("00_device.json", "01_measuring.json"):
        shutil.copy(COMMITTED / name, folder / name)
    monkeypatch.setenv("GPULAB_DATA", str(tmp_path / "data"))
    return folder


def _cpu_run(folder: Path) -> Path:
    """01's result as a smoke run on a CPU writes it: the reference's experiments and claims, on a CPU."""
    mine = json.loads((COMMITTED / "01_measuring.json").read_text()) | {"smoke": True, "device": CPU.to_dict()}
    (folder / "cpu").mkdir(parents=True)
    (folder / "cpu" / "01_measuring.json").write_text(json.dumps(mine))
    return folder / "cpu"


def test_a_cpu_run_compares_with_the_reference_gpu_by_default(reference, tmp_path):
    results, _ = summary.collect(_cpu_run(tmp_path / "mine"))
    folder, line = default_compare(results, None)
    assert folder == reference and "No GPU in this run" in line and "--compare" in line
    assert default_compare(results, tmp_path / "other") == (tmp_path / "other", None)  # the reader's choice stands
    gpu = {nb: {**d, "device": {**d["device"], "kind": "cuda"}} for nb, d in results.items()}
    assert default_compare(gpu, None) == (None, None)  # a GPU run is shown alone unless asked
    assert default_compare({}, None) == (None, None)


def test_no_reference_folder_means_no_comparison(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_DATA", str(tmp_path / "empty"))
    results, _ = summary.collect(_cpu_run(tmp_path / "mine"))
    assert default_compare(results, None) == (None, None)


def test_a_cpu_summary_shows_the_reference_numbers_and_its_chart(reference, tmp_path):
    md, png = summary_page.write_summary(_cpu_run(tmp_path / "mine"), tmp_path / "out")
    text = md.read_text()
    assert "No GPU in this run" in text and "reference ratio" in text and "reference verdict" in text
    ref = json.loads((reference / "01_measuring.json").read_text())
    head = summary.headline_gains(ref)[0][1]
    assert summary._ratio_str(head) in text  # the reference GPU's headline, beside this run's "—"
    assert png.stat().st_size > 0


def test_the_chart_of_a_cpu_run_draws_the_reference_gpus_gains_labelled_so(reference, tmp_path):
    results, _ = summary.collect(_cpu_run(tmp_path / "mine"))
    theirs, _ = summary.collect(reference)
    fig_results, fig_ref, title = figure_inputs(results, theirs, "cpu", summary.not_a_speed_run)
    assert set(fig_results) == {"01_measuring"} and fig_ref is None
    assert title.startswith("The reference GPU, NVIDIA H200") and "smoke run" in title
    gpu = {nb: {**d, "smoke": False, "device": {**d["device"], "kind": "cuda"}} for nb, d in results.items()}
    assert figure_inputs(gpu, theirs, "x", summary.not_a_speed_run)[:2] == (gpu, theirs)  # a GPU run: its own bars


def test_the_chart_of_a_few_notebooks_keeps_its_legend_off_its_axis_label(reference):
    """A CPU run of one or two notebooks draws one to three bars: the legend sat on the axis label, and a long name
    lost its end ("03 GELU: eager vs torch.compile…")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    theirs, _ = summary.collect(reference)
    fig = summary_page.summary_figure({"01_measuring": theirs["01_measuring"]}, title="t")
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ax = fig.axes[0]
    assert not ax.get_legend().get_window_extent(r).overlaps(ax.xaxis.label.get_window_extent(r))
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels and all("…" not in t and t.count("\n") <= 1 for t in labels), labels
    plt.close(fig)
