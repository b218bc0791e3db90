"""`python -m gpulab check`: does measuring work on this machine? Peaks, monitor readings and monitor overhead.

It measures four things and checks them as claims:
1. measured BF16 matmul TFLOP/s and device copy bandwidth (against floors that a healthy GPU of its class meets),
2. the monitor around about 2 s of large BF16 matmuls (NVML busy and GPM tensor activity should be high),
3. the monitor around 1 s of idle, 1.5 s after the busy window (both should be near zero),
4. how much the monitor slows a small training loop, with it on and off in alternating blocks of one run.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import torch

from .device import DeviceInfo, get_device, measure_peaks, synchronize
from .experiment import Claim, Comparison, RunResult
from .monitor import Monitor
from .results import NotebookResult
from .timing import Measurement


def _matmul_window(device: DeviceInfo, seconds: float, n: int) -> Monitor:
    a = torch.randn(n, n, device=device.torch_device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device.torch_device, dtype=torch.bfloat16)
    a @ b
    synchronize()
    with Monitor(device) as mon:
        t0 = time.perf_counter()
        i = 0
        while time.perf_counter() - t0 < seconds:
            a @ b
            i += 1
            if i % 20 == 0:
                synchronize()  # keep the queue short so the window ends when the work does
        synchronize()
    return mon


def _idle_window(device: DeviceInfo, seconds: float, settle_s: float = 0.0) -> Monitor:
    synchronize()
    # NVML's samples average over the driver's last sample period: one taken just after busy work still
    # reports it, so wait for the earlier work to age out before the idle window starts.
    time.sleep(settle_s)
    with Monitor(device) as mon:
        time.sleep(seconds)
    return mon


def _small_training_loop(device: DeviceInfo, width: int, batch: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width)
                                ).to(device.torch_device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device=device.torch_device)

    def step():
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def monitor_overhead(device: DeviceInfo, *, phases: int = 12, blocks: int = 8, block_s: float = 0.25,
                     width: int = 2048, batch: int = 2048) -> tuple[Measurement, Measurement]:
    """Per-step time of a small training loop with the monitor off and on, in alternating phases of one run.

    Each "on" phase keeps one Monitor running across all its blocks (seconds), so the monitor's polling
    thread really competes with the loop; phases go off, on, on, off, ... against drift. The default loop
    (two 2048-wide layers, batch 2048, FP32) keeps the GPU busy for a few ms per step, like real training;
    a loop of sub-millisecond steps is bound by the host's launch speed, whose run-to-run noise (several %
    on a shared host) hides an effect this small.
    """
    step = _small_training_loop(device, width, batch)
    for _ in range(20):
        step()
    synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        step()
    synchronize()
    steps = max(5, int(block_s / ((time.perf_counter() - t0) / 20)))  # blocks of about block_s seconds
    times: dict[bool, list[float]] = {False: [], True: []}

    def run_blocks(into: list[float]) -> None:
        for _ in range(blocks):
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            synchronize()
            into.append((time.perf_counter() - t0) / steps)

    for i in range(phases):
        on = i % 4 in (1, 2)
        if on:
            with Monitor(device):
                run_blocks(times[True])
        else:
            run_blocks(times[False])
    return Measurement("monitor off", times[False]), Measurement("monitor on", times[True])


def run_check(*, smoke: bool = False, save: bool = True) -> NotebookResult:
    """Run the self-check and return (and by default save) its result as 00_device.json."""
    device = get_device()
    result = NotebookResult("00_device", smoke=smoke, device=device)
    peaks = measure_peaks(device, size=1024 if smoke else None)
    result.record("measured_peaks", peaks.to_dict())
    result.record("datasheet", asdict(device.peaks) if device.peaks else None)
    n, busy_s, idle_s = (256, 0.3, 0.3) if smoke else (8192, 2.0, 1.0)
    busy = _matmul_window(device, busy_s, n).trace
    idle = _idle_window(device, idle_s, settle_s=0.0 if smoke else 1.5).trace
    result.record("matmul_window", busy.to_dict())
    result.record("idle_window", idle.to_dict())
    off, on = (monitor_overhead(device, phases=2, blocks=3, block_s=0.02, width=256, batch=64) if smoke
               else monitor_overhead(device))
    ratio = on.median / off.median
    cmp = Comparison("monitor overhead (small training loop)", RunResult("monitor off", off, item_name="steps"),
                     RunResult("monitor on", on, item_name="steps"), device=device.name,
                     notes=[f"on/off time ratio {ratio:.4f} (medians of {on.n} alternating blocks)"])
    result.add(cmp)
    result.record("monitor_overhead_ratio", ratio)

    gpu = "needs a CUDA GPU"
    checks: list[tuple[Claim, Any]] = [
        (Claim("BF16 8192³ matmul reaches at least 700 TFLOP/s", low=700, unit="TFLOP/s",
               source="H100 floor"), peaks.tflops.get("bf16") if device.is_cuda and not smoke else None),
        (Claim("device-to-device copy reaches at least 2.7 TB/s", low=2700, unit="GB/s", source="H100 floor"),
         peaks.copy_gbs if device.is_cuda and not smoke else None),
        (Claim("NVML utilization >= 90% during ~2 s of large BF16 matmuls", low=90, unit="%", source="monitor"),
         busy.mean("nvml_util")),
        (Claim("GPM tensor activity > 50% during ~2 s of large BF16 matmuls", low=50, unit="%", source="monitor"),
         busy.mean("gpm_tensor_active")),
        (Claim("NVML utilization < 10% during ~1 s idle", high=10, unit="%", source="monitor"),
         idle.mean("nvml_util")),
        (Claim("the monitor slows a small training loop by under 1%", high=1.0, unit="%", source="monitor"),
         (ratio - 1) * 100),
    ]
    for claim, value in checks:
        why = gpu if not device.is_cuda else ("smoke sizes" if smoke else busy.available.get("gpm_tensor_active"))
        result.claim(claim.check(value) if value is not None else claim.untestable(why or "not measured"))
    if save:
        result.save()
    return result


def print_check(result: NotebookResult) -> None:
    """Print the self-check's claims, one line each."""
    for c in result.claims:
        print(f"{c.verdict:>10}  {c.text}: measured {c._measured_str()}" + (f" ({c.note})" if c.note else ""))
    off_on = result.extra.get("monitor_overhead_ratio")
    if off_on:
        print(f"            monitor on/off time ratio {off_on:.4f}")
    print(f"saved: {result.path()}")
