"""What a reader sees on a page: one verdict line per experiment and claim, the claims table grouped, keyed and
folded under its counts, the device table folded once, and exported HTML without noise (papermill's injected
cell, widgets, empty sections, frozen progress bars, warnings, absolute paths, raw dicts), its stylesheet cut to
what it uses, opened by a key results box that leads with the headline measurements."""
import html
import os
import re
from pathlib import Path

import nbformat
import pytest

import gpulab as gl
from gpulab.app import html_export
from gpulab.app.html_export import noise
from gpulab.verdicts.claims import Claim
from gpulab.verdicts.tally import claims_table_html
from test_results import make_result

REPO = str(Path(__file__).resolve().parents[1])


def test_not_comparable_claims_repeating_one_measurement_collapse_into_one_row_and_every_claim_shows_its_key():
    reason = "arr-coc module timings: another model on another GPU"
    claims = [Claim("BF16 2-3x", low=2, high=3, key="07.bf16_speed").check(2.5)]
    claims += [Claim(f"module {i} 45 -> 8 ms", low=5, key=f"08.module_{i}").not_comparable(1.5, reason)
               for i in range(16)]
    claims.append(Claim("one of its kind", low=1, key="08.alone").not_comparable(2.0, "an RTX 3090 review"))
    page = claims_table_html(claims)
    assert page.count("<tr>") == 1 + 1 + 1 + 1  # head, the measured claim, one group, the lone one
    assert page.count(reason) == 1 and "16 claims not comparable" in page and "<details>" in page
    assert all(f"08.module_{i}" in page for i in range(16)) and "07.bf16_speed" in page and "08.alone" in page


def test_the_lesson_shows_the_device_table_once_and_folded():
    les = gl.lesson("01_measuring", {"SMOKE": True}, full=dict(BIG_N=64), show=False)
    page = les._repr_html_()
    assert page.count("<details>") == 1 and page.count("<table") == 1
    assert page.index("<details>") < page.index("<table")


def _bar(text):
    return nbformat.v4.new_output("display_data", data={
        html_export.WIDGET_VIEW: {"model_id": "abc", "version_major": 2, "version_minor": 0}, "text/plain": text})


def _noisy_notebook(tmp_path):
    nb = nbformat.v4.new_notebook()
    md = nbformat.v4.new_markdown_cell("# 01 Measuring\n\nSome prose.")
    params = nbformat.v4.new_code_cell("SMOKE = False")
    params.metadata["tags"] = ["parameters"]
    injected = nbformat.v4.new_code_cell("# Parameters\nSMOKE = True\n")
    injected.metadata["tags"] = ["injected-parameters"]
    code = nbformat.v4.new_code_cell("x = 1")
    code.outputs = [
        _bar("  0%|          | 0/7 [00:00<?, ?it/s]"),
        _bar("interactive(children=(Dropdown(description='mode', options=('fp32', 'bf16'), value='fp32'), Output()), "
             "_dom_classes=('widget-interact',))"),
        nbformat.v4.new_output("stream", name="stderr", text=f"{REPO}/gpulab/experiment.py:59: UserWarning: MFU 101%"
                               " is over 100%\n  warnings.warn(\n"),
        nbformat.v4.new_output("stream", name="stdout",
                               text=f"saved {REPO}/runs/h100c/results/nvidia-h100/09_traces/0_slow.json.gz\n"
                                    f"trace in {Path.home()}/x.json and /work/elsewhere/data/results/a.json\n"
                                    "epoch 1:  50%\repoch 1: 100%\n"),
        nbformat.v4.new_output("display_data", data={"text/plain": f"'{REPO}/notebooks/01_measuring.ipynb'"}),
    ]
    sweep = nbformat.v4.new_code_cell("for n in tqdm(range(7)): pass")  # a bar on real work: the cell stays
    sweep.outputs = [_bar(" 100%|##########| 7/7 [00:01<00:00,  5.1it/s]")]
    try_it = nbformat.v4.new_markdown_cell("## 5. Try it: change the tiny kernels")
    control = nbformat.v4.new_code_cell("control_panel(run_tiny)")
    control.outputs = [_bar("interactive(children=(IntSlider(value=512, description='size'),))")]
    beside = nbformat.v4.new_markdown_cell("## This run beside the reference GPU")
    view = nbformat.v4.new_code_cell("gl.reference_view(res)")
    view.outputs = [nbformat.v4.new_output("execute_result", data={
        "text/plain": "<ReferenceView>", "text/html": "<p>This run is the reference run of 01_measuring: on other "
                                                      "GPUs, its numbers are the reference column.</p>"})]
    bare = nbformat.v4.new_markdown_cell("## 6. A heading with nothing under it")
    claims = nbformat.v4.new_markdown_cell("## Every claim of the section")
    table = nbformat.v4.new_code_cell("display(HTML(gl.claims_table_html(res.claims)))")
    table.outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "<HTML>", "text/html": claims_table_html([Claim("BF16 2-3x", low=2, high=3).check(2.5)])})]
    nb.cells = [md, params, injected, code, sweep, try_it, control, beside, view, bare, claims, table]
    path = tmp_path / "01_measuring.ipynb"
    nbformat.write(nb, str(path))
    return path


def test_noise_finds_each_kind_of_problem_in_synthetic_html():
    dict_lines = "\n".join(f"  &#x27;k{i}&#x27;: {i}," for i in range(25))
    page = ("<html><style>.x{content:'0%|'}</style><body>"
            "<pre>  0%|          | 0/7 [00:00&lt;?, ?it/s]</pre>"
            "<pre>100%|██████████| 7/7 [00:01&lt;00:00, 5.1it/s]</pre>"
            "<pre>interactive(children=(Dropdown(description=&#x27;mode&#x27;</pre>"
            "<pre>/opt/x/site-packages/torch/profiler.py:224: UserWarning: Profiler clears events</pre>"
            "<p>see /work/main/runs/h100a/results/x.json</p>"
            f"<pre>{{\n{dict_lines}\n}}</pre>"
            "<p>A profiler UserWarning is filtered where we call it; https://example.com/home/x is a URL.</p>"
            "</body></html>")
    found = noise(page)
    kinds = sorted({f.split(":")[0] for f in found})
    assert kinds == ["absolute path", "progress bar frozen at 0%", "raw dict of 27 lines", "warning",
                     "widget without a kernel"]
    assert sum(f.startswith("progress bar") for f in found) == 1  # 100% is finished, not frozen
    assert noise("<html><body><p>clean: 3.38x faster, 1 kernel, data/reference/x.json</p></body></html>") == []


def _headlined(speedup=2.5):
    """A result whose second experiment is its headline, beside a larger side gain that is not."""
    r = make_result("01_measuring", speedup=speedup)
    side = make_result("01_measuring", speedup=10.0).experiments[0]
    side.name = "side gain"
    r.experiments.insert(0, side)
    r.headlines.add("bf16 autocast")
    data = r.to_dict()
    data["claims"][0]["key"] = "01.bf16_speed"
    return data


def test_exported_page_has_no_noise_and_opens_with_key_results(tmp_path):
    pytest.importorskip("nbconvert")
    ipynb = _noisy_notebook(tmp_path)
    dest = html_export.export_html(ipynb, tmp_path / "page.html", result=_headlined())
    page = dest.read_text()
    assert noise(page) == [], noise(page)
    assert "gpulab-key-results" in page and "Key results" in page and "<b>bf16 autocast</b>: <b>2.50x faster" in page
    assert "1 claim: 1 confirmed" in page
    assert page.index("01 Measuring") < page.index("gpulab-key-results") < page.index("epoch 1")
    assert "UserWarning" not in page and "interactive control" not in page and "interactive(" not in page
    assert "results/nvidia-h100/09_traces/0_slow.json.gz" in page and "epoch 1: 100%" in page
    assert REPO not in page and str(Path.home()) + "/" not in page


def test_exported_page_drops_the_injected_parameters_the_controls_and_the_empty_sections(tmp_path):
    pytest.importorskip("nbconvert")
    html = html_export.export_html(_noisy_notebook(tmp_path), tmp_path / "page.html", result=_headlined()).read_text()
    page = re.sub(r"<[^>]+>", "", html)  # the code as a reader sees it, without the highlighting's spans
    assert "SMOKE = False" in page and "# Parameters" not in page and "injected-parameters" not in page
    assert "Try it: change the tiny kernels" not in page and "control_panel" not in page  # a control, no kernel
    assert "beside the reference GPU" not in page and "This run is the reference run" not in page
    assert "A heading with nothing under it" not in page
    assert "tqdm(range(7))" in page  # a progress bar goes, the work it sat on stays
    assert "Every claim of the section" in page and "gpulab-claims" in html  # a section with something to show


def test_key_results_lead_with_the_headline_and_show_no_internal_keys():
    box = html_export.key_results_html(_headlined())
    assert box.index("bf16 autocast") < box.index("1 claim: 1 confirmed")
    assert "side gain" not in box  # larger, but not what the page is about
    assert "01.bf16_speed" not in box and "<code>" not in box
    assert "time per call 25.0 ms -&gt; 10.0 ms, MFU 0.0404% -&gt; 0.101%" in box  # before -> after
    assert box.count("<li>") == 1


def test_key_results_of_an_older_file_without_headlines_lead_with_its_largest_gain():
    data = _headlined()
    for e in data["experiments"]:
        e.pop("headline")
    box = html_export.key_results_html(data)
    assert "<b>side gain</b>: <b>10.0x faster" in box and "bf16 autocast" not in box


def test_a_smoke_result_gives_no_gain_in_the_key_results():
    data = make_result("01_measuring", smoke=True).to_dict()
    assert "smoke run: not a speed measurement" in html_export.key_results_html(data)


def test_prune_css_keeps_the_rules_and_variables_the_page_uses():
    css = ("/* licence */ :root { --used: red; --chain: var(--used); --icon: url(data:image/svg+xml;base64,AAAA); "
           "--unused: blue } .jp-Cell { color: var(--chain) } .jp-Widget { color: var(--icon) } "
           "div:not(.jp-mod-hidden) { margin: 0 } @media print { .jp-Cell { color: black } .jp-Toolbar { x: 1 } }"
           + " " * 10_000)
    page = f"<html><head><style>{css}</style></head><body><div class='jp-Cell'>x</div></body></html>"
    out = html_export.prune_css(page)
    assert ".jp-Cell" in out and "--used: red" in out and "--chain" in out and "div:not(.jp-mod-hidden)" in out
    assert ".jp-Widget" not in out and "--icon" not in out and "--unused" not in out and ".jp-Toolbar" not in out
    assert "@media print" in out and "Jupyter Development Team" in out  # the licence named once
    small = "<html><head><style>.x { color: red }</style></head><body></body></html>"
    assert html_export.prune_css(small) == small  # a page's own small block: as written


def test_comparison_and_claim_show_one_verdict_line_with_the_rest_folded():
    cmp = make_result().experiments[0]
    page = cmp._repr_html_()
    summary = page.split("<summary>")[1].split("</summary>")[0]
    assert page.startswith("<details") and "bf16 autocast" in summary and "2.00x faster" in summary
    assert "interval" in summary and "<table" not in summary and "<table" in page  # the table folded
    claim = Claim("2-3x faster", low=2, high=3, source="guide §7.1").check(2.5)
    line = claim._repr_html_().split("<summary>")[1].split("</summary>")[0]
    assert "2-3x faster" in line and "CONFIRMED" in line and "guide §7.1" not in line


def test_the_full_claims_table_is_folded_under_a_count():
    claims = [Claim("BF16 2-3x", low=2, high=3, key="07.bf16_speed").check(2.5),
              Claim("FP16 2-3x", low=2, high=3, key="07.fp16_speed").check(1.2),
              Claim("FP8", low=1.5, key="07.fp8").untestable("no FP8 here")]
    page = claims_table_html(claims, "07 · every claim")
    assert page.startswith("<details") and page.index("<summary>") < page.index("</summary>") < page.index("<table")
    summary = page.split("<summary>")[1].split("</summary>")[0]
    assert "3 claims: 1 confirmed, 1 refuted (lower than claimed), 1 not tested" in summary
    assert "07 · every claim" in summary


def test_scrub_paths_makes_paths_relative():
    s = html_export.scrub_paths
    assert s(f"{REPO}/data/reference/x.json") == "data/reference/x.json"
    assert s("/work/main/runs/h100c/results/a.json") == "results/a.json"
    assert s("/opt/torch/.venv/lib/python3.12/site-packages/torch/profiler/profiler.py:224") == \
        "torch/profiler/profiler.py:224"
    assert s(f"{os.path.expanduser('~')}/notes.txt").startswith("~/")


def test_widgets_vanish_from_a_static_page():
    outs = html_export.clean_outputs([
        _bar("HBox(children=(HTML(value=''), FloatProgress(value=0.0, max=7.0), HTML(value='')))"),
        _bar(" 30%|###       | 3/10 [00:01<00:02,  3.1it/s]"),
        _bar("batch size search: 0try [00:00, ?try/s]"),  # a bar with no total: 06's page called it a control
        _bar("batch size search: 12try [00:31,  2.6s/try]"),
        _bar("HBox(children=(Button(description='run'),))"),
        nbformat.v4.new_output("stream", name="stdout", text="step 1/3\rstep 2/3\rstep 3/3 done\n")])
    assert len(outs) == 1 and outs[0]["text"] == "step 3/3 done\n"  # bars and the button: no kernel to draw them


@pytest.mark.notebook
def test_an_exported_smoke_page_opens_with_its_results_and_folds_its_claims(smoke_run, tmp_path):
    """01 at smoke size, exported as the course exports a run: no injected parameters cell, no widget, no section
    left empty, the key results box under the title led by the headline, the claims table folded."""
    pytest.importorskip("nbconvert")
    import json

    data, executed = smoke_run("01_measuring")
    ipynb = tmp_path / "01_measuring.ipynb"
    ipynb.write_text(json.dumps(executed))
    page = html_export.export_html(ipynb, tmp_path / "page.html", result=data).read_text()
    assert noise(page) == [], noise(page)
    assert "celltag_injected-parameters" not in page and "interactive control" not in page
    nb = nbformat.reads(json.dumps(executed), as_version=4)
    html_export.clean_notebook(nb)
    levels = [html_export._heading(c) for c in nb.cells]
    for i, level in enumerate(levels):  # every heading has prose or a cell under it
        if level and not html_export._prose(nb.cells[i]):
            assert i + 1 < len(levels) and not 0 < levels[i + 1] <= level, nb.cells[i].source
    assert not any(c.get("metadata", {}).get(html_export.NOTHING) for c in nb.cells)
    box = page[page.index("gpulab-key-results"):]
    box = box[:box.index("</div>")]
    assert page.index("gpulab-key-results") < page.index("jp-CodeCell")  # under the title, before any code
    headlines = [e["name"] for e in data["experiments"] if e.get("headline")]
    if headlines:
        assert box.index("<li>") < box.index(html.escape(headlines[0])) < box.index("</li>")
    assert "claims:" in box and "<code>" not in box
    assert "<details class='gpulab-claims'>" in page or '<details class="gpulab-claims">' in page
