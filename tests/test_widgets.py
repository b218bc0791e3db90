"""The control panel: ipywidgets' interact_manual with a Run button; nothing runs until it is pressed."""
import pytest

from gpulab.display import widgets


def test_control_panel_runs_only_on_demand():
    pytest.importorskip("ipywidgets")
    calls = []
    panel = widgets.control_panel(lambda size, mode: calls.append((size, mode)), size=[1, 2, 4], mode=["a", "b"])
    assert calls == []  # built, not run: headless runs never start the experiment
    assert any(getattr(c, "description", "") == "Run" for c in panel.children)
    panel.kwargs_widgets[0].value = 4
    panel.update()  # what the Run button does
    assert calls == [(4, "a")]


def test_control_panel_rejects_bad_controls():
    pytest.importorskip("ipywidgets")
    with pytest.raises(ValueError, match="control size"):
        widgets.control_panel(lambda size: None, size=object())
    with pytest.raises(ValueError, match="run must be callable"):
        widgets.control_panel("not a function", size=[1])
