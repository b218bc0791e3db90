"""A page's layout: the headline figure of its key results box, the folded parameters cell, the print stylesheet."""
import base64
import re

import nbformat
import pytest

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
    assert html.startswith("<details><summary>the sweep, every size</summary><table>") and "<b>raw</b>" in html
    assert repr(gl.fold(1, summary="x")) == "Folded('x', 1 output)"
    with pytest.raises(ValueError, match="summary"):
        gl.fold(1, summary=" ")
