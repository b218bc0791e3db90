"""Each notebook's parameter schema: in step with its parameters cell, its defaults pass, mistakes are named."""
import json
import math
import re
from pathlib import Path

import pytest

import gpulab as gl
from gpulab.verdicts.params import SCHEMAS, check_params, parse_value
from _notebook_run import parameters_cell

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_matches_the_notebooks_parameters_and_its_defaults_pass(name):
    defaults = parameters_cell(name)
    assert set(defaults) == set(SCHEMAS[name]), f"{name}: schema and parameters cell differ"
    assert check_params(defaults, name, unknown=True) == defaults
    assert check_params(defaults | {"SMOKE": True}, name)["SMOKE"] is True


def test_every_notebook_has_a_schema():
    assert {p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")} == set(SCHEMAS)


@pytest.mark.parametrize("values, message", [
    ({"SMOKE": "false"}, "SMOKE='false' must be True or False"),
    ({"SMOKE": 1}, "SMOKE=1 must be True or False"),
    ({"BIG_N": "abc"}, "BIG_N='abc' must be an int >= 1 and <= 2147483647 (or None)"),
    ({"MIN_TIME_S": 1e308}, "MIN_TIME_S=1e+308 must be a finite number > 0 and <= 3600 (or None)"),
    ({"OPT_WORKERS": 10**6}, "OPT_WORKERS=1000000 must be an int >= 0 and <= 256"),
    ({"BIG_N": 0}, "BIG_N=0 must be an int >= 1"),
    ({"BIG_N": 1.5}, "BIG_N=1.5 must be an int"),
    ({"MIN_TIME_S": -1}, "MIN_TIME_S=-1 must be a finite number > 0"),
    ({"MIN_TIME_S": math.nan}, "MIN_TIME_S=nan must be a finite number > 0"),
])
def test_check_params_names_the_parameter_and_what_it_takes(values, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        gl.check_params(values, "01_measuring")


def test_a_notebooks_globals_are_checked_and_other_names_ignored():
    g = parameters_cell("03_fusion") | {"torch": object(), "_private": 1}
    assert "torch" not in check_params(g, "03_fusion")
    with pytest.raises(ValueError, match=r"MODEL\['n_head'\]=0"):
        check_params(g | {"MODEL": SCHEMAS["03_fusion"]["MODEL"].default | {"n_head": 0}}, "03_fusion")
    with pytest.raises(ValueError, match="SWEEP_MODES"):
        check_params(g | {"SWEEP_MODES": ["fastest"]}, "03_fusion")
    with pytest.raises(ValueError, match="unknown parameter 'SMOKEE' .did you mean SMOKE"):
        check_params({"SMOKEE": True}, "03_fusion", unknown=True)
    with pytest.raises(ValueError, match="no parameter schema for notebook '99_x'"):
        check_params({}, "99_x")


def test_parse_value_reads_python_and_keeps_other_text():
    assert parse_value("4096") == 4096 and parse_value("0.5") == 0.5 and parse_value("True") is True
    assert parse_value("None") is None and parse_value("[32, 64]") == [32, 64]
    assert parse_value("false") == "false" and parse_value("abc") == "abc"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_each_notebook_checks_its_parameters_right_after_theparameters_cell(name):
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    idx = next(i for i, c in enumerate(nb["cells"]) if "parameters" in c["metadata"].get("tags", []))
    first_code = next("".join(c["source"]) for c in nb["cells"][idx + 1:] if c["cell_type"] == "code")
    # gl.lesson checks every parameter against the schema before anything else runs
    assert (f'gl.check_params(globals(), "{name}")' in first_code
            or f'gl.lesson("{name}", globals()' in first_code.replace("\n", " ").replace("(\n", "(")), first_code[:300]


def _too_big(param, value):
    """A value past any bound, shaped like `value` (a param's default or smoke size)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, int):
        return [10**12]
    if isinstance(value, float):
        return [1e308]
    if isinstance(value, dict):
        return [value | {k: 10**12} for k in value]
    if isinstance(value, (list, tuple)) and value:
        return [[big] + list(value[1:]) for big in _too_big(param, value[0])]
    return []


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_numeric_parameter_has_an_upper_bound_it_names(name):
    """MIN_TIME_S=1e308 or BATCH=10**12 is refused before any work, saying the allowed range, for every number a
    notebook takes (inside its dicts, lists and pairs too), not found minutes into the run."""
    numeric = 0
    for pname, param in SCHEMAS[name].items():
        scalar = [1] if param.accepts.startswith("an int") else [0.5] if param.accepts.startswith("a number") else []
        for size in (param.default, param.size_for(True), *scalar):
            if "pairs" in param.accepts and not isinstance(size, list):
                continue
            for big in _too_big(param, size):
                numeric += 1
                with pytest.raises(ValueError, match=r"<= \d"):
                    param(pname, big)
    assert numeric, f"{name} has no numeric parameter?"
