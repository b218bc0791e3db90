"""08 in smoke mode: no number of another system is confirmed or refuted; what transfers is judged; table shown."""
import pytest

from _notebook_run import check_claims_contract, html_outputs
from gpulab.lessons.case_study import OTHER_SYSTEMS

pytestmark = pytest.mark.notebook


@pytest.fixture(scope="module")
def run08(smoke_run):
    return smoke_run("08_case_study")


def test_claims_contract(run08):
    data, executed = run08
    check_claims_contract(data)
    by = {c["text"]: c for c in data["claims"]}
    for text, *_ in OTHER_SYSTEMS:
        assert by[text]["verdict"] in ("not comparable", "not tested"), by[text]
    assert any(t.startswith("Benchmark floor") for t in by) and any(t.startswith("Utilization alone") for t in by)
    assert "Case study (guide §8, 000, 002, 003): every claim" in html_outputs(executed)


def test_waterfall_throughput_is_over_windows(run08):
    data, _ = run08
    rows = data["extra"]["waterfall"]
    assert rows and all(r["pipeline"] for r in rows)
    assert all(r["tokens_per_s_interval"][0] <= r["tokens_per_s"] <= r["tokens_per_s_interval"][1] for r in rows)
    assert [e["kind"] for e in data["experiments"]] == ["optimisation"]
