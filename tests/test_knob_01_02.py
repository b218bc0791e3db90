"""Notebooks 01 and 02: a reader's edit of the main knob flows into the labels, the result JSON and the verdicts."""
import json

import pytest

from _notebook_jobs import edited
from _notebook_run import judged

MM_FP16 = edited("01_measuring", [('MM_DTYPE = "bf16"', 'MM_DTYPE = "fp16"')])
LOW_FP16 = edited("02_tensor_cores", [('LOW = "bf16"', 'LOW = "fp16"')])


def _all_text(data: dict, executed: dict) -> str:
    outs = []
    for c in executed["cells"]:
        for o in c.get("outputs", []):
            outs += [str(v) for v in o.get("data", {}).values()] + [o.get("text", "")]
    return json.dumps(data) + "\n".join(str(x) for x in outs)


@pytest.mark.notebook
def test_01_matmul_dtype_edit_flows_through():
    data, executed = MM_FP16.result()
    assert data["params"]["MM_DTYPE"] == "fp16"
    peaks = data["extra"]["peaks"]
    assert "fp16" in peaks["tflops"] and "bf16" not in peaks["tflops"] and peaks["search"]["fp16"]
    assert "FP16" in _all_text(data, executed)  # the search figure's legend and the peaks table
    for c in judged(data):
        assert "bf16" not in json.dumps(c).lower(), c["key"]


@pytest.mark.notebook
def test_02_shape_dtype_edit_flows_through():
    data, executed = LOW_FP16.result()
    assert data["params"]["LOW"] == "fp16"
    assert data["extra"]["best_shape_as_linear"]["dtype"] == "fp16"
    size = next(e for e in data["experiments"] if e["name"].startswith("matrix size"))
    labels = json.dumps(size)
    assert "fp16" in labels and "bf16" not in labels
    assert "nn.Linear" in _all_text(data, executed) and "fp16" in _all_text(data, executed)
    for c in judged(data):
        if c["key"].startswith(("align_", "tensor_")):
            assert "bf16" not in json.dumps(c).lower(), c["key"]
