"""The runner and the CLI refuse what would lose or misreport data, and say every failure where it is seen."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpulab.__main__ import main
from gpulab.app import course, run_folders
from test_results import make_result

pm = pytest.importorskip("papermill")


@pytest.fixture
def fake_papermill(monkeypatch):
    """Each "notebook" writes a result file where the runner points it, and its executed copy, as a real one does."""
    ran = []

    def execute(src, dst, **kwargs):
        stem = Path(src).stem
        ran.append(stem)
        make_result(stem, speedup=2.0).save(os.environ["GPULAB_RESULTS"])
        Path(dst).write_text(json.dumps({"cells": [], "metadata": {"papermill": {"output_path": dst}}}))

    monkeypatch.setattr(pm, "execute_notebook", execute)
    return ran


def test_out_inside_the_reference_folder_or_notebooks_is_refused(capsys):
    for out in (run_folders.REFERENCE_DIR / "nvidia-h200", course.NOTEBOOK_DIR / "x"):
        assert main(["run", "01", "--smoke", "--out", str(out)]) == 2
        assert "--out" in capsys.readouterr().err


def test_a_second_run_into_the_same_folder_exits_2_naming_the_first(tmp_path, capsys, fake_papermill):
    out = tmp_path / "run"
    out.mkdir()
    (out / run_folders.LOCK_NAME).write_text(f"{os.getppid()} pid, started earlier\n")  # a live process holds it
    assert main(["run", "01", "--smoke", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "in use by another run" in err and str(os.getppid()) in err and not fake_papermill
    (out / run_folders.LOCK_NAME).write_text("999999999 pid, started long ago\n")  # a stale lock: its run is gone
    assert main(["run", "01", "--smoke", "--out", str(out)]) == 0
    assert not (out / run_folders.LOCK_NAME).exists()


def test_a_result_not_copied_shows_in_the_terminal_and_the_exit_code(tmp_path, monkeypatch, capsys, fake_papermill):
    (tmp_path / "data").write_text("a file where the data folder should be: nothing can be written under it")
    monkeypatch.setattr(course, "results_dir", lambda: tmp_path / "data" / "results")
    code = main(["run", "01", "--smoke", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 1 and "problem: 01_measuring: result not copied" in err
    assert "result not copied" in (tmp_path / "run" / "summary.md").read_text()


def test_a_compare_folder_of_garbage_is_refused_before_running(tmp_path, capsys, fake_papermill):
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "01_measuring.json").write_text("{ not json")
    assert main(["run", "01", "--smoke", "--out", str(tmp_path / "run"), "--compare", str(ref)]) == 2
    assert "none of its result files loads" in capsys.readouterr().err and not fake_papermill
    make_result("02_tensor_cores", speedup=2.0).save(tmp_path / "ref2")
    ref2 = next((tmp_path / "ref2").iterdir())
    (ref2 / "01_measuring.json").write_text("{ not json")
    assert main(["run", "01", "--smoke", "--out", str(tmp_path / "run2"), "--compare", str(ref2)]) == 1
    assert "problem: --compare: skipped 01_measuring.json" in capsys.readouterr().err


def test_check_on_a_read_only_data_folder_says_so_before_measuring(tmp_path, monkeypatch, capsys):
    import gpulab.__main__ as cli
    import gpulab.app.selfcheck as sc

    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(cli.os, "access", lambda path, mode: Path(path) != tmp_path)  # tmp_path is read-only
    monkeypatch.setattr(sc, "run_check", lambda **k: pytest.fail("measured before checking the folder"))
    assert main(["check", "--smoke"]) == 2
    assert "read-only" in capsys.readouterr().err


def test_ctrl_c_prints_one_line_and_writes_the_summary_of_what_finished(tmp_path, monkeypatch, capsys):
    def execute(src, dst, **kwargs):
        if "02_" in src:
            raise KeyboardInterrupt
        make_result(Path(src).stem, speedup=2.0).save(os.environ["GPULAB_RESULTS"])

    monkeypatch.setattr(pm, "execute_notebook", execute)
    assert main(["run", "01", "02", "--smoke", "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert err.count("interrupted") == 1 and "Traceback" not in err
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert "01_measuring" in summary and "interrupted" in summary


def test_a_parameter_given_twice_is_an_error_naming_it(tmp_path, capsys, fake_papermill):
    assert main(["run", "01", "--smoke", "--out", str(tmp_path / "run"), "-p", "BIG_N", "1", "-p", "BIG_N", "2"]) == 2
    assert "-p BIG_N is given twice" in capsys.readouterr().err and not fake_papermill


@pytest.mark.parametrize("params, match", [(["-p", "BIG_N", "1048576"], "GiB"),
                                           (["-p", "BIG_N", "100", "-p", "TINY_SIZE", "64"], "multiple of TINY_SIZE")])
def test_parameters_that_cannot_work_are_refused_before_any_notebook_runs(tmp_path, capsys, fake_papermill, params,
                                                                          match):
    assert main(["run", "01", "--smoke", "--out", str(tmp_path / "run"), *params]) == 2
    assert match in capsys.readouterr().err and not fake_papermill


def test_ctrl_c_that_reaches_the_kernel_first_stops_the_run_too(tmp_path, monkeypatch, capsys):
    """Ctrl-C goes to the kernel as well: papermill then reports a cell error named KeyboardInterrupt."""
    ran = []

    def execute(src, dst, **kwargs):
        ran.append(Path(src).stem)
        err = pm.PapermillExecutionError(cell_index=3, exec_count=3, source="", ename="KeyboardInterrupt",
                                         evalue="", traceback=[])
        raise err

    monkeypatch.setattr(pm, "execute_notebook", execute)
    assert main(["run", "01", "02", "--smoke", "--out", str(tmp_path / "run")]) == 130
    assert ran == ["01_measuring"] and (tmp_path / "run" / "summary.md").exists()
