"""Notebook 11 runs the whole toolkit on a model of the reader's: its smoke run records every tool's result."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulab.params import SCHEMAS

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "11_your_model.ipynb"


def test_parameters_cell_leaves_every_size_to_the_schema():
    nb = json.loads(NOTEBOOK.read_text())
    assert nb["nbformat"] == 4 and nb["nbformat_minor"] == 5 and all(c.get("id") for c in nb["cells"])
    src = next("".join(c["source"]) for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    values: dict = {}
    exec(src, values)
    sized = [k for k, p in SCHEMAS["11_your_model"].items() if p.has_default]
    assert sized and all(values[k] is None for k in sized), "sized parameters start at None"
    assert values["SMOKE"] is False and set(values) - {"__builtins__"} <= set(SCHEMAS["11_your_model"])
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert 'gl.lesson("11_your_model", globals(), claims=' in code


def test_the_course_runs_it():
    from gpulab.app.course import notebooks

    assert NOTEBOOK in notebooks(["11"])


@pytest.mark.notebook
def test_smoke_run_records_every_tool(smoke_run):
    data, executed = smoke_run("11_your_model")
    assert data["smoke"] is True and data["params"]["BATCH"] == SCHEMAS["11_your_model"]["BATCH"].smoke
    extra = data["extra"]
    for key in ("step", "timeline", "tracker", "profile", "breakdown", "memory", "syncs", "batch_size",
                "dataloader", "seconds"):
        assert key in extra, key
    assert extra["step"]["flops"] > 0 and extra["step"]["median_ms"] > 0
    assert extra["tracker"]["steps"] > 0 and extra["batch_size"]["max_fitting"] >= 1
    assert extra["dataloader"]["rows"] and extra["memory"]["peak_bytes"] > 0
    assert extra["syncs"] is None  # no CUDA in CI: the sync hunt cannot tell, and says so
    assert [e["name"] for e in data["experiments"]] == ["my change"]
    assert [c["key"] for c in data["claims"]] == ["11.my_change"]
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert not errors
    md = [c for c in executed["cells"] if c["cell_type"] == "markdown"]
    assert "## Try this" in "".join(md[-1]["source"])
