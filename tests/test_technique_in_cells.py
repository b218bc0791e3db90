"""The technique is written in the cells: each notebook's code cells hold the PyTorch it teaches, so a reader can
change one line and rerun; and `gpulab/lessons/` stays one small module per notebook that imports no other."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from _notebook_run import GUIDE

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
LESSONS = ROOT / "gpulab" / "lessons"

# Each entry: alternatives separated by "|" (any one must appear in a code cell of the notebook).
REQUIRED = {
    "01_measuring": [r"torch\.cuda\.synchronize\(|torch\.cuda\.Event\(", r"time\.time\(\)", r"FlopCounterMode"],
    "02_tensor_cores": [r"torch\.set_float32_matmul_precision\(", r"torch\.bfloat16", r"torch\.float16",
                        r"torch\.float32", r"torch\._scaled_mm\(|float8_e4m3fn", r"@|torch\.matmul\(|torch\.mm\("],
    "03_fusion": [r"torch\.compile\(", r"torch\.cuda\.graph\(|torch\.cuda\.CUDAGraph\("],
    "04_sync_points": [r"\.item\(\)", r"\.pin_memory\(\)", r"non_blocking=True", r"torch\.cuda\.Stream\("],
    "05_data_overlap": [r"DataLoader\(", r"num_workers=", r"pin_memory=", r"prefetch_factor=",
                        r"persistent_workers="],
    "06_batch_size": [r"find_max_batch_size\(", r"\.backward\(\)", r"ACCUM|accum"],
    "07_mixed_precision": [r"torch\.autocast\(", r"torch\.amp\.GradScaler\(", r"F\.scaled_dot_product_attention\(",
                           r"fused=True"],
    "08_case_study": [r"torch\.autocast\(", r"torch\.compile\(", r"scaled_dot_product_attention\(", r"fused=True"],
    "09_profiling": [r"torch\.profiler\.profile\(", r"schedule\(|schedule=", r"torch\.cuda\.nvtx\.range",
                     r"_record_memory_history\("],
    "10_multi_gpu": [r"DistributedDataParallel\(", r"fully_shard\(", r"dist\.all_reduce\("],
    "11_your_model": [r"gl\.diagnose\(", r"gl\.count_flops\(", r"gl\.mfu\(", r"gl\.Monitor\(", r"gl\.plots\.timeline\(",
                      r"gl\.track\(", r"gl\.profile\(", r"gl\.time_breakdown\(", r"gl\.step_memory\(",
                      r"gl\.find_syncs\(", r"gl\.find_max_batch_size\(", r"gl\.tune_dataloader\(",
                      r"gl\.before_after\(", r"torch\.autocast\(", r"\.backward\(\)"],
}
MAX_LESSON_LINES = 3600
# A line that writes PyTorch a reader would type (not an import): the share of cells holding one is the measure.
PYTORCH_LINE = re.compile(r"\btorch\.|\bnn\.|\bF\.|\.backward\(|DataLoader\(|\.zero_grad\(|\bopt(imizer)?\.step\(|scaler\."
                          r"|autocast|\.item\(\)|\.to\(|\.cuda\(\)|\.pin_memory\(|dist\.|fully_shard\(|DistributedDataParallel\(")
MIN_SHARE_EACH, MIN_SHARE_ALL = 0.45, 0.60


def code_cells(name: str) -> str:
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_the_technique_is_written_in_a_code_cell(name):
    code = code_cells(name)
    missing = [pattern for pattern in REQUIRED[name] if not re.search(pattern, code)]
    assert not missing, f"{name}: no code cell writes {missing}"


def test_lessons_are_small_and_one_per_notebook():
    modules = [p for p in LESSONS.glob("*.py") if p.name != "__init__.py"]
    total = sum(len(p.read_text().splitlines()) for p in LESSONS.glob("*.py"))
    assert total <= MAX_LESSON_LINES, f"gpulab/lessons/ holds {total} lines (at most {MAX_LESSON_LINES})"
    assert len(modules) <= len(list(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))), sorted(p.name for p in modules)


def test_no_lesson_imports_another():
    names = {p.stem for p in LESSONS.glob("*.py")} - {"__init__"}
    for p in LESSONS.glob("*.py"):
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                targets = [mod.rsplit(".", 1)[-1]] if mod else [a.name for a in node.names]
                if node.level == 1 and not mod:  # from . import x
                    targets = [a.name for a in node.names]
                if mod.startswith("gpulab.lessons.") or node.level == 1:
                    bad = [t for t in targets if t in names and t != p.stem]
                    assert not bad, f"{p.name} imports the lesson module(s) {bad}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    assert not a.name.startswith("gpulab.lessons."), f"{p.name} imports {a.name}"


def test_notebooks_are_nbformat_4_5_with_cell_ids():
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text())
        assert (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5), path.name
        assert all(c.get("id") for c in nb["cells"]), f"{path.name}: a cell without an id"


def test_one_size_convention():
    """Every notebook's sizes come from its schema through gl.lesson: no full=/smoke= dicts, no use_sizes."""
    from _notebook_run import parameters_cell

    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        code = code_cells(path.stem)
        assert "use_sizes(" not in code and "use_smoke_sizes(" not in code and "SMOKE_SIZES" not in code, path.name
        assert not re.search(r"gl\.lesson\([^)]*\bfull=", code), f"{path.name}: sizes passed to gl.lesson by hand"
        values = parameters_cell(path.stem)
        assert values.get("SMOKE") is False, path.name
        from gpulab.verdicts.params import SCHEMAS
        schema = SCHEMAS[path.stem]
        for name, value in values.items():
            if name != "SMOKE" and schema[name].has_default:
                assert value is None, f"{path.stem}: {name} = {value!r}; a sized parameter is None in the cell"


def _course_claims():
    """(lesson module, key, quote, source) of every claim declared in gpulab/lessons."""
    import importlib

    for p in sorted(LESSONS.glob("*.py")):
        if p.stem == "__init__":
            continue
        for spec in getattr(importlib.import_module(f"gpulab.lessons.{p.stem}"), "CLAIMS", ()):
            get = spec.get if isinstance(spec, dict) else lambda k, s=spec: getattr(s, k, "")
            yield p.stem, get("key"), get("quote"), get("source")


def test_every_course_claim_quotes_its_source():
    """Each declared claim carries the source's words verbatim (`quote`) and where they come from (`source`)."""
    for module, key, quote, source in _course_claims():
        assert quote, f"{module}: claim {key} has no quote"
        assert source, f"{module}: claim {key} has no source"


def test_one_guide_sentence_is_judged_in_one_notebook():
    """A quote has its verdict in one notebook only, the one whose workload it is about; others show context.

    Within a notebook one sentence may carry two claims when it states two quantities (a before and an after)."""
    def squash(text: str) -> str:  # a list item ("- ", "1. ", "# ") is the same sentence
        return re.sub(r"^(?:[-*#]+|\d+\.)\s*", "", " ".join(text.split()))
    where: dict[str, set[str]] = {}
    for module, key, quote, source in _course_claims():
        if source.split()[0] != "course":  # the course's own checks quote no document
            where.setdefault(squash(quote), set()).add(module)
    twice = {q: sorted(m) for q, m in where.items() if len(m) > 1}
    assert not twice, f"quotes judged in more than one notebook: {twice}"


@pytest.mark.skipif(not GUIDE.is_dir(), reason="the guide's text is not next to this checkout")
def test_every_quote_stands_verbatim_in_the_document_it_names():
    """A claim's quote is the named document's words (spacing aside): "guide §7.3" is 001, "002 review" is 002;
    a claim of the course's own ("course check") quotes no document."""
    squash = lambda t: " ".join(t.split())  # noqa: E731
    docs = {p.name[:3]: squash(p.read_text(errors="replace")) for p in GUIDE.glob("00*.txt")}
    for module, key, quote, source in _course_claims():
        named = re.search(r"\b00\d\b", source)  # "002 review", "guide summary (000)"; else "guide §7.3" is 001
        doc = named.group() if named else {"guide": "001"}.get(source.split()[0], source.split()[0])
        if doc in docs:
            assert squash(quote) in docs[doc], f"{module}: claim {key}'s quote is not in {doc}: {quote!r}"
        else:
            assert doc == "course", f"{module}: claim {key} names an unknown source {source!r}"


def technique_cells(name: str) -> list[bool]:
    """For each working code cell (not the parameters cell, not imports only): does it write PyTorch?"""
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    found = []
    for c in nb["cells"]:
        if c["cell_type"] != "code" or "parameters" in c["metadata"].get("tags", []):
            continue
        lines = [ln for ln in "".join(c["source"]).splitlines() if ln.strip() and not ln.strip().startswith("#")]
        code = [ln for ln in lines if not re.match(r"\s*(import|from)\s", ln)]
        if code:
            found.append(any(PYTORCH_LINE.search(ln) for ln in code))
    return found


def test_most_working_cells_write_pytorch():
    shares = {name: technique_cells(name) for name in sorted(REQUIRED)}
    low = {n: f"{sum(c)}/{len(c)}" for n, c in shares.items() if sum(c) < MIN_SHARE_EACH * len(c)}
    assert not low, f"under {MIN_SHARE_EACH:.0%} of working code cells write PyTorch: {low}"
    total = sum(sum(c) for c in shares.values()) / sum(len(c) for c in shares.values())
    assert total >= MIN_SHARE_ALL, f"{total:.0%} of the course's working code cells write PyTorch (at least {MIN_SHARE_ALL:.0%})"
