"""The lesson helper: sizes, the smoke flag as recorded, claims as data and their needs."""
import json

import pytest

import gpulab as gl
from gpulab.verdicts.lesson import NEEDS


def _lesson(ns, **kw):
    return gl.lesson("01_measuring", ns, full=dict(BIG_N=4096, MIN_TIME_S=1.0), smoke=dict(BIG_N=64), show=False,
                     **kw)


def test_sizes_fill_none_and_write_back():
    ns = {"SMOKE": False, "BIG_N": None, "MIN_TIME_S": 0.2}
    les = _lesson(ns)
    assert les.small  # no CUDA GPU on CI: smoke sizes whatever SMOKE says
    assert ns["BIG_N"] == 64 and ns["MIN_TIME_S"] == 0.2  # a reader's value wins; a missing smoke size keeps full
    assert les.result.smoke is True and les.result.params["BIG_N"] == 64


def test_bad_parameter_is_refused_by_schema():
    with pytest.raises(ValueError, match="BIG_N"):
        _lesson({"BIG_N": -3, "MIN_TIME_S": None})


def test_smoke_key_without_full_is_an_error():
    with pytest.raises(ValueError, match="no full size"):
        gl.lesson("01_measuring", {}, full=dict(BIG_N=1), smoke=dict(TYPO=2), show=False)


def test_claim_needs_give_not_tested_in_one_place(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    les = _lesson({}, claims=[dict(key="gpu", text="a GPU claim", low=1, high=2, needs="cuda"),
                              dict(key="any", text="any claim", low=1, high=2, unit="kernels"),
                              dict(key="never", text="never reached", low=0, high=1)])
    assert les.check("gpu", 1.5).verdict == "not tested"
    assert "CUDA" in les.result.claims[0].note
    assert les.check("any", 1.5, interval=(1.2, 1.8)).verdict == "confirmed"
    path = les.save()
    data = json.loads(path.read_text())
    verdicts = {c["text"]: c["verdict"] for c in data["claims"]}
    assert verdicts == {"a GPU claim": "not tested", "any claim": "confirmed", "never reached": "not tested"}
    assert data["smoke"] is True


def test_a_smoke_run_judges_no_timing_claim_but_still_judges_the_rest(tmp_path, monkeypatch):
    """Smoke sizes carry no speed verdict: a speed, ratio, MFU or utilization claim is "not tested" with the
    reason; a count, a definition, arithmetic, a datasheet value or a claim marked untimed is still judged."""
    from gpulab.verdicts.claims import SMOKE_NOTE

    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    les = _lesson({}, claims=[dict(key="speed", text="2-3x faster", low=2, high=3),
                              dict(key="gain", text="10-20% faster", low=10, high=20, unit="% gain"),
                              dict(key="mfu", text="40-60% MFU", low=40, high=60, unit="%"),
                              dict(key="rate", text="480 samples/s", low=400, unit="samples/s"),
                              dict(key="kernels", text="1 fused kernel", low=1, high=1, unit="kernels"),
                              dict(key="bits", text="7 mantissa bits", low=7, high=7, unit="bits",
                                   evidence="definition"),
                              dict(key="formula", text="1.7 TFLOP per step", low=1.6, high=1.8, unit="%",
                                   evidence="arithmetic"),
                              dict(key="memory", text="half the memory", low=1.8, high=2.2, timed=False)])
    assert les.small
    for key in ("speed", "gain", "mfu", "rate"):
        c = les.check(key, 2.5, interval=(2.4, 2.6))
        assert (c.verdict, c.note, c.measured) == ("not tested", SMOKE_NOTE, None), key
    assert les.check("kernels", 1).verdict == "confirmed"
    assert les.check("bits", 7).verdict == "confirmed"
    assert les.check("formula", 1.7).verdict == "confirmed"
    assert les.check("memory", 2.0).verdict == "confirmed"
    data = json.loads(les.save().read_text())
    timed = {c["key"].split(".")[-1]: c["timed"] for c in data["claims"]}
    assert timed == {"speed": True, "gain": True, "mfu": True, "rate": True, "kernels": False, "bits": False,
                     "formula": False, "memory": False}


def test_claim_spec_errors_name_the_field():
    with pytest.raises(ValueError, match="needs"):
        gl.ClaimSpec(key="k", text="t", low=1, needs=("warp_drive",))
    with pytest.raises(ValueError, match="evidence"):
        gl.ClaimSpec(key="k", text="t", low=1, evidence="vibes")
    with pytest.raises(ValueError, match="declared twice"):
        _lesson({}, claims=[dict(key="a", text="x", low=1), dict(key="a", text="y", low=1)])
    with pytest.raises(KeyError, match="no claim"):
        _lesson({}).check("missing", 1.0)


def test_every_need_answers_on_cpu():
    les = _lesson({})
    for name in NEEDS:
        why = les.missing(name)
        assert why is None or isinstance(why, str)
    assert les.missing("cuda") and les.missing("full")


def test_the_section_clock_times_each_section_from_the_last_lap_or_mark():
    from gpulab.verdicts.lesson import SectionClock

    now = iter([0.0, 2.0, 5.0, 6.0, 9.0])
    clock = SectionClock(lambda: next(now))  # starts at 0
    clock.lap("setup")  # 2 s
    clock.mark()  # at 5: the 3 s before are left out
    clock.lap("timed")  # 1 s
    assert clock.to_dict() == {"setup": 2.0, "timed": 1.0, "total": 9.0}
