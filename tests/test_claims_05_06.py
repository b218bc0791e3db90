"""Notebooks 05 and 06 in smoke mode: every claim says what kind of evidence it is, measured verdicts carry an
interval, fed loops are timed as pipelines, and each notebook ends with its table of claims."""
from __future__ import annotations

from pathlib import Path

import pytest


NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.mark.notebook
@pytest.mark.parametrize("name, title", [("05_data_overlap", "Every quantitative claim of §5"),
                                         ("06_batch_size", "Every quantitative claim of §6")])
def test_claims_have_evidence_intervals_and_a_table(name, title, smoke_run):
    data, executed = smoke_run(name)
    for c in data["claims"]:
        assert c["evidence"] in ("measured", "arithmetic", "datasheet", "definition"), c
        if c["verdict"] in ("confirmed", "refuted", "inconclusive"):
            assert c["interval"] is not None and c["interval"][0] <= c["measured"] <= c["interval"][1], c
    for e in data["experiments"]:
        assert e["kind"] in ("optimisation", "demonstration"), e["name"]
    html = [o["data"]["text/html"] for cell in executed["cells"] for o in cell.get("outputs", [])
            if "text/html" in o.get("data", {})]
    assert any(title in "".join(h) for h in html), f"{name}: no closing table of claims"
    if name == "05_data_overlap":
        fed = {e["name"]: e for e in data["experiments"]}
        for exp in ("starved vs fed", "prefetch_factor 2 -> 4"):
            for side in ("before", "after"):
                run = fed[exp][side]
                assert run["summary"]["pipeline"] is True
                assert len(run["measurement"]["windows"]) >= 2 and run["measurement"]["meta"]["data_wait_s_per_batch"]
        assert all(len(r["samples_per_s_interval"]) == 2 for r in data["extra"]["utilization_by_workers"])
    else:
        names = {e["name"]: e for e in data["experiments"]}
        assert names["80% of the max batch"]["kind"] == "demonstration"
        b80 = data["extra"]["batch_80_percent"]
        assert b80["b80"] < b80["max"] or b80["max"] == 1
