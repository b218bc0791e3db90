"""The package's layers: the core and the tools at the top of gpulab/ import no lesson, app or display code
(gpulab.lessons, gpulab.app, gpulab.display), and no module grows past 500 lines."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "gpulab"
CORE = ["checks", "text", "claims", "compiler", "params", "dtypes", "memory", "device", "peaks", "timing", "flops", "monitor", "profiling", "experiment", "results",
        "lesson", "tracker", "traces"]
CORE += ["tracker_overhead"]  # what a step tracker costs (notebook 09)
CORE += ["host", "verdicts", "peak_search"]  # the host's kernel-launch time, recorded by every lesson
CORE += ["folding"]  # gl.fold: a secondary output under one summary line
CORE += ["units", "global_state"]  # a claim's unit, and a fraction (gl.mfu) beside a percent band
TOOLS = ["dataloading", "feeds", "batchsize", "sweeps", "fused_loss", "workloads", "training", "distributed", "matmuls", "sampling"]
TOOLS += ["diagnosis"]  # gl.diagnose: evidence, rules and trials over a user's training step
OTHER = {"_rank", "__main__"}  # a rank's entry point, the CLI entry
UPPER = ("gpulab.lessons", "gpulab.app", "gpulab.display")


def _loaded_after_import(module: str) -> list[str]:
    code = (f"import sys, json, importlib; importlib.import_module('gpulab.{module}'); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('gpulab'))))")
    return json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)


@pytest.mark.parametrize("module", CORE + TOOLS)
def test_core_and_tools_import_no_lesson_app_or_display_code(module):
    bad = [m for m in _loaded_after_import(module) if m.startswith(UPPER)]
    assert not bad, f"importing gpulab.{module} loads {bad}"


def test_every_top_level_module_has_a_layer():
    """A new module at the top of gpulab/ is core or a tool (or goes into lessons/, app/ or display/)."""
    names = {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()} - {"lessons", "app", "display"}
    unclassified = sorted(names - set(CORE) - set(TOOLS) - OTHER)
    assert not unclassified, f"place these in a layer (tests/test_layers.py) or a subpackage: {unclassified}"


def test_no_module_over_500_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"split these by concern: {long}"


def test_old_module_paths_are_gone():
    """One deprecation path (names, not module paths): `gpulab.matmul_lab` no longer imports."""
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
            "import gpulab\ntry:\n    import gpulab.matmul_lab\nexcept ModuleNotFoundError:\n    print('gone')")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=PKG.parent).stdout
    assert out.strip() == "gone"


@pytest.mark.parametrize("module", CORE + TOOLS)
def test_core_and_tools_do_not_import_upper_layers_even_lazily(module):
    """An import inside a function still ties the core to a lesson or the app: none anywhere in the source."""
    import ast
    path = PKG / f"{module}.py" if (PKG / f"{module}.py").exists() else PKG / module
    files = [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))
    bad = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                name = "." * node.level + (node.module or "")
                if any(part in ("lessons", "app", "display") for part in name.lstrip(".").split(".")[:1]) or \
                        (node.module or "").startswith(UPPER):
                    bad.append(f"{f.name}:{node.lineno} from {name}")
            elif isinstance(node, ast.Import):
                bad += [f"{f.name}:{node.lineno} import {a.name}" for a in node.names if a.name.startswith(UPPER)]
    assert not bad, f"gpulab.{module} imports upper layers: {bad}"
