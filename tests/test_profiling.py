"""Profiler summaries: only real device kernels are counted and timed (a step's annotation is not a kernel)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gpulab.measuring import profiling

CUDA = torch.autograd.DeviceType.CUDA
CPU = torch.autograd.DeviceType.CPU


def _event(name, start, end, device=CUDA, *, annotation=False, activity=None):
    """A stand-in for torch.autograd.profiler_util.FunctionEvent with the fields the summary reads."""
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end),
                           is_user_annotation=annotation, activity_type=activity)


def fake_trace(steps: int = 2, kernels_per_step: int = 3, with_activity_type: bool = True):
    """Per step: a CPU annotation, its GPU-side mirror, `kernels_per_step` kernels and one HtoD copy.

    Steps are 100 µs apart; kernels run 10 µs each with 5 µs gaps, then a 4 µs copy and a 2 µs memset.
    """
    act = (lambda a: a) if with_activity_type else (lambda a: None)
    events = []
    for s in range(steps):
        t0 = 100.0 * s
        events.append(_event("gpulab_step", t0, t0 + 90, CPU, annotation=True, activity=act("user_annotation")))
        events.append(_event("gpulab_step", t0 + 1, t0 + 95, CUDA, annotation=True,
                             activity=act("gpu_user_annotation")))
        events.append(_event("aten::mm", t0 + 2, t0 + 8, CPU, activity=act("cpu_op")))
        events.append(_event("cudaLaunchKernel", t0 + 3, t0 + 4, CPU, activity=act("cuda_runtime")))
        t = t0 + 5
        for k in range(kernels_per_step):
            events.append(_event(f"kernel_{k}", t, t + 10, activity=act("kernel")))
            t += 15
        events.append(_event("Memcpy HtoD (Pageable -> Device)", t, t + 4, activity=act("gpu_memcpy")))
        events.append(_event("Memset (Device)", t + 5, t + 7, activity=act("gpu_memset")))
    return events


@pytest.mark.parametrize("with_activity_type", [True, False])
def test_summary_counts_kernels_not_annotations(with_activity_type):
    s = profiling.summarize_events(fake_trace(2, 3, with_activity_type), steps=2, cuda=True)
    assert s.kernel_count == 6 and s.kernels_per_step == 3
    assert s.memcpy_count == 2 and s.memset_count == 2
    assert s.gpu_busy_ms == pytest.approx(6 * 10 / 1e3)  # the union of kernel intervals only
    assert s.memcpy_ms == pytest.approx(2 * 4 / 1e3) and s.memset_ms == pytest.approx(2 * 2 / 1e3)
    assert [n for n, _, _ in s.top_kernels] == ["kernel_0", "kernel_1", "kernel_2"]
    # wall: first step start (0) to the later of the last step's end (190 µs) and its last memset (157 µs)
    assert s.wall_ms == pytest.approx(0.190)
    assert s.busy_fraction == pytest.approx(0.060 / 0.190)
    assert s.summary()["copies_per_step"] == 2


def test_overlapping_kernels_are_counted_once_in_busy_time():
    events = [_event("gpulab_step", 0, 100, CPU, annotation=True),
              _event("a", 0, 10, activity="kernel"), _event("b", 5, 15, activity="kernel"),
              _event("c", 30, 40, activity="kernel")]
    s = profiling.summarize_events(events, steps=1, cuda=True)
    assert s.kernel_count == 3
    assert s.gpu_busy_ms == pytest.approx(0.025)


def test_classify_device_events():
    kinds = [profiling.device_activity_kind(e) for e in fake_trace(1, 2)]
    assert kinds.count("kernel") == 2 and kinds.count("memcpy") == 1 and kinds.count("memset") == 1
    assert kinds.count(None) == len(kinds) - 4


class _FakeProfiler:
    """Replaces torch.profiler.profile: records nothing, returns a prepared trace."""

    def __init__(self, events, **kwargs):
        self._events = events

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def step(self):
        pass

    def events(self):
        return self._events


def test_profile_counts_only_device_kernels(monkeypatch):
    """profile() on a 'GPU' whose trace holds 3 kernels per step plus the step's own annotation."""
    trace = fake_trace(steps=2, kernels_per_step=3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.profiler, "profile", lambda **kw: _FakeProfiler(trace, **kw))
    s = profiling.profile(lambda: None, steps=2, warmup=0)
    assert s.kernel_count == 6
    assert s.kernels_per_step == 3
    assert s.gpu_busy_ms == pytest.approx(0.060)
    assert s.busy_fraction < 0.5


def test_cpu_profile_has_no_kernels(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU path, also on a GPU host
    s = profiling.profile(lambda: torch.ones(64) * 2, steps=2, warmup=1)
    assert s.kernel_count is None and s.busy_fraction is None and s.cpu_ops >= 2


def test_profile_rejects_bad_arguments():
    with pytest.raises(ValueError, match="steps"):
        profiling.profile(lambda: None, steps=0)
    with pytest.raises(ValueError, match="warmup"):
        profiling.profile(lambda: None, warmup=-1)


# -- trace export and the time breakdown ----------------------------------------------------------------

def test_profile_writes_a_gzipped_trace_with_the_steps(tmp_path):
    from gpulab.tools import traces

    path = tmp_path / "trace.json.gz"
    s = profiling.profile(lambda: torch.randn(32, 32) @ torch.randn(32, 32), steps=3, warmup=0, wait=1,
                          trace_path=path)
    assert s.trace_path == str(path)
    data = traces.load_trace(path)  # gzip + JSON
    names = [e.get("name") for e in data["traceEvents"]]
    assert names.count("gpulab_step") == 3  # only the active steps are kept
    assert any(str(n).startswith("aten::mm") for n in names)


def test_profile_rejects_a_trace_name_it_cannot_write(tmp_path):
    with pytest.raises(ValueError, match="trace_path"):
        profiling.profile(lambda: None, trace_path=tmp_path / "trace.txt")


def _x(name, cat, ts, dur, corr=None):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "args": {} if corr is None else {"correlation": corr}}


def synthetic_trace():
    """Two 100 µs steps. Step 1: a kernel, then .item() (a sync), a 20 µs idle gap, a kernel launched after it.
    Step 2: a copy, a kernel launched late (host launching), and a kernel queued early but starting late."""
    ev = [_x("gpulab_step", "user_annotation", 0, 100), _x("gpulab_step", "user_annotation", 100, 100)]
    ev += [_x("cudaLaunchKernel", "cuda_runtime", 0, 2, 1), _x("k1", "kernel", 5, 30, 1),
           _x("cudaStreamSynchronize", "cuda_runtime", 3, 33), _x("cudaLaunchKernel", "cuda_runtime", 50, 2, 2),
           _x("k2", "kernel", 55, 45, 2)]
    ev += [_x("cudaMemcpyAsync", "cuda_runtime", 100, 2, 3), _x("Memcpy HtoD", "gpu_memcpy", 100, 10, 3),
           _x("cudaLaunchKernel", "cuda_runtime", 115, 2, 4), _x("k3", "kernel", 120, 20, 4),
           _x("cudaLaunchKernel", "cuda_runtime", 125, 2, 5), _x("k4", "kernel", 150, 50, 5)]
    return {"traceEvents": ev}


def test_time_breakdown_splits_idle_by_cause(tmp_path):
    from gpulab.tools import traces

    b = traces.time_breakdown(synthetic_trace())
    assert b.steps == 2 and b.window_ms == pytest.approx(0.200) and b.kernels == 4
    ms = {k: round(v * 1e3, 6) for k, v in b.ms.items()}  # µs
    assert ms["kernels"] == 145 and ms["memcpy/memset"] == 10
    # gaps: 0-5 (before k1: launched at 0, queued), 35-55 (after the sync), 110-120 (k3 launched at 115),
    # 140-150 (k4 launched at 125, before the gap: queued work waiting)
    assert ms["idle: after a sync"] == 20
    assert ms["idle: host launching"] == 10
    assert ms["idle: queued work waiting"] == 15
    assert sum(ms.values()) == pytest.approx(200)
    assert b.largest_idle() == "idle: after a sync"
    # the same trace from a gzipped file
    import gzip
    import json
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(synthetic_trace(), f)
    assert traces.time_breakdown(path).ms == b.ms


def test_time_breakdown_of_a_cpu_trace_says_why_it_is_empty(tmp_path):
    from gpulab.tools import traces

    path = tmp_path / "cpu.json.gz"
    profiling.profile(lambda: torch.ones(8) * 2, steps=2, warmup=0, trace_path=path)
    b = traces.time_breakdown(path)
    assert b.window_ms == 0 and "without a CUDA GPU" in b.note


def test_step_memory_by_category():
    from gpulab.tools import traces

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(16, 64)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    step()
    p = traces.step_memory(step, device="cpu")
    if p.note:
        pytest.skip(p.note)
    n_bytes = sum(q.numel() * 4 for q in model.parameters())
    at = p.at_peak()
    assert at["parameters"] == n_bytes
    assert 2 * n_bytes <= at["optimizer state"] <= 2 * n_bytes + 256  # exp_avg, exp_avg_sq and a step count each
    assert p.peak_bytes >= 4 * n_bytes and p.peak_ms is not None


def test_profile_shows_no_cycle_warning_a_reader_cannot_act_on():
    """torch warns as a scheduled profiler starts that each cycle clears its events; gl.profile reads them in time."""
    import warnings

    import torch

    import gpulab as gl

    m, x = torch.nn.Linear(16, 16), torch.randn(4, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gl.profile(lambda: m(x).sum().backward(), steps=2)
    assert not [w for w in caught if "clears events" in str(w.message)]
