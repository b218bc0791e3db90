"""Watch the device while code runs: NVML utilization, memory, power, clocks, GPM metrics and host CPU.

What the numbers mean (NVML's own definitions):
- nvml_util: percent of the sample period (1/6 s to 1 s) during which one or more kernels was executing.
  One tiny kernel at a time reads as 100%: it says "busy", not "how busy".
- nvml_mem_util: percent of the sample period during which device memory was being read or written.
- gpm_sm_active: percent of SMs that were busy; gpm_sm_occupancy: resident warps over the maximum;
  gpm_tensor_active: percent of time the SMs were doing tensor (matrix-unit) work;
  gpm_dram_bw: DRAM bandwidth used over its maximum. GPM (GPU Performance Monitoring) needs Hopper or newer.

Utilization is read from the driver's buffered samples (nvmlDeviceGetSamples) rather than by fast polling
from a Python thread, which the GIL starves while a Python-heavy loop runs. A missing NVML, GPU or GPM is
recorded as "not available" with the reason; it never raises into the reader's notebook.
"""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .checks import positive_float, positive_int
from .estimates import Estimate
from .device import DeviceInfo, get_device
from .files import JsonRecord

METRICS = {
    "nvml_util": "GPU busy (NVML, %)",
    "nvml_mem_util": "memory controller busy (NVML, %)",
    "mem_used_gb": "memory used (GB)",
    "power_w": "power (W)",
    "sm_clock_mhz": "SM clock (MHz)",
    "gpm_sm_active": "SM active (GPM, %)",
    "gpm_sm_occupancy": "SM occupancy (GPM, %)",
    "gpm_tensor_active": "tensor active (GPM, %)",
    "gpm_dram_bw": "DRAM bandwidth (GPM, %)",
    "cpu_percent": "host CPU, mean of cores (%)",
}
_GPM_MIN_GAP_S = 0.1  # NVML's GPM counters refresh about every 100 ms: two samples closer than that read nothing
_GPM_IDS = {"gpm_sm_active": 2, "gpm_sm_occupancy": 3, "gpm_tensor_active": 5, "gpm_dram_bw": 10}


@dataclass
class Trace(JsonRecord):
    """A timeline of device metrics: per metric a list of (seconds since start, value)."""

    duration_s: float = 0.0
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    cpu_per_core: list[tuple[float, list[float]]] = field(default_factory=list)
    window: dict[str, float] = field(default_factory=dict)  # whole-window GPM values (more reliable than 1 s)
    available: dict[str, str] = field(default_factory=dict)  # metric -> "ok" or why not
    device: str = ""

    def values(self, metric: str) -> list[float]:
        """The values of `metric` in time order (docs/API.md lists the metric names)."""
        return [v for _, v in self.series.get(metric, [])]

    def mean(self, metric: str) -> float | None:
        """Mean over the window, or None when the metric was not available (GPM: the whole-window value)."""
        if metric in self.window:
            return self.window[metric]
        vals = self.values(metric)
        return statistics.fmean(vals) if vals else None

    def estimate(self, metric: str, *, samples_only: bool = False) -> Estimate | None:
        """The window's mean of `metric` with the interquartile range of its samples as the interval.

        A whole-window reading (GPM) or a single sample is exact, unless `samples_only`; None when not recorded."""
        from .measurement import quantiles

        vals = self.values(metric)
        if samples_only:
            if not vals:
                return None
            mean = statistics.fmean(vals)
        else:
            mean = self.mean(metric)
            if mean is None:
                return None
            if metric in self.window or len(vals) < 2:
                return Estimate.exact(mean)
        q1, _, q3 = quantiles(vals)
        return Estimate(mean, min(q1, mean), max(q3, mean))

    def summary(self) -> dict[str, float | None]:
        """The mean of every metric that was recorded."""
        return {m: self.mean(m) for m in METRICS if self.available.get(m) == "ok"}

    def missing(self) -> dict[str, str]:
        """Each metric not recorded, with the reason."""
        return {m: why for m, why in self.available.items() if why != "ok"}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with every sample."""
        d = asdict(self)
        d["summary"] = self.summary()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trace:
        """A Trace from `to_dict`'s dict."""
        t = super().from_dict(d)
        t.series = {k: [tuple(p) for p in v] for k, v in t.series.items()}
        return t

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{METRICS[m]}</td><td>{v:.1f}</td></tr>" for m, v in self.summary().items()
                       if v is not None)
        miss = "".join(f"<li>{m}: {why}</li>" for m, why in self.missing().items())
        return (f"<b>Monitor</b> {self.device}, {self.duration_s:.2f} s<table>{rows}</table>"
                + (f"not available:<ul>{miss}</ul>" if miss else ""))


def _load_nvml():
    import pynvml  # provided by nvidia-ml-py
    return pynvml


class Monitor:
    """Context manager recording a `Trace` of the device (and host CPU) while its block runs.

    >>> with Monitor() as mon:
    ...     train(steps=100)
    >>> mon.trace.summary()

    Utilization comes from the driver's buffer, so `poll_s` only sets how often memory, power, clock and CPU
    are read: once a second keeps the thread's share of the GIL (its cost to a Python-bound loop) small.
    """

    def __init__(self, device: DeviceInfo | None = None, *, poll_s: float = 1.0, gpm_period_s: float = 1.0,
                 gpm: bool = True, cpu: bool = True, nvml: Any = None):
        poll_s = positive_float("poll_s", poll_s)  # NaN would make the polling thread spin
        gpm_period_s = positive_float("gpm_period_s", gpm_period_s)
        self.device = device or get_device()
        self.poll_s, self.gpm_period_s, self.use_gpm, self.use_cpu = poll_s, gpm_period_s, gpm, cpu
        self._nvml_override = nvml
        self.trace = Trace(device=self.device.name)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- setup ---------------------------------------------------------------------------------------
    def _open_nvml(self) -> None:
        self.nvml, self.handle = None, None
        why = None
        if not self.device.is_cuda:
            why = "no CUDA GPU"
        else:
            try:
                nv = self._nvml_override or _load_nvml()
                nv.nvmlInit()
                self.handle = self._handle(nv)
                self.nvml = nv
            except ImportError:
                why = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            except Exception as e:  # NVMLError_LibraryNotFound, driver not loaded, no permission...
                why = f"NVML unavailable: {type(e).__name__}: {e}"
        for m in ("nvml_util", "nvml_mem_util", "mem_used_gb", "power_w", "sm_clock_mhz"):
            self.trace.available[m] = why or "ok"
        self._open_gpm(why)

    def _handle(self, nv):
        # Map through UUID / PCI bus id: CUDA and NVML number devices differently under CUDA_VISIBLE_DEVICES.
        for get, key in ((getattr(nv, "nvmlDeviceGetHandleByUUID", None), self.device.uuid),
                         (getattr(nv, "nvmlDeviceGetHandleByPciBusId", None), self.device.pci_bus_id)):
            if get and key:
                try:
                    return get(key)
                except Exception:
                    continue
        return nv.nvmlDeviceGetHandleByIndex(self.device.index or 0)

    def _open_gpm(self, nvml_why: str | None) -> None:
        self._gpm_samples: list[Any] = []
        why = nvml_why
        if why is None and not self.use_gpm:
            why = "turned off"
        if why is None:
            try:
                support = self.nvml.nvmlGpmQueryDeviceSupport(self.handle)
                if not support.isSupportedDevice:
                    why = "GPM not supported on this GPU (needs Hopper or newer)"
            except Exception as e:
                why = f"GPM unavailable: {type(e).__name__}: {e}"
        for m in _GPM_IDS:
            self.trace.available[m] = why or "ok"
        self.gpm_ok = why is None

    # -- sampling ------------------------------------------------------------------------------------
    def _add(self, metric: str, t: float, value: float) -> None:
        self.trace.series.setdefault(metric, []).append((round(t, 4), float(value)))

    def _read_buffered(self, metric: str, sample_type: int) -> None:
        """Append the driver's buffered utilization samples taken since the last read."""
        try:
            _, samples = self.nvml.nvmlDeviceGetSamples(self.handle, sample_type, self._last_ts[metric])
        except Exception as e:
            if not self.trace.series.get(metric):
                self.trace.available[metric] = f"not available: {type(e).__name__}: {e}"
            return
        self.trace.available[metric] = "ok"
        for s in samples:
            if s.timeStamp <= self._last_ts[metric]:
                continue
            self._last_ts[metric] = s.timeStamp
            self._add(metric, s.timeStamp / 1e6 - self._t0_epoch, s.sampleValue.uiVal)

    def _gpm_sample(self) -> Any:
        s = self.nvml.nvmlGpmSampleAlloc()
        self.nvml.nvmlGpmSampleGet(self.handle, s)
        self._gpm_samples.append(s)
        return s

    def _gpm_metrics(self, s1: Any, s2: Any) -> dict[str, float]:
        nv = self.nvml
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(_GPM_IDS)
        mg.sample1, mg.sample2 = s1, s2
        for i, mid in enumerate(_GPM_IDS.values()):
            mg.metrics[i].metricId = mid
        nv.nvmlGpmMetricsGet(mg)
        return {name: mg.metrics[i].value for i, name in enumerate(_GPM_IDS) if mg.metrics[i].nvmlReturn == 0}

    def _poll(self, t: float, final: bool = False) -> None:
        if self.nvml is not None:
            nv, h = self.nvml, self.handle
            self._read_buffered("nvml_util", 1)      # NVML_GPU_UTILIZATION_SAMPLES
            self._read_buffered("nvml_mem_util", 2)  # NVML_MEMORY_UTILIZATION_SAMPLES
            for metric, read in (("mem_used_gb", lambda: nv.nvmlDeviceGetMemoryInfo(h).used / 1e9),
                                 ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1e3),
                                 ("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, 1))):  # NVML_CLOCK_SM
                if self.trace.available.get(metric) != "ok":
                    continue
                try:
                    self._add(metric, t, read())
                except Exception as e:
                    self.trace.available[metric] = f"not available: {type(e).__name__}"
            # The last poll closes the window with a sample of its own, so a window shorter than the GPM period
            # still gets its whole-window reading; NVML needs samples over 100 ms apart to refresh.
            gap = t - self._gpm_last_t if self.gpm_ok else 0.0
            if self.gpm_ok and (gap >= self.gpm_period_s or (final and gap > _GPM_MIN_GAP_S)):
                try:
                    s2 = self._gpm_sample()
                    for name, v in self._gpm_metrics(self._gpm_prev, s2).items():
                        self._add(name, (self._gpm_last_t + t) / 2, v)
                    self._gpm_prev, self._gpm_last_t = s2, t
                except Exception as e:
                    self.gpm_ok = False
                    for m in _GPM_IDS:
                        self.trace.available[m] = f"GPM read failed: {type(e).__name__}: {e}"
        if self._psutil is not None:
            per_core = self._psutil.cpu_percent(percpu=True)
            self.trace.cpu_per_core.append((round(t, 4), per_core))
            self._add("cpu_percent", t, statistics.fmean(per_core) if per_core else 0.0)

    def _run(self) -> None:
        if self._psutil is not None:
            self._psutil.cpu_percent(percpu=True)  # psutil keeps its last reading per thread: prime this one
        while not self._stop.wait(self.poll_s):
            self._poll(time.perf_counter() - self._t0)

    # -- public --------------------------------------------------------------------------------------
    def start(self) -> Monitor:
        """Start recording in a background thread."""
        if self._thread is not None:
            raise RuntimeError("this Monitor is already running; use a new one for a new window")
        self._open_nvml()
        self._psutil = None
        if self.use_cpu:
            try:
                import psutil
                psutil.cpu_percent(percpu=True)  # primes the counters: the next call covers the interval
                self._psutil = psutil
                self.trace.available["cpu_percent"] = "ok"
            except ImportError:
                self.trace.available["cpu_percent"] = "psutil is not installed"
        self._t0, self._t0_epoch = time.perf_counter(), time.time()
        self._last_ts = {"nvml_util": int(self._t0_epoch * 1e6), "nvml_mem_util": int(self._t0_epoch * 1e6)}
        if self.gpm_ok:
            try:
                self._gpm_first = self._gpm_prev = self._gpm_sample()
                self._gpm_last_t = 0.0
            except Exception as e:
                self.gpm_ok = False
                for m in _GPM_IDS:
                    self.trace.available[m] = f"GPM sample failed: {type(e).__name__}: {e}"
        self._thread = threading.Thread(target=self._run, name="gpulab-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Trace:
        """Stop recording, take the last samples and return the trace."""
        if self._thread is None:
            raise RuntimeError("Monitor.stop() called before start()")
        if self._stop.is_set():  # stopped already (its `with` block ended): the window is closed, keep it as it is
            return self.trace
        self._stop.set()
        self._thread.join()
        t = time.perf_counter() - self._t0
        self.trace.duration_s = t
        self._poll(t, final=True)
        if self.gpm_ok and len(self._gpm_samples) >= 2:
            try:
                self.trace.window = self._gpm_metrics(self._gpm_first, self._gpm_samples[-1])
            except Exception:
                pass
        for s in self._gpm_samples:
            try:
                self.nvml.nvmlGpmSampleFree(s)
            except Exception:
                pass
        self._gpm_samples = []
        # Only samples inside the window: the driver buffer may hold a little from before start.
        for metric in ("nvml_util", "nvml_mem_util"):
            if metric in self.trace.series:
                self.trace.series[metric] = [(x, v) for x, v in self.trace.series[metric] if 0 <= x <= t + 0.05]
        return self.trace

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def availability(device: DeviceInfo | None = None) -> dict[str, str]:
    """Which monitoring works here: metric -> "ok" or why not (a 0.3 s probe)."""
    mon = Monitor(device, poll_s=0.1, gpm_period_s=0.2)
    with mon:
        time.sleep(0.3)
    return dict(mon.trace.available)


GPM_MIN_WINDOW_S = 2.0  # a GPM reading behind a claim covers at least this much back-to-back work


def watch(fn: Any, seconds: float = GPM_MIN_WINDOW_S, device: DeviceInfo | None = None,
          sync_every: int = 20) -> Trace:
    """Run `fn()` back to back for `seconds` under a Monitor and return its trace.

    Nothing but `fn`'s work is in the window (warmed up first), so whole-window GPM values describe `fn` itself;
    a sync every `sync_every` calls keeps the queue short, so the window ends when the work does."""
    import torch

    if not callable(fn):
        raise ValueError("fn must be callable")
    positive_float("seconds", seconds)
    positive_int("sync_every", sync_every)
    device = device or get_device()

    def sync():
        if device.is_cuda:
            torch.cuda.synchronize(device.torch_device)

    fn()
    sync()
    with Monitor(device) as mon:
        t0, i = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            fn()
            i += 1
            if i % sync_every == 0:
                sync()
        sync()
    return mon.trace
