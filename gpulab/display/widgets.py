"""ipywidgets controls that re-run an experiment with new settings (headless runs use the defaults)."""
from __future__ import annotations

from typing import Any, Callable


def _widget_for(name: str, spec: Any):
    import ipywidgets as w

    if isinstance(spec, w.Widget):
        return spec
    if isinstance(spec, (list, tuple)) and spec and all(isinstance(s, str) for s in spec):
        return w.Dropdown(options=list(spec), value=spec[0], description=name)
    if isinstance(spec, list):
        return w.SelectionSlider(options=spec, value=spec[0], description=name)
    if isinstance(spec, bool):
        return w.Checkbox(value=spec, description=name)
    if isinstance(spec, tuple) and len(spec) in (2, 3):
        lo, hi, *step = spec
        cls = w.FloatSlider if any(isinstance(v, float) for v in spec) else w.IntSlider
        return cls(min=lo, max=hi, step=step[0] if step else 1, value=lo, description=name)
    raise ValueError(f"control {name}={spec!r}: use a list of options, a bool, (min, max[, step]) or a widget")


def control_panel(run: Callable[..., Any], **controls: Any):
    """Controls plus a Run button (ipywidgets' `interact_manual`): clicking calls `run(**values)` and shows what
    it returns or draws.

    controls: name=[options] (dropdown or selection slider), name=(min, max, step) (slider), name=bool, or a
    ready ipywidget. Without ipywidgets this returns None and says so."""
    try:
        import ipywidgets as w
        from IPython.display import display
    except ImportError:
        print("ipywidgets is not installed: the interactive control is skipped (pip install ipywidgets)")
        return None
    if not callable(run):
        raise ValueError("run must be callable")
    boxes = {name: _widget_for(name, spec) for name, spec in controls.items()}

    def show(**values: Any) -> None:
        result = run(**values)
        if result is not None:
            display(result)
        import matplotlib.pyplot as plt
        plt.show()

    # interact_manual runs nothing until the button is pressed: a headless run never starts an experiment here
    return w.interact_manual.options(manual_name="Run")(**boxes).widget(show)
