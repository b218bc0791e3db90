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
import types
from typing import TYPE_CHECKING, Any

from . import _moved  # noqa: F401 (gpulab.batchsize, .dataloading, .tracker: the tools' old paths, one release)

# Every public name and the module it lives in. They load on first use (PEP 562), so that `import gpulab`, and
# `python -m gpulab --help`, do not wait for torch; `from gpulab import X` and `gl.X` work as with plain imports.
_WHERE = {
    "DeviceInfo": "measuring.device", "MeasuredPeaks": "measuring.peaks", "get_device": "measuring.device",
    "lookup_peaks": "measuring.device", "measure_peaks": "measuring.peaks",
    "float32_matmul_precision": "measuring.device",
    "Measurement": "measuring.measurement", "Speedup": "measuring.measurement", "benchmark": "measuring.timing",
    "speedup": "measuring.measurement",
    "lesson": "verdicts.lesson", "Lesson": "verdicts.lesson", "ClaimSpec": "verdicts.lesson",
    "flops": "measuring.flops", "count_flops": "measuring.flops", "mfu": "measuring.flops",
    "Monitor": "measuring.monitor", "Trace": "measuring.monitor", "watch": "measuring.monitor",
    "profile": "measuring.profiling", "ProfileSummary": "measuring.profiling", "find_syncs": "measuring.profiling",
    "nvtx_range": "measuring.profiling", "time_breakdown": "tools.traces", "TimeBreakdown": "tools.traces",
    "step_memory": "tools.traces", "StepMemoryProfile": "tools.traces",
    "track": "tools.tracker", "StepTracker": "tools.tracker", "read_csv": "tools.tracker_outputs",
    "find_max_batch_size": "tools.batchsize", "BatchSizeSearch": "tools.batchsize",
    "tune_dataloader": "tools.dataloading", "DataLoaderTuning": "tools.dataloading",
    "CUDAPrefetcher": "tools.dataloading",
    "Claim": "verdicts.claims", "Estimate": "measuring.estimates", "interval_of": "measuring.estimates",
    "claims_table_html": "verdicts.tally", "Comparison": "verdicts.experiment", "RunResult": "verdicts.run_result",
    "before_after": "verdicts.experiment", "measure": "verdicts.experiment",
    "diagnose": "tools.diagnosis", "Diagnosis": "tools.diagnosis", "Finding": "tools.diagnosis",
    "NotebookResult": "verdicts.results", "load_result": "verdicts.results", "load_reference": "verdicts.results",
    "reference_view": "verdicts.results", "check_params": "verdicts.params", "fold": "verdicts.folding",
    "plots": "display.plots", "widgets": "display.widgets",
}
_MODULES = ("flops", "plots", "widgets")  # the public names that are modules

if TYPE_CHECKING:  # what an editor and a type checker see
    from .measuring import flops
    from .tools.batchsize import BatchSizeSearch, find_max_batch_size
    from .verdicts.claims import Claim
    from .measuring.estimates import Estimate, interval_of
    from .verdicts.tally import claims_table_html
    from .tools.dataloading import CUDAPrefetcher, DataLoaderTuning, tune_dataloader
    from .tools.diagnosis import Diagnosis, Finding, diagnose
    from .measuring.device import DeviceInfo, float32_matmul_precision, get_device, lookup_peaks
    from .verdicts.experiment import Comparison, before_after, measure
    from .verdicts.run_result import RunResult
    from .measuring.flops import count_flops, mfu
    from .verdicts.folding import fold
    from .verdicts.lesson import ClaimSpec, Lesson, lesson
    from .measuring.monitor import Monitor, Trace, watch
    from .verdicts.params import check_params
    from .measuring.peaks import MeasuredPeaks, measure_peaks
    from .measuring.profiling import ProfileSummary, find_syncs, nvtx_range, profile
    from .verdicts.results import NotebookResult, load_reference, load_result, reference_view
    from .measuring.timing import benchmark
    from .measuring.measurement import Measurement, Speedup, speedup
    from .tools.tracker import StepTracker, track
    from .tools.tracker_outputs import read_csv
    from .tools.traces import StepMemoryProfile, TimeBreakdown, step_memory, time_breakdown

__all__ = list(_WHERE)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """A public name, or a submodule (`gl.results`, `gl.lessons`), loaded on first use and kept."""
    if name == "track":
        value = _track()
    elif name in _WHERE:
        module = importlib.import_module(f".{_WHERE[name]}", __name__)
        value = module if name in _MODULES else getattr(module, name)
    elif name == "compare":  # the one deprecated top-level name: gl.speedup says what it returns
        import warnings

        warnings.warn("gl.compare is deprecated: use gl.speedup (it returns a Speedup)", DeprecationWarning,
                      stacklevel=2)
        return importlib.import_module(".measuring.measurement", __name__).speedup
    else:
        value = _submodule(name)
    globals()[name] = value
    return value


def _track() -> Any:
    """gpulab.tools.tracker.track, with `plot=True` turned into gpulab's figure (the core tracker draws nothing itself)."""
    import functools

    from .tools.tracker import track

    @functools.wraps(track)  # help(gl.track) shows track's real signature
    def with_figure(**kwargs: Any) -> Any:
        if kwargs.get("plot") is True:  # the display layer loads only when a figure is asked for
            from .display.plots import tracker_figure
            kwargs["plot"] = tracker_figure
        return track(**kwargs)
    return with_figure


def _submodule(name: str) -> types.ModuleType:
    """`gl.results`, `gl.lessons`: a layer, or a module in one (the layers first, so no old path warns)."""
    for where in ("measuring.", "verdicts.", "tools.", "workloads.", ""):
        try:
            return importlib.import_module(f".{where}{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{where}{name}":
                raise
    raise AttributeError(f"module 'gpulab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
