"""The lesson helper: sizes, the smoke flag as recorded, claims as data and their needs."""
import json

import pytest

import gpulab as gl
from gpulab.lesson import NEEDS


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
                              dict(key="any", text="any claim", low=1, high=2),
                              dict(key="never", text="never reached", low=0, high=1)])
    assert les.check("gpu", 1.5).verdict == "not tested"
    assert "CUDA" in les.result.claims[0].note
    assert les.check("any", 1.5, interval=(1.2, 1.8)).verdict == "confirmed"
    path = les.save()
    data = json.loads(path.read_text())
    verdicts = {c["text"]: c["verdict"] for c in data["claims"]}
    assert verdicts == {"a GPU claim": "not tested", "any claim": "confirmed", "never reached": "not tested"}
    assert data["smoke"] is True


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
    from gpulab.lesson import SectionClock

    now = iter([0.0, 2.0, 5.0, 6.0, 9.0])
    clock = SectionClock(lambda: next(now))  # starts at 0
    clock.lap("setup")  # 2 s
    clock.mark()  # at 5: the 3 s before are left out
    clock.lap("timed")  # 1 s
    assert clock.to_dict() == {"setup": 2.0, "timed": 1.0, "total": 9.0}
