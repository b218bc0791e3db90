"""08 in smoke mode: every claim keyed and quoted; no other system's number confirmed or refuted; the verdict lines
under their experiments; the written-out steps in the loss check; the waterfall's throughput over windows."""
import pytest

from _notebook_run import check_claims_contract, html_outputs
from gpulab.lessons import case_study as CS

pytestmark = pytest.mark.notebook


@pytest.fixture(scope="module")
def run08(smoke_run):
    return smoke_run("08_case_study")


def test_claims_contract(run08):
    data, executed = run08
    check_claims_contract(data)
    by = {c["key"]: c for c in data["claims"]}
    assert set(by) == {f"08.{c['key']}" for c in CS.CLAIMS}
    assert all(c["quote"] for c in data["claims"])
    for key in CS.PROXY:
        assert by[f"08.{key}"]["verdict"] == "not comparable", by[f"08.{key}"]
    assert by["08.same_loss"]["verdict"] in ("confirmed", "inconclusive", "refuted")  # measured on a CPU too
    assert "Case study (guide §8, 000, 002, 003): every claim" in html_outputs(executed)


def test_waterfall_throughput_is_over_windows(run08):
    data, _ = run08
    rows = data["extra"]["waterfall"]
    assert rows and all(r["pipeline"] for r in rows)
    assert all(r["tokens_per_s_interval"][0] <= r["tokens_per_s"] <= r["tokens_per_s_interval"][1] for r in rows)
    assert [e["kind"] for e in data["experiments"]] == ["optimisation"]
    loss = data["extra"]["loss_check"]
    assert len(loss["naive"]["losses"]) == len(loss["final"]["losses"]) == data["params"]["LOSS_STEPS"]
