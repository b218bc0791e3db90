"""A summary never mixes runs: one section per device (and per smoke or full run), only regular files read, a bad
file named and skipped, a verdict gpulab does not know listed, and no summary of nothing."""
from __future__ import annotations

import json
import os

import pytest

from gpulab.__main__ import main
from gpulab.app import summary, summary_page
from test_results import make_result

H200 = {"kind": "cuda", "name": "NVIDIA H200", "capability": [9, 0]}


def _folder(tmp_path):
    return make_result("01_measuring").save(tmp_path / "res").parent


def _rewrite(path, **fields):
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def test_a_folder_mixing_devices_gets_a_section_per_device(tmp_path):
    """Item 4: H200 rows never sit under an H100 heading."""
    folder = _folder(tmp_path)
    make_result("02_tensor_cores").save(tmp_path / "res")
    _rewrite(folder / "02_tensor_cores.json", device=H200)
    md, _ = summary_page.write_summary(folder, tmp_path / "out")
    text = md.read_text()
    title = text.splitlines()[0]
    assert "NVIDIA H100 80GB HBM3" in title and "NVIDIA H200" in title and "2 devices" in title
    h100, h200 = text.index("## NVIDIA H100 80GB HBM3"), text.index("## NVIDIA H200")
    first, second = sorted((h100, h200))
    owner = {h100: "01_measuring", h200: "02_tensor_cores"}
    assert owner[first] in text[first:second] and owner[second] not in text[first:second]


def test_a_smoke_run_mixed_with_a_gpu_run_never_shows_a_gain_under_smoke(tmp_path):
    folder = _folder(tmp_path)
    make_result("02_tensor_cores", smoke=True).save(tmp_path / "res")
    text = summary_page.write_summary(folder, tmp_path / "out")[0].read_text()
    full, smoke = text.index("## NVIDIA H100 80GB HBM3 (full size)"), text.index("## NVIDIA H100 80GB HBM3 (smoke")
    row = next(ln for ln in text[smoke:].splitlines() if ln.startswith("| 02_tensor_cores |"))
    assert "smoke run: not a speed measurement" in row and "2.00x" not in row
    assert full < smoke and "2.00x" in text[full:smoke]


def test_one_device_keeps_one_plain_summary(tmp_path):
    text = summary_page.write_summary(_folder(tmp_path), tmp_path / "out")[0].read_text()
    assert text.startswith("# gpulab summary: NVIDIA H100 80GB HBM3\n") and "\n## NVIDIA" not in text


def test_a_named_pipe_is_not_read(tmp_path):
    """Item 11: a FIFO named like a result would hang the summary."""
    folder = _folder(tmp_path)
    os.mkfifo(folder / "02_tensor_cores.json")
    found, problems = summary.collect(folder)
    assert set(found) == {"01_measuring"}
    assert "skipped 02_tensor_cores.json: not a regular file" in problems


def test_a_nan_ratio_names_its_file_and_the_summary_goes_on(tmp_path):
    folder = _folder(tmp_path)
    make_result("02_tensor_cores").save(tmp_path / "res")
    data = json.loads((folder / "02_tensor_cores.json").read_text())
    data["experiments"][0].update(ratio=float("nan"), ratio_interval=[1.0, 2.0])
    (folder / "02_tensor_cores.json").write_text(json.dumps(data))  # json writes NaN, and reads it back
    md, _ = summary_page.write_summary(folder, tmp_path / "out")
    text = md.read_text()
    assert "skipped 02_tensor_cores.json" in text and "ratio" in text.split("## Problems")[1]


def test_a_verdict_gpulab_does_not_know_is_a_problem(tmp_path):
    folder = _folder(tmp_path)
    data = json.loads((folder / "01_measuring.json").read_text())
    data["claims"][0]["verdict"] = "CONFIRMED!!"
    (folder / "01_measuring.json").write_text(json.dumps(data))
    found, problems = summary.collect(folder)
    assert "01_measuring" in found
    assert any("01_measuring.json" in p and "'CONFIRMED!!'" in p and "confirmed, refuted" in p for p in problems)


def test_summary_of_a_folder_where_nothing_loads_exits_non_zero(tmp_path, capsys):
    folder = tmp_path / "res"
    folder.mkdir()
    (folder / "01_measuring.json").write_text("{ cut")
    assert main(["summary", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "none of its result files loads" in err and "01_measuring.json" in err
    assert not (folder / "summary.md").exists()
