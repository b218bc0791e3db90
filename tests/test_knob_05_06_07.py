"""Notebooks 05, 06 and 07 edited as a reader would: the main knob changed in its cell, the notebook run at smoke
size, and the new value found in the labels and the result JSON, with no verdict about the old one."""
import html

import pytest

from _notebook_jobs import edited
from _notebook_run import html_outputs, judged

pytestmark = pytest.mark.notebook

AMP_FP16 = edited("07_mixed_precision", [("AMP_DTYPE = torch.bfloat16", "AMP_DTYPE = torch.float16")])
ONE_WORKER = edited("05_data_overlap", [("NUM_WORKERS = min(4, CORES)", "NUM_WORKERS = 1")])
BIG_BATCH_16 = edited("06_batch_size", [("BIG_BATCH = 64", "BIG_BATCH = 16")])


def _this_run_html(executed):
    """The HTML and Markdown this run showed, less the reference GPU's view (its labels are the reference run's)."""
    cells = [c for c in executed["cells"] if "reference_view" not in "".join(c["source"])]
    markdown = "".join("".join(o.get("data", {}).get("text/markdown", [])) for c in cells for o in c.get("outputs", []))
    return html.unescape(html_outputs({"cells": cells}) + markdown)


def _names(data):
    return [e["name"] for e in data["experiments"]]


def test_07_autocast_dtype_flows():
    data, executed = AMP_FP16.result()
    names = _names(data)
    assert "training step FP32 -> FP16 autocast" in names
    assert not any("BF16 autocast" in n for n in names)
    assert [e["headline"] for e in data["experiments"] if e["name"] == "training step FP32 -> FP16 autocast"] == [True]
    rows = {r["key"]: r for r in data["extra"]["precision_modes"]}
    assert rows["fp16_autocast"]["mode"] == "FP16 autocast" and "bf16" not in rows
    by = {c["key"]: c for c in data["claims"]}
    assert by["07.bf16_no_scaler"]["verdict"] == "not tested"
    assert "this run measures FP16 autocast" in by["07.bf16_no_scaler"]["note"]
    assert not any("BF16 autocast" in (c.get("note") or "") for c in judged(data))
    shown = _this_run_html(executed)
    assert "BF16 autocast" not in shown and "training step FP32 -> FP16 autocast" in shown


def test_05_worker_count_flows():
    data, executed = ONE_WORKER.result()
    mine = data["extra"]["my_loader"]
    assert mine["num_workers"] == 1 and "num_workers=1" in mine["label"]
    assert "num_workers=1, pin_memory=False" in _this_run_html(executed)


def test_06_batch_flows():
    data, executed = BIG_BATCH_16.result()
    step = data["extra"]["my_step"]
    assert (step["batch_size"], step["small_batch"], step["label"]) == (16, 2, "batch 2 -> 16")
    assert [e["headline"] for e in data["experiments"] if e["name"] == "batch 2 -> 16"] == [True]
    assert not any(e["name"] == "batch 4 -> 32" for e in data["experiments"])
    by = {c["key"]: c for c in data["claims"]}
    assert by["06.speed_8_64"]["verdict"] == "not tested"
    assert "batch 2 -> 16" in _this_run_html(executed)
