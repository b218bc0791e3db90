"""Where a course run may write and which files it owns: the notebooks' and the reference runs' folders stay untouched,
one run at a time holds a folder's lock, each run gets a new folder (or one holding no earlier run's files), never the
folder it compares with, and a summary replaces only a summary that gpulab wrote (its marker line says so)."""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Callable, Iterator

from ..measuring.files import data_dir, make_writable, pid_alive, results_dir
from .faults import system_folder
from .summary import collect


NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
REFERENCE_DIR = data_dir() / "reference"
LOCK_NAME = ".gpulab-run.lock"
SUMMARY_MARK = "<!-- written by gpulab summary: it replaces this file, and no other -->"
PNG_MARK = "gpulab summary"  # in summary.png's metadata (Software)
RUN_FILES = ("runs.json", "summary.md", "summary.png")


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def check_out_dir(out: Path | str, name: str = "--out") -> Path:
    """A folder the run may write to: not empty text, not a file, not under notebooks/, writable."""
    if out is None or str(out).strip() == "":
        raise ValueError(f"{name} is empty; give a folder for the executed notebooks and the summary")
    out = Path(out).expanduser()
    if _inside(out, NOTEBOOK_DIR):
        raise ValueError(f"{name} {out} is inside {NOTEBOOK_DIR}: runs never write there (the course's notebooks "
                         "would be replaced by executed copies); choose another folder, e.g. runs/mine")
    if _inside(out, REFERENCE_DIR):
        raise ValueError(f"{name} {out} is inside {REFERENCE_DIR}: the committed reference runs are never "
                         "overwritten by a run; choose another folder, e.g. runs/mine")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{name} {out} is an existing file; give a folder")
    system = system_folder(out)
    if system:
        raise ValueError(f"{name} {out} is {system}, a folder of the system itself: a run writes a dozen files "
                         "and folders; choose a folder of its own, e.g. runs/mine")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {out}: {parent} is not writable")
    make_writable(out, name)
    return out


def check_reference_dir(compare: Path | str | None, name: str = "--compare") -> Path | None:
    """A reference folder that exists and holds result JSON files (or None)."""
    if compare is None:
        return None
    compare = Path(compare).expanduser()
    if not compare.exists():
        raise ValueError(f"{name} {compare}: no such folder (e.g. data/reference/nvidia-h200)")
    if not compare.is_dir():
        raise ValueError(f"{name} {compare} is a file; give the folder of a reference run")
    if not any(compare.glob("[0-9][0-9]_*.json")):
        raise ValueError(f"{name} {compare} holds no result files (NN_name.json)")
    found, problems = collect(compare)
    if not found:
        raise ValueError(f"{name} {compare}: none of its result files loads ({'; '.join(problems[:3])})")
    return compare


def reference_problems(compare: Path | None, name: str = "--compare") -> list[str]:
    """The files of a reference folder that do not load, each named (for the terminal, as the summary lists them)."""
    return [] if compare is None else [f"{name}: {p}" for p in collect(compare)[1]]


@contextlib.contextmanager
def run_lock(out: Path) -> Iterator[Path]:
    """Hold `out`'s lock while a run writes there: a second run into the same folder stops, naming the first."""
    lock = out / LOCK_NAME
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            holder = lock.read_text(errors="replace").strip() if lock.exists() else ""
            pid = int(holder.split()[0]) if holder.split() and holder.split()[0].isdigit() else None
            if pid is not None and pid_alive(pid):
                raise ValueError(f"--out {out} is in use by another run ({holder}); wait for it to finish or choose "
                                 f"another folder (a stale lock: delete {lock})") from None
            lock.unlink(missing_ok=True)  # its run is gone: a stale lock
    else:
        raise ValueError(f"--out {out}: could not take the lock {lock}")
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()} pid, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    try:
        yield lock
    finally:
        lock.unlink(missing_ok=True)


def new_run_dir(base: Path | str = "runs") -> Path:
    """A fresh folder runs/<date-time>, with -2, -3, ... when another run started in the same second."""
    base = Path(base)
    if _inside(base, NOTEBOOK_DIR):  # started from inside notebooks/: keep runs beside it instead
        base = NOTEBOOK_DIR.parent / "runs"
    base.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1, 10_000):
        path = base / (stamp if i == 1 else f"{stamp}-{i}")
        try:
            path.mkdir()  # atomic: of two runs asking for the same name, one gets it
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"no free run folder under {base}")


def check_compare_apart(out: Path, compare: Path | None) -> None:
    """Refuse a --compare folder that the run writes into (or that holds the run folder)."""
    if compare is not None and (_inside(compare, out) or _inside(out, compare)):
        raise ValueError(f"--compare {compare} is inside --out {out} (or holds it): the run would overwrite the "
                         "results it compares with; give another --out, e.g. runs/mine")


def check_run_targets(out: Path, compare: Path | None, results: Path | str | None,
                      check_folder: Callable[[Path, str], Path]) -> None:
    """Before any work: --compare is apart from --out, --out holds no earlier run's files (unless a live run holds
    its lock: the lock says so), and a GPULAB_RESULTS that is set can be written (not a file, not read-only, not
    the committed reference runs)."""
    check_compare_apart(out, compare)
    if not (out / LOCK_NAME).exists():
        check_fresh_run_folder(out, Path(results) if results else out / "results")
    if os.environ.get("GPULAB_RESULTS"):
        check_folder(results_dir(), "GPULAB_RESULTS")


def not_this_runs(source: Path, runs: list) -> list[str]:
    """The result files in `source` that this run did not write (kept out of its summary)."""
    own = {Path(r.result).name for r in runs if r.result}
    return [p.stem for p in source.glob("[0-9][0-9]_*.json") if p.name not in own]


def earlier_run_files(out: Path, results: Path) -> list[Path]:
    """An earlier run's files in `out`: its runs.json, summary, executed notebooks and result files."""
    found = [out / name for name in RUN_FILES if (out / name).exists()]
    found += sorted(out.glob("[0-9][0-9]_*.ipynb")) + sorted(results.glob("*/[0-9][0-9]_*.json"))
    return found


def check_fresh_run_folder(out: Path, results: Path) -> None:
    """Refuse a run folder that holds files this run did not make, naming one: a run never replaces them."""
    earlier = earlier_run_files(out, results)
    if earlier:
        more = f" and {len(earlier) - 1} more" if len(earlier) > 1 else ""
        raise ValueError(f"--out {out} holds files of an earlier run or of your own ({earlier[0]}{more}): a run "
                         "never replaces files it did not make; choose a new folder (e.g. runs/mine-2) or leave "
                         "--out out for a new runs/<date-time>")


def written_by_gpulab(path: Path) -> bool:
    """Whether `path` is a summary.md or summary.png that gpulab wrote (its marker; older ones by their heading)."""
    try:
        head = path.read_bytes()[:1_000_000]
    except OSError:
        return False
    if path.suffix == ".png":
        return PNG_MARK.encode() in head
    return SUMMARY_MARK.encode() in head or head.startswith(b"# gpulab summary")


def check_summary_target(out: Path) -> None:
    """Refuse to write summary.md/summary.png over files of those names that gpulab did not write."""
    md, png = out / "summary.md", out / "summary.png"
    ours_md = md.exists() and written_by_gpulab(md)
    for path in (md, png):
        if path.exists() and not (written_by_gpulab(path) or (path is png and ours_md)):
            raise ValueError(f"{path} exists and was not written by gpulab: a summary never replaces it; move it, "
                             "or give --out another folder")


def run_record(runs: list) -> dict:
    """runs.json: its marker, each notebook's run, and the result files this run wrote (its own, and no other)."""
    return {"written_by": "gpulab run", "runs": [r.__dict__ for r in runs],
            "results": [Path(r.result).name for r in runs if r.result]}
