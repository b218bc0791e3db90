"""A step tracker for any training loop: GPU time per step without a sync, throughput, TFLOP/s and MFU.

    with gl.track(flops_per_step=f, items_per_step=tokens, dtype="bf16", log_every=50) as t:
        for batch in loader:
            train_step(batch)
            t.step()

Each `step()` records one CUDA event on the current stream and returns at once; the time between two events is
the step's period on the GPU's timeline, idle gaps included. Events are read only once `event.query()` says the
GPU has passed them, so the tracker never makes the CPU wait (`stop()` waits once). On a CPU they are host clock
readings. On very short steps one event per step can take a visible share of the host's time, so by default
(`every=None`) the tracker times its own work and records one event every N steps, N chosen to keep its cost
under 0.2% of a step (`StepRecord.steps` says N); `every=1` forces one per step."""
from __future__ import annotations

import inspect
import math
import statistics
import time
import warnings
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from ..measuring import checks
from ..measuring.flops import mfu as _mfu
from ..measuring.text import pct, si
from .tracker_outputs import CSV_FIELDS, HOST_CSV_FIELDS, StepRecord, TrackerOutputs, _check_csv_header
from .tracker_outputs import read_csv  # noqa: F401 (where gpulab.tracker's readers found it)

COST_BUDGET = 0.002  # the tracker keeps its own host time under this share of a step (see `every`)
MAX_EVERY = 64


class HostEvent:
    """A stand-in for torch.cuda.Event on a CPU: records a clock reading; always complete."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock, self.t = clock, None

    def record(self, stream: Any = None) -> None:
        self.t = self._clock()

    def query(self) -> bool:
        return self.t is not None

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.t - self.t) * 1e3

    def synchronize(self) -> None:
        pass


def _default_event_factory(cuda: bool, clock: Callable[[], float]) -> Callable[[], Any]:
    if cuda:
        return lambda: torch.cuda.Event(enable_timing=True)
    return lambda: HostEvent(clock)


class StepTracker(TrackerOutputs):
    """Tracks the steps of a training loop; see the module docstring. Use `track(...)` to make one.

    Args:
        flops_per_step: model FLOPs of one step (from `count_flops` or a formula), for TFLOP/s and MFU.
        items_per_step: samples (or tokens) per step, for throughput (`step(items=...)` overrides it per step).
        item_name: what an item is, for labels ("samples" by default, as in `gl.before_after`; "tokens" for an LM).
        dtype: the dtype the matmuls run in; picks the device's datasheet dense peak for MFU.
        peak_tflops, peak_name: a peak to use instead and what to call it.
        peaks: measured peaks (`gl.measure_peaks()`): MFU against the measured peak of `dtype`.
        log_every: print one line every N measured steps (0: never).
        csv_path: append one row per measured step to this CSV file (on a CPU, whose work is synchronous, the
            step's time is the host clock's: a `step_ms` column and no GPU columns); `gl.read_csv` reads it back.
        tensorboard: a log directory or a SummaryWriter; scalars under "tracker/".
        plot: draw one figure in Jupyter, updated in place every `plot_every_s` seconds: a function
            tracker -> matplotlib Figure, or True for gpulab's own (`gl.track` supplies it; the core draws nothing).
        monitor: a running `gl.Monitor` (or True to start one) whose latest NVML/GPM readings go with each step.
        every: record one event every N steps (None: adapt N so the tracker's own cost stays under 0.2% of a
            step; 1: one event per step).
        event_factory, clock, printer: injectable for tests (default: CUDA events, perf_counter, print).
    """

    def __init__(self, *, flops_per_step: float | None = None, items_per_step: float | None = None,
                 item_name: str = "samples", dtype: str | None = None, peak_tflops: float | None = None,
                 peak_name: str = "", log_every: int = 0, csv_path: str | Path | None = None,
                 tensorboard: Any = None, peaks: Any = None, plot: bool | Callable[[Any], Any] = False,
                 plot_every_s: float = 1.0, monitor: Any = None,
                 every: int | None = None, device: Any = None, event_factory: Callable[[], Any] | None = None,
                 clock: Callable[[], float] = time.perf_counter, printer: Callable[[str], Any] = print):
        for name, v in (("flops_per_step", flops_per_step), ("items_per_step", items_per_step),
                        ("peak_tflops", peak_tflops)):
            if v is not None and (not isinstance(v, (int, float)) or not v > 0):
                raise ValueError(f"{name}={v!r} must be a positive number or None")
        if not isinstance(log_every, int) or log_every < 0:
            raise ValueError(f"log_every={log_every!r} must be an integer >= 0")
        if plot is True:
            raise ValueError("plot=True: use gl.track (it supplies gpulab's figure), or pass plot=<function tracker -> "
                             "Figure>, e.g. gpulab.display.plots.tracker_figure")
        if plot_every_s <= 0:
            raise ValueError(f"plot_every_s={plot_every_s} must be > 0")
        if every is not None and (not isinstance(every, int) or isinstance(every, bool) or not 1 <= every <= 10_000):
            raise ValueError(f"every={every!r} must be an integer from 1 to 10000, or None (adapt to the step time)")
        from ..measuring.device import get_device

        self.device = device or get_device()
        if peaks is not None and peak_tflops is not None:
            raise ValueError("give peaks= (measured peaks) or peak_tflops=, not both")
        if peaks is not None and not hasattr(peaks, "tflops"):
            raise ValueError(f"peaks={peaks!r} must be measured peaks from gl.measure_peaks()")
        if dtype is not None and peak_tflops is None:
            from ..measuring.device import check_dtype

            dtype = check_dtype(dtype)
            if peaks is not None:
                peak_tflops = peaks.tflops.get(dtype)
                if peak_tflops is None:
                    raise ValueError(f"peaks has no measured {dtype} peak (it holds: {', '.join(peaks.tflops) or 'none'})")
                peak_name = peak_name or f"measured {dtype} peak"
            else:
                peak_tflops = self.device.datasheet_tflops(dtype)
                if peak_tflops is not None:
                    peak_name = peak_name or f"{self.device.name} {dtype} datasheet dense peak"
        elif peaks is not None:
            raise ValueError("peaks= needs dtype= (which measured peak to use)")
        if peak_tflops is None:
            peak_name = ""  # no peak, no name: a peak that does not exist is never named
        self.flops, self.items, self.item_name = flops_per_step, items_per_step, item_name
        self.peak_tflops, self.peak_name = peak_tflops, peak_name or ("" if peak_tflops is None else "given peak")
        self.log_every, self.plot, self.plot_every_s = log_every, plot, plot_every_s
        self.csv_path = Path(csv_path) if csv_path else None
        self._tb_arg, self.monitor, self._own_monitor = tensorboard, monitor, False
        self.clock, self.printer = clock, printer
        cuda = self.device.is_cuda and event_factory is None
        self.event_factory = event_factory or _default_event_factory(cuda, clock)
        self.timer = "cuda events" if cuda else ("injected events" if event_factory else "host clock")
        self.csv_fields = HOST_CSV_FIELDS if self.timer == "host clock" else CSV_FIELDS
        if self.csv_path is not None:
            _check_csv_header(self.csv_path, self.csv_fields)
        self._records: list[StepRecord] = []
        self._raw: list[tuple[int, float, float, float | None, float | None, float | None, int]] = []
        self._outputs = bool(csv_path or tensorboard is not None or log_every or plot)
        # CUDA events are reused once read (creating one per step costs more than recording it); injected
        # events are not, since a test's fake event may stay "complete" once recorded.
        self._pool: list[Any] | None = [] if cuda else None
        self.notes: list[str] = []
        self._pending: deque[tuple[int, int, Any, Any, float, float | None]] = deque()
        self._prev_event, self._prev_host, self._n = None, None, 0
        self.every, self._adapt = (every or 1), every is None
        self._since, self._items_acc, self._cost_s = 0, 0.0, 0.0
        self._writer, self._csv, self._display, self._last_plot = None, None, None, -math.inf
        self._started, self._stopped = False, False

    def __repr__(self) -> str:
        state = "running" if self._started else "stopped" if self._stopped else "not started"
        return f"StepTracker({state}, {self._n} steps, {len(self._raw)} records read, {self.timer}, every={self.every})"

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> StepTracker:
        """Record the first event: the next `step()` closes step 1."""
        if self._started:
            raise RuntimeError("this tracker is already running; make a new one for a new loop")
        if self._stopped:
            raise RuntimeError(self._stopped_message())
        self._started = True
        if self.monitor is True:
            from ..measuring.monitor import Monitor

            self.monitor, self._own_monitor = Monitor(self.device).start(), True
        self._open_outputs()
        self._prev_event, self._prev_host = self._record(), self.clock()
        return self

    def step(self, items: float | None = None) -> None:
        """Mark the end of a step (and the start of the next). Never waits for the GPU."""
        if not self._started:
            if self._stopped:
                raise RuntimeError(self._stopped_message())
            self.start()
        checks.positive_float("items", items, allow_none=True, allow_zero=True)  # -5 would read as -312 samples/s
        self._n += 1
        self._since += 1
        if self._items_acc is not None:
            it = items if items is not None else self.items
            self._items_acc = None if it is None else self._items_acc + it
        if self._since < self.every:
            return  # between events: a counter, nothing else
        k = self._since
        t0, host_ms = self._close_window()
        first = len(self._raw)
        self._read(block=False)
        if self._adapt:  # the cost of recording and reading; outputs (plot, CSV) are the reader's choice
            self._adjust(self.clock() - t0, host_ms / 1e3 / k)
        self._emit_from(first)

    def _close_window(self) -> tuple[float, float]:
        """Record the event that ends the current window and queue the window for reading; returns the host
        clock at the event and the window's host milliseconds."""
        t0 = self.clock()
        ev = self._record()
        host_ms = (t0 - self._prev_host) * 1e3
        self._pending.append((self._n, self._since, self._prev_event, ev, host_ms, self._items_acc))
        self._prev_event, self._prev_host = ev, t0
        self._since, self._items_acc = 0, 0.0
        return t0, host_ms

    def _adjust(self, cost_s: float, step_s: float) -> None:
        """Pick the next window so that this tracker's own time stays under COST_BUDGET of a step."""
        self._cost_s = cost_s if not self._cost_s else 0.8 * self._cost_s + 0.2 * cost_s
        if step_s > 0:
            self.every = max(1, min(MAX_EVERY, math.ceil(self._cost_s / (COST_BUDGET * step_s))))

    def stop(self) -> list[StepRecord]:
        """Wait once for the last step's event, read every pending step, close the outputs (again: no-op)."""
        if self._stopped:
            return self.records
        if not self._started:
            raise RuntimeError("stop() called before start()")
        if self._since:  # the last, partial window
            self._close_window()
        self._drain(block=True)
        self._flush_outputs(force=True)
        if self._own_monitor:
            self.monitor.stop()
        if self._csv is not None:
            self._csv.close()
            self._csv = None
        if self._writer is not None:
            self._writer.flush()
        self._started, self._stopped = False, True
        return self.records

    def _stopped_message(self) -> str:
        return (f"this tracker stopped after {self._n} steps (its with block ended, or stop() was called) and is not "
                "restarted: its records stay as measured. Make a new one, gl.track(...), for another loop")

    def __enter__(self) -> StepTracker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- measuring ------------------------------------------------------------------------------------
    def _record(self) -> Any:
        ev = self._pool.pop() if self._pool else self.event_factory()
        ev.record()
        return ev

    def _drain(self, block: bool) -> None:
        """Read every pending step whose end event the GPU has passed; with `block`, wait for the last one.

        Only the raw times are kept here (the per-step cost is a few microseconds); records with throughput,
        TFLOP/s and MFU are built when read, or at once when an output (log, CSV, TensorBoard, plot) is on.
        """
        first = len(self._raw)
        self._read(block)
        self._emit_from(first)

    def _emit_from(self, first: int) -> None:
        """Send the steps read since raw index `first` to the outputs that are on."""
        if self._outputs and len(self._raw) > first:
            self._emit(self._build(first))

    def _read(self, block: bool) -> None:
        """Move every completed pending step to the raw list (with `block`, wait for the last one first)."""
        if block and self._pending:
            self._pending[-1][3].synchronize()
        monitored = self.monitor is not None and self.monitor is not True
        while self._pending and self._pending[0][3].query():
            n, k, start, end, host_ms, items = self._pending.popleft()
            nvml, gpm = (self._latest("nvml_util"), self._latest("gpm_sm_active")) if monitored else (None, None)
            self._raw.append((n, start.elapsed_time(end), host_ms, items, nvml, gpm, k))
            if self._pool is not None:
                self._pool.append(start)  # its step is read; the end event starts the next step

    def _build(self, first: int) -> list[StepRecord]:
        """StepRecords for the raw steps from index `first` on (each MFU through flops.mfu)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one odd step must not flood the log; the summary warns
            return [self._make_record(*raw) for raw in self._raw[first:]]

    @property
    def records(self) -> list[StepRecord]:
        """Every step read so far, with its throughput, TFLOP/s, MFU and the monitor's readings."""
        if len(self._records) < len(self._raw):
            self._records.extend(self._build(len(self._records)))
        return self._records

    def _latest(self, metric: str) -> float | None:
        trace = getattr(self.monitor, "trace", None)
        series = trace.series.get(metric) if trace is not None else None
        return series[-1][1] if series else None

    def _make_record(self, n: int, gpu_ms: float, host_ms: float, items: float | None, nvml: float | None,
                     gpm: float | None, k: int = 1) -> StepRecord:
        gpu_ms, host_ms = gpu_ms / k, host_ms / k  # per step, over the window
        s = gpu_ms / 1e3
        ok = s > 0
        tflops = self.flops / s / 1e12 if self.flops and ok else None
        mfu = _mfu(self.flops, s, self.peak_tflops) if self.flops and self.peak_tflops and ok else None
        per_step_items = items / k if items else None
        return StepRecord(step=n, gpu_ms=gpu_ms, host_ms=host_ms, steps=k,
                          items_per_s=per_step_items / s if per_step_items and ok else None,
                          tflops=tflops, mfu=mfu, nvml_util=nvml, gpm_sm_active=gpm)

    def log_line(self, r: StepRecord) -> str:
        """One line for a script's log."""
        parts = [f"step {r.step}", si(r.gpu_ms / 1e3, "s")]  # 13.5 ms, not 13.51 ms
        if r.items_per_s is not None:
            parts.append(f"{si(r.items_per_s)} {self.item_name}/s")  # 421 k, not 420,783
        if r.tflops is not None:
            parts.append(si(r.tflops * 1e12, "FLOP/s"))  # 185 TFLOP/s on a GPU, 78.4 MFLOP/s on a CPU
        if r.mfu is not None:
            parts.append(f"MFU {pct(r.mfu)}")  # 4.00%, not 4.0%
        if r.nvml_util is not None:
            parts.append(f"NVML {r.nvml_util:.0f}%")
        if r.gpm_sm_active is not None:
            parts.append(f"SM active {r.gpm_sm_active:.0f}%")
        return " | ".join(parts)

    # -- results --------------------------------------------------------------------------------------
    def summary(self, skip: int = 0) -> dict[str, Any]:
        """Medians over the measured steps (after the first `skip` records), with the GPU time's quartiles. `steps` counts
        every step marked; `timed_steps` those read (fewer only while it runs: the last wait for the GPU or window)."""
        notes = list(self.notes)
        if self._started:
            self._drain(block=False)  # whatever the GPU has finished; never waits
        steps = self._n - sum(r.steps for r in self.records[:skip])
        rs = self.records[skip:]
        timed = sum(r.steps for r in rs)
        if self._started and timed < steps:
            notes.append(f"still running: {steps} steps marked, {timed} read so far; stop() (or the end of the "
                         "with block) reads the rest")
        if not rs:
            return {"steps": max(steps, 0), "timed_steps": 0, "records": 0, "running": self._started, "notes": notes}
        med = lambda k: (statistics.median(v) if (v := [getattr(r, k) for r in rs if getattr(r, k) is not None])  # noqa: E731
                         else None)
        gpu = sorted(r.gpu_ms for r in rs)
        q = statistics.quantiles(gpu, n=4, method="inclusive") if len(gpu) > 1 else [gpu[0]] * 3
        total_s = sum(r.gpu_ms * r.steps for r in rs) / 1e3
        flops_rate = self.flops * timed / total_s / 1e12 if self.flops and total_s > 0 else None
        mfu_window = flops_rate / self.peak_tflops if flops_rate and self.peak_tflops else None
        worst = max([m for m in (med("mfu"), mfu_window) if m is not None], default=None)
        if worst is not None and worst > 1.0:
            warnings.warn(f"tracked MFU {worst:.0%} is over 100% of the {self.peak_name or 'given peak'} "
                          f"({self.peak_tflops} TFLOP/s): the FLOP count per step or the peak is wrong", stacklevel=2)
        return {"steps": steps, "timed_steps": timed, "records": len(rs), "running": self._started, "every": self.every,
                "gpu_ms_median": q[1], "gpu_ms_q1": q[0], "gpu_ms_q3": q[2],
                "host_ms_median": med("host_ms"), "items_per_s_median": med("items_per_s"),
                "tflops_median": med("tflops"), "mfu_median": med("mfu"),
                "tflops_window": flops_rate,
                "mfu_window": mfu_window,
                "peak_tflops": self.peak_tflops, "peak_name": self.peak_name, "timer": self.timer,
                "notes": notes}

    def to_dict(self) -> dict[str, Any]:
        """The summary and every step record, JSON-ready."""
        return {"summary": self.summary(), "records": [asdict(r) for r in self.records]}


def track(**kwargs: Any) -> StepTracker:
    """A `StepTracker` for your loop (its arguments are StepTracker's); use it as a context manager and call `.step()`.

    `gl.track(plot=True)` draws gpulab's live figure in Jupyter (the display layer loads only then)."""
    return StepTracker(**kwargs)


track.__signature__ = inspect.signature(StepTracker).replace(return_annotation="StepTracker")  # what help() shows
