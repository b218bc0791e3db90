"""gpulab: measure how well PyTorch code uses a GPU - time it, count its FLOPs, watch the device, get MFU.

    import gpulab as gl
    dev = gl.get_device()                      # what this machine is, with datasheet peaks
    m = gl.benchmark(lambda: a @ b)            # median and IQR, CUDA events on a GPU
    with gl.Monitor() as mon: train()          # NVML + GPM utilization timeline
    cmp = gl.before_after(slow, fast, name="bf16", flops=f, dtype="bf16")
    with gl.track(flops_per_step=f, dtype="bf16") as t: ... t.step()   # MFU per step, no sync

Every public name, with its one-line summary: docs/API.md.
"""
from typing import Any

from . import flops
from .batchsize import BatchSizeSearch, find_max_batch_size
from .claims import Claim, Estimate, claims_table_html, interval_of
from .dataloading import CUDAPrefetcher, DataLoaderTuning, tune_dataloader
from .device import DeviceInfo, float32_matmul_precision, get_device, lookup_peaks
from .experiment import Comparison, RunResult, before_after, measure
from .flops import count_flops, mfu
from .lesson import ClaimSpec, Lesson, lesson
from .monitor import Monitor, Trace, watch
from .peaks import MeasuredPeaks, measure_peaks
from .profiling import ProfileSummary, find_syncs, nvtx_range, profile
from .results import NotebookResult, load_reference, load_result, reference_view
from .timing import Measurement, Speedup, benchmark, speedup
from .tracker import StepTracker, read_csv
from .tracker import track as _track
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
    "NotebookResult", "load_result", "load_reference", "reference_view", "check_params",
    "plots", "widgets",
]
__version__ = "0.1.0"


def track(**kwargs: Any) -> StepTracker:
    """A `StepTracker` for your loop (see its arguments); `plot=True` draws gpulab's live figure in Jupyter."""
    if kwargs.get("plot") is True:  # the display layer loads only when a figure is asked for
        from .display.plots import tracker_figure
        kwargs["plot"] = tracker_figure
    return _track(**kwargs)


def __getattr__(name: str):
    """Display modules and the course's parameter schemas load on first use: `import gpulab` stays light."""
    import importlib

    if name in ("plots", "widgets"):
        return importlib.import_module(f".display.{name}", __name__)
    if name in ("lessons", "app", "display"):  # subpackages, as attributes
        return importlib.import_module(f".{name}", __name__)
    if name == "check_params":  # the notebooks' parameter schemas load on first use
        return importlib.import_module(".params", __name__).check_params
    if name == "compare":  # the one deprecated top-level name: gl.speedup says what it returns
        import warnings

        warnings.warn("gl.compare is deprecated: use gl.speedup (it returns a Speedup)", DeprecationWarning,
                      stacklevel=2)
        from .timing import speedup
        return speedup
    raise AttributeError(f"module 'gpulab' has no attribute {name!r}")
