"""The runner's and the CLI's paths off the happy one: nothing lost, every mistake named, exit 2 before any
notebook runs. Notebook execution is faked here except where a tiny notebook of our own runs for real."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import nbformat
import pytest

from gpulab.app import course, run_folders
from gpulab.__main__ import main
from gpulab.measuring.device import get_device
from gpulab.measuring.files import TMP_MARK, write_json_atomic
from gpulab.verdicts.results import load_result
from test_results import make_result

matplotlib.use("Agg")  # tests only
ROOT = Path(__file__).resolve().parent.parent


def exit_code(argv: list[str]) -> int:
    """main(argv)'s exit status, whether it returns it or argparse exits."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def notebooks_snapshot() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in course.NOTEBOOK_DIR.iterdir() if p.is_file()}


@pytest.fixture
def no_notebook_may_run(monkeypatch):
    """Fail the test if any notebook starts: usage errors must stop the run before that."""
    import papermill as pm

    def forbidden(*args, **kwargs):
        raise AssertionError("a notebook ran although the options were wrong")

    monkeypatch.setattr(pm, "execute_notebook", forbidden)


@pytest.fixture
def fake_notebooks(monkeypatch):
    """Notebook execution replaced: each notebook 'writes' a result into GPULAB_RESULTS, or fails."""
    import papermill as pm

    calls = []
    failing: set[str] = set()

    def fake_execute(src, dst, **kwargs):
        stem = Path(src).stem
        calls.append((stem, kwargs))
        Path(dst).write_text("{}")
        if stem in failing:
            raise RuntimeError(f"{stem} broke")
        make_result(stem, speedup=3.0).save(os.environ["GPULAB_RESULTS"])

    monkeypatch.setattr(pm, "execute_notebook", fake_execute)
    monkeypatch.setattr(course, "get_device", lambda: make_result().device, raising=False)
    import gpulab.measuring.device
    monkeypatch.setattr(gpulab.measuring.device, "get_device", lambda index=None: make_result().device)
    return calls, failing


# -- 1. never write under notebooks/ ------------------------------------------------------------------------

def test_out_inside_notebooks_is_refused(no_notebook_may_run, monkeypatch, capsys):
    before = notebooks_snapshot()
    assert exit_code(["run", "02", "--out", str(course.NOTEBOOK_DIR)]) == 2
    assert "runs never write there" in capsys.readouterr().err
    monkeypatch.chdir(course.NOTEBOOK_DIR)
    assert exit_code(["run", "01", "--out", "."]) == 2
    assert exit_code(["run", "01", "--out", "sub/folder"]) == 2
    assert notebooks_snapshot() == before and not (course.NOTEBOOK_DIR / "sub").exists()


def test_default_run_folder_started_inside_notebooks_lands_beside_it(monkeypatch, tmp_path):
    monkeypatch.chdir(course.NOTEBOOK_DIR)
    monkeypatch.setattr(run_folders, "NOTEBOOK_DIR", course.NOTEBOOK_DIR)  # unchanged; new_run_dir checks it
    fake_root = tmp_path / "repo"
    (fake_root / "notebooks").mkdir(parents=True)
    monkeypatch.setattr(run_folders, "NOTEBOOK_DIR", fake_root / "notebooks")
    monkeypatch.chdir(fake_root / "notebooks")
    path = course.new_run_dir()
    assert path.parent == fake_root / "runs"


# -- 2. unique run folders ----------------------------------------------------------------------------------

def test_two_runs_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(course.time, "strftime", lambda fmt: "20260101-120000")
    a, b, c = (course.new_run_dir(tmp_path / "runs") for _ in range(3))
    assert len({a, b, c}) == 3 and all(p.is_dir() for p in (a, b, c))
    assert [p.name for p in (a, b, c)] == ["20260101-120000", "20260101-120000-2", "20260101-120000-3"]


# -- 3 and 6. this run's results only; a failed notebook's old numbers are not shown as this run's --------

def test_summary_shows_this_runs_results_and_names_failures(tmp_path, fake_notebooks, monkeypatch):
    calls, failing = fake_notebooks
    latest = tmp_path / "results"  # GPULAB_RESULTS of the test: where Jupyter runs write
    make_result("03_fusion", speedup=7.0).save(latest)  # an old result of a notebook not in this run
    make_result("02_tensor_cores", speedup=9.0).save(latest)  # an old result of the notebook that will fail
    failing.add("02_tensor_cores")
    run = course.run_course(["01", "02"], smoke=True, out=tmp_path / "run", progress=False)
    text = run.summary_md.read_text()
    assert "| 01_measuring |" in text
    assert "03_fusion" not in text and "9.00x" not in text  # neither earlier results nor the failed one's
    assert "02_tensor_cores failed: RuntimeError: 02_tensor_cores broke; its results are not shown" in text
    # The run's own result stays in the run folder; the latest copy in data/results was updated for 01 only.
    assert load_result(tmp_path / "run" / "results" / "nvidia-h100-80gb-hbm3" / "01_measuring.json")
    assert (latest / "nvidia-h100-80gb-hbm3" / "01_measuring.json").exists()
    assert load_result(latest / "nvidia-h100-80gb-hbm3" / "02_tensor_cores.json")["experiments"][0]["speedup"] == 9.0
    # Each notebook was told where to write: its run's folder, not data/results.
    assert all(kw["parameters"]["SMOKE"] is True for _, kw in calls)


def test_all_summarises_the_latest_result_of_every_notebook_with_dates(tmp_path, fake_notebooks):
    latest = tmp_path / "results"
    make_result("03_fusion", speedup=7.0).save(latest)
    run = course.run_course(["01"], smoke=True, out=tmp_path / "run", progress=False, show_all=True)
    text = run.summary_md.read_text()
    assert "| 01_measuring |" in text and "| 03_fusion |" in text and "7.00x" in text
    assert "date (UTC)" in text and time.strftime("%Y-") in text


def test_a_jupyter_run_does_not_overwrite_the_runs_result(tmp_path, fake_notebooks):
    course.run_course(["01"], smoke=True, out=tmp_path / "run", progress=False)
    mine = tmp_path / "run" / "results" / "nvidia-h100-80gb-hbm3" / "01_measuring.json"
    before = mine.read_bytes()
    make_result("01_measuring", speedup=1.1).save()  # what a notebook run in Jupyter does
    assert mine.read_bytes() == before


# -- 4 and 5. corrupt and partial result files are named, never a traceback --------------------------------

def _partial(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    good = make_result("01_measuring").to_dict()
    (folder / "01_measuring.json").write_text(json.dumps(good))
    (folder / "02_tensor_cores.json").write_bytes(b"\xb7\x00\xff binary")
    no_summary = json.loads(json.dumps(good)) | {"notebook": "03_fusion"}
    del no_summary["experiments"][0]["before"]["summary"]
    (folder / "03_fusion.json").write_text(json.dumps(no_summary))
    no_name = json.loads(json.dumps(good)) | {"notebook": "04_sync_points"}
    del no_name["experiments"][0]["name"]
    (folder / "04_sync_points.json").write_text(json.dumps(no_name))
    text_speedup = json.loads(json.dumps(good)) | {"notebook": "05_data_overlap"}
    text_speedup["experiments"][0]["speedup"] = "fast"
    (folder / "05_data_overlap.json").write_text(json.dumps(text_speedup))


def test_summary_names_corrupt_and_partial_files(tmp_path, capsys):
    _partial(tmp_path / "r")
    assert exit_code(["summary", str(tmp_path / "r"), "--out", str(tmp_path / "o")]) == 0
    text = (tmp_path / "o" / "summary.md").read_text()
    assert "| 01_measuring |" in text
    assert "skipped 02_tensor_cores.json: not a text file" in text
    assert "skipped 03_fusion.json: experiment 'bf16 autocast' 'before' needs a 'summary'" in text
    assert "skipped 04_sync_points.json: experiment 0 needs 'name'" in text
    assert "skipped 05_data_overlap.json: experiment 'bf16 autocast' 'speedup' must be a number, got 'fast'" in text
    assert "Traceback" not in capsys.readouterr().err


def test_a_reference_with_bad_files_is_named_in_problems(tmp_path):
    _partial(tmp_path / "ref")
    make_result("01_measuring").save(tmp_path / "mine")
    assert exit_code(["summary", str(tmp_path / "mine" / "nvidia-h100-80gb-hbm3"), "--compare",
                      str(tmp_path / "ref")]) == 0
    text = (tmp_path / "mine" / "nvidia-h100-80gb-hbm3" / "summary.md").read_text()
    assert "reference skipped 05_data_overlap.json: experiment 'bf16 autocast' 'speedup' must be a number" in text


def test_a_corrupt_result_written_during_a_run_does_not_end_it(tmp_path, monkeypatch, capsys):
    import papermill as pm

    def writes_binary(src, dst, **kwargs):
        Path(dst).write_text("{}")
        folder = Path(os.environ["GPULAB_RESULTS"]) / get_device().slug
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{Path(src).stem}.json").write_bytes(b"\xb7\xb7\xb7")

    monkeypatch.setattr(pm, "execute_notebook", writes_binary)
    # Both notebooks run and the summary is written; the unreadable results show in the terminal and exit code too.
    assert exit_code(["run", "01", "02", "--out", str(tmp_path / "run")]) == 1
    captured = capsys.readouterr()
    out = captured.out
    assert "ok   01_measuring" in out and "ok   02_tensor_cores" in out and "summary:" in out
    assert "problem: 01_measuring: result not copied" in captured.err
    text = (tmp_path / "run" / "summary.md").read_text()
    assert "skipped 01_measuring.json: not a text file" in text


# -- 7. atomic writes: no hidden temporaries after SIGKILL, files 0644 --------------------------------------

def test_a_write_killed_midway_leaves_a_named_temporary_that_the_next_write_removes(tmp_path):
    target = tmp_path / "r" / "01_measuring.json"
    write_json_atomic(target, {"old": 1})
    code = ("import os, signal, sys; sys.path.insert(0, sys.argv[2]); import gpulab.verdicts.results as r\n"
            "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
            "r.write_json_atomic(sys.argv[1], {'big': list(range(100000))})\n")
    proc = subprocess.run([sys.executable, "-c", code, str(target), str(ROOT)])
    assert proc.returncode == -signal.SIGKILL
    left = [p.name for p in target.parent.iterdir() if p != target]
    assert left and all(TMP_MARK in n and not n.startswith(".") for n in left)  # visible and recognisable
    assert json.loads(target.read_text()) == {"old": 1}  # the previous file is intact
    write_json_atomic(target, {"new": 2})
    assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_result_files_are_created_0644(tmp_path):
    old = os.umask(0o022)
    try:
        path = make_result().save(tmp_path)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


# -- usage errors: exit 2 before any notebook runs ----------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["run", "01", "--out", ""], "is empty"),
    (["run", "01", "--timeout", "-5"], "must be > 0 seconds"),
    (["run", "01", "--timeout", "0"], "must be > 0 seconds"),
    (["run", "01", "--timeout", "ten"], "is not whole seconds"),
    (["run", "01", "--compare", "/missing/reference"], "--compare /missing/reference: no such folder"),
    (["run", "01", "-p", "SMOKE", "false"], "SMOKE='false' must be True or False (Python spells it False)"),
    (["run", "01", "-p", "SMOKEE", "True"], "no chosen notebook (01_measuring) has a parameter 'SMOKEE' "
                                             "(did you mean SMOKE?)"),
    (["run", "01", "-p", "BIG_N", "abc"], "BIG_N='abc' must be an int >= 1 and <= 2147483647 (or None)"),
    (["run", "01", "-p", "BIG_N", "0"], "BIG_N=0 must be an int >= 1 and <= 2147483647 (or None)"),
    (["run", "01", "-p", "MIN_TIME_S", "-1"], "MIN_TIME_S=-1 must be a finite number > 0 and <= 3600 (or None)"),
    (["run", "02", "-p", "DTYPES", "fp32"], "DTYPES='fp32' must be a non-empty list"),
    (["run", "02", "-p", "DTYPES", "['fp32', 'int4']"], "DTYPES[1]='int4' is not allowed"),
    (["run", "01", "--smoke", "-p", "SMOKE", "True"], "contradicts"),
    (["summary", "/nonexistent/results"], "/nonexistent/results: no such folder"),
])
def test_usage_errors_exit_2_and_name_the_mistake(argv, message, no_notebook_may_run, capsys, tmp_path,
                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert exit_code(argv) == 2
    assert message in capsys.readouterr().err
    assert not Path("/nonexistent").exists() and not (tmp_path / "runs").exists()


def test_out_an_existing_file_or_a_read_only_folder(tmp_path, no_notebook_may_run, capsys):
    f = tmp_path / "file.txt"
    f.write_text("x")
    assert exit_code(["run", "01", "--out", str(f)]) == 2
    assert "is an existing file; give a folder" in capsys.readouterr().err
    assert exit_code(["run", "01", "--compare", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err
    if os.geteuid() == 0:
        pytest.skip("root may write to a read-only folder")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    assert exit_code(["run", "01", "--out", str(ro / "run")]) == 2
    assert "is not writable" in capsys.readouterr().err


def test_summary_of_a_folder_without_results_writes_nothing(tmp_path, capsys):
    assert exit_code(["summary", str(tmp_path)]) == 2
    assert "holds no result files" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_parameters_reach_only_the_notebooks_that_take_them(tmp_path, fake_notebooks):
    calls, _ = fake_notebooks
    assert exit_code(["run", "01", "03", "-p", "BIG_N", "256", "-p", "TRAIN_BATCH", "2",
                      "--out", str(tmp_path / "run")]) == 0
    params = {stem: kw["parameters"] for stem, kw in calls}
    assert params["01_measuring"] == {"SMOKE": True, "BIG_N": 256}
    assert params["03_fusion"] == {"SMOKE": True, "TRAIN_BATCH": 2}


def test_check_picks_smoke_sizes_without_a_gpu_like_run(monkeypatch, capsys):
    import torch

    import gpulab.app.selfcheck as selfcheck

    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(selfcheck, "run_check", lambda **kw: seen.update(kw) or make_result("00_device"))
    monkeypatch.setattr(selfcheck, "print_check", lambda result: None)
    assert exit_code(["check"]) == 0
    assert seen == {"smoke": True, "progress": True} and "--full" in capsys.readouterr().err
    assert exit_code(["check", "--full"]) == 0 and seen["smoke"] is False


# -- the kernel's noise, a cell timeout, and HTML, on tiny notebooks of our own ------------------------------

def _tiny_course(folder: Path) -> Path:
    folder.mkdir(parents=True)
    params = nbformat.v4.new_code_cell("SMOKE = False\nSLEEP_S = 0")
    params.metadata["tags"] = ["parameters"]
    work = nbformat.v4.new_code_cell(
        "import time, torch, matplotlib.pyplot as plt\n"
        "with torch.profiler.profile() as p:\n    torch.ones(4) @ torch.ones(4)\n"
        "plt.plot([1, 2, 3]); plt.show()\n"
        "time.sleep(SLEEP_S)\n"
        "import gpulab as gl\n"
        "from test_results import make_result\n"
        "make_result(NAME).save()")
    for name in ("01_tiny", "02_slow"):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# tiny"), params,
                                             nbformat.v4.new_code_cell(f"NAME = {name!r}"), work])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, str(folder / f"{name}.ipynb"))
    return folder


@pytest.mark.notebook
def test_real_run_is_quiet_names_a_cell_timeout_and_writes_html(tmp_path, monkeypatch, capfd):
    pytest.importorskip("papermill")
    folder = _tiny_course(tmp_path / "nbs")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    monkeypatch.setattr(course, "NOTEBOOK_DIR", folder)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    monkeypatch.setattr(course, "SCHEMAS", {})  # notebooks without a schema: names checked by papermill
    run = course.run_course(["01"], smoke=True, out=tmp_path / "run", progress=False, html=True)
    err = capfd.readouterr().err
    assert run.ok, run.runs
    assert "without encryption" not in err and "profiler_start" not in err, err
    html = Path(run.runs[0].html).read_text()
    assert "data:image/png;base64" in html or "image/png" in html
    slow = course.run_course(["02"], smoke=True, out=tmp_path / "run2", progress=False, timeout_s=1,
                             parameters={"SLEEP_S": 5})
    assert not slow.ok
    assert "a cell timed out after 1 s (--timeout 1) in cell 4 of 4 (import time, torch" in slow.runs[0].error
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # the notebooks themselves untouched
