"""Verdicts from intervals: the five outcomes, NaN in every form, the evidence kinds and the counting."""
import math

import numpy as np
import pytest
import torch

from gpulab.verdicts.claims import Claim, judge
from gpulab.measuring.estimates import Estimate, estimate_of
from gpulab.verdicts.tally import count_verdicts
from gpulab.verdicts.experiment import Comparison
from gpulab.verdicts.run_result import RunResult
from gpulab.measuring.measurement import Measurement


@pytest.mark.parametrize("interval, verdict, side", [
    ((2.2, 2.8), "confirmed", None),            # wholly inside
    ((2.0, 3.0), "confirmed", None),            # inside, edges included
    ((3.1, 3.5), "refuted", "higher"),          # wholly above: the technique beats the claim
    ((1.2, 1.9), "refuted", "lower"),           # wholly below
    ((1.8, 2.4), "inconclusive", None),         # straddles the low edge
    ((2.9, 3.3), "inconclusive", None),         # straddles the high edge
    ((1.0, 4.0), "inconclusive", None),         # too noisy to decide: covers the whole band and more
])
def test_five_verdicts_come_from_the_interval(interval, verdict, side):
    mid = sum(interval) / 2
    c = Claim("BF16 is 2-3x faster", low=2, high=3).check(mid, interval=interval)
    assert (c.verdict, c.side) == (verdict, side)
    assert c.interval == interval


def test_a_median_inside_the_band_with_a_straddling_interval_is_not_confirmed():
    c = Claim("at least 45% MFU", low=45, unit="%").check(46, interval=(44.5, 47))
    assert c.verdict == "inconclusive"


def test_open_bands():
    assert judge((50, 60), 45, None) == ("confirmed", None)
    assert judge((40, 44), 45, None) == ("refuted", "lower")
    assert judge((0, 5), None, 10) == ("confirmed", None)
    assert judge((11, 12), None, 10) == ("refuted", "higher")


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -float("inf"), np.float64("nan"),
                                 np.float32("nan"), torch.tensor(float("nan")), torch.tensor([1.0, 2.0]),
                                 "fast", (float("nan"), (1, 2)), (1.0, (float("nan"), 2.0))])
def test_nan_in_every_form_is_not_tested(bad):
    c = Claim("x", low=1, high=2).check(bad)
    assert c.verdict == "not tested" and c.measured is None and c.note


def test_numpy_and_tensor_scalars_are_measurements():
    assert Claim("x", low=1, high=2).check(np.float32(1.5)).verdict == "confirmed"
    assert Claim("x", low=1, high=2).check(torch.tensor(2.5)).verdict == "refuted"


@pytest.mark.parametrize("kwargs", [dict(low=float("nan")), dict(high=float("inf")), dict(low=3, high=2), {},
                                    dict(low=1, evidence="hearsay")])
def test_bad_claims_are_value_errors(kwargs):
    with pytest.raises(ValueError):
        Claim("x", **kwargs)


def test_interval_must_contain_the_value():
    with pytest.raises(ValueError, match="does not contain"):
        Claim("x", low=1).check(5, interval=(1, 2))


def test_a_comparison_carries_its_interval_into_the_claim():
    b = RunResult("b", Measurement("b", [1.0, 1.01, 0.99, 1.0]))
    a = RunResult("a", Measurement("a", [0.5, 0.51, 0.49, 0.5]))
    cmp = Comparison("x", b, a)
    c = Claim("2x faster", low=1.9, high=2.1).check(cmp)
    lo, hi = c.interval
    assert c.measured == pytest.approx(2.0) and lo < 2.0 < hi and c.verdict == "confirmed"
    assert estimate_of(cmp).map(lambda r: (r - 1) * 100).value == pytest.approx(100)


def test_not_comparable_shows_the_proxy_and_judges_nothing():
    c = Claim("8xA100 VLM: 95% utilization", low=90, unit="%").not_comparable(98.0, "an 8xA100 vision model")
    assert c.verdict == "not comparable" and c.measured == 98.0 and "8xA100" in c.note
    with pytest.raises(ValueError):
        Claim("x", low=1).not_comparable(1.0, "")


def test_round_trip_keeps_every_field():
    c = Claim("x", low=1, high=2, evidence="arithmetic", source="§1").check(3, interval=(2.5, 3.5),
                                                                           measurement="m1")
    d = c.to_dict()
    assert {"measured", "interval", "low", "high", "verdict", "side", "evidence", "measurement"} <= set(d)
    back = Claim.from_dict(d)
    assert back.to_dict() == d and back.label == "refuted: higher than claimed"


def test_old_files_still_load():
    back = Claim.from_dict({"text": "x", "low": 1, "high": 2, "verdict": "within noise", "measured": 1.5})
    assert back.verdict == "not tested"


def test_counts_are_per_claim_even_when_claims_share_a_measurement():
    """One measurement deciding two claims counts twice, each with its own verdict: a shared measurement that
    confirms one claim and refutes another must show the refutation (it was hidden behind the first claim)."""
    claims = [Claim("a", low=1).check(2, measurement="peak").to_dict(),
              Claim("b", low=1).check(2, measurement="peak").to_dict(),     # same measurement, counted too
              Claim("b2", high=1.5).check(2, measurement="peak").to_dict(),  # same measurement, refuted higher
              Claim("c", high=1).check(2).to_dict(),
              Claim("d", low=3).check(2).to_dict(),
              Claim("e", low=1, high=3).check(2, interval=(0, 4)).to_dict(),
              Claim("f", low=0, high=0, evidence="definition").check(0).to_dict(),
              Claim("g", low=1).untestable("no GPU").to_dict(),
              Claim("h", low=1).not_comparable(5, "another GPU").to_dict()]
    n = count_verdicts(claims)
    assert n == {"confirmed": 2, "refuted_higher": 2, "refuted_lower": 1, "inconclusive": 1,
                 "not comparable": 1, "not tested": 1, "not_measured": 1}
    assert sum(n.values()) == len(claims)


def test_estimate_rejects_nan_and_maps_monotone_functions():
    with pytest.raises(ValueError):
        Estimate(math.nan, 0, 1)
    e = Estimate(2.0, 1.5, 2.5).map(lambda x: 1 / x)
    assert e.lo == pytest.approx(0.4) and e.hi == pytest.approx(1 / 1.5)


def test_agreement_between_two_runs():
    from gpulab.verdicts.tally import agreement

    def c(text, verdict, side=None):
        return {"text": text, "verdict": verdict, "side": side}

    a = {"02": [c("x", "confirmed"), c("y", "refuted", "lower"), c("z", "inconclusive"), c("w", "confirmed")]}
    b = {"02": [c("x", "confirmed"), c("y", "refuted", "higher"), c("z", "inconclusive"), c("w", "refuted", "lower")],
         "03": [c("q", "confirmed")]}
    r = agreement(a, b)
    assert r["claims"] == 4 and r["same"] == 2 and r["share_same"] == 0.5
    assert [f[1] for f in r["confirmed_vs_refuted"]] == ["w"]


def test_no_decided_reference_claim_has_an_interval_touching_its_band():
    """In the committed references, a confirmed or refuted claim's interval never sits on a band edge."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "data" / "reference"
    for f in sorted(root.glob("*/[0-9][0-9]_*.json")):
        for c in json.loads(f.read_text()).get("claims", []):
            iv = c.get("interval")
            if c.get("verdict") not in ("confirmed", "refuted") or not iv or iv[1] <= iv[0]:
                continue  # older files have no interval; exact counts and definitions have zero width
            for edge in (c.get("low"), c.get("high")):
                assert edge is None or not iv[0] <= edge <= iv[1], f"{f.name}: {c['text']} {iv} touches {edge}"


def test_median_interval_is_the_range_for_few_values_and_order_statistics_beyond():
    from gpulab.measuring.estimates import median_interval

    assert median_interval([3.0]) == (3.0, 3.0)
    assert median_interval([5, 1, 4, 2, 3, 6, 7, 8]) == (1.0, 8.0)  # n = 8: only the range covers 95%
    assert median_interval(list(range(1, 10))) == (2.0, 8.0)  # n = 9: x(2), x(8) covers 96.1%
    assert median_interval(list(range(1, 13))) == (3.0, 10.0)  # n = 12: x(3), x(10) covers 96.1%
    with pytest.raises(ValueError, match="values"):
        median_interval([])
    with pytest.raises(ValueError, match="confidence"):
        median_interval([1, 2], confidence=1.5)


def test_more_rounds_narrow_a_speedup_interval_instead_of_widening_it():
    """One outlying round widens a range but not a confidence interval of the median of 12 rounds."""
    from gpulab.measuring.measurement import Measurement, speedup

    def meas(label, rounds):
        return Measurement(label, times_s=list(rounds), meta={"round_medians": list(rounds)})

    after = [1.0] * 12
    before = [1.20, 1.21, 1.19, 1.22, 1.18, 1.20, 1.21, 1.19, 1.20, 1.60, 0.90, 1.20]  # two wild rounds
    s = speedup(meas("b", before), meas("a", after))
    assert 1.15 < s.lo <= s.ratio <= s.hi < 1.25


def test_a_percent_gain_shows_its_speedup_beside_it():
    from gpulab.verdicts.claims import Claim

    c = Claim("TF32 gives a 20-30% matmul speedup", low=20, high=30, unit="% gain")
    assert c.expected == "20–30%"
    c.check(590.0, interval=(585.0, 592.0))  # one quantity, one reading: "+590%" is the 6.90x on the line above
    assert c._measured_str() == "+590% (6.90x) [585, 592]" and c.verdict == "refuted"
    c = Claim("2-5% faster", low=2, high=5, unit="% gain").check(-7.6, interval=(-23.4, 21.9))
    assert c._measured_str().startswith("-7.60% (0.924x)")


def test_a_unitless_claim_has_no_stray_space():
    c = Claim("matches", low=1, high=1, unit="").check(0)
    assert c.expected == "1" and c._measured_str() == "0"
    assert "expected 1, measured 0:" in c._repr_html_()


def test_a_comparison_of_unequal_work_is_judged_on_the_ratio_its_headline_shows():
    """Batch 4 -> 16: each call takes about twice as long (time ratio ~0.5) but does 4x the work, so the headline
    is images/s ~2x; a claim of "at least 1.5x" is judged on that, never on the time per call."""
    b = RunResult("batch 4", Measurement("b", [1.0, 1.01, 0.99, 1.0]), items=4, item_name="images")
    a = RunResult("batch 16", Measurement("a", [2.02, 2.03, 2.01, 2.02]), items=16, item_name="images")
    cmp = Comparison("batch 4 -> 16", b, a)
    assert cmp.speedup == pytest.approx(0.495, abs=0.01) and "images/s 1.98x higher" in cmp.verdict
    c = Claim("a bigger batch trains 1.5x more images/s", low=1.5).check(cmp)
    h = cmp.headline()
    assert c.verdict == "confirmed" and c.measured == pytest.approx(h.value) == pytest.approx(1.98, abs=0.01)
    assert c.interval == pytest.approx(h.interval)
    same = Comparison("equal work", RunResult("b", Measurement("b", [1.0] * 4), items=8),
                      RunResult("a", Measurement("a", [0.5] * 4), items=8))
    assert Claim("2x", low=1.9, high=2.1).check(same).measured == pytest.approx(2.0)  # equal work: time ratio
    assert "headline" in Claim.check.__doc__ and "items/s" in Claim.check.__doc__


def test_repeats_widen_the_interval_to_their_spread_at_a_band_edge():
    """A ratio read 6.90x [6.88, 6.92] against a 7.0 edge is refuted on one measurement's interval; the same shape
    measured again at 7.14x makes it inconclusive, as the spread of its own repeats says."""
    c = Claim("TF32 ~8x", low=7, high=9).check(6.9, interval=(6.88, 6.92))
    assert c.verdict == "refuted"
    c = Claim("TF32 ~8x", low=7, high=9).check(6.9, interval=(6.88, 6.92), repeats=[6.95, 7.14, float("nan")])
    assert c.verdict == "inconclusive" and c.interval == (6.88, 7.14) and c.measured == 6.9
    assert Claim("x", low=1).check(2.0, repeats=[]).interval == (2.0, 2.0)  # no repeats: unchanged


def test_the_course_s_own_targets_are_counted_apart_from_the_guide_s_claims():
    from gpulab.verdicts.tally import claim_origin
    from gpulab.verdicts.claims import origin_of

    assert origin_of("course target") == origin_of("course target for gpulab's tracker") == "course"
    assert origin_of("guide §7.3") == origin_of("002 optimization review") == origin_of("000 summary") == "guide"
    assert origin_of("self-check floor") == origin_of("monitor") == origin_of("") == "course"
    assert origin_of("guide §8.4 (the 1% bar is this course's)") == "course"
    ours = Claim("10x floor", low=10, source="course target").check(12)
    theirs = Claim("2-3x", low=2, high=3, source="guide §7.1").check(2.5)
    assert (ours.origin, theirs.origin) == ("course", "guide")
    d = [ours.to_dict(), theirs.to_dict(), {"text": "old", "verdict": "confirmed", "source": "course check"}]
    assert [claim_origin(c) for c in d] == ["course", "guide", "course"]
    assert count_verdicts(d, origin="guide")["confirmed"] == 1 and count_verdicts(d, origin="course")["confirmed"] == 2
    assert count_verdicts(d)["confirmed"] == 3
    with pytest.raises(ValueError, match="origin"):
        Claim("x", low=1, origin="hearsay")


def test_not_comparable_rows_that_repeat_one_measurement_fold_into_one_and_are_never_blank():
    from gpulab.verdicts.tally import claims_table_html, fold_claims

    judged = Claim("floor 10x", low=10, key="08.floor", source="course target").check(12.5, measurement="speedup")
    others = [Claim(f"system {i}: {i}x", low=i, key=f"08.sys{i}").not_comparable(12.5, f"system {i}",
                                                                                 measurement="speedup")
              for i in range(3)]
    util = [Claim("util 65%", low=60, unit="%", key="08.u0").not_comparable(97.0, "VLM", measurement="util:first"),
            Claim("util 95%", low=90, unit="%", key="08.u1").not_comparable(98.0, "VLM", measurement="util:last")]
    blank = Claim("ResNet MFU", low=60, unit="%", key="02.mfu_0").not_comparable(None, "another model")
    rows = fold_claims([judged, *others, *util, blank])
    assert [(h.key if h else None, [c.key for c in g]) for h, g in rows] == [
        ("08.floor", ["08.sys0", "08.sys1", "08.sys2"]), (None, ["08.u0", "08.u1"]), ("02.mfu_0", [])]
    page = claims_table_html([judged, *others, *util, blank])
    assert all(k in page for k in ("08.sys0", "08.sys2", "08.u1", "02.mfu_0")) and "none measured" in page


@pytest.mark.parametrize("gpu", ["nvidia-h200"])
def test_the_reference_s_not_comparable_rows_fold_to_at_most_30_and_12_in_08(gpu):
    import json
    from pathlib import Path

    from gpulab.verdicts.tally import fold_claims

    folder = Path(__file__).resolve().parents[1] / "data" / "reference" / gpu
    per = {}
    for p in sorted(folder.glob("[0-9][0-9]_*.json")):
        claims = json.loads(p.read_text())["claims"]
        per[p.stem] = sum(1 for h, g in fold_claims(claims)
                          if (h is None and g) or (h is not None and h["verdict"] == "not comparable"))
    assert per["08_case_study"] <= 12 and sum(per.values()) <= 30, per


def test_a_comparison_of_unequal_flops_without_items_is_judged_on_flop_per_second():
    """A 1000-token sequence against 1024 (no items counted): the FLOPs per call differ, so the headline, its
    verdict and a claim on it are FLOP/s after over before, not the time per call."""
    b = RunResult("seq 1000", Measurement("b", [1.0, 1.01, 0.99, 1.0]), flops=1.0e12)
    a = RunResult("seq 1024", Measurement("a", [1.0, 1.01, 0.99, 1.0]), flops=2.0e12)
    cmp = Comparison("alignment", b, a)
    assert cmp.basis == "FLOP/s" and cmp.headline().value == pytest.approx(2.0)
    assert cmp.verdict.startswith("FLOP/s 2.00x higher")
    assert Claim("aligned runs >= 1.05x the FLOP/s", low=1.05).check(cmp).verdict == "confirmed"
    same = Comparison("equal", RunResult("b", Measurement("b", [1.0] * 4), flops=1e12, items=4),
                      RunResult("a", Measurement("a", [1.0] * 4), flops=2e12, items=4))
    assert same.basis == "time"  # items counted on both sides decide: equal items, equal work


def test_a_comparison_s_round_ratios_are_the_repeats_a_verdict_at_a_band_edge_covers():
    """Four interleaved rounds read 6.8x-7.2x per round; the median-of-rounds interval alone says 6.9x-7.1x. Passed
    as repeats, the rounds' spread decides a 7.0 edge: inconclusive, not refuted on one round."""
    rb, ra = [6.8, 7.0, 7.1, 7.2], [1.0, 1.0, 1.0, 1.0]
    b = RunResult("fp32", Measurement("b", rb, meta={"round_medians": rb}), items=2)
    a = RunResult("tf32", Measurement("a", ra, meta={"round_medians": ra}), items=4)
    cmp = Comparison("tf32", b, a)
    assert cmp.round_ratios() == pytest.approx([13.6, 14.0, 14.2, 14.4])  # work-normalised like the headline
    c = Claim("~14x", low=13.9, high=20).check(cmp, repeats=cmp.round_ratios())
    assert c.interval[0] == pytest.approx(13.6) and c.verdict == "inconclusive"
    assert Comparison("one round", RunResult("b", Measurement("b", [1.0])),
                      RunResult("a", Measurement("a", [1.0]))).round_ratios() == []


def test_an_undecided_claim_says_why_and_whether_more_rounds_could_decide_it():
    """An interval wider than the band can never lie inside it; one narrower than the band across an edge could."""
    from gpulab.verdicts.claims import Claim
    wide = Claim("8 -> 12: 15-20% better", low=15, high=20).check((17.0, (11.0, 24.0)), "rounds")
    assert wide.verdict == "inconclusive" and wide.note.startswith("rounds; cannot decide here because the interval "
                                                                   "(13 wide) is wider than the band (5 wide)")
    edge = Claim("compile: 2% faster", low=1.02).check((1.0166, (1.01, 1.025)))
    assert edge.verdict == "inconclusive" and "holds the band's edge 1.02; a narrower one (more rounds)" in edge.note
    assert Claim("x", low=1.0).check((1.5, (1.2, 1.8)), "kept").note == "kept"  # decided: the note is untouched
