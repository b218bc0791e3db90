"""A reader turns 08's and 09's main knob and reruns at smoke size: labels and the result JSON follow the edit."""
import json

import pytest

from _notebook_jobs import edited

WORKERS_2 = edited("08_case_study", [("WORKERS = None", "WORKERS = 2")])
BATCH_12 = edited("09_profiling", [("BATCH = None", "BATCH = 12")])


@pytest.mark.notebook
def test_08_workers_flow_into_the_waterfall():
    data, _ = WORKERS_2.result()
    assert data["params"]["WORKERS"] == 2
    rows = data["extra"]["waterfall"]
    assert any("2 workers" in json.dumps(r) for r in rows)  # the data step's row describes what ran
    assert not any("1 worker" in json.dumps(r) for r in rows)  # never the smoke default it replaced
    headline = [e["name"] for e in data["experiments"] if e.get("headline")]
    assert headline == ["GPT training loop: naive -> optimized"]
    claims = {c["key"]: c for c in data["claims"]}
    assert claims["08.step2_data"]["verdict"] == "not tested"


@pytest.mark.notebook
def test_09_batch_flows_into_the_fix_comparisons():
    data, _ = BATCH_12.result()
    assert data["params"]["BATCH"] == 12
    steps = data["params"]["STEPS_PER_CALL"]
    fixes = [e for e in data["experiments"] if e["name"].startswith("fix: ") or e["name"] == "all four fixes"]
    assert len(fixes) == 5
    for e in fixes:  # every before/after counts the edited batch's samples per timed call
        assert e["after"]["items"] == 12 * steps, e["name"]
    headline = [e["name"] for e in data["experiments"] if e.get("headline")]
    assert headline == ["all four fixes"]
