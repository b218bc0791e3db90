"""Where a course run may write: the notebooks' and the reference runs' folders stay untouched, one run at a time holds
a folder's lock, and each run gets a new folder."""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterator

from ..measuring.files import data_dir, pid_alive
from .faults import make_writable, system_folder
from .summary import collect


NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
REFERENCE_DIR = data_dir() / "reference"
LOCK_NAME = ".gpulab-run.lock"


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


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
        raise ValueError(f"{name} {compare}: no such folder (e.g. data/reference/nvidia-h100-80gb-hbm3)")
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
