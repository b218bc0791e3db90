"""The summary's counting: verdicts by kind, one measurement once, gains from optimisations only, old files."""
import copy
import math

import pytest

from gpulab.app import summary
from gpulab.experiment import before_after, measure
from gpulab.timing import benchmark
from test_results import make_result


def _claim(verdict, side=None, measurement=None, evidence="measured"):
    return {"text": f"{verdict} {side} {measurement}", "verdict": verdict, "side": side,
            "measurement": measurement, "evidence": evidence, "measured": 1.0}


def _data(claims, experiments):
    d = make_result().to_dict()
    d["claims"], d["experiments"] = claims, experiments
    return d


def _exp(name, speedup, kind=None):
    e = copy.deepcopy(make_result().to_dict()["experiments"][0])
    e.update(name=name, speedup=speedup)
    if kind is None:
        e.pop("kind", None)  # a file written before experiments had a kind
    else:
        e["kind"] = kind
    return e


def test_notebook_table_counts_verdicts_by_kind_and_a_shared_measurement_once():
    claims = [_claim("confirmed", measurement="m1"), _claim("confirmed", measurement="m1"),
              _claim("confirmed", measurement="m1"), _claim("refuted", "higher"), _claim("refuted", "lower"),
              _claim("refuted", "lower"), _claim("inconclusive"), _claim("not comparable"), _claim("not tested"),
              _claim("confirmed", evidence="definition")]
    table = summary.notebook_table({"01_measuring": _data(claims, [_exp("a", 2.0, "optimisation")])})
    row = table.splitlines()[2].split(" | ")
    assert row[4:] == ["1", "1", "2", "1", "1", "1", "1 |"]


def test_largest_gain_is_an_optimisation_and_old_files_without_kind_count_as_one():
    exps = [_exp("tiny kernels vs one matmul", 380.0, "demonstration"), _exp("bf16", 2.5, "optimisation"),
            _exp("old file", 3.0)]
    table = summary.notebook_table({"01_measuring": _data([], exps)})
    assert "3.00x: old file" in table and "380" not in table.split("\n")[2]
    only_demo = summary.notebook_table({"01_measuring": _data([], [_exp("demo", 9.0, "demonstration")])})
    assert "| — |" in only_demo


def test_old_claims_without_side_or_evidence_still_summarise(tmp_path):
    d = make_result().to_dict()
    for c in d["claims"]:
        for k in ("side", "evidence", "measurement", "interval"):
            c.pop(k, None)
    for e in d["experiments"]:
        for k in ("kind", "within_noise", "verdict", "speedup_interval"):
            e.pop(k, None)
    text = summary.summary_tables({"01_measuring": d}) + summary.notebook_table({"01_measuring": d})
    assert "| 01_measuring | bf16 autocast | optimisation | 2.00x | — |" in text


def test_refuted_claims_say_which_side():
    d = _data([_claim("refuted", "higher") | {"text": "BF16 2-3x"}], [])
    assert "| refuted: higher than claimed |" in summary.summary_tables({"01_measuring": d})


@pytest.mark.parametrize("call", [
    lambda: benchmark(lambda: None, min_time_s=math.nan),
    lambda: measure(lambda: None, flops=math.nan, monitor=False, min_time_s=0.01),
    lambda: before_after(lambda: None, lambda: None, name="x", flops=1e9, after_flops=0, monitor=False,
                         min_time_s=0.01),
])
def test_nan_and_zero_are_refused_by_the_harness(call):
    with pytest.raises(ValueError, match="must be a finite number > 0"):
        call()


def test_a_summary_beside_a_reference_counts_the_verdicts_that_agree():
    from gpulab.app.summary import agreement_section

    def run(*verdicts):
        claims = [{"text": f"claim {i}", "verdict": v, "side": "lower" if v == "refuted" else None}
                  for i, v in enumerate(verdicts)]
        return {"01_x": {"claims": claims}}

    text = agreement_section(run("confirmed", "refuted", "inconclusive", "confirmed"),
                             run("confirmed", "confirmed", "inconclusive", "inconclusive"))
    assert text.startswith("2 of 4 claims in both runs have the same verdict (50.0%); 1 confirmed in one")
    rows = [line for line in text.splitlines() if line.startswith("| 01_x")]
    assert rows[0] == "| 01_x | **claim 1** | refuted: lower than claimed | confirmed |"  # the flip comes first
    assert rows[1] == "| 01_x | claim 3 | confirmed | inconclusive |"
    assert agreement_section(run("confirmed"), {}) == "No claim is in both this run and the reference."
