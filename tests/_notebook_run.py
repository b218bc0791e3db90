"""Run one notebook in smoke mode through papermill and return (result JSON, executed notebook)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulab.results import load_result

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def run_smoke(name: str, tmp_path: Path, monkeypatch) -> tuple[dict, dict]:
    papermill = pytest.importorskip("papermill")
    results = tmp_path / "results"
    monkeypatch.setenv("GPULAB_RESULTS", str(results))
    out = tmp_path / f"{name}.ipynb"
    papermill.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(out), parameters={"SMOKE": True},
                               kernel_name="python3", cwd=str(NOTEBOOKS), progress_bar=False)
    files = list(results.glob(f"*/{name}.json"))
    assert len(files) == 1, f"{name} wrote no result JSON under {results}"
    return load_result(files[0]), json.loads(out.read_text())


def html_outputs(executed: dict) -> str:
    return "".join("".join(o.get("data", {}).get("text/html", [])) for c in executed["cells"]
                   for o in c.get("outputs", []))


def check_claims_contract(data: dict) -> None:
    """Every claim says its evidence; every verdict on a measurement stands on an interval."""
    for c in data["claims"]:
        assert c["evidence"] in ("measured", "arithmetic", "datasheet", "definition"), c
        if c["verdict"] in ("confirmed", "refuted", "inconclusive"):
            assert c["interval"] is not None and c["interval"][0] <= c["measured"] <= c["interval"][1], c
        if c["verdict"] == "not comparable":
            assert c["note"], c
    for e in data["experiments"]:
        assert e["kind"] in ("optimisation", "demonstration"), e["name"]
