"""A page's layout: the headline figure of its key results box, the folded parameters cell, the print stylesheet."""
import base64
import copy
import re

import nbformat
import pytest
from matplotlib.text import Text

from gpulab.app import html_export, page_layout
from gpulab.app.summary import gain
from test_results import make_result


def test_headline_figure_draws_the_headline_before_and_after_with_its_mfu():
    e = make_result(speedup=2.5).to_dict()["experiments"][0]
    png = page_layout.headline_figure_png([e], [gain(e)])
    assert png is not None and png.startswith(b"\x89PNG")
    html = page_layout.headline_figure_html([e], [gain(e)])
    src = re.search(r"base64,([^']+)'", html).group(1)
    assert base64.b64decode(src).startswith(b"\x89PNG") and "bf16 autocast" in html


def test_headline_figure_is_left_out_when_a_side_has_no_numbers():
    e = make_result().to_dict()["experiments"][0]
    e["after"]["summary"] = {}
    assert page_layout.headline_figure_png([e], [gain(e)]) is None
    assert page_layout.headline_figure_html([e], [gain(e)]) == ""


def test_key_results_of_a_gpu_run_carry_the_figure_and_of_a_smoke_run_none():
    assert "data:image/png;base64," in html_export.key_results_html(make_result().to_dict())
    assert "<img" not in html_export.key_results_html(make_result(smoke=True).to_dict())


def test_parameters_cell_is_folded_with_every_value_and_a_count():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 01"),
                nbformat.v4.new_code_cell("SMOKE = False  # tiny sizes\nBIG_N = None  # <4096>\n",
                                          metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("x = 1")]
    page_layout.fold_parameters(nb)
    folded = nb.cells[1]
    assert folded.cell_type == "markdown" and folded.source.startswith("<details><summary>Parameters (2;")
    assert "BIG_N = None  # &lt;4096&gt;" in folded.source and nb.cells[2].source == "x = 1"


def test_print_stylesheet_goes_in_the_head_and_hides_the_prompts():
    page = page_layout.add_print_css("<html><head><title>t</title></head><body>x</body></html>")
    head = page.split("</head>")[0]
    assert "@media print" in head and "@page { size: A4" in head and ".jp-InputPrompt" in head
    assert page_layout.add_print_css("<p>x</p>").endswith("<p>x</p>")


def test_exported_page_prints_with_the_stylesheet_and_folded_parameters(tmp_path):
    pytest.importorskip("nbconvert")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 01 Measuring"),
                nbformat.v4.new_code_cell("SMOKE = False\n", metadata={"tags": ["parameters"]})]
    nbformat.write(nb, str(tmp_path / "01.ipynb"))
    page = html_export.export_html(tmp_path / "01.ipynb", result=make_result().to_dict()).read_text()
    assert "@media print" in page and "<details><summary>Parameters (1;" in page


def test_fold_puts_outputs_under_a_summary_and_refuses_an_empty_one():
    import gpulab as gl

    class Table:
        def _repr_html_(self):
            return "<table><tr><td>1</td></tr></table>"

    html = gl.fold(Table(), "<b>raw</b>", summary="the sweep, every size")._repr_html_()
    assert html.startswith("<details class='gpulab-fold'><summary>the sweep, every size</summary><table>")
    assert "<b>raw</b>" in html
    assert repr(gl.fold(1, summary="x")) == "Folded('x', 1 output)"
    with pytest.raises(ValueError, match="summary"):
        gl.fold(1, summary=" ")


def test_a_time_per_call_prints_in_ms_not_as_a_milli_of_a_millisecond():
    assert page_layout.value_text(0.2, "time per call (ms)") == "0.200 ms"
    assert page_layout.value_text(77.6, "time per call (ms)") == "77.6 ms"
    assert page_layout.value_text(2.27e6, "tokens/s") == "2.27 M"


def test_long_labels_wrap_at_spaces():
    assert page_layout.wrap_label("torch.compile (mode=default)") == "torch.compile\n(mode=default)"
    assert page_layout.wrap_label("eager") == "eager"
    assert all(len(line) <= 26 for line in page_layout.wrap_label("max-autotune-no-cudagraphs mode").split("\n"))


def test_headline_figure_keeps_titles_labels_and_values_inside_and_apart():
    """03's page: the row titles sat on the panels' titles, "torch.compile (mode=default)" lost its left edge and
    the axis read "1e11"; 01's read "200 m" for 0.2 ms."""
    e = make_result(speedup=2.5).to_dict()["experiments"][0]
    e["before"]["label"], e["after"]["label"] = "eager", "torch.compile (mode=default)"
    e["name"] = "GPT training step: eager vs torch.compile (mode=default)"
    t = copy.deepcopy(e)
    t["before"]["summary"] = {"median_ms": 77.6}
    t["after"]["summary"] = {"median_ms": 0.2}
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = page_layout.headline_figure([e, t], [gain(e), gain(t)])
    FigureCanvasAgg(fig).draw()
    r = fig.canvas.get_renderer()
    box = fig.bbox
    texts = [x for x in fig.findobj(Text) if x.get_visible() and x.get_text().strip()]
    for x in texts:
        b = x.get_window_extent(r)
        assert b.x0 >= box.x0 - 1 and b.x1 <= box.x1 + 1 and b.y0 >= box.y0 - 1 and b.y1 <= box.y1 + 1, x.get_text()
    titles = [x.get_window_extent(r) for x in texts if x.get_text().startswith(("GPT training", "bf16"))]
    panels = [x.get_window_extent(r) for x in texts if x.get_text() in ("MFU (%)", "time per call (ms)")]
    assert titles and panels and not any(a.overlaps(b) for a in titles for b in panels)
    shown = {x.get_text().strip() for x in texts}
    assert "0.200 ms" in shown and "77.6 ms" in shown and not any(s.endswith(" m") for s in shown)
    assert not any("1e" in s for s in shown)  # no axis offset text


def test_the_print_stylesheet_wraps_code_and_says_where_a_folded_table_is():
    """On A4, 152 code lines ran off the right edge, and "(the full table: click)" led nowhere on paper."""
    import gpulab as gl
    from gpulab.verdicts.claims import Claim
    from gpulab.verdicts.tally import claims_table_html

    folded = gl.fold("<table><tr><td>1</td></tr></table>", summary="every size")._repr_html_()
    claims = claims_table_html([Claim("x", low=1, unit="x", key="01.x").check(2.0)])
    page = page_layout.add_print_css(f"<html><head></head><body>{folded}{claims}</body></html>")
    css = page.split("</head>")[0].split("@media print")[1]
    assert "white-space: pre-wrap" in css and "overflow-wrap: anywhere" in css  # no code line runs off the page
    for cls in ("gpulab-fold", "gpulab-claims", "gpulab-reference"):
        assert f"details.{cls}:not([open]) > summary::after" in css and "HTML" in page_layout.PRINT_NOTES[cls]
        assert cls == "gpulab-reference" or f"<details class='{cls}'>" in page  # the classes the notes select
