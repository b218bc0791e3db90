"""The committed reference pages (data/reference/<gpu>/html/*.html) read without noise: no progress bar frozen
at 0%, no widget repr, no warnings, no absolute paths, no raw dict over 20 lines (`html_export.noise`)."""
from pathlib import Path

import pytest

from gpulab.app.html_export import noise

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(ROOT.glob("data/reference/*/html/*.html"))


@pytest.mark.parametrize("page", PAGES, ids=[f"{p.parent.parent.name}/{p.name}" for p in PAGES])
def test_reference_page_has_no_noise(page):
    found = noise(page.read_text(errors="replace"))
    assert not found, f"{page.relative_to(ROOT)}: " + "; ".join(found[:10])


def test_there_are_reference_pages():
    assert PAGES
