"""The summary's counting: verdicts by kind, one count per claim, gains from optimisations only, old files."""
import copy
import math

import pytest

from gpulab.app import summary, summary_page
from gpulab.app.readme import update_readme
from gpulab.verdicts.experiment import before_after, measure
from gpulab.measuring.timing import benchmark
from test_results import make_result


def _claim(verdict, side=None, measurement=None, evidence="measured"):
    return {"text": f"{verdict} {side} {measurement}", "verdict": verdict, "side": side,
            "measurement": measurement, "evidence": evidence, "measured": 1.0, "source": "guide §1.2"}


def _data(claims, experiments):
    d = make_result().to_dict()
    d["claims"], d["experiments"] = claims, experiments
    return d


def _exp(name, speedup, kind=None):
    e = copy.deepcopy(make_result().to_dict()["experiments"][0])
    e.update(name=name, speedup=speedup, speedup_interval=[speedup, speedup], ratio=speedup,
             ratio_interval=[speedup, speedup])
    if kind is None:
        for k in ("kind", "ratio", "ratio_interval", "ratio_basis"):
            e.pop(k, None)  # a file written before experiments had a kind or a work-normalised ratio
    else:
        e["kind"] = kind
    return e


def test_notebook_table_counts_verdicts_by_kind_one_per_claim():
    claims = [_claim("confirmed", measurement="m1"), _claim("refuted", "higher", measurement="m1"),
              _claim("confirmed", measurement="m1"), _claim("refuted", "lower"),
              _claim("refuted", "lower"), _claim("inconclusive"), _claim("not comparable"), _claim("not tested"),
              _claim("confirmed", evidence="definition")]
    table = summary.notebook_table({"01_measuring": _data(claims, [_exp("a", 2.0, "optimisation")])})
    row = table.splitlines()[2].split(" | ")
    assert row[5:] == ["2", "1", "2", "1", "1", "1", "1", "— |"]  # the refutation sharing m1 is counted


def test_largest_gain_is_an_optimisation_and_old_files_without_kind_count_as_one():
    exps = [_exp("tiny kernels vs one matmul", 380.0, "demonstration"), _exp("bf16", 2.5, "optimisation"),
            _exp("old file", 3.0)]
    table = summary.notebook_table({"01_measuring": _data([], exps)})
    assert "3.00x: old file" in table
    assert "380" not in table.split("\n")[2]
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
    measured = {"01_x": {"claims": [{"text": "c", "key": "01.c", "verdict": "inconclusive", "measured": 0.718,
                                     "interval": [0.255, 1.08], "high": 1.0, "unit": "%"}]}}
    base = {"01_x": {"claims": [{**measured["01_x"]["claims"][0], "verdict": "confirmed", "measured": 0.328,
                                 "interval": [0.209, 0.466]}]}}
    assert "| inconclusive: 0.718% [0.255, 1.08] | confirmed: 0.328% [0.209, 0.466] |" in agreement_section(measured, base)


def _unequal(name, speedup, items_before, items_after, kind="optimisation"):
    e = _exp(name, speedup, kind)
    e["before"]["items"], e["after"]["items"] = items_before, items_after
    for k in ("ratio", "ratio_interval", "ratio_basis"):
        e.pop(k)  # an older file: the ratio is recomputed from the items per call
    return e


def test_gains_are_optimisations_on_the_work_normalised_ratio_and_never_implausible():
    """A 376.8x demonstration is no gain; '80% of max batch' is 1.23x per call but 0.98x per item; 1 -> 2 GPUs at
    8.6x is a scaling efficiency of 430%: flagged, not a gain."""
    d = _data([], [_exp("tiny kernels vs one matmul", 376.8, "demonstration"),
                   _unequal("80% of the max batch", 1.23, 69632, 55296),
                   _exp("1 -> 2 GPUs (DDP)", 8.6, "optimisation"), _exp("bf16", 1.5, "optimisation")])
    g = summary.gains(d)
    assert [e["name"] for e, _ in g] == ["bf16", "80% of the max batch"]
    assert g[1][1].value == pytest.approx(1.23 * 55296 / 69632)
    assert "scaling efficiency 430% is over 100%" in summary.flagged({"10_multi_gpu": d})[0]
    assert "4.30" not in summary.notebook_table({"10_multi_gpu": d}) and "1.50x: bf16" in summary.notebook_table(
        {"10_multi_gpu": d})
    cpu = copy.deepcopy(d)
    cpu["device"]["kind"] = "cpu"
    cpu["experiments"] = [_exp("1 -> 2 processes", 1.5, "optimisation")]
    assert "CPU processes stand in for GPUs" in summary.flagged({"10_multi_gpu": cpu})[0]


def test_the_summary_figure_draws_one_optimisation_per_notebook_with_intervals_values_and_a_legend():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slow = _exp("slower", 0.5, "optimisation")
    slow["ratio_interval"] = [0.45, 0.55]
    results = {"01_measuring": _data([], [_exp("demo", 376.8, "demonstration"), _exp("graphs", 8.5, "optimisation"),
                                          _exp("second", 2.0, "optimisation")]),
               "02_tensor_cores": _data([], [slow])}
    fig = summary_page.summary_figure(results, reference={"01_measuring": results["01_measuring"]})
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert sorted(labels) == ["01 graphs", "02 slower"]  # the top one per notebook, no demonstration
    assert len(ax.patches) == 2
    assert {"8.50x", "0.50x"} <= {t.get_text() for t in ax.texts}  # values on the bars
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    assert {"faster (interval above 1)", "slower (interval below 1)", "95% interval", "reference GPU"} <= legend
    assert fig.get_figwidth() * 100 <= 900
    plt.close(fig)
    smoke = {nb: d | {"smoke": True} for nb, d in results.items()}
    fig = summary_page.summary_figure(smoke)
    assert not fig.axes[0].patches and "smoke run: not a speed measurement" in fig.axes[0].texts[0].get_text()
    plt.close(fig)
    assert "| smoke run: not a speed measurement |" in summary.notebook_table(smoke)


def test_comparisons_with_a_reference_match_claims_on_their_key_not_their_wording():
    from gpulab.verdicts.tally import agreement

    mine = {"07": [{"key": "07.bf16_speed", "text": "BF16 is 2-3x faster", "verdict": "confirmed"},
                   {"key": "07.fp16_speed", "text": "same words", "verdict": "confirmed"}]}
    ref = {"07": [{"key": "07.bf16_speed", "text": "BF16 autocast: 2-3x (reworded)", "verdict": "refuted",
                   "side": "lower"},
                  {"key": "07.other", "text": "same words", "verdict": "refuted", "side": "lower"}]}
    r = agreement(mine, ref)
    assert r["claims"] == 1 and r["confirmed_vs_refuted"] == [("07", "07.bf16_speed", "confirmed", "refuted")]
    old = {"07": [{"text": "same words", "verdict": "confirmed"}]}  # an older file without keys: by text
    assert agreement(old, ref)["claims"] == 1
    text = summary.agreement_section({"07_x": {"claims": mine["07"]}}, {"07_x": {"claims": ref["07"]}})
    assert "| 07_x | **BF16 is 2-3x faster (`07.bf16_speed`)** | confirmed | refuted: lower than claimed |" in text
    tables = summary.summary_tables({"07_x": {"claims": mine["07"], "experiments": []}},
                                    {"07_x": {"claims": ref["07"], "experiments": []}})
    assert "| 07_x | same words (`07.fp16_speed`) | course |  | — | confirmed | — | — |" in tables  # no source


def test_readme_refuses_a_smoke_or_cpu_run_before_writing_anything(tmp_path, capsys):
    from gpulab.__main__ import main

    make_result("01_measuring", smoke=True).save(tmp_path)
    folder = tmp_path / "nvidia-h100-80gb-hbm3"
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- reference-summary -->\nold\n<!-- /reference-summary -->\n")
    assert main(["summary", str(folder), "--readme", str(readme)]) == 2
    err = capsys.readouterr().err
    assert "needs a full-size GPU run" in err and "smoke run" in err
    assert readme.read_text().count("\nold\n") == 1  # untouched
    assert not (folder / "summary.md").exists()
    with pytest.raises(ValueError, match="full-size GPU run"):
        update_readme(readme, folder)


def test_the_reference_view_matches_claims_on_their_key():
    from gpulab.verdicts.results import ReferenceView

    mine = make_result().to_dict()
    ref = copy.deepcopy(mine)
    mine["claims"][0].update(key="01.bf16", text="BF16 autocast is 2-3x faster (reworded)")
    ref["claims"][0].update(key="01.bf16", verdict="refuted", measured=1.5)
    rows = [r for r in ReferenceView(mine, ref).rows() if r[0].startswith("claim:")]
    assert rows == [("claim: BF16 autocast is 2-3x faster (reworded)", "confirmed (2.00x)", "refuted (1.50x)")]
    mine["claims"][0].update(unit="kernels", measured=1)  # the claim's own spelling: "1 kernel", not "1 kernels"
    assert ReferenceView(mine, ref).rows()[-1][1] == "confirmed (1 kernel)"


def test_readme_without_a_reference_section_is_refused_before_writing(tmp_path, capsys):
    from gpulab.__main__ import main

    make_result("01_measuring", smoke=False).save(tmp_path)
    folder = tmp_path / "nvidia-h100-80gb-hbm3"
    assert main(["summary", str(folder), "--readme", str(tmp_path / "missing.md")]) == 2
    assert "not a README with a reference section" in capsys.readouterr().err
    assert not (folder / "summary.md").exists()


def test_the_headline_gain_is_the_lesson_s_marked_experiment_on_equal_work_with_its_interval(tmp_path):
    """01's 5.35x micro-benchmark is not what 01 teaches: the experiment the lesson marks as its headline is shown,
    with its interval, beside the refuted and inconclusive counts; unmarked results fall back to the largest."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    micro, taught = _exp("tiny add, graphs", 5.35, "optimisation"), _exp("bf16 training step", 1.8, "optimisation")
    taught.update(headline=True, ratio_interval=[1.7, 1.9])
    micro["headline"] = False
    d = _data([_claim("refuted", "lower"), _claim("inconclusive")], [micro, taught])
    d["wall_s"] = 71.4
    table = summary.notebook_table({"01_measuring": d})
    row = table.splitlines()[2]
    assert "1.80x [1.70, 1.90]: bf16 training step" in row and "5.35" not in row and "| 71 |" in row
    assert [e["name"] for e, _ in summary.headline_gains(d)] == ["bf16 training step"]
    old = _data([], [_exp("a", 1.2, "optimisation"), _exp("b", 3.0, "optimisation")])  # no headline field
    assert [e["name"] for e, _ in summary.headline_gains(old)] == ["b"]
    fig = summary_page.summary_figure({"01_measuring": d})
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["01 bf16 training step"]
    plt.close(fig)
    tables = summary.summary_tables({"01_measuring": d})
    assert "**bf16 training step** (headline)" in tables and "1.80x [1.70, 1.90]" in tables


def test_a_smoke_summary_shows_no_speed_verdict_and_no_gain(tmp_path):
    d = _data([], [_exp("bf16", 2.5, "optimisation")])
    d["experiments"][0]["verdict"] = "2.50x faster"
    smoke = d | {"smoke": True}
    tables = summary.summary_tables({"01_measuring": smoke})
    assert "2.50x faster" not in tables and "2.50x" not in tables and "smoke run: not a speed measurement" in tables
    assert "2.50x" not in summary.notebook_table({"01_measuring": smoke})
    assert "2.50x faster" in summary.summary_tables({"01_measuring": d})


def test_the_course_s_own_targets_are_counted_apart_in_every_table():
    claims = [dict(_claim("confirmed"), source="guide §1.2"), dict(_claim("confirmed"), source="course target"),
              dict(_claim("refuted", "lower"), source="course check", origin="course")]
    d = _data(claims, [])
    row = summary.notebook_table({"01_measuring": d}).splitlines()[2].split(" | ")
    assert row[5] == "1" and row[-1] == "1 confirmed or settled, 1 refuted |"
    tables = summary.summary_tables({"01_measuring": d})
    assert tables.count("| course |") == 2 and tables.count("| guide |") == 1
    assert "course's own targets" in summary.notebook_table({}) and "course's own targets" in summary.COUNTS_NOTE
