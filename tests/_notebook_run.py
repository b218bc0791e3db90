"""Helpers for the tests that assert on a notebook's smoke run (the run itself: the `smoke_run` fixture)."""
from __future__ import annotations

from pathlib import Path



NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


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
