"""The notebooks teach: prose first, short code cells, the scaffolding in gpulab.lessons (counted in non-blank lines)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
GUIDE = ["01_measuring", "02_tensor_cores", "03_fusion", "04_sync_points", "05_data_overlap", "06_batch_size",
         "07_mixed_precision", "08_case_study"]  # the eight that mirror the guide's sections
MAX_CELL = 30  # lines of code in any one cell
MAX_GUIDE_CODE = 1300  # lines of code across the eight


def lines(name: str, kind: str) -> list[int]:
    """Non-blank source lines of each cell of `kind` ("code" or "markdown")."""
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    return [sum(1 for line in "".join(c["source"]).splitlines() if line.strip())
            for c in nb["cells"] if c["cell_type"] == kind]


@pytest.mark.parametrize("name", sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")))
def test_no_code_cell_is_over_the_limit(name):
    assert max(lines(name, "code")) <= MAX_CELL, f"{name}: a code cell over {MAX_CELL} lines"


@pytest.mark.parametrize("name", GUIDE)
def test_prose_comes_first(name):
    code, prose = sum(lines(name, "code")), sum(lines(name, "markdown"))
    assert prose >= code, f"{name}: {prose} lines of prose for {code} of code"


def test_the_eight_guide_notebooks_stay_short():
    total = sum(sum(lines(name, "code")) for name in GUIDE)
    assert total <= MAX_GUIDE_CODE, f"{total} lines of code across the eight"


@pytest.mark.parametrize("name", sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")))
def test_every_notebook_ends_with_try_this(name):
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    md = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    assert "## Try this" in md[-1], f"{name}: the last prose is not a 'Try this' section"
