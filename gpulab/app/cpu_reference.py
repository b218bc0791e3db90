"""A run without a GPU still shows what the lessons measure: its summary puts the reference GPU's run beside it.

A CPU run's timings are no speed measurement (`summary.not_a_speed_run`), so its own tables hold no gain and its
chart no bar. Without `--compare`, the summary of such a run compares with the committed reference run
(`results.reference_dir()`) and says so in one line; its chart draws the reference GPU's gains, labelled as such.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ..verdicts.results import reference_dir


def _shown(folder: Path) -> str:
    """`folder` as the reader would type it: relative to the working folder when it lies under it."""
    try:
        rel = Path(os.path.relpath(folder))
    except ValueError:  # another drive (Windows)
        return folder.as_posix()
    return folder.as_posix() if rel.parts[:1] == ("..",) else rel.as_posix()


def default_compare(results: dict[str, dict], compare: Path | str | None) -> tuple[Path | str | None, str | None]:
    """(the folder to compare with, the line that says it was chosen): `compare` itself when given; the reference
    GPU's folder when every result of the run comes from a machine without a CUDA GPU; else (None, None)."""
    if compare is not None or not results:
        return compare, None
    if any((d.get("device") or {}).get("kind") == "cuda" for d in results.values()):
        return None, None
    folder = reference_dir()
    if not any(folder.glob("[0-9][0-9]_*.json")):
        return None, None
    return folder, (f"No GPU in this run: beside its numbers are the reference GPU's (`{_shown(folder)}`); "
                    "`--compare` picks another reference run.")


def figure_inputs(results: dict[str, dict], reference: dict[str, dict], device: str,
                  not_a_speed_run: Callable[[dict], str | None]) -> tuple[dict[str, dict], dict[str, dict] | None, str]:
    """(results, reference, title) for `summary.summary_figure`: this run's gains beside the reference's; or, where
    no result of this run is a speed measurement (`not_a_speed_run` gives why), the reference GPU's gains of the
    same notebooks, titled as the reference GPU's (not this run's)."""
    title = f"What each lesson's optimisation gained on {device} (each notebook's headline, equal work)"
    if not reference or any(not not_a_speed_run(d) for d in results.values()):
        return results, reference, title
    theirs = {nb: d for nb, d in reference.items() if nb in results} or reference
    ref_device = next(iter(theirs.values())).get("device", {}).get("name", "the reference GPU")
    why = sorted({w for d in results.values() if (w := not_a_speed_run(d))})
    return theirs, None, (f"The reference GPU, {ref_device}: what each lesson's optimisation gained there "
                          f"(this run: {'; '.join(why) or 'no result'})")
