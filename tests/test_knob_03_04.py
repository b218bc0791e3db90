"""A reader turns each notebook's main knob and reruns at smoke size: labels, names and verdicts follow the edit."""
import json

import pytest

from _notebook_jobs import edited
from _notebook_run import judged

REDUCE_OVERHEAD = edited("03_fusion", [('COMPILE_MODE = "default"', 'COMPILE_MODE = "reduce-overhead"')])
READ_CPU = edited("04_sync_points", [("READ = torch.Tensor.item", "READ = torch.Tensor.cpu")])


def _experiment_text(data: dict) -> str:
    return json.dumps([{k: e.get(k) for k in ("name", "before", "after")} for e in data["experiments"]])


@pytest.mark.notebook
def test_03_compile_mode_flows_into_labels_names_and_verdicts():
    data, executed = REDUCE_OVERHEAD.result()
    text = _experiment_text(data)
    assert "torch.compile (mode=reduce-overhead)" in text  # the label of every compiled side
    assert "mode=default" not in text
    names = [e["name"] for e in data["experiments"]]
    assert "GPT training step: eager vs torch.compile (mode=reduce-overhead)" in names  # runs at smoke size
    assert "GELU: eager vs torch.compile (mode=reduce-overhead)" in names
    assert all("mode=default" not in json.dumps(c) for c in judged(data))
    assert any(e.get("headline") for e in data["experiments"])


@pytest.mark.notebook
def test_04_read_call_flows_into_labels_names_and_verdicts():
    data, executed = READ_CPU.result()
    text = _experiment_text(data)
    names = [e["name"] for e in data["experiments"]]
    assert "training loop: two .cpu() per step vs one" in names
    assert "training loop: .cpu() every step vs losses summed on the GPU" in names
    assert ".item()" not in text  # no label names the call the edit replaced
    headline = [e["name"] for e in data["experiments"] if e.get("headline")]
    assert headline == ["training loop: .cpu() every step vs losses summed on the GPU"]
    claims = {c["key"]: c for c in data["claims"]}
    for key in ("04.item_twice", "04.item_forces"):  # about .item(): not judged on a run that reads with .cpu()
        assert claims[key]["verdict"] == "not tested" and "this run measures .cpu()" in claims[key]["note"]
    assert not any(c["key"] in ("04.item_twice", "04.item_forces") for c in judged(data))
