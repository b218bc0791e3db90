"""gpulab: measure how well PyTorch code uses a GPU - time it, count its FLOPs, watch the device, get MFU.

    import gpulab as gl
    dev = gl.get_device()                      # what this machine is, with datasheet peaks
    m = gl.benchmark(lambda: a @ b)            # median and IQR, CUDA events on a GPU
    with gl.Monitor() as mon: train()          # NVML + GPM utilization timeline
    cmp = gl.before_after(slow, fast, name="bf16", flops=f, dtype="bf16")
    with gl.track(flops_per_step=f, dtype="bf16") as t: ... t.step()   # MFU per step, no sync

Every public name, with its one-line summary: docs/API.md.
"""
import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# Every public name and the module it lives in. They load on first use (PEP 562), so that `import gpulab`, and
# `python -m gpulab --help`, do not wait for torch; `from gpulab import X` and `gl.X` work as with plain imports.
_WHERE = {
    "flops": None, "count_flops": "flops", "mfu": "flops",
    "BatchSizeSearch": "batchsize", "find_max_batch_size": "batchsize",
    "Claim": "claims", "Estimate": "claims", "claims_table_html": "claims", "interval_of": "claims",
    "CUDAPrefetcher": "dataloading", "DataLoaderTuning": "dataloading", "tune_dataloader": "dataloading",
    "Diagnosis": "diagnosis", "Finding": "diagnosis", "diagnose": "diagnosis",
    "DeviceInfo": "device", "float32_matmul_precision": "device", "get_device": "device", "lookup_peaks": "device",
    "Comparison": "experiment", "RunResult": "experiment", "before_after": "experiment", "measure": "experiment",
    "ClaimSpec": "lesson", "Lesson": "lesson", "lesson": "lesson",
    "Monitor": "monitor", "Trace": "monitor", "watch": "monitor",
    "MeasuredPeaks": "peaks", "measure_peaks": "peaks",
    "ProfileSummary": "profiling", "find_syncs": "profiling", "nvtx_range": "profiling", "profile": "profiling",
    "NotebookResult": "results", "load_reference": "results", "load_result": "results", "reference_view": "results",
    "Measurement": "timing", "Speedup": "timing", "benchmark": "timing", "speedup": "timing",
    "StepTracker": "tracker", "read_csv": "tracker", "track": None,
    "StepMemoryProfile": "traces", "TimeBreakdown": "traces", "step_memory": "traces", "time_breakdown": "traces",
    "check_params": "params", "fold": "folding",
    "plots": "display.plots", "widgets": "display.widgets",
}

if TYPE_CHECKING:  # what an editor and a type checker see
    from . import flops
    from .batchsize import BatchSizeSearch, find_max_batch_size
    from .claims import Claim, Estimate, claims_table_html, interval_of
    from .dataloading import CUDAPrefetcher, DataLoaderTuning, tune_dataloader
    from .diagnosis import Diagnosis, Finding, diagnose
    from .device import DeviceInfo, float32_matmul_precision, get_device, lookup_peaks
    from .experiment import Comparison, RunResult, before_after, measure
    from .flops import count_flops, mfu
    from .folding import fold
    from .lesson import ClaimSpec, Lesson, lesson
    from .monitor import Monitor, Trace, watch
    from .params import check_params
    from .peaks import MeasuredPeaks, measure_peaks
    from .profiling import ProfileSummary, find_syncs, nvtx_range, profile
    from .results import NotebookResult, load_reference, load_result, reference_view
    from .timing import Measurement, Speedup, benchmark, speedup
    from .tracker import StepTracker, read_csv, track
    from .traces import StepMemoryProfile, TimeBreakdown, step_memory, time_breakdown

__all__ = [
    "DeviceInfo", "MeasuredPeaks", "get_device", "lookup_peaks", "measure_peaks", "float32_matmul_precision",
    "Measurement", "Speedup", "benchmark", "speedup",
    "lesson", "Lesson", "ClaimSpec",
    "flops", "count_flops", "mfu",
    "Monitor", "Trace", "watch",
    "profile", "ProfileSummary", "find_syncs", "nvtx_range", "time_breakdown", "TimeBreakdown", "step_memory",
    "StepMemoryProfile",
    "track", "StepTracker", "read_csv",
    "find_max_batch_size", "BatchSizeSearch", "tune_dataloader", "DataLoaderTuning", "CUDAPrefetcher",
    "Claim", "Estimate", "interval_of", "claims_table_html", "Comparison", "RunResult", "before_after", "measure",
    "diagnose", "Diagnosis", "Finding",
    "NotebookResult", "load_result", "load_reference", "reference_view", "check_params", "fold",
    "plots", "widgets",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """A public name, or a submodule (`gl.results`, `gl.lessons`), loaded on first use and kept."""
    if name == "track":
        value = _track()
    elif name in _WHERE:
        where = _WHERE[name]
        module = importlib.import_module(f".{where or name}", __name__)
        value = module if where is None or where.startswith("display.") else getattr(module, name)
    elif name == "compare":  # the one deprecated top-level name: gl.speedup says what it returns
        import warnings

        warnings.warn("gl.compare is deprecated: use gl.speedup (it returns a Speedup)", DeprecationWarning,
                      stacklevel=2)
        return importlib.import_module(".timing", __name__).speedup
    else:
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'gpulab' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def _track() -> Any:
    """gpulab.tracker.track, with `plot=True` turned into gpulab's figure (the core tracker draws nothing itself)."""
    import functools

    from .tracker import track

    @functools.wraps(track)  # help(gl.track) shows track's real signature
    def with_figure(**kwargs: Any) -> Any:
        if kwargs.get("plot") is True:  # the display layer loads only when a figure is asked for
            from .display.plots import tracker_figure
            kwargs["plot"] = tracker_figure
        return track(**kwargs)
    return with_figure


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """gpulab itself. `gl.lesson` is the function: loading the submodule of the same name must not rebind it."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "lesson" and isinstance(value, types.ModuleType):
            return  # the module stays in sys.modules["gpulab.lesson"], where `from gpulab.lesson import ...` finds it
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
