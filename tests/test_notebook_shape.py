"""The notebooks teach: readable code cells, each ending with 'Try this' (counted in non-blank lines).

A notebook may hold as much code as its technique needs (the technique lives in the cells); a cell stays short
enough to read, except a `%%writefile` cell, which is a whole program for torchrun."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
GUIDE = ["01_measuring", "02_tensor_cores", "03_fusion", "04_sync_points", "05_data_overlap", "06_batch_size",
         "07_mixed_precision", "08_case_study"]  # the eight that mirror the guide's sections
MAX_CELL = 40  # lines of code in any one cell (a %%writefile cell is a program of its own)


def lines(name: str, kind: str) -> list[int]:
    """Non-blank source lines of each cell of `kind` ("code" or "markdown")."""
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    return [sum(1 for line in "".join(c["source"]).splitlines() if line.strip())
            for c in nb["cells"] if c["cell_type"] == kind and not "".join(c["source"]).startswith("%%writefile")]


@pytest.mark.parametrize("name", sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")))
def test_no_code_cell_is_over_the_limit(name):
    assert max(lines(name, "code")) <= MAX_CELL, f"{name}: a code cell over {MAX_CELL} lines"


@pytest.mark.parametrize("name", sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")))
def test_every_notebook_ends_with_try_this(name):
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    md = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    assert "## Try this" in md[-1], f"{name}: the last prose is not a 'Try this' section"


def test_no_result_is_built_mid_cell_and_never_shown():
    """Jupyter shows only a cell's last expression: a table or view built on an earlier line without display() is
    computed and silently dropped (08's waterfall table and 10's tables once were)."""
    import ast
    import json
    from pathlib import Path

    shown_only_by_display = ("Table", "T.Table", "gl.reference_view", "gl.fold", "gl.claims_table_html", "HTML",
                             "Markdown")
    lost = []
    for path in sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            src = "".join(cell["source"])
            if cell["cell_type"] != "code" or src.lstrip().startswith("%"):
                continue
            for st in ast.parse(src).body[:-1]:
                if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and \
                        ast.unparse(st.value.func) in shown_only_by_display:
                    lost.append(f"{path.name} cell {i}: {ast.unparse(st)[:60]}")
    assert not lost, lost
