"""Every notebook runs headless in smoke mode, and what it wrote (its result JSON) is checked."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
EXPECTED = ["01_measuring", "02_tensor_cores", "03_fusion", "04_sync_points",
            "05_data_overlap", "06_batch_size", "07_mixed_precision", "08_case_study", "09_profiling",
            "10_multi_gpu", "11_your_model"]
VERDICTS = {"confirmed", "refuted", "inconclusive", "not comparable", "not tested"}


def test_all_notebooks_present():
    assert sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_is_stripped_and_parameterised(name):
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    for cell in nb["cells"]:
        assert not cell.get("outputs"), f"{name}: commit notebooks with outputs stripped"
        assert not cell.get("execution_count"), f"{name}: commit notebooks with execution counts cleared"
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{name}: needs exactly one cell tagged 'parameters'"
    assert "SMOKE = False" in "".join(tagged[0]["source"]), f"{name}: SMOKE must default to False"
    assert nb["cells"][0]["cell_type"] == "markdown", f"{name}: starts with prose"


@pytest.mark.notebook
@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_smoke_run(name, smoke_run):
    data, executed = smoke_run(name)
    assert data["notebook"] == name and data["smoke"] is True
    assert data["experiments"], f"{name}: no before/after experiment recorded"
    for e in data["experiments"]:
        assert e["speedup"] > 0 and e["before"]["summary"]["median_ms"] > 0
    assert data["claims"], f"{name}: no claim checked"
    for c in data["claims"]:
        assert c["verdict"] in VERDICTS, c
        if c["verdict"] in ("confirmed", "refuted", "inconclusive"):  # a verdict needs a value; a proxy may be absent
            assert c["measured"] is not None, c
        else:
            assert c["note"], f"{name}: an untested claim must say why: {c['text']}"
    images = [o for cell in executed["cells"] for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 2, f"{name}: expected at least a utilization plot and an MFU plot as PNG outputs"
