"""What a reader sees on a page: the claims table grouped and keyed, the device table folded once, and exported
HTML without noise (frozen progress bars, widget reprs, warnings, absolute paths, raw dicts) opened by a key
results box."""
import copy
import os
from pathlib import Path

import nbformat
import pytest

import gpulab as gl
from gpulab.app import html_export
from gpulab.app.html_export import noise
from gpulab.claims import Claim, claims_table_html
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
    nb.cells = [md, code]
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


def test_exported_page_has_no_noise_and_opens_with_key_results(tmp_path):
    pytest.importorskip("nbconvert")
    ipynb = _noisy_notebook(tmp_path)
    data = make_result("01_measuring", speedup=2.5).to_dict()
    data["claims"][0]["key"] = "01.bf16_speed"
    dest = html_export.export_html(ipynb, tmp_path / "page.html", result=data)
    page = dest.read_text()
    assert noise(page) == [], noise(page)
    assert "gpulab-key-results" in page and "Key results" in page and "2.50x: bf16 autocast" in page
    assert "01.bf16_speed" in page and "1 confirmed" in page
    assert page.index("01 Measuring") < page.index("gpulab-key-results") < page.index("epoch 1")
    assert "An interactive control (interactive)" in page and "UserWarning" not in page
    assert "results/nvidia-h100/09_traces/0_slow.json.gz" in page and "epoch 1: 100%" in page
    assert REPO not in page and str(Path.home()) + "/" not in page


def test_a_smoke_result_gives_no_gain_in_the_key_results():
    data = make_result("01_measuring", smoke=True).to_dict()
    assert "smoke run: not a speed measurement" in html_export.key_results_html(data)


def test_scrub_paths_makes_paths_relative():
    s = html_export.scrub_paths
    assert s(f"{REPO}/data/reference/x.json") == "data/reference/x.json"
    assert s("/work/main/runs/h100c/results/a.json") == "results/a.json"
    assert s("/opt/torch/.venv/lib/python3.12/site-packages/torch/profiler/profiler.py:224") == \
        "torch/profiler/profiler.py:224"
    assert s(f"{os.path.expanduser('~')}/notes.txt").startswith("~/")


def test_progress_bar_widgets_vanish_and_other_widgets_become_a_note():
    outs = html_export.clean_outputs([
        _bar("HBox(children=(HTML(value=''), FloatProgress(value=0.0, max=7.0), HTML(value='')))"),
        _bar(" 30%|###       | 3/10 [00:01<00:02,  3.1it/s]"),
        _bar("batch size search: 0try [00:00, ?try/s]"),  # a bar with no total: 06's page called it a control
        _bar("batch size search: 12try [00:31,  2.6s/try]"),
        _bar("HBox(children=(Button(description='run'),))"),
        nbformat.v4.new_output("stream", name="stdout", text="step 1/3\rstep 2/3\rstep 3/3 done\n")])
    assert len(outs) == 2 and "interactive control (HBox)" in outs[0]["data"]["text/plain"]
    assert outs[1]["text"] == "step 3/3 done\n"
