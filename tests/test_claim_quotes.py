"""A claim quotes a sentence of the guide, never a bare heading; one verdict per guide sentence in a notebook; the
course's own targets say so in their source and are counted apart."""
from __future__ import annotations

import importlib
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from _notebook_run import GUIDE
from gpulab.verdicts.lesson import _as_spec

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ROOT / "gpulab" / "lessons"
JUDGED = ("confirmed", "refuted", "inconclusive")


def _specs():
    """(lesson module, ClaimSpec) of every claim declared in gpulab/lessons/*.py."""
    for p in sorted(LESSONS.glob("*.py")):
        if p.stem != "__init__":
            for c in getattr(importlib.import_module(f"gpulab.lessons.{p.stem}"), "CLAIMS", ()):
                yield p.stem, _as_spec(c)


def _bare(text: str) -> str:
    """A line without its markup: '#', '*', list marks, spacing and a closing colon."""
    return re.sub(r"[:\s]+$", "", re.sub(r"^(?:[-#*\s]+|\d+\.\s+)", "", text.replace("**", ""))).strip()


def _headings() -> set[str]:
    """Every markdown heading of the guide's documents: '#' lines and lines that are bold alone, outside code."""
    out = set()
    for p in GUIDE.glob("00*.txt"):
        code = False
        for line in p.read_text(errors="replace").splitlines():
            if line.lstrip().startswith("```"):
                code = not code
                continue
            s = line.strip()
            if not code and (s.startswith("#") or re.fullmatch(r"\*\*[^*]+\*\*:?", s)):
                out.add(_bare(s))
    return out


@pytest.mark.skipif(not GUIDE.is_dir(), reason="the guide's text is not next to this checkout")
def test_every_guide_quote_is_verbatim_and_a_sentence_not_a_bare_heading():
    squash = lambda t: " ".join(t.split())  # noqa: E731
    guide = squash(" ".join(p.read_text(errors="replace") for p in GUIDE.glob("00*.txt")))
    headings = _headings()
    assert "Custom MFU tracker" in headings and "Step 2: Optimize data loading" in headings  # the parser sees them
    for module, s in _specs():
        quote = s.quote or s.text
        if s.origin == "course" and squash(quote) not in guide:
            assert quote.startswith("course"), f"{module}.{s.key}: a course target's quote says it is the course's"
            continue
        assert squash(quote) in guide, f"{module}.{s.key}: quote not in the guide: {quote!r}"
        assert not re.fullmatch(r"\s*\*\*[^*]+\*\*:?\s*", quote), f"{module}.{s.key}: a bold heading: {quote!r}"
        assert _bare(quote) not in headings, f"{module}.{s.key}: quotes a bare heading: {quote!r}"
        assert len(_bare(quote)) >= 8, f"{module}.{s.key}: too short to be a claim: {quote!r}"


def test_a_course_target_is_marked_by_its_source_and_a_guide_claim_is_not():
    course = {f"{m}.{s.key}" for m, s in _specs() if s.origin == "course"}
    assert {"case_study.floor_speedup", "case_study.floor_mfu", "profiling.guide_tracker_cost_gpu_bound",
            "profiling.tracker_cost_launch_bound", "multi_gpu.ddp_scaling"} <= course
    assert "measuring.raw_matmul" not in course and "mixed_precision.tf32_8x" not in course


def test_judged_claims_of_a_notebook_never_share_one_quote():
    """One verdict per guide sentence: two claims may test one sentence only on two quantities it states, each
    quoting its own part; a spec list declares no two measured guide claims with one quote unless at most one of
    them is judged (the others not comparable) in the reference runs."""
    ref_judged = defaultdict(set)  # notebook number -> keys judged in a reference run
    for p in sorted((ROOT / "data" / "reference").glob("*/[0-9][0-9]_*.json")):
        data = json.loads(p.read_text())
        for c in data.get("claims", []):
            if c.get("verdict") in JUDGED and c.get("key"):
                ref_judged[p.stem[:2]].add(c["key"].split(".", 1)[1])
    by_module = defaultdict(lambda: defaultdict(list))
    prefix = {}
    for module, s in _specs():
        by_module[module][" ".join((s.quote or s.text).split())].append(s)
    for nb in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"):
        src = nb.read_text()
        for module in by_module:
            if f"lessons.{module}" in src or f"lessons import {module}" in src:
                prefix.setdefault(module, nb.stem[:2])
    for module, groups in by_module.items():
        assert prefix.get(module), f"no notebook imports gpulab.lessons.{module}"
        judged_here = ref_judged.get(prefix.get(module, ""), set())
        for quote, specs in groups.items():
            measured = [s.key for s in specs if s.origin == "guide" and s.evidence == "measured"]
            decided = [k for k in measured if k in judged_here]
            assert len(decided) <= 1, f"{module}: {decided} are judged on one quote {quote!r}"
