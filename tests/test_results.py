import json
import os

import pytest

import gpulab.verdicts.results as results
from gpulab.measuring.device import DeviceInfo
from gpulab.verdicts.experiment import Claim, Comparison
from gpulab.verdicts.run_result import RunResult
from gpulab.verdicts.results import NotebookResult, ResultError, load_result, reference_view
from gpulab.measuring.files import write_json_atomic
from gpulab.measuring.measurement import Measurement

H100 = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", capability=(9, 0))


def make_result(name="01_measuring", speedup=2.0, smoke=False):
    r = NotebookResult(name, smoke=smoke, device=H100, params={"SIZE": 4096})
    before = RunResult("before", Measurement("before", [0.01 * speedup] * 3), flops=1e10, dtype="bf16",
                       peak_tflops=989.4)
    after = RunResult("after", Measurement("after", [0.01] * 3), flops=1e10, dtype="bf16", peak_tflops=989.4)
    r.add(Comparison("bf16 autocast", before, after, device=H100.name))
    r.claim(Claim("2-3x faster", low=2, high=3, source="guide §7.1").check(speedup))
    r.record("sweep", {"sizes": [1, 2], "tflops": [float("nan"), 3.0]})
    return r


def test_json_round_trip_in_the_shared_schema(tmp_path):
    r = make_result()
    path = r.save(tmp_path)
    assert path == tmp_path / "nvidia-h100-80gb-hbm3" / "01_measuring.json"
    data = load_result(path)
    assert {"notebook", "device", "smoke", "experiments", "claims"} <= data.keys()
    e = data["experiments"][0]
    assert {"name", "before", "after", "speedup"} <= e.keys() and e["speedup"] == pytest.approx(2.0)
    c = data["claims"][0]
    assert {"text", "expected", "measured", "verdict"} <= c.keys() and c["verdict"] == "confirmed"
    assert data["extra"]["sweep"]["tflops"] == [None, 3.0]  # NaN is not valid JSON: written as null
    assert results.comparisons(data)[0].after.mfu == pytest.approx(r.experiments[0].after.mfu)
    assert results.claims(data)[0].verdict == "confirmed"


def test_default_path_follows_gpulab_results(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path / "elsewhere"))
    assert make_result().save().parent == tmp_path / "elsewhere" / "nvidia-h100-80gb-hbm3"


def test_a_crash_mid_write_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    path = make_result(speedup=2.0).save(tmp_path)
    before = path.read_text()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        make_result(speedup=9.0).save(tmp_path)
    assert path.read_text() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_a_failure_while_serialising_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    target = write_json_atomic(tmp_path / "x.json", {"ok": 1})

    def broken_dumps(*args, **kwargs):
        raise TypeError("cannot serialise")

    monkeypatch.setattr(results.json, "dumps", broken_dumps)
    with pytest.raises(TypeError):
        write_json_atomic(target, {"new": 2})
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"ok": 1}


def test_load_result_reports_missing_malformed_and_incomplete(tmp_path):
    with pytest.raises(ResultError, match="no such file"):
        load_result(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ResultError, match="not valid JSON"):
        load_result(tmp_path / "bad.json")
    (tmp_path / "partial.json").write_text(json.dumps({"notebook": "x", "device": {}}))
    with pytest.raises(ResultError, match="missing keys"):
        load_result(tmp_path / "partial.json")


def test_bad_names_are_rejected():
    with pytest.raises(ValueError, match="notebook"):
        NotebookResult("../escape", smoke=True, device=H100)
    with pytest.raises(ValueError, match="Comparison"):
        make_result().add({"name": "dict"})


def test_reference_view_shows_both_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_DATA", str(tmp_path))
    ref = make_result(speedup=2.5)
    ref.save(tmp_path / "reference")
    mine = make_result(speedup=1.2, smoke=True)
    view = reference_view(mine, slug="nvidia-h100-80gb-hbm3")
    html = view._repr_html_()
    assert "reference: NVIDIA H100" in html and "refuted" in html and "confirmed" in html
    assert "No reference run" in reference_view(mine, slug="no-such-gpu")._repr_html_()
