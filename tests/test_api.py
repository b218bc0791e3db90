"""An API you can find: the reusable tools at the top level, one page listing every public name (kept true
here), a docstring on every public method, `--version`, and one deprecation path."""
from __future__ import annotations

import inspect
import warnings
from pathlib import Path

import pytest

import gpulab as gl
from gpulab.__main__ import _members, api_markdown, main

API_MD = Path(__file__).resolve().parent.parent / "docs" / "API.md"


def test_api_page_is_generated_from_the_code():
    assert API_MD.read_text() == api_markdown(), "docs/API.md is stale: run `python -m gpulab api > docs/API.md`"


def test_every_public_name_and_method_has_a_docstring():
    missing = []
    for name in gl.__all__:
        obj = getattr(gl, name)
        if inspect.ismodule(obj):
            missing += [f"{name}.{n}" for n, f in vars(obj).items() if not n.startswith("_")
                        and inspect.isfunction(f) and f.__module__ == obj.__name__ and not inspect.getdoc(f)]
            continue
        if not inspect.getdoc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            missing += [f"{name}.{m}" for m, f in _members(obj) if not (getattr(f, "__doc__", None) or "").strip()]
    assert not missing, f"no docstring: {missing}"


def test_reusable_tools_are_at_the_top_level():
    for name in ("find_max_batch_size", "tune_dataloader", "read_csv", "ProfileSummary", "StepMemoryProfile",
                 "TimeBreakdown", "Speedup", "BatchSizeSearch", "DataLoaderTuning"):
        assert name in gl.__all__ and getattr(gl, name) is not None, name
    assert "tensorboard" in API_MD.read_text().lower()
    assert "tensorboard" in (API_MD.parent.parent / "pyproject.toml").read_text()


def test_version_on_the_command_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"gpulab {gl.__version__}"


def test_one_deprecation_path():
    """gl.compare and DeviceInfo.peaks warn; old module paths and the silent shims are gone; __all__ is current."""
    with pytest.warns(DeprecationWarning, match="gl.speedup"):
        assert gl.compare is gl.speedup
    assert "compare" not in gl.__all__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in gl.__all__:
            getattr(gl, name)  # every listed name resolves without a deprecation
    root = Path(gl.__file__).parent
    assert not (root / "_compat.py").exists()
    assert not (root / "app" / "params.py").exists()  # the runner imports the schemas from gpulab.verdicts.params
    import gpulab.measuring.device as d

    with pytest.raises(AttributeError):
        d._PEAK_CACHE  # noqa: B018  (a private forward: gone)
