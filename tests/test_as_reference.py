"""A reference run on the reference GPU is shown beside nothing older: its pages become the reference."""
from __future__ import annotations

import pytest

from gpulab.verdicts.results import AS_REFERENCE_ENV, REFERENCE_SLUG, NotebookResult, load_reference, reference_view


def test_a_reference_run_loads_no_older_reference_of_its_own_gpu(monkeypatch, tmp_path):
    import shutil

    from gpulab.verdicts.results import reference_dir

    assert load_reference("01_measuring") is not None  # committed
    committed = reference_dir() / "01_measuring.json"
    for slug in (REFERENCE_SLUG, "nvidia-a100-sxm4-80gb"):
        (tmp_path / "reference" / slug).mkdir(parents=True)
        shutil.copy(committed, tmp_path / "reference" / slug / committed.name)
    monkeypatch.setenv("GPULAB_DATA", str(tmp_path))
    monkeypatch.setenv(AS_REFERENCE_ENV, "1")
    assert load_reference("01_measuring") is None
    assert load_reference("01_measuring", slug=REFERENCE_SLUG) is None
    assert load_reference("01_measuring", slug="nvidia-a100-sxm4-80gb") is not None  # another GPU's folder: shown


def test_the_reference_view_of_a_reference_run_says_so(monkeypatch):
    mine = NotebookResult("01_measuring", smoke=False)
    monkeypatch.setenv(AS_REFERENCE_ENV, "1")
    assert "is the reference run" in reference_view(mine)._repr_html_()
    monkeypatch.setenv(AS_REFERENCE_ENV, "")
    assert "reference:" in reference_view(mine)._repr_html_()


def test_as_reference_is_refused_off_the_reference_gpu_and_at_smoke_sizes(tmp_path):
    from gpulab.app.course import run_course

    with pytest.raises(ValueError, match="as_reference=True needs full sizes"):
        run_course(["01"], smoke=True, out=tmp_path / "r", as_reference=True)
    with pytest.raises(ValueError, match="runs only on the reference GPU"):  # this machine is not an H200
        run_course(["01"], smoke=False, out=tmp_path / "r", as_reference=True)
    assert not (tmp_path / "r").exists()  # refused before any work
