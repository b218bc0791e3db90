"""Which files a run owns: a run writes only into a folder that holds no earlier run's files, never into the folder
it compares with, and a summary replaces only a summary that gpulab wrote (its marker line says so)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

SUMMARY_MARK = "<!-- written by gpulab summary: it replaces this file, and no other -->"
PNG_MARK = "gpulab summary"  # in summary.png's metadata (Software)
RUN_FILES = ("runs.json", "summary.md", "summary.png")


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


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
    from .course import LOCK_NAME

    check_compare_apart(out, compare)
    if not (out / LOCK_NAME).exists():
        check_fresh_run_folder(out, Path(results) if results else out / "results")
    if os.environ.get("GPULAB_RESULTS"):
        from ..results import results_dir

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
