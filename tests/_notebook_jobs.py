"""The tests' notebook runs, in the background: each one papermill in its own process, two at a time, started as
soon as the session knows it will need them, so that on a 2-core machine the notebooks run beside the unit tests
instead of after them. A test asks for a run (`NotebookRun.result()`) and waits only if it is not done yet.

A run is a notebook at smoke size, optionally edited as a reader would edit it (`edits`: each `old` text, found in
exactly one code cell, becomes `new`) and with papermill parameters on top of `SMOKE=True`. Equal runs share one
execution. `GPULAB_TEST_NOTEBOOK_JOBS` sets how many run at once (default 2; 1 runs them one after another).
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
TIMEOUT_S = 900  # one smoke run; a hung kernel fails its test instead of the whole session


@dataclass(frozen=True)
class NotebookRun:
    """One smoke run: the notebook's name, a reader's edits to its code, papermill parameters on top of SMOKE=True
    (as (name, value) pairs) and the stem of the result file it writes (default: the notebook's name)."""

    name: str
    edits: tuple[tuple[str, str], ...] = ()
    parameters: tuple[tuple[str, Any], ...] = ()
    result_stem: str | None = None

    def source(self) -> dict:
        """The notebook as the reader left it: every edit applied, each to the one code cell that holds its text."""
        nb = json.loads((NOTEBOOKS / f"{self.name}.ipynb").read_text())
        for old, new in self.edits:
            hits = [c for c in nb["cells"] if c["cell_type"] == "code" and old in "".join(c["source"])]
            assert len(hits) == 1, f"{self.name}: {old!r} is in {len(hits)} code cells, not one"
            hits[0]["source"] = "".join(hits[0]["source"]).replace(old, new).splitlines(keepends=True)
        return nb

    def result(self) -> tuple[dict, dict]:
        """(result JSON, executed notebook), waiting for the run (started now if it was not planned)."""
        return JOBS.get(self)

    def results_folder(self) -> Path:
        """The folder the run wrote its results into (GPULAB_RESULTS), once it has finished."""
        self.result()
        return JOBS.folders[self]


def edited(name: str, edits: list[tuple[str, str]], parameters: dict | None = None,
           result: str | None = None) -> NotebookRun:
    """A reader's edit of `name`, run at smoke size: declare it at a test module's top level so that the session
    starts it early, and call `.result()` in the test."""
    return NotebookRun(name, tuple(tuple(e) for e in edits), tuple(sorted((parameters or {}).items())), result)


class Jobs:
    """The session's notebook runs: a small pool of papermill processes, each run executed once."""

    def __init__(self, workers: int):
        self.workers = max(1, workers)
        self._futures: dict[NotebookRun, cf.Future] = {}
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._pool: cf.ThreadPoolExecutor | None = None
        self._root: Path | None = None
        self._env: dict[str, str] | None = None
        self.folders: dict[NotebookRun, Path] = {}
        self.pids: set[int] = set()  # every papermill process started, running or not

    def submit(self, run: NotebookRun) -> cf.Future:
        """Queue `run` (once); runs start in the order they were queued."""
        with self._lock:
            if run not in self._futures:
                if self._pool is None:
                    self._pool = cf.ThreadPoolExecutor(self.workers, thread_name_prefix="notebook")
                    self._root = Path(tempfile.mkdtemp(prefix="gpulab-test-notebooks-"))
                    self._env = dict(os.environ)  # as the session started, before any test patched it
                self._futures[run] = self._pool.submit(self._execute, run, len(self._futures))
            return self._futures[run]

    def get(self, run: NotebookRun) -> tuple[dict, dict]:
        return self.submit(run).result()

    def _execute(self, run: NotebookRun, index: int) -> tuple[dict, dict]:
        from gpulab.verdicts.results import load_result

        folder = self._root / f"{index:02d}-{run.name}"
        folder.mkdir()
        src, out = folder / f"{run.name}.ipynb", folder / f"{run.name}.out.ipynb"
        src.write_text(json.dumps(run.source()))
        parameters = {"SMOKE": True, **dict(run.parameters)}
        env = {**self._env, "GPULAB_RESULTS": str(folder / "results")}
        self.folders[run] = folder / "results"
        cmd = [sys.executable, "-m", "papermill", str(src), str(out), "-y", json.dumps(parameters),
               "--cwd", str(NOTEBOOKS), "-k", "python3", "--no-progress-bar"]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with self._lock:
            self._procs.add(proc)
            self.pids.add(proc.pid)
        try:
            log, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            log, _ = proc.communicate()
            raise AssertionError(f"{run.name} ran past {TIMEOUT_S} s at smoke size:\n{log[-3000:]}") from None
        finally:
            with self._lock:
                self._procs.discard(proc)
        if proc.returncode != 0:
            raise AssertionError(f"{run.name} failed at smoke size (papermill exit {proc.returncode}):\n{log[-4000:]}")
        stem = run.result_stem or run.name
        files = list((folder / "results").glob(f"*/{stem}.json"))
        assert len(files) == 1, f"{run.name} wrote no {stem}.json under {folder / 'results'}"
        return load_result(files[0]), json.loads(out.read_text())

    def shutdown(self) -> None:
        """Stop what is queued or running and remove the runs' folder (end of session)."""
        with self._lock:
            for f in self._futures.values():
                f.cancel()
            for p in self._procs:
                p.kill()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)


def live_children() -> list:
    """This process's live child processes (recursive) that are not the background notebook runs or their kernels:
    what a test that starts workers must find stopped when it ends."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if {p.pid, *(a.pid for a in p.parents())} & JOBS.pids:
                continue
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


JOBS = Jobs(int(os.environ.get("GPULAB_TEST_NOTEBOOK_JOBS", "2")))

_NAME = re.compile(r"\b\d\d_[a-z_]+[a-z]\b")


def notebook_names(text: str) -> list[str]:
    """The course notebooks `text` names, in order of first mention."""
    known = {p.stem for p in NOTEBOOKS.glob("*.ipynb")}
    return list(dict.fromkeys(n for n in _NAME.findall(text) if n in known))


def planned_runs(items: list, smoke_overrides: dict[str, dict]) -> list[NotebookRun]:
    """The runs the selected `notebook` tests will ask for, in the order they will first ask: the edited runs a
    test module declares, and the smoke run of each notebook a `smoke_run` test names (its parameter, else its
    module's text)."""
    runs: list[NotebookRun] = []
    texts: dict[str, str] = {}
    for item in items:
        if item.get_closest_marker("notebook") is None or getattr(item, "module", None) is None:
            continue
        module = item.module
        runs += [v for v in vars(module).values() if isinstance(v, NotebookRun)]
        if "smoke_run" in getattr(item, "fixturenames", ()):
            params = getattr(getattr(item, "callspec", None), "params", {})
            names = notebook_names(" ".join(str(v) for v in params.values()))
            if not names:
                if module.__file__ not in texts:
                    texts[module.__file__] = Path(module.__file__).read_text()
                names = notebook_names(texts[module.__file__])
            runs += [smoke(n, smoke_overrides) for n in names]
    return list(dict.fromkeys(runs))


def smoke(name: str, smoke_overrides: dict[str, dict]) -> NotebookRun:
    """The shared smoke run of `name`, with the test suite's -p overrides for it."""
    return NotebookRun(name, parameters=tuple(sorted(smoke_overrides.get(name, {}).items())))
