"""Reshaping a notebook keeps what it measures: its experiments, claims and extra tables, by name.

tests/data/notebook_contract.json holds each notebook's smoke-run experiment names, claim texts and extra keys;
a notebook that loses or renames one fails here (update the file only when a measurement really changes).
"""
import json
from pathlib import Path

import pytest

CONTRACT = json.loads((Path(__file__).parent / "data" / "notebook_contract.json").read_text())


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_notebook_keeps_its_experiments_claims_and_tables(name, smoke_run):
    data, _ = smoke_run(name)
    want = CONTRACT[name]
    got = {"experiments": sorted(e["name"] for e in data["experiments"]),
           "claims": sorted(c["text"] for c in data["claims"]),
           "extra": sorted(data["extra"])}
    for key in ("experiments", "claims", "extra"):
        missing = sorted(set(want[key]) - set(got[key]))
        assert not missing, f"{name} lost {key}: {missing}"

