"""Faults and odd input met where a reader meets them: each named in one line, nothing half-written, no noise."""
from __future__ import annotations

import sys

import torch

import gpulab as gl


def test_profile_keeps_the_profilers_own_log_lines_off_the_page(capfd):
    """The profiler library writes "USDT:... profiler_start" to stderr from C++; the reader's own lines still show."""
    x = torch.randn(32, 32)

    def step():
        print("the reader's line", file=sys.stderr)
        return x @ x

    summary = gl.profile(step, steps=2, warmup=0)
    err = capfd.readouterr().err
    assert summary.steps == 2 and "USDT" not in err and "profiler_start" not in err
    assert err.count("the reader's line") == 3  # one untimed warm-up step of the schedule, then two


# -- results are read by file name ---------------------------------------------------------------------------

import errno
import json
import os
import signal
from pathlib import Path

import pytest

from gpulab.__main__ import main
from gpulab.app import course, run_folders, summary
from gpulab.verdicts.results import ResultError, load_result
from test_cli_guards import fake_papermill  # noqa: F401  (one fake runner for both files)
from test_results import make_result

pm = pytest.importorskip("papermill")


def _results(tmp_path, *names):
    for name in names:
        make_result(name).save(tmp_path)
    return next(tmp_path.iterdir())


def test_a_backup_beside_a_result_is_not_its_row_and_is_named(tmp_path):
    folder = _results(tmp_path, "01_measuring", "02_tensor_cores")
    good = json.loads((folder / "01_measuring.json").read_text())
    backup = dict(good, params={"SIZE": 1})  # an older run, kept by hand
    (folder / "01_measuring_old.json").write_text(json.dumps(backup))
    found, problems = summary.collect(folder)
    assert set(found) == {"01_measuring", "02_tensor_cores"} and found["01_measuring"]["params"] == {"SIZE": 4096}
    assert problems == ["skipped 01_measuring_old.json: it claims to be 01_measuring, whose result is "
                        "01_measuring.json (a copy or a backup? results are read by file name)"]


def test_a_file_naming_another_notebook_replaces_nothing(tmp_path):
    folder = _results(tmp_path, "02_tensor_cores")
    other = json.loads((folder / "02_tensor_cores.json").read_text())
    (folder / "01_measuring.json").write_text(json.dumps(dict(other, params={"SIZE": 1})))  # 01's name, 02 inside
    (folder / "03_fusion.json").write_text(json.dumps(dict(other, notebook="09_profiling")))  # nobody's
    found, problems = summary.collect(folder)
    assert set(found) == {"02_tensor_cores"} and found["02_tensor_cores"]["params"] == {"SIZE": 4096}
    assert any(p.startswith("skipped 01_measuring.json: it claims to be 02_tensor_cores") for p in problems)
    assert ("skipped 03_fusion.json: its notebook field says '09_profiling', not '03_fusion' (results are read by "
            "file name: <notebook>.json)") in problems


def test_the_summary_command_lists_a_misnamed_file_under_problems(tmp_path, capsys):
    folder = _results(tmp_path, "01_measuring")
    (folder / "01_measuring_old.json").write_text((folder / "01_measuring.json").read_text())
    assert main(["summary", str(folder), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "## Problems" in md and "skipped 01_measuring_old.json: it claims to be 01_measuring" in md
    assert "01_measuring_old.json" in capsys.readouterr().out


# -- the result schema ---------------------------------------------------------------------------------------

def test_a_result_from_a_newer_gpulab_is_refused_by_name(tmp_path):
    path = make_result().save(tmp_path)
    data = json.loads(path.read_text())
    path.write_text(json.dumps(dict(data, schema=99)))
    with pytest.raises(ResultError, match=r"written by a newer gpulab \(schema 99; this one reads 1\)"):
        load_result(path)
    found, problems = summary.collect(path.parent)
    assert not found and "written by a newer gpulab (schema 99; this one reads 1)" in problems[0]
    for bad in ("1", 0, True):
        path.write_text(json.dumps(dict(data, schema=bad)))
        with pytest.raises(ResultError, match="'schema' must be a whole number"):
            load_result(path)
    path.write_text(json.dumps({k: v for k, v in data.items() if k != "schema"}))  # before the field existed
    assert load_result(path)["notebook"] == "01_measuring"


# -- the command line: refused before any work ---------------------------------------------------------------

def _one_line(err):
    lines = [ln for ln in err.splitlines() if ln.startswith("gpulab:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_an_empty_notebook_name_is_refused_not_the_whole_course(tmp_path, capsys, fake_papermill):
    assert main(["run", "", "--smoke", "--out", str(tmp_path / "run")]) == 2
    assert "notebook '' is empty (an unset variable?)" in _one_line(capsys.readouterr().err) and not fake_papermill
    assert main(["run", "01", " ", "--smoke", "--out", str(tmp_path / "run")]) == 2 and not fake_papermill


def test_a_parameter_past_its_bound_is_refused_before_any_work_saying_the_range(tmp_path, capsys, fake_papermill):
    assert main(["run", "01", "--smoke", "--out", str(tmp_path / "run"), "-p", "MIN_TIME_S", "1e308"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "MIN_TIME_S=1e+308 must be a finite number > 0 and <= 3600" in line and not fake_papermill


@pytest.mark.parametrize("out", ["/", "/usr", "/proc/gpulab-run", "/sys/x/y"])
def test_an_out_folder_of_the_system_is_refused_before_any_work(out, capsys, fake_papermill):
    assert main(["run", "01", "--smoke", "--out", out]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"--out {out}" in line and "system" in line and not fake_papermill
    assert not Path(out).exists() or out in ("/", "/usr")


def test_an_out_folder_that_cannot_be_made_is_refused_in_one_line(tmp_path, capsys, fake_papermill, monkeypatch):
    real_mkdir = Path.mkdir

    def refuse(self, *a, **k):
        if self.name == "run":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", refuse)
    assert main(["run", "01", "--smoke", "--out", str(tmp_path / "run")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "cannot be written: Permission denied" in line and not fake_papermill


# -- faults while running ------------------------------------------------------------------------------------

def test_sigterm_is_handled_like_ctrl_c(tmp_path, monkeypatch, capsys):
    """A job scheduler or `timeout` sends TERM: one line, the summary of what finished, the lock gone, exit 143."""
    def execute(src, dst, **kwargs):
        if "02_" in src:
            os.kill(os.getpid(), signal.SIGTERM)
        make_result(Path(src).stem, speedup=2.0).save(os.environ["GPULAB_RESULTS"])
        Path(dst).write_text("{}")

    monkeypatch.setattr(pm, "execute_notebook", execute)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "run"
    assert main(["run", "01", "02", "03", "--smoke", "--out", str(out)]) == 143
    line = _one_line(capsys.readouterr().err)
    assert "stopped by SIGTERM" in line and "1 notebook(s) that finished" in line
    md = (out / "summary.md").read_text()
    assert "01_measuring" in md and "interrupted (SIGTERM)" in md and "03_fusion" not in md
    assert not (out / run_folders.LOCK_NAME).exists()
    assert sorted(p.name for p in out.glob("*.ipynb")) == ["01_measuring.ipynb"]  # 02's cut copy is gone
    assert signal.getsignal(signal.SIGTERM) == before  # the handler lives only while the run does


def _disk_fills_in(stem, how, monkeypatch):
    def execute(src, dst, **kwargs):
        Path(dst).write_text('{"cells": [{"source": "half a no')  # papermill was writing when the disk filled
        if stem in src:
            if how == "runner":
                raise OSError(errno.ENOSPC, "No space left on device", dst)
            raise pm.PapermillExecutionError(cell_index=3, exec_count=3, source="res.save()", ename="OSError",
                                             evalue="[Errno 28] No space left on device", traceback=[])
        make_result(Path(src).stem, speedup=2.0).save(os.environ["GPULAB_RESULTS"])
        Path(dst).write_text("{}")

    monkeypatch.setattr(pm, "execute_notebook", execute)


@pytest.mark.parametrize("how", ["runner", "kernel"])
def test_a_full_disk_is_named_in_one_line_with_no_partial_file_left(tmp_path, monkeypatch, capsys, how):
    _disk_fills_in("02_", how, monkeypatch)
    out = tmp_path / "run"
    assert main(["run", "01", "02", "03", "--smoke", "--out", str(out)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "No space left on device" in line or "no space left on the device" in line
    assert not (out / run_folders.LOCK_NAME).exists()
    left = sorted(p.name for p in out.iterdir())
    assert left == ["01_measuring.ipynb", "results"], left  # 01 whole; nothing of 02, 03 never started
    assert not [p for p in tmp_path.rglob("*") if ".gpulab-tmp-" in p.name]


def test_an_executed_notebook_cut_mid_write_is_never_left_under_its_name(tmp_path, monkeypatch, capsys):
    """A notebook whose kernel died while papermill wrote: no half a JSON file where the executed notebook goes."""
    def execute(src, dst, **kwargs):
        Path(dst).write_text('{"cells": [')
        raise RuntimeError("Kernel died")

    monkeypatch.setattr(pm, "execute_notebook", execute)
    out = tmp_path / "run"
    assert main(["run", "01", "--smoke", "--out", str(out)]) == 1
    assert "FAIL 01_measuring" in capsys.readouterr().out
    assert not list(out.glob("*.ipynb")) and not list(out.glob("*gpulab-tmp*"))


def test_the_executed_notebook_names_itself_not_its_temporary(tmp_path, capsys, fake_papermill):
    out = tmp_path / "run"
    assert main(["run", "01", "--smoke", "--out", str(out)]) == 0
    nb = json.loads((out / "01_measuring.ipynb").read_text())
    assert nb["metadata"]["papermill"]["output_path"] == str(out / "01_measuring.ipynb")


def test_every_problem_of_run_all_is_in_the_terminal_and_the_exit_code(tmp_path, monkeypatch, capsys,
                                                                       fake_papermill):
    """A corrupt latest result of another notebook: the summary lists it, and so do the terminal and the exit code."""
    from gpulab.measuring.device import get_device

    latest = tmp_path / "data" / "results"
    monkeypatch.setattr(course, "results_dir", lambda: latest)
    (latest / get_device().slug).mkdir(parents=True)
    (latest / get_device().slug / "05_data_overlap.json").write_text("{ cut")
    assert main(["run", "01", "--smoke", "--all", "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert "problem: skipped 05_data_overlap.json: not valid JSON" in err
    assert "skipped 05_data_overlap.json" in (tmp_path / "run" / "summary.md").read_text()
