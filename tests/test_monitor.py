"""The monitor against a fake NVML (no GPU needed), with NVML broken, and with no GPU at all."""
import time
from types import SimpleNamespace

import pynvml
import pytest

from gpulab.measuring.device import DeviceInfo
from gpulab.measuring.monitor import Monitor, Trace

FAKE_GPU = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", index=0, capability=(9, 0),
                      uuid="GPU-1234", pci_bus_id="00000000:00:06.0")


class FakeNVML:
    """Just enough of pynvml: buffered utilization samples, memory, power, clock and GPM."""

    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION

    def __init__(self, util=97, gpm_supported=True, gpm_values=None, now=time.time):
        self.util, self.gpm_supported, self.now = util, gpm_supported, now
        self.gpm_values = gpm_values or {2: 86.9, 3: 12.8, 5: 84.4, 10: 24.1}
        self.handles_asked = []
        self.freed = 0

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.handles_asked.append(uuid)
        return "handle"

    def nvmlDeviceGetSamples(self, handle, sample_type, last_ts):
        now_us = int(self.now() * 1e6)
        # one sample from long before the window (must be dropped) and the driver's recent ones
        stamps = [now_us - 60_000_000] + [now_us - k * 166_000 for k in range(3, -1, -1)]
        value = self.util if sample_type == 1 else 40
        return 1, [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=value)) for t in stamps
                   if t > last_ts]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=10e9, total=80e9)

    def nvmlDeviceGetPowerUsage(self, handle):
        return 550_000  # mW

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return 1980

    def nvmlGpmQueryDeviceSupport(self, handle):
        return SimpleNamespace(isSupportedDevice=int(self.gpm_supported))

    def nvmlGpmSampleAlloc(self):
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleGet(self, handle, sample):
        return sample

    def nvmlGpmSampleFree(self, sample):
        self.freed += 1

    def nvmlGpmMetricsGet(self, mg):
        for i in range(mg.numMetrics):
            mg.metrics[i].value = self.gpm_values[mg.metrics[i].metricId]
            mg.metrics[i].nvmlReturn = 0
        return mg


EPOCH = 1_700_000_000.0  # where the window's clock starts on NVML's epoch-based timeline


def test_records_buffered_samples_and_gpm_from_fake_nvml(window_clock, monkeypatch):
    """Six polls 1/16 s apart on the window's clock, made here rather than by the monitor's thread (which a loaded
    host can hold back), then the closing one: a GPM reading every 1/8 s."""
    from gpulab import monitor

    monkeypatch.setattr(monitor.time, "time", lambda: EPOCH + window_clock.t)
    nv = FakeNVML(now=lambda: EPOCH + window_clock.t)
    with Monitor(FAKE_GPU, nvml=nv, poll_s=3600, gpm_period_s=0.125) as mon:  # its thread waits out the window
        for _ in range(6):
            window_clock.t += 0.0625
            mon._poll(window_clock.t)
        window_clock.t += 0.0625
    tr = mon.trace
    assert nv.handles_asked == ["GPU-1234"]  # mapped by UUID, not by index
    assert all(v == "ok" for v in tr.available.values()), tr.available
    util = tr.series["nvml_util"]
    assert util and all(0 <= t <= tr.duration_s + 0.05 for t, _ in util)  # the old sample was dropped
    assert len({t for t, _ in util}) == len(util)  # no sample read twice
    assert tr.mean("nvml_util") == pytest.approx(97)
    assert tr.mean("mem_used_gb") == pytest.approx(10.0)
    assert tr.mean("power_w") == pytest.approx(550.0)
    assert tr.mean("gpm_tensor_active") == pytest.approx(84.4)
    assert tr.window["gpm_sm_active"] == pytest.approx(86.9)
    assert len(tr.series["gpm_sm_active"]) == 3  # a timeline (at 1/8, 2/8 and 3/8 s), not just one window
    assert nv.freed == 4  # GPM samples are released: the first and one per reading


@pytest.fixture
def window_clock(monkeypatch):
    """The monitor's window timed on a clock the test advances: a loaded host cannot stretch 20 ms past 100 ms."""
    import types

    from gpulab.measuring import monitor
    from test_timing import FakeClock

    clock = FakeClock()
    monkeypatch.setattr(monitor, "time", types.SimpleNamespace(perf_counter=clock, time=time.time,
                                                               sleep=time.sleep))
    return clock


def test_a_window_shorter_than_the_gpm_period_still_gets_its_gpm_reading(window_clock):
    # 0.3 s of work under the default 1 s GPM period: the closing poll takes the second sample.
    with Monitor(FAKE_GPU, nvml=FakeNVML(), poll_s=0.05) as mon:
        window_clock.t += 0.3
    assert mon.trace.window["gpm_tensor_active"] == pytest.approx(84.4)
    assert mon.trace.summary()["gpm_sm_active"] == pytest.approx(86.9)


def test_a_window_under_100_ms_reads_no_gpm_rather_than_a_stale_one(window_clock):
    with Monitor(FAKE_GPU, nvml=FakeNVML(), poll_s=0.05) as mon:
        window_clock.t += 0.02
    assert mon.trace.mean("gpm_tensor_active") is None
    assert mon.trace.available["nvml_util"] == "ok"


def test_gpm_unsupported_is_reported_not_raised():
    with Monitor(FAKE_GPU, nvml=FakeNVML(gpm_supported=False), poll_s=0.05) as mon:
        time.sleep(0.1)
    assert "Hopper" in mon.trace.available["gpm_tensor_active"]
    assert mon.trace.mean("gpm_tensor_active") is None
    assert mon.trace.available["nvml_util"] == "ok"
    assert "gpm_tensor_active" not in mon.trace.summary()


def test_nvml_that_fails_to_initialise_degrades():
    class Broken(FakeNVML):
        def nvmlInit(self):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    with Monitor(FAKE_GPU, nvml=Broken(), poll_s=0.05) as mon:
        time.sleep(0.1)
    assert mon.trace.available["nvml_util"].startswith("NVML unavailable")
    assert mon.trace.series.get("nvml_util") is None
    assert mon.trace.available["cpu_percent"] == "ok"  # the host CPU is still recorded
    assert mon.trace.series["cpu_percent"]


def test_a_query_that_is_not_supported_marks_only_that_metric():
    class NoPower(FakeNVML):
        def nvmlDeviceGetPowerUsage(self, handle):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    with Monitor(FAKE_GPU, nvml=NoPower(), poll_s=0.05) as mon:
        time.sleep(0.15)
    assert mon.trace.available["power_w"].startswith("not available")
    assert mon.trace.available["mem_used_gb"] == "ok"


def test_no_gpu_records_cpu_and_says_what_is_missing():
    cpu = DeviceInfo(kind="cpu", name="test cpu")
    with Monitor(cpu, poll_s=0.05) as mon:
        sum(i * i for i in range(200_000))
    tr = mon.trace
    assert tr.available["nvml_util"] == "no CUDA GPU"
    assert tr.missing()["gpm_sm_active"] == "no CUDA GPU"
    assert tr.series["cpu_percent"] and tr.cpu_per_core and len(tr.cpu_per_core[0][1]) >= 1


def test_trace_round_trips_and_monitor_rejects_misuse():
    with Monitor(FAKE_GPU, nvml=FakeNVML(), poll_s=0.05) as mon:
        time.sleep(0.1)
    tr2 = Trace.from_dict(mon.trace.to_dict())
    assert tr2.summary() == mon.trace.summary()
    assert "GPU busy" in tr2._repr_html_()
    with pytest.raises(ValueError, match="poll_s"):
        Monitor(FAKE_GPU, poll_s=0)
    with pytest.raises(RuntimeError, match="before start"):
        Monitor(FAKE_GPU).stop()
    with pytest.raises(RuntimeError, match="already running"):
        mon.start()


def test_watch_covers_the_requested_window_of_back_to_back_work(cpu_device, window_clock):
    """On the window's clock, which only the work advances: a loaded host cannot cut the number of calls."""
    from gpulab.measuring.monitor import watch

    calls = []

    def work():
        calls.append(1)
        window_clock.t += 2**-6  # 1/64 s a call; powers of two add up exactly

    trace = watch(work, seconds=0.25, device=cpu_device)
    assert trace.duration_s >= 0.25 and len(calls) == 1 + 16  # a warm-up call, then 0.25 s of back-to-back calls


@pytest.mark.parametrize("kwargs", [dict(seconds=0), dict(seconds=float("nan")), dict(sync_every=0)])
def test_watch_rejects_bad_input(kwargs, cpu_device):
    from gpulab.measuring.monitor import watch

    with pytest.raises(ValueError):
        watch(lambda: None, device=cpu_device, **kwargs)
