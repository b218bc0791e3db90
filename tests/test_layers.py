"""The package's layers: the core imports no lesson, app or display code, and no module grows past 500 lines."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "gpulab"
CORE = ["checks", "claims", "device", "peaks", "timing", "flops", "monitor", "profiling", "experiment", "results",
        "lesson", "tracker", "traces"]
TOOLS = ["dataloading", "batchsize", "fused_loss", "workloads", "training", "distributed"]
APP = {"course", "summary", "selfcheck", "html_export", "params", "__main__"}
DISPLAY = {"plots", "widgets"}


def _is_lesson(name: str) -> bool:
    return name.endswith(("_lab", "_lesson", "_claims", "_report")) or name in ("compile_checks", "case_study")


def _loaded_after_import(module: str) -> list[str]:
    code = (f"import sys, json, importlib; importlib.import_module('gpulab.{module}'); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('gpulab'))))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return [m.split(".")[1] for m in json.loads(out) if m.count(".") >= 1]


@pytest.mark.parametrize("module", CORE + TOOLS)
def test_core_and_tools_import_no_lesson_app_or_display_code(module):
    loaded = set(_loaded_after_import(module))
    bad = sorted(m for m in loaded if _is_lesson(m) or m in APP or m in DISPLAY)
    assert not bad, f"importing gpulab.{module} loads {bad}"


def test_every_module_is_classified():
    """A new module must be placed in a layer here, so the layering rule covers it."""
    names = {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"} | {p.name for p in PKG.iterdir()
                                                                          if (p / "__init__.py").exists()}
    known = set(CORE) | set(TOOLS) | APP | DISPLAY | {"_rank"}
    unclassified = sorted(n for n in names if n not in known and not _is_lesson(n))
    assert not unclassified, f"place these in a layer in tests/test_layers.py: {unclassified}"


def test_no_module_over_500_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"split these by concern: {long}"
