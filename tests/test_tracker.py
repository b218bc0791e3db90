"""The step tracker: lazy event reads, no synchronize per step, numbers from fake events and a fake clock."""
from __future__ import annotations

import statistics

import pytest
import torch

import gpulab as gl
from gpulab.tools import tracker as tk


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeEvent:
    """Completes only when the test says the 'GPU' got there; counts elapsed_time and synchronize calls."""

    gpu_time = 0.0  # ms on the fake GPU timeline; the test advances it
    done_upto = 0  # events with an index below this are complete
    made: list = []
    syncs = 0

    def __init__(self):
        self.index = len(FakeEvent.made)
        FakeEvent.made.append(self)
        self.t = None

    def record(self, stream=None):
        self.t = FakeEvent.gpu_time

    def query(self) -> bool:
        return self.index < FakeEvent.done_upto

    def elapsed_time(self, end) -> float:
        assert self.query() and end.query(), "elapsed_time read before the GPU reached both events"
        return end.t - self.t

    def synchronize(self):
        FakeEvent.syncs += 1
        FakeEvent.done_upto = len(FakeEvent.made)


@pytest.fixture
def fake_events():
    FakeEvent.gpu_time, FakeEvent.done_upto, FakeEvent.made, FakeEvent.syncs = 0.0, 0, [], 0
    return FakeEvent


def _tracker(cpu_device, **kw):
    lines = []
    t = tk.track(flops_per_step=2e12, items_per_step=1000, peak_tflops=100.0, peak_name="test peak",
                 device=cpu_device, event_factory=FakeEvent, clock=FakeClock(), printer=lines.append, **kw)
    return t, lines


def test_reads_lazily_and_never_synchronizes_per_step(fake_events, cpu_device, monkeypatch):
    def no_sync(*a, **k):
        raise AssertionError("the tracker synchronized inside the loop")
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    t, _ = _tracker(cpu_device)
    t.start()
    for i in range(5):
        FakeEvent.gpu_time += 10.0  # each step takes 10 ms on the GPU
        t.step()
    assert t.records == [] and fake_events.syncs == 0  # nothing complete yet: nothing read, nobody waited
    fake_events.done_upto = 3  # the GPU has passed the start event and the ends of steps 1 and 2
    FakeEvent.gpu_time += 20.0
    t.step()
    assert [r.step for r in t.records] == [1, 2] and fake_events.syncs == 0
    monkeypatch.undo()
    t.stop()
    assert fake_events.syncs == 1  # one wait, at the end
    assert [r.step for r in t.records] == [1, 2, 3, 4, 5, 6]
    assert [r.gpu_ms for r in t.records] == [10.0] * 5 + [20.0]
    r = t.records[0]
    assert r.tflops == pytest.approx(200.0) and r.mfu == pytest.approx(2.0)  # 2e12 FLOP in 10 ms on a 100 TF peak
    assert r.items_per_s == pytest.approx(100_000)


def test_summary_and_log_line(fake_events, cpu_device):
    t, lines = _tracker(cpu_device, log_every=2)
    with t:
        for ms in (10.0, 10.0, 30.0, 10.0):
            FakeEvent.gpu_time += ms
            t.step()
    with pytest.warns(UserWarning, match="over 100%"):  # 2e12 FLOP in 10 ms on a 100 TF peak: 200% is named
        s = t.summary()
    assert s["steps"] == 4 and s["gpu_ms_median"] == 10.0
    assert s["tflops_window"] == pytest.approx(4 * 2e12 / 0.060 / 1e12)
    assert s["peak_name"] == "test peak" and s["timer"] == "injected events"
    assert len(lines) == 2 and lines[0].startswith("step 2 | 10.0 ms") and "MFU" in lines[0]


def test_host_clock_on_cpu(cpu_device):
    clock = FakeClock()
    t = tk.track(device=cpu_device, clock=clock, printer=lambda s: None)
    with t:
        for _ in range(3):
            clock.t += 0.005
            t.step()
    assert t.timer == "host clock"
    assert [round(r.gpu_ms, 6) for r in t.records] == [5.0, 5.0, 5.0]
    assert t.records[0].mfu is None and t.records[0].tflops is None


def test_csv_round_trip(fake_events, cpu_device, tmp_path):
    path = tmp_path / "steps.csv"
    t, _ = _tracker(cpu_device, csv_path=path)
    with t:
        for ms in (10.0, 12.5):
            FakeEvent.gpu_time += ms
            t.step()
    back = tk.read_csv(path)
    assert back == t.records
    assert back[1].gpu_ms == 12.5 and back[1].nvml_util is None


def _cpu_tracker(cpu_device, clock, **kw):
    return tk.track(device=cpu_device, clock=clock, printer=lambda s: None, **kw)


def test_a_cpu_trackers_csv_has_step_ms_and_no_gpu_columns(cpu_device, tmp_path):
    clock, path = FakeClock(), tmp_path / "cpu.csv"
    with _cpu_tracker(cpu_device, clock, csv_path=path, every=1, items_per_step=8) as t:
        for ms in (5.0, 7.5):
            clock.t += ms / 1e3
            t.step()
    header = path.read_text().splitlines()[0].split(",")
    assert header == list(tk.HOST_CSV_FIELDS) and "step_ms" in header
    assert not {"gpu_ms", "nvml_util", "gpm_sm_active"} & set(header)
    back = tk.read_csv(path)
    assert back == t.records and [round(r.gpu_ms, 6) for r in back] == [5.0, 7.5]
    # The tracker appends: a file with another tracker's columns is refused before any step, naming it.
    gpu_csv = tmp_path / "gpu.csv"
    gpu_csv.write_text(",".join(tk.CSV_FIELDS) + "\n")
    with pytest.raises(ValueError, match="csv_path=.*gpu.csv.*other columns"):
        _cpu_tracker(cpu_device, clock, csv_path=gpu_csv)
    with _cpu_tracker(cpu_device, clock, csv_path=path, every=1) as again:  # the same kind appends
        clock.t += 0.001
        again.step()
    assert len(tk.read_csv(path)) == 3


@pytest.mark.parametrize("row, what", [("3,1,10.0", "line 3: the row is cut short"),
                                       ("3,1,abc,,,,", "line 3: step_ms='abc' is not a number"),
                                       (",1,10.0,,,,", "line 3: step=''"),
                                       ("3,1,10.0,,,,,,,", "line 3: 10 values for 7 columns"),
                                       ("3,1,,,,,", "line 3: no step time")])
def test_read_csv_of_a_bad_or_cut_row_names_the_file_and_line(tmp_path, row, what):
    path = tmp_path / "steps.csv"
    path.write_text(",".join(tk.HOST_CSV_FIELDS) + "\n1,1,5.0,5.1,,,\n" + row + "\n")
    with pytest.raises(ValueError) as e:
        tk.read_csv(path)
    assert str(path) in str(e.value) and what in str(e.value)


def test_read_csv_of_another_file_says_it_is_not_a_trackers(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="other.csv: not a step tracker's CSV"):
        tk.read_csv(path)


def test_a_tracker_used_after_its_with_block_says_so(cpu_device):
    clock = FakeClock()
    with _cpu_tracker(cpu_device, clock, every=1) as t:
        for _ in range(3):
            clock.t += 0.01
            t.step()
    records = list(t.records)
    for again in (t.step, t.start, t.__enter__):
        with pytest.raises(RuntimeError, match="stopped after 3 steps.*gl.track"):
            again()
    assert t.records == records and t.stop() == records  # nothing restarted; a second stop() changes nothing
    assert t.summary()["steps"] == 3


def test_summary_of_a_running_tracker_counts_every_step(cpu_device):
    clock = FakeClock()
    t = _cpu_tracker(cpu_device, clock, every=4)
    t.start()
    for _ in range(5):
        clock.t += 0.01
        t.step()
    s = t.summary()
    assert s["steps"] == 5 and s["timed_steps"] == 4 and s["running"] is True
    assert any("still running: 5 steps marked, 4 read" in n for n in s["notes"])
    t.stop()
    s = t.summary()
    assert s["steps"] == s["timed_steps"] == 5 and s["running"] is False and not s["notes"]
    fresh = _cpu_tracker(cpu_device, clock, every=4).start()
    fresh.step()
    assert fresh.summary()["steps"] == 1 and fresh.summary()["timed_steps"] == 0


def test_track_shows_its_real_signature_and_a_short_repr(cpu_device):
    import inspect
    import pydoc

    params = inspect.signature(gl.track).parameters
    init = inspect.signature(tk.StepTracker).parameters
    assert list(params) == list(init) and "kwargs" not in params
    assert all(params[k].default == init[k].default for k in init)
    text = pydoc.render_doc(gl.track)
    assert "flops_per_step" in text and "**kwargs" not in text
    t = gl.track(device=cpu_device, every=1, clock=FakeClock(), printer=lambda s: None)
    assert repr(t).startswith("StepTracker(not started, 0 steps") and len(repr(t)) < 200
    with t:
        t.step()
    assert "stopped, 1 steps" in repr(t)


def test_item_name_defaults_agree_between_track_and_before_after(cpu_device):
    import inspect

    from gpulab.verdicts.run_result import RunResult

    track = inspect.signature(gl.track).parameters["item_name"].default
    assert track == "samples" == inspect.signature(gl.before_after).parameters["item_name"].default
    assert track == RunResult.__dataclass_fields__["item_name"].default
    assert gl.track(device=cpu_device).item_name == "samples"


def test_tensorboard_writer_gets_scalars(fake_events, cpu_device):
    class Writer:
        def __init__(self):
            self.scalars = []

        def add_scalar(self, tag, value, step):
            self.scalars.append((tag, value, step))

        def flush(self):
            pass

    w = Writer()
    t, _ = _tracker(cpu_device, tensorboard=w)
    with t:
        FakeEvent.gpu_time += 10.0
        t.step()
    assert ("tracker/gpu_ms", 10.0, 1) in w.scalars and any(tag == "tracker/mfu" for tag, _, _ in w.scalars)


def test_missing_tensorboard_degrades(fake_events, cpu_device, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *a, **k):
        if name == "torch.utils.tensorboard":
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    t, lines = _tracker(cpu_device, tensorboard=tmp_path / "tb")
    with t:
        FakeEvent.gpu_time += 10.0
        t.step()
    assert t.records and any("TensorBoard logging off" in n for n in t.notes)


def test_monitor_readings_go_with_each_step(fake_events, cpu_device):
    mon = type("M", (), {})()
    mon.trace = gl.Trace(series={"nvml_util": [(0.1, 40.0), (1.1, 97.0)]})
    t, _ = _tracker(cpu_device, monitor=mon)
    with t:
        FakeEvent.gpu_time += 10.0
        t.step()
    assert t.records[0].nvml_util == 97.0 and t.records[0].gpm_sm_active is None


def test_bad_arguments_are_named(cpu_device):
    with pytest.raises(ValueError, match="flops_per_step"):
        tk.track(flops_per_step=-1, device=cpu_device)
    with pytest.raises(ValueError, match="log_every"):
        tk.track(log_every=-2, device=cpu_device)
    with pytest.raises(ValueError, match="dtype"):
        tk.track(dtype="fp64", device=cpu_device)


def test_guide_tracker_synchronizes_twice_per_step(monkeypatch):
    from gpulab.tools import tracker_overhead as pl

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(1))
    g = pl.GuideTracker(1e12, 100e12)
    for _ in range(3):
        g.start_step()
        g.end_step()
    assert len(calls) == 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tracked_steps_make_no_sync_on_gpu():
    a = torch.randn(1024, 1024, device="cuda")
    t = tk.track(flops_per_step=2 * 1024**3, dtype="fp32", printer=lambda s: None)
    t.start()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            a = (a @ a).tanh_()
            t.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    records = t.stop()
    assert len(records) == 20 and all(r.gpu_ms > 0 for r in records)


def test_paired_overhead_interval_from_paired_differences():
    from gpulab.tools.tracker_overhead import paired_overhead
    off = [1.0, 1.2, 0.9, 1.1] * 25  # large drift, shared by each pair
    on = [x * 1.005 for x in off]  # 0.5% slower, exactly
    est = paired_overhead(on, off)
    assert est.value == pytest.approx(0.5, abs=1e-9)
    assert 0.3 < est.lo <= 0.5 <= est.hi < 0.7  # the drift cancels: a tight interval despite 30% spread per side
    with pytest.raises(ValueError, match="same length"):
        paired_overhead([1.0], [1.0, 2.0])


def test_paired_overhead_is_not_swung_by_one_slow_round():
    from gpulab.tools.tracker_overhead import paired_overhead
    off = [3.5e-3] * 40
    on = [x * 1.02 for x in off]  # 2% slower in every pair
    off[7] = off[31] = 6.5e-3  # two host hiccups in untracked rounds: by the mean, the tracker looks free
    est = paired_overhead(on, off)
    assert est.value == pytest.approx(0.02 * 3.5e-3 / statistics.fmean(off) * 100, rel=1e-6)
    assert est.lo > 1.5 and est.hi < 2.5  # the median pair, its interval narrow: still above a 1% bar


def test_tracker_overhead_runs_abba_blocks_and_synced_rounds(cpu_device):
    from gpulab.tools import tracker_overhead as pl
    calls = []
    clock = FakeClock()

    def step():
        clock.t += 0.01
        calls.append("step")

    o = pl.tracker_overhead(step, loop="fake", block_steps=3, blocks=8, round_steps=2, rounds=4,
                            flops_per_step=1e9, peak_tflops=100.0, clock=clock, sync=lambda: None,
                            make_tracker=lambda: gl.track(flops_per_step=1e9, peak_tflops=100.0, device=cpu_device,
                                                          clock=clock, printer=lambda s: None))
    assert len(o.blocks["off"]) == len(o.blocks["gpulab tracker"]) == 4
    assert len(o.rounds["off"]) == len(o.rounds["guide §8.4 tracker"]) == 4
    assert o.overhead("gpulab tracker").value == pytest.approx(0.0, abs=1e-9)  # the fake clock: no cost
    assert pl._abba(8) == [True, False, False, True, True, False, False, True]
    assert set(o.to_dict()["overhead_pct"]) == {"gpulab tracker", "guide §8.4 tracker"}


def test_tracker_adapts_its_window_to_keep_its_cost_small(cpu_device):
    """Each event costs 50 µs of host time; steps take 2 ms: one event per step would cost 2.5%. The tracker
    times itself and widens its window until its share is under 0.2%, and no step is lost."""
    clock = FakeClock()

    class CostlyEvent(tk.HostEvent):
        def record(self, stream=None):
            clock.t += 50e-6
            super().record(stream)

    t = tk.track(flops_per_step=1e9, peak_tflops=100.0, device=cpu_device, clock=clock, printer=lambda s: None,
                 event_factory=lambda: CostlyEvent(clock))
    with t:
        for _ in range(500):
            clock.t += 2e-3
            t.step()
    assert t.every == 13  # ceil(50 µs / (0.2% of 2 ms))
    assert t.summary()["steps"] == 500 and sum(r.steps for r in t.records) == 500
    full = t.records[-2]  # the last record is the partial window that stop() closes
    assert full.steps == 13 and full.gpu_ms == pytest.approx(2.0 + 0.05 / 13, rel=1e-6)  # per step, over its window
    fixed = tk.track(every=1, device=cpu_device, clock=clock, printer=lambda s: None,
                     event_factory=lambda: CostlyEvent(clock))
    with fixed:
        for _ in range(20):
            clock.t += 2e-3
            fixed.step()
    assert fixed.every == 1 and len(fixed.records) == 20
    with pytest.raises(ValueError, match="every"):
        tk.track(every=0, device=cpu_device)


def test_output_costs_do_not_widen_the_window(cpu_device):
    """A slow printer (or plot, or CSV) is the reader's choice: only recording and reading count as cost."""
    clock = FakeClock()

    def slow_print(line):
        clock.t += 10e-3

    t = tk.track(flops_per_step=1e9, peak_tflops=100.0, device=cpu_device, clock=clock, printer=slow_print,
                 log_every=1)
    with t:
        for _ in range(50):
            clock.t += 2e-3
            t.step()
    assert t.every == 1 and len(t.records) == 50


def test_tracker_overhead_times_blocks_with_events_when_given(cpu_device):
    """With an event factory, each block's time is read from its two events (the GPU's timeline on CUDA)."""
    from gpulab.tools import tracker_overhead as pl
    clock = FakeClock()

    def step():
        clock.t += 0.01

    o = pl.tracker_overhead(step, loop="fake", block_steps=2, blocks=8, round_steps=2, rounds=2,
                            flops_per_step=1e9, peak_tflops=100.0, clock=clock, sync=lambda: None,
                            events=lambda: tk.HostEvent(clock),
                            make_tracker=lambda: gl.track(flops_per_step=1e9, peak_tflops=100.0, device=cpu_device,
                                                          clock=clock, printer=lambda s: None))
    assert o.block_timer == "events" and o.blocks["off"] == pytest.approx([0.01] * 4)
    assert len(o.host_blocks["off"]) == 4 and o.overhead("gpulab tracker").value == pytest.approx(0.0, abs=1e-9)


class FakeTracker:
    """A tracker that spends `cost_s` of the fake clock in each step() call and records nothing."""

    def __init__(self, clock, cost_s: float = 0.0):
        self.clock, self.cost_s = clock, cost_s

    def start(self):
        return self

    def step(self):
        self.clock.t += self.cost_s

    def stop(self):
        pass

    def summary(self):
        return {}


def test_tracker_overhead_measures_the_trackers_own_host_time(cpu_device):
    """Each on block records the host time inside tracker.step(): a tracker that costs 0.1 ms per call on a
    10 ms step reads 1% own cost, and the off blocks carry none of it."""
    from gpulab.tools import tracker_overhead as pl
    clock = FakeClock()

    def step():
        clock.t += 0.01

    o = pl.tracker_overhead(step, loop="fake", block_steps=3, blocks=8, round_steps=2, rounds=2,
                            flops_per_step=1e9, peak_tflops=100.0, clock=clock, sync=lambda: None, events=None,
                            make_tracker=lambda: FakeTracker(clock, cost_s=1e-4))
    assert o.own_s == pytest.approx([1e-4] * 4)
    own = o.own_cost()
    assert own.value == pytest.approx(1.0) and own.interval == pytest.approx((1.0, 1.0))
    assert o.overhead("gpulab tracker").value == pytest.approx(1.0)  # host-paced: the A/B sees the same cost
    assert "own_cost_pct" in o.to_dict()


def test_tracker_overhead_times_the_guide_trackers_own_calls(cpu_device, monkeypatch):
    """On a host-paced loop the guide's tracker costs the time its two syncs wait, call by call: each sync here
    waits 20 µs for the 'GPU', so a 3.5 ms step pays 40 µs (1.14%); the step itself is not counted as its time."""
    from gpulab.tools import tracker_overhead as pl
    clock = FakeClock()

    def step():
        clock.t += 3.5e-3

    def synchronize(*a):
        clock.t += 20e-6

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the guide's tracker syncs only with CUDA
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)

    o = pl.tracker_overhead(step, loop="fake", block_steps=3, blocks=8, round_steps=5, rounds=4,
                            flops_per_step=1e9, peak_tflops=100.0, clock=clock, sync=lambda: None, events=None,
                            make_tracker=lambda: FakeTracker(clock))
    assert o.guide_own_s == pytest.approx([40e-6] * 4)
    own = o.guide_own_cost()
    assert own.value == pytest.approx(40 / 3500 * 100) and own.interval == pytest.approx((own.value, own.value))
    assert o.overhead("guide §8.4 tracker").value == pytest.approx(own.value)  # host-paced: the A/B sees the same
    assert o.to_dict()["guide_own_cost_pct"] == pytest.approx([own.value] * 3)
    with pytest.raises(ValueError, match="at least 2 rounds"):
        pl.OverheadResult(loop="x", steps_per_block=1, steps_per_round=1, blocks={}, rounds={}).guide_own_cost()
