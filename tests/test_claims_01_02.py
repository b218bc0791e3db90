"""Notebook 01 in smoke mode: every claim carries its kind of evidence, the demonstrations are marked, and
the notebook ends with a table of every claim of the guide's §1."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpulab.verdicts.claims import EVIDENCE

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def check_common(data: dict, executed: dict, table_title: str) -> dict[str, dict]:
    """Checks every notebook's claims must pass; returns the claims by text."""
    for c in data["claims"]:
        assert c["evidence"] in EVIDENCE, c
        if c["verdict"] in ("confirmed", "refuted", "inconclusive"):
            assert c["interval"] is not None and c["interval"][0] <= c["measured"] <= c["interval"][1], c
        if c["evidence"] == "measured" and c["verdict"] in ("confirmed", "refuted") and data["device"].get("is_cuda"):
            assert c["interval"][0] < c["interval"][1] or c["unit"] in ("models", "fields wrong"), c
    for e in data["experiments"]:
        assert e["kind"] in ("optimisation", "demonstration"), e["name"]
    html = [o["data"]["text/html"] for cell in executed["cells"] for o in cell.get("outputs", [])
            if "text/html" in o.get("data", {})]
    assert any(table_title in "".join(h) for h in html), "the notebook ends with its claims table"
    return {c["text"]: c for c in data["claims"]}


@pytest.mark.notebook
def test_01_claims_are_labelled_and_tabled(smoke_run):
    data, executed = smoke_run("01_measuring")
    claims = check_common(data, executed, "01 · every claim of the guide")
    kinds = {e["name"]: e["kind"] for e in data["experiments"]}
    assert kinds["busy vs useful: tiny kernels vs one big matmul"] == "demonstration"
    assert kinds["launch gaps: Python loop vs CUDA graph"] == "optimisation"
    arithmetic = [t for t, c in claims.items() if c["evidence"] == "arithmetic"]
    assert len(arithmetic) == 3 and all("GPT-2" in t or "1.09%" in t for t in arithmetic), arithmetic
    good = next(c for t, c in claims.items() if t.startswith("40-60% MFU"))
    assert "optimised loop" in good["text"] and good["verdict"] == "not tested"  # no GPU at smoke size
    assert any("misses short bursts" in t for t in claims)
    assert any(c["verdict"] == "not comparable" for c in claims.values())
    assert "optimised_step" in data["extra"] and "bursts" in data["extra"]
    assert data["extra"]["optimised_step"]["config"].count("fused loss") == 1


@pytest.mark.notebook
def test_02_claims_are_labelled_and_tabled(smoke_run):
    data, executed = smoke_run("02_tensor_cores")
    claims = check_common(data, executed, "02 · every claim of the guide")
    kinds = {e["name"]: e["kind"] for e in data["experiments"]}
    assert kinds["matrix size: many small matmuls vs one big one"] == "demonstration"
    formats = [c for t, c in claims.items() if "mantissa bits" in t]
    assert len(formats) == 4 and all(c["evidence"] == "definition" for c in formats)
    fp8 = next(c for t, c in claims.items() if t.startswith("FP8: H100 only"))
    assert fp8["evidence"] == "datasheet"
    assert sum(c["verdict"] == "not comparable" for c in claims.values()) == 3  # MFU targets of other systems (the GPT-3 row is judged in 10)
