"""Helpers for the tests that assert on a notebook's smoke run (the run itself: the `smoke_run` fixture)."""
from __future__ import annotations

import json
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def parameters_cell(name: str) -> dict:
    """The values a notebook's cell tagged `parameters` sets, as papermill would start from them."""
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    src = next("".join(c["source"]) for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    values: dict = {}
    exec(src, values)
    return {k: v for k, v in values.items() if not k.startswith("__")}


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


def check_claims_listed(data: dict, expected: list[str]) -> None:
    """Each expected claim is in the result; judged measurements carry an interval; the rest say why."""
    from gpulab.verdicts.claims import EVIDENCE, VERDICTS

    texts = [c["text"] for c in data["claims"]]
    for t in expected:
        assert t in texts, t
    for c in data["claims"]:
        assert c["verdict"] in VERDICTS and c["evidence"] in EVIDENCE, c
        if c["verdict"] in ("confirmed", "refuted", "inconclusive") and c["evidence"] == "measured":
            assert c["interval"] is not None and c["interval"][0] <= c["measured"] <= c["interval"][1], c
        if c["verdict"] in ("not tested", "not comparable"):
            assert c["note"], c


def check_experiments_listed(data: dict, expected: list[str]) -> None:
    """Each expected experiment kept its name, and every experiment says its kind."""
    from gpulab.verdicts.run_result import KINDS

    names = [e["name"] for e in data["experiments"]]
    for n in expected:
        assert n in names, n
    assert all(e["kind"] in KINDS for e in data["experiments"])


def check_table_before_try_this(executed: dict, title: str) -> None:
    """The claims table titled `title` is shown before the notebook's "Try this" section."""
    cells = executed["cells"]
    table = [i for i, c in enumerate(cells) for o in c.get("outputs", [])
             if title in "".join(o.get("data", {}).get("text/html", ""))]
    try_this = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and "## Try this" in "".join(c["source"])]
    assert table and try_this and table[0] < try_this[-1]

# The guide the claims quote: its text files beside the checkout (../shared/guide); tests that read it skip without it.
GUIDE = NOTEBOOKS.parent.parent / "shared" / "guide"


def judged(data: dict) -> list[dict]:
    """The claims this run gave a verdict on (confirmed, refuted or inconclusive)."""
    return [c for c in data["claims"] if c["verdict"] in ("confirmed", "refuted", "inconclusive")]
