"""The course runner: every notebook through papermill into a run folder of its own, then one summary built
only from the result JSON files that this run wrote.

`gpulab run` points the notebooks at `<run folder>/results/` (GPULAB_RESULTS), so a later run, or a notebook run
in Jupyter, never overwrites a run's numbers; a notebook that ran to the end also has its result copied to
`data/results/<gpu>/`, the latest of each notebook (`gpulab run --all` summarises it). Nothing is written under
notebooks/ or data/reference/. Every mistake in the options is refused before any notebook runs; faults on the
way end in one line, never a half-written file (`faults`)."""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ..measuring.checks import positive_int
from .faults import DiskFull, Stopped, disk_full, keep_if_whole, system_folder, where  # noqa: F401
from ..verdicts.params import SCHEMAS, check_params, too_big
from ..measuring.files import TMP_MARK, results_dir, write_json_atomic
from ..verdicts.results import ResultError, load_result
from .summary import collect
from .summary_page import write_summary
from .run_folders import (NOTEBOOK_DIR, _inside, check_out_dir, check_reference_dir, check_run_targets, new_run_dir,
                          not_this_runs, reference_problems, run_lock, run_record)

# The kernel's own log (e.g. "Kernel is running over TCP without encryption", once per notebook) and the
# profiler's start/stop lines are nothing a reader can act on; errors in the notebook's code still show.
KERNEL_ARGS = ["--IPKernelApp.log_level=CRITICAL"]
QUIET_ENV = {"KINETO_LOG_LEVEL": "6"}  # the profiler library's log (profiler_start/stop, gpuGetDeviceCount)


def notebooks(selection: Sequence[str] = (), folder: Path | None = None) -> list[Path]:
    """The course notebooks in order; `selection` picks by number ("01", "5") or name prefix."""
    folder = folder or NOTEBOOK_DIR
    allnb = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    if not selection:
        return allnb
    chosen = []
    for s in selection:
        if not s.strip():  # `gpulab run "$NB"` with NB unset must not run the whole course
            raise ValueError(f"notebook {s!r} is empty (an unset variable?); give a number (01) or a name, or none "
                             "at all for every notebook")
        key = s.zfill(2) if s.isdigit() else s
        match = [p for p in allnb if p.stem.startswith(key)]
        if not match:
            names = ", ".join(p.stem for p in allnb)
            raise ValueError(f"notebook {s!r} not found; choose from: {names}")
        chosen += [p for p in match if p not in chosen]
    return chosen


@dataclass
class NotebookRun:
    """How one notebook's headless run went."""

    notebook: str
    ok: bool
    seconds: float
    output: str
    error: str = ""
    html: str = ""
    result: str = ""  # the result file it wrote in this run


@dataclass
class CourseRun:
    """All notebook runs of one `gpulab run`, and where the summary went."""

    runs: list[NotebookRun] = field(default_factory=list)
    out: Path | None = None
    summary_md: Path | None = None
    summary_png: Path | None = None
    problems: list[str] = field(default_factory=list)  # everything the summary lists under Problems, and more
    interrupted: bool = False
    stopped_by: str = ""  # what interrupted it: "Ctrl-C", or the signal's name ("SIGTERM")

    @property
    def ok(self) -> bool:
        """True when every notebook ran, nothing went wrong around them, and the run was not interrupted."""
        return all(r.ok for r in self.runs) and not self.problems and not self.interrupted


# -- checks made before any notebook runs -------------------------------------------------------------------


def _schema_size(notebook: str, name: str, params: Mapping[str, Any], smoke: bool) -> Any:
    value = params.get(name)
    return value if value is not None else SCHEMAS[notebook][name].size_for(smoke)


def _memory_bytes() -> int | None:
    """The most memory one allocation could hope for here: the GPU's (if any), else the host's."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory
        import psutil

        return psutil.virtual_memory().total
    except Exception:
        return None


def _rule_01(params: Mapping[str, Any], smoke: bool) -> str | None:
    big, tiny = (_schema_size("01_measuring", k, params, smoke) for k in ("BIG_N", "TINY_SIZE"))
    if big and tiny and big % tiny:
        return (f"BIG_N={big} must be a multiple of TINY_SIZE={tiny} (the tiny matmuls add up to the big one's "
                "FLOPs)")
    have = _memory_bytes()
    need = 3 * 4 * big * big if big else 0  # A, B and the result, FP32
    if have and need > have:
        return (f"BIG_N={big} needs {need / 2**30:,.0f} GiB for one FP32 matmul's three matrices; this machine has "
                f"{have / 2**30:,.0f} GiB")
    return None


# Rules between a notebook's parameters, and sizes that cannot fit: checked before any notebook runs.
RULES = {"01_measuring": _rule_01}


def parameter_names(nb: Path) -> set[str]:
    """The parameters a notebook takes: its schema's names, or papermill's reading of its parameters cell."""
    if nb.stem in SCHEMAS:
        return set(SCHEMAS[nb.stem])
    import papermill as pm

    return set(pm.inspect_notebook(str(nb)))


def notebook_parameters(chosen: Sequence[Path], user: Mapping[str, Any], smoke: bool) -> dict[str, dict[str, Any]]:
    """The parameters to pass each chosen notebook (only the names it takes), checked against its schema; a name
    no chosen notebook takes is an error (papermill would only log it and run the defaults)."""
    import difflib

    names = {nb.stem: parameter_names(nb) for nb in chosen}
    known = sorted(set().union(*names.values()))
    for name in user:
        if not any(name in n for n in names.values()):
            close = difflib.get_close_matches(name, known, n=1)
            raise ValueError(f"-p {name}: no chosen notebook ({', '.join(names)}) has a parameter {name!r}"
                             + (f" (did you mean {close[0]}?)" if close else "") + f"; they take: {', '.join(known)}")
    out = {}
    for nb in chosen:
        params = {"SMOKE": bool(smoke)} | {k: v for k, v in user.items() if k in names[nb.stem]}
        if nb.stem in SCHEMAS:
            check_params(params, nb.stem, unknown=True)
        if nb.stem in RULES and (why := RULES[nb.stem](params, smoke)):
            raise ValueError(f"{nb.stem}: {why}")
        if why := too_big(user, names[nb.stem], _memory_bytes()):
            raise ValueError(f"{nb.stem}: {why}")
        out[nb.stem] = params
    return out


# -- running ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the kernels started inside, and restore them after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def describe_error(e: BaseException, executed: Path, timeout_s: int | None) -> str:
    """One line for a failed notebook: the cell that timed out and the timeout, or the cell's error."""
    if type(e).__name__ == "CellTimeoutError":
        where = _last_started_cell(executed)
        return (f"a cell timed out after {timeout_s} s (--timeout {timeout_s}){where}; raise --timeout or "
                "leave it out for no limit")
    if type(e).__name__ == "PapermillExecutionError":
        first = (e.source or "").strip().splitlines()
        return (f"cell {e.cell_index + 1} ({first[0][:60] if first else 'empty'}) raised {e.ename}: "
                f"{str(e.evalue).strip()[:200]}")
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip(" -")]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300]


def _last_started_cell(executed: Path) -> str:
    try:
        import nbformat

        nb = nbformat.read(str(executed), as_version=4)
    except Exception:
        return ""
    # Number the cells as the reader's notebook has them: without the cell papermill injected.
    cells = [c for c in nb.cells if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    started = [(i, c) for i, c in enumerate(cells) if c.cell_type == "code" and c.get("execution_count")]
    if not started:
        return ""
    i, cell = started[-1]
    first = cell.source.strip().splitlines()
    return f" in cell {i + 1} of {len(cells)} ({first[0][:60] if first else 'empty'})"


def _result_of(results: Path, stem: str, since: float) -> Path | None:
    """The result file a notebook wrote in this run, if any (11's `RUN_NAME` names it `<stem>-<RUN_NAME>.json`)."""
    found = [p for pattern in (f"*/{stem}.json", f"*/{stem}-*.json") for p in results.glob(pattern)
             if p.stat().st_mtime >= since - 1]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def run_course(selection: Sequence[str] = (), *, smoke: bool = False, out: Path | str | None = None,
               compare: Path | str | None = None, results: Path | str | None = None, progress: bool = True,
               timeout_s: int | None = None, parameters: Mapping[str, Any] | None = None, html: bool = False,
               show_all: bool = False, as_reference: bool = False) -> CourseRun:
    """Run the chosen notebooks headless (one failure does not stop the rest), then write the summary.

    `out`: the run folder (default: a new runs/<date-time>); `compare`: a reference run to show beside it;
    `results`: where the notebooks write their JSON (default: <out>/results); `timeout_s`: seconds per cell;
    `parameters`: checked against the notebooks' schemas; `html`: also export each notebook; `show_all`: summarise
    data/results/<gpu>/, not only this run; `as_reference`: the reference GPU's own run (its pages show no older
    reference beside them)."""
    from ..measuring.device import get_device
    from ..verdicts.results import AS_REFERENCE_ENV, REFERENCE_SLUG

    chosen = notebooks(selection)
    positive_int("timeout_s", timeout_s, allow_none=True)
    compare = check_reference_dir(compare)
    ref_problems = reference_problems(compare)
    per_notebook = notebook_parameters(chosen, dict(parameters or {}), smoke)
    slug = get_device().slug
    if as_reference:
        if smoke:
            raise ValueError("as_reference=True needs full sizes: a reference run is never a smoke run")
        if slug != REFERENCE_SLUG:
            raise ValueError(f"as_reference=True runs only on the reference GPU ({REFERENCE_SLUG}); this is "
                             f"{slug}: its run is shown beside the reference instead")
    if html:
        from .html_export import check_available
        check_available()
    out = check_out_dir(out) if out is not None else new_run_dir()
    check_run_targets(out, compare, results, check_out_dir)  # nothing a run did not make is touched
    out.mkdir(parents=True, exist_ok=True)
    run_results = Path(results) if results else out / "results"
    if _inside(run_results, NOTEBOOK_DIR):
        raise ValueError(f"results={run_results} is inside {NOTEBOOK_DIR}; runs never write there")
    latest = results_dir()  # where Jupyter runs write: the latest result of each notebook
    run_id = os.environ.get("GPULAB_RUN_ID") or out.resolve().name + f"-{os.getpid()}"  # set: calls share peaks
    env = {"GPULAB_RESULTS": str(run_results.resolve()), "GPULAB_RUN_ID": run_id}
    env |= {k: os.environ.get(k, v) for k, v in QUIET_ENV.items()}
    env[AS_REFERENCE_ENV] = "1" if as_reference else ""

    with run_lock(out):
        return _run_locked(chosen, per_notebook, out, run_results, latest, slug, env, compare, ref_problems,
                           timeout_s, html, show_all, progress)


def _run_locked(chosen, per_notebook, out, run_results, latest, slug, env, compare, ref_problems, timeout_s, html,
                show_all, progress) -> CourseRun:
    import papermill as pm
    from tqdm.auto import tqdm

    course = CourseRun(out=out)
    problems: list[str] = []
    bar = tqdm(chosen, desc="notebooks", disable=not progress)
    try:
        _run_notebooks(bar, pm, course, problems, per_notebook, out, run_results, latest, env, timeout_s, html)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM as `Stopped`
        course.interrupted, course.stopped_by = True, str(e) if isinstance(e, Stopped) else "Ctrl-C"
        done = ", ".join(r.notebook for r in course.runs) or "none"
        problems.append(f"interrupted ({course.stopped_by}): the summary holds only the notebooks that finished "
                        f"({done})")
    finally:
        bar.close()
    write_json_atomic(out / "runs.json", run_record(course.runs))
    failed = [r.notebook for r in course.runs if not r.ok]
    if show_all:
        source = latest / slug
        heading = (f"The latest result of every notebook in `{source}` (this run's and earlier ones, each with "
                   "its date).")
        expected = []
    else:
        source = run_results / slug
        heading = f"This run's results only (`{source}`); `--all` shows the latest result of every notebook."
        ran = {r.notebook for r in course.runs}
        expected = [nb.stem for nb in chosen if nb.stem not in failed and nb.stem in ran]
    exclude = [] if show_all else failed + not_this_runs(source, course.runs)
    course.summary_md, course.summary_png = write_summary(source, out, compare=compare, expected=expected,
                                                          exclude=exclude, problems=problems, heading=heading)
    # what the summary found (a corrupt or misnamed file) goes to the terminal and the exit code too, once
    named = tuple(r.notebook for r in course.runs if not r.ok) + tuple(p.split()[0] for p in problems)
    found = [p for p in collect(source, expected, exclude)[1]
             if not (p.startswith("missing: no result for ") and p.split()[4] in named)
             and (show_all or not p.startswith("no results folder"))]
    course.problems = ([p for p in problems if not p.startswith(tuple(f"{f} failed" for f in failed))] + found
                       + ref_problems)
    if course.interrupted:
        course.problems = [p for p in course.problems if not p.startswith("interrupted")]
    return course


def _run_notebooks(bar, pm, course, problems, per_notebook, out, run_results, latest, env, timeout_s, html) -> None:
    for nb in bar:
        bar.set_postfix_str(nb.stem)
        dest = out / nb.name
        writing = out / f"{nb.stem}{TMP_MARK}{os.getpid()}.ipynb"  # papermill rewrites it after every cell
        t0, wall0 = time.perf_counter(), time.time()
        try:
            with _environment(env), _quiet_logs():
                pm.execute_notebook(str(nb), str(writing), parameters=per_notebook[nb.stem], kernel_name="python3",
                                    cwd=str(nb.parent), progress_bar=False, execution_timeout=timeout_s,
                                    extra_arguments=KERNEL_ARGS)
            keep_if_whole(writing, dest)
            run = NotebookRun(nb.stem, True, time.perf_counter() - t0, str(dest))
        except BaseException as e:
            keep_if_whole(writing, dest)  # a cell's error or a timeout: the notebook as far as it ran
            if disk_full(e):
                raise DiskFull(errno.ENOSPC, f"no space left on the device writing {nb.stem}'s files",
                               where(e) or str(out)) from None
            if not isinstance(e, Exception):
                raise
            if getattr(e, "ename", "") == "KeyboardInterrupt":  # Ctrl-C reached the kernel first: stop the run
                raise KeyboardInterrupt from None
            # report and go on: one failing notebook must not stop the course
            run = NotebookRun(nb.stem, False, time.perf_counter() - t0, str(dest), describe_error(e, dest, timeout_s))
            problems.append(f"{nb.stem} failed: {run.error}; its results are not shown as this run's")
        if run.ok:
            written = _result_of(run_results, nb.stem, wall0)
            if written is None:
                problems.append(f"{nb.stem} ran but wrote no result file under {run_results}")
            else:
                run.result = str(written)
                _publish_latest(written, latest / written.parent.name, problems)
        if html and dest.exists():
            from .html_export import export_html
            try:
                with _quiet_logs():
                    run.html = str(export_html(dest, dest.with_suffix(".html")))
            except Exception as e:  # the HTML copy is a convenience: say so, keep the run
                problems.append(f"{nb.stem}: no HTML copy ({type(e).__name__}: {e})")
        course.runs.append(run)


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """Papermill's and nbclient's own log lines ("Timeout waiting for execute reply") repeat what the run's
    report says better; keep them to errors while a notebook runs."""
    loggers = [logging.getLogger(n) for n in ("papermill", "traitlets", "nbclient")]
    old = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, old):
            lg.setLevel(level)


def _publish_latest(written: Path, folder: Path, problems: list[str]) -> None:
    """Copy a notebook's result of this run to data/results/<gpu>/ (the latest of each notebook)."""
    tmp = folder / f"{written.name}{TMP_MARK}{os.getpid()}"
    try:
        load_result(written)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(written, tmp)
        os.replace(tmp, folder / written.name)
    except (OSError, ResultError) as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)  # never a half-copied file beside the latest results
        if disk_full(e):
            raise DiskFull(errno.ENOSPC, f"no space left on the device copying {written.name} to the latest results",
                           str(folder)) from None
        problems.append(f"{written.stem}: result not copied to {folder} ({e})")
