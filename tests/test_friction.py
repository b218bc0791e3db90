"""Issue 25's friction points on a user's own model: each case here failed (or misled) before its fix."""
from __future__ import annotations

import inspect
import threading
import time

import pytest
import torch

import gpulab as gl
from gpulab.measuring.profiling import ProfileSummary
from gpulab.tools.traces import StepMemoryProfile, categorize

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU behaviour")


def test_profile_summary_repr_is_short_and_readable():
    s = ProfileSummary(steps=3, wall_ms=120.0, gpu_busy_ms=60.0, kernel_count=300, gaps_ms=[0.01] * 20_000,
                       sync_calls={"cudaStreamSynchronize": 3})
    r = repr(s)
    assert len(r) < 300 and "3 steps" in r and "40.000 ms per step" in r and "20000 idle gaps" in r


def test_step_memory_repr_is_short_and_readable():
    n = 5000
    m = StepMemoryProfile(device="cuda:0", times_ms=[i * 0.01 for i in range(n)],
                          by_category={"parameters": [2**20] * n, "activations": list(range(n))})
    r = repr(m)
    assert len(r) < 300 and "peak" in r and "parameters 1.0 MiB" in r
    page = m._repr_html_()  # in the figure's unit: 11's page read "5,140 MiB" beside "peak 5.39 GB"
    assert "<table>" in page and "MiB" not in page and "1.05 MB" in page


def test_memory_the_profiler_could_not_categorize_within_the_step_counts_as_activations():
    """The LM case: the profiler left what forward saved for backward uncategorized (2,329 MiB in "other")."""
    names = ["PARAMETER", "OPTIMIZER_STATE", "INPUT", "TEMPORARY", "ACTIVATION", "GRADIENT", "AUTOGRAD_DETAIL", None]
    mib = 2**20
    rows = [[100 * mib, 200 * mib, mib, 0, 0, 0, 0, 5 * mib + extra * mib] for extra in (0, 1000, 2329, 500, 0)]
    series, moved = categorize(names, rows)
    assert max(series["activations"]) == 2329 * mib and moved == 2329 * mib
    assert max(series["other"]) == 6 * mib  # the input and the level that stayed all step
    assert series["parameters"][0] == 100 * mib and series["optimizer state"][0] == 200 * mib


def _trace(step_ms: float, steps: int = 2) -> dict:
    events, t = [], 0.0
    for _ in range(steps):
        events.append({"ph": "X", "name": "gpulab_step", "cat": "user_annotation", "ts": t, "dur": step_ms * 1e3})
        events.append({"ph": "X", "name": "k", "cat": "kernel", "ts": t + 100, "dur": step_ms * 0.4e3,
                       "args": {"correlation": 1}})
        t += step_ms * 1e3
    return {"traceEvents": events}


def test_breakdown_says_when_the_profiler_itself_slowed_the_step():
    slowed = gl.time_breakdown(_trace(40.0), unprofiled_step_ms=18.0)
    assert "profiler itself costs host time" in slowed.note and "2.2x" in slowed.note
    assert "profiler" not in gl.time_breakdown(_trace(19.0), unprofiled_step_ms=18.0).note
    with pytest.raises(ValueError, match="unprofiled_step_ms"):
        gl.time_breakdown(_trace(19.0), unprofiled_step_ms=-1)


@NO_CUDA
def test_find_syncs_without_cuda_says_it_cannot_tell():
    ran = []
    assert gl.find_syncs(lambda: ran.append(1)) is None and not ran  # None: cannot tell; [] would read "no syncs"


@pytest.mark.parametrize("error", [RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't "
                                                "allocate memory: you tried to allocate 2199023255552 bytes."),
                                   MemoryError()])
def test_batch_size_finder_takes_a_cpu_allocation_failure_as_out_of_memory(error):
    def step(b):
        if b > 12:
            raise error
        torch.ones(b).sum()

    found = gl.find_max_batch_size(step, device="cpu", max_batch=64, measure_throughput=False, progress=False)
    assert found.max_fitting == 12
    # No default cap that a CPU could swap on: a CPU search names its own (test_batchsize), a GPU's is 4096.
    assert inspect.signature(gl.find_max_batch_size).parameters["max_batch"].default is None


def test_monitor_first_cpu_sample_is_not_zero(monkeypatch):
    """psutil keeps its last reading per thread: a counter primed in another thread reads 0 the first time."""
    import psutil

    primed: set[int] = set()

    def per_thread(interval=None, percpu=False):
        tid = threading.get_ident()
        first = tid not in primed
        primed.add(tid)
        value = 0.0 if first else 50.0
        return [value, value] if percpu else value

    monkeypatch.setattr(psutil, "cpu_percent", per_thread)
    with gl.Monitor(poll_s=0.02, gpm=False) as mon:
        time.sleep(0.15)
    values = mon.trace.values("cpu_percent")
    assert values and values[0] == 50.0


def test_track_takes_measured_peaks_and_never_names_a_peak_it_does_not_have(cpu_device):
    t = gl.track(flops_per_step=1e9, dtype="fp32", device=cpu_device)
    assert t.peak_tflops is None and t.peak_name == ""
    peaks = gl.MeasuredPeaks(device=cpu_device.name, tflops={"fp32": 0.5}, copy_gbs=10.0, matmul_size=64)
    t = gl.track(flops_per_step=1e9, dtype="fp32", peaks=peaks, device=cpu_device)
    assert t.peak_tflops == 0.5 and t.peak_name == "measured fp32 peak"
    with pytest.raises(ValueError, match="bf16"):
        gl.track(flops_per_step=1e9, dtype="bf16", peaks=peaks, device=cpu_device)


def test_tracked_mfu_over_100_percent_warns(cpu_device):
    t = gl.track(flops_per_step=1e15, peak_tflops=1.0, device=cpu_device, every=1, printer=lambda s: None)
    with t:
        for _ in range(4):
            time.sleep(0.002)
            t.step()
    with pytest.warns(UserWarning, match="over 100%"):
        t.summary()


def test_benchmark_refuses_a_generator_function():
    def gen():
        yield torch.ones(1000).sum()

    with pytest.raises(ValueError, match="generator"):
        gl.benchmark(gen)


@pytest.mark.parametrize("times", [[-0.5, 0.1], [0.0, 0.0, 0.1], [float("nan")], [float("inf")]])
def test_measurement_refuses_times_that_are_not_positive(times):
    with pytest.raises(ValueError, match="times_s"):
        gl.Measurement("x", times)


def test_mfu_refuses_nan():
    with pytest.raises(ValueError, match="seconds"):
        gl.mfu(1e12, float("nan"), 100.0)


@NO_CUDA
def test_benchmark_on_cuda_without_cuda_names_the_device():
    with pytest.raises(ValueError, match="device='cuda'"):
        gl.benchmark(lambda: None, device="cuda")


def test_lookup_peaks_refuses_none():
    with pytest.raises(ValueError, match="name=None"):
        gl.lookup_peaks(None)


def test_help_answers_without_importing_torch():
    """`python -m gpulab --help` took 15 s on a loaded host: torch was imported before argparse looked."""
    import subprocess
    import sys

    code = ("import runpy, sys\nsys.argv = ['gpulab', '--help']\ntry:\n    runpy.run_module('gpulab', "
            "run_name='__main__')\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            "heavy = [m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules]\nassert not heavy, heavy\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "usage: gpulab" in out


def test_a_cuda_build_without_a_gpu_is_told_the_cpu_wheel_is_smaller(monkeypatch, capsys):
    from gpulab.__main__ import cuda_build_note, main

    monkeypatch.setattr(torch.version, "cuda", None)
    assert cuda_build_note() is None  # the CPU wheel: nothing to say
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    note = cuda_build_note()
    assert "CUDA 12.8 build" in note and "about 5 GB" in note and "whl/cpu" in note
    assert main(["info"]) == 0
    assert capsys.readouterr().out.count("about 5 GB") == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_build_note() is None  # a GPU uses the CUDA build


def test_lesson_repr_is_short(cpu_device, monkeypatch):
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # a smoke lesson sets 1 thread: not in this process
    lesson = gl.lesson("01_measuring", {}, device=cpu_device, show=False)
    assert lesson.reference is not None  # the reference result made the dataclass's repr 16.6 KB
    assert len(repr(lesson)) < 1024 and "01_measuring" in repr(lesson)
