"""A run touches nothing it did not make: the folder it compares with, an earlier run's files, a reader's own
summary, the committed reference runs; and what goes wrong around it is said before any work."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

import gpulab as gl
from gpulab import results
from gpulab.__main__ import main
from gpulab.app import course, run_folders
from gpulab.measuring.device import get_device
from test_cli_guards import fake_papermill  # noqa: F401  (one fake runner for every CLI test)
from test_results import make_result

pm = pytest.importorskip("papermill")


def _err_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("gpulab:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_compare_folder_inside_the_run_folder_is_refused(tmp_path, capsys, fake_papermill):
    """Item 1: a run into X compared with X/results/<gpu> would overwrite what it compares with."""
    out = tmp_path / "run"
    folder = make_result("01_measuring").save(out / "results").parent
    before = (folder / "01_measuring.json").read_text()
    assert main(["run", "01", "--smoke", "--out", str(out), "--compare", str(folder)]) == 2
    line = _err_line(capsys.readouterr().err)
    assert "--compare" in line and "inside --out" in line and not fake_papermill
    assert (folder / "01_measuring.json").read_text() == before


@pytest.mark.parametrize("earlier", ["results", "runs.json", "summary.md", "notebook"])
def test_a_folder_holding_an_earlier_runs_files_is_refused_and_kept(tmp_path, capsys, fake_papermill, earlier):
    """Item 2: an earlier (interrupted) run's results, runs.json, summary or executed notebooks are never replaced."""
    out = tmp_path / "run"
    out.mkdir()
    path = {"results": lambda: make_result("05_data_overlap").save(out / "results"),
            "runs.json": lambda: out / "runs.json", "summary.md": lambda: out / "summary.md",
            "notebook": lambda: out / "05_data_overlap.ipynb"}[earlier]()
    if not path.exists():
        path.write_text("[]\n")
    before = path.read_text()
    assert main(["run", "01", "--smoke", "--out", str(out)]) == 2
    line = _err_line(capsys.readouterr().err)
    assert path.name in line and "never replaces" in line and not fake_papermill
    assert path.read_text() == before and not (out / "01_measuring.ipynb").exists()


def test_runs_json_lists_this_runs_notebooks_with_a_marker(tmp_path, capsys, fake_papermill):
    out = tmp_path / "run"
    assert main(["run", "01", "02", "--smoke", "--out", str(out)]) == 0
    runs = json.loads((out / "runs.json").read_text())
    assert runs["written_by"] == "gpulab run" and [r["notebook"] for r in runs["runs"]] == ["01_measuring",
                                                                                          "02_tensor_cores"]
    assert runs["results"] == ["01_measuring.json", "02_tensor_cores.json"]


def test_the_summary_command_never_replaces_a_readers_own_summary(tmp_path, capsys):
    """Item 3: `summary --out` into a folder holding a summary.md gpulab did not write is refused, naming it."""
    folder = make_result("01_measuring").save(tmp_path / "res").parent
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.md").write_text("# my notes\n")
    assert main(["summary", str(folder), "--out", str(mine)]) == 2
    line = _err_line(capsys.readouterr().err)
    assert str(mine / "summary.md") in line and "not written by gpulab" in line
    assert (mine / "summary.md").read_text() == "# my notes\n" and not (mine / "summary.png").exists()
    (mine / "summary.md").unlink()
    (mine / "summary.png").write_bytes(b"a photo")
    assert main(["summary", str(folder), "--out", str(mine)]) == 2
    assert (mine / "summary.png").read_bytes() == b"a photo"
    # gpulab's own summary is rewritten, as often as asked
    assert main(["summary", str(folder)]) == 0 and main(["summary", str(folder)]) == 0


def test_gpulab_results_in_the_reference_folder_is_refused_before_any_work(tmp_path, monkeypatch, capsys,
                                                                         fake_papermill):
    """Item 5: GPULAB_RESULTS into data/reference is refused as --out there is."""
    monkeypatch.setenv("GPULAB_DATA", str(tmp_path / "data"))  # a stand-in: the test never touches the real one
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path / "data" / "reference"))
    assert main(["run", "01", "--smoke", "--out", str(tmp_path / "run")]) == 2
    line = _err_line(capsys.readouterr().err)
    assert "GPULAB_RESULTS" in line and "reference" in line and not fake_papermill
    with pytest.raises(ValueError, match="GPULAB_RESULTS"):
        make_result("01_measuring").save()


@pytest.mark.parametrize("how", ["file", "read-only"])
def test_gpulab_results_that_cannot_be_written_is_refused_before_any_notebook(tmp_path, monkeypatch, capsys,
                                                                            fake_papermill, how):
    """Weak: GPULAB_RESULTS set to a file or a read-only folder: said before the notebooks run, not after."""
    target = tmp_path / "res"
    if how == "file":
        target.write_text("not a folder")
    else:
        target.mkdir()
        real = run_folders.make_writable

        def refuse(out, name="--out"):
            if Path(out) == target:
                raise ValueError(f"{name} {out} cannot be written: Read-only file system")
            return real(out, name)
        monkeypatch.setattr(run_folders, "make_writable", refuse)
    monkeypatch.setenv("GPULAB_RESULTS", str(target))
    assert main(["run", "01", "--smoke", "--out", str(tmp_path / "run")]) == 2
    assert "GPULAB_RESULTS" in _err_line(capsys.readouterr().err) and not fake_papermill


def test_gpulab_results_naming_a_file_is_refused_where_a_lesson_starts(tmp_path, monkeypatch):
    (tmp_path / "res").write_text("not a folder")
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path / "res"))
    with pytest.raises(ValueError, match="GPULAB_RESULTS=.* is a file"):
        gl.lesson("01_measuring", {"SMOKE": True}, show=False)


def test_gpulab_results_that_cannot_be_written_is_refused_where_a_lesson_starts(monkeypatch):
    """A notebook opened in Jupyter finds an unwritable GPULAB_RESULTS at its first cell, not at its save (/proc
    refuses a new folder even to root, who passes every permission check)."""
    monkeypatch.setenv("GPULAB_RESULTS", "/proc/gpulab-results")
    with pytest.raises(ValueError, match="GPULAB_RESULTS /proc/gpulab-results cannot be written"):
        gl.lesson("01_measuring", {"SMOKE": True}, show=False)


def test_a_relative_gpulab_results_resolves_once_against_the_starting_folder(tmp_path, monkeypatch, capsys):
    """Weak: under Jupyter the kernel starts in notebooks/; the variable was set where Jupyter was started."""
    (tmp_path / "notebooks").mkdir()
    monkeypatch.setenv("PWD", str(tmp_path))
    monkeypatch.chdir(tmp_path / "notebooks")
    monkeypatch.setenv("GPULAB_RESULTS", "mine")
    assert results.results_dir() == tmp_path / "mine"
    assert os.environ["GPULAB_RESULTS"] == str(tmp_path / "mine")  # resolved once
    assert str(tmp_path / "mine") in capsys.readouterr().err


def test_sighup_is_handled_like_sigterm(tmp_path, monkeypatch, capsys):
    """Weak: a closed terminal mid-run: the summary and runs.json of what finished, the lock gone, exit 129."""
    def execute(src, dst, **kwargs):
        if "02_" in src:
            os.kill(os.getpid(), signal.SIGHUP)
        make_result(Path(src).stem, speedup=2.0).save(os.environ["GPULAB_RESULTS"])
        Path(dst).write_text("{}")

    monkeypatch.setattr(pm, "execute_notebook", execute)
    before = signal.getsignal(signal.SIGHUP)
    out = tmp_path / "run"
    assert main(["run", "01", "02", "--smoke", "--out", str(out)]) == 129
    assert "stopped by SIGHUP" in _err_line(capsys.readouterr().err)
    assert "01_measuring" in (out / "summary.md").read_text() and (out / "runs.json").exists()
    assert not (out / run_folders.LOCK_NAME).exists() and not list(out.glob("*gpulab-tmp*"))
    assert signal.getsignal(signal.SIGHUP) == before


def test_a_size_past_the_devices_memory_is_refused_before_any_work(tmp_path, monkeypatch, capsys, fake_papermill):
    """Weak: -p COPY_MB 2147483647 would fail 19 s later in the allocator."""
    monkeypatch.setattr(course, "_memory_bytes", lambda: 16 * 2**30)
    assert main(["run", "01", "--smoke", "--out", str(tmp_path / "run"), "-p", "COPY_MB", "2147483647"]) == 2
    line = _err_line(capsys.readouterr().err)
    assert "COPY_MB=2147483647" in line and "16 GiB" in line and not fake_papermill


def test_api_into_a_full_disk_does_not_suggest_an_option_it_lacks(monkeypatch, capsys):
    import errno
    import sys

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Full())
    assert main(["api"]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "--out" not in err


def test_wall_seconds_of_the_summary_and_the_runner_say_what_they_count(tmp_path, capsys, fake_papermill):
    """Trial: the summary's wall (s) and the runner's seconds differ; each says what it counts."""
    out = tmp_path / "run"
    assert main(["run", "01", "--smoke", "--out", str(out)]) == 0
    text = (out / "summary.md").read_text()
    assert "wall (s)" in text and "from the lesson's first cell to its save" in text
    assert "kernel start to end" in capsys.readouterr().out


def test_the_summary_shows_only_the_results_this_run_wrote(tmp_path, monkeypatch, capsys):
    """Item 2: a result another writer leaves in the run's folder meanwhile is not this run's row."""
    def execute(src, dst, **kwargs):
        make_result(Path(src).stem, speedup=2.0).save(os.environ["GPULAB_RESULTS"])
        make_result("07_mixed_precision", speedup=3.0).save(os.environ["GPULAB_RESULTS"])  # not this run's
        Path(dst).write_text("{}")

    import gpulab.measuring.device
    from test_results import H100

    monkeypatch.setattr(pm, "execute_notebook", execute)
    monkeypatch.setattr(gpulab.measuring.device, "get_device", lambda *a, **k: H100)  # the summary reads the results' device
    assert main(["run", "01", "--smoke", "--out", str(tmp_path / "run")]) == 0
    text = (tmp_path / "run" / "summary.md").read_text()
    assert "01_measuring" in text and "07_mixed_precision" not in text
