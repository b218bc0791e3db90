"""`python -m gpulab check`: does measuring work on this machine? Peaks, monitor readings and monitor overhead.

Its claims: sustained BF16 matmul TFLOP/s and copy bandwidth against floors that hold on any healthy GPU
(fractions of this device's datasheet values), the monitor high over large matmuls and near zero at idle, and the
monitor's cost to a small training loop. It also times three calls with gpulab and with torch.utils.benchmark's
blocked_autorange (`timer_agreement`).
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import torch

from ..measuring.device import DeviceInfo, get_device, synchronize
from ..measuring.peaks import measure_peaks
from ..verdicts.claims import Claim
from ..verdicts.experiment import Comparison
from ..verdicts.run_result import RunResult
from ..measuring.host import host_speed
from ..measuring.monitor import Monitor, Trace, watch
from ..verdicts.results import NotebookResult
from ..measuring.timing import benchmark
from ..measuring.measurement import Measurement


def _matmul_window(device: DeviceInfo, seconds: float, n: int) -> Trace:
    a = torch.randn(n, n, device=device.torch_device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device.torch_device, dtype=torch.bfloat16)
    return watch(lambda: a @ b, seconds, device)


# Floors as fractions of the datasheet: portable across GPUs. An H100 SXM sustains about 80% of its
# dense BF16 peak on an 8192³ matmul and about 90% of its memory bandwidth on a large copy.
BF16_FLOOR = 0.60
COPY_FLOOR = 0.70


def _course(words: str) -> str:
    """The quote of a self-check claim: the course's own check, not the guide's words."""
    return f"course check: {words}"


def _monitor_claim(text: str, key: str, **band: float) -> Claim:
    """A self-check claim on the monitor, in percent, quoting itself as the course's own check."""
    return Claim(text, unit="%", source="monitor", key=key, quote=_course(text), **band)


def floor_claims(device: DeviceInfo, peaks, smoke: bool) -> list[tuple[Claim, Any, str]]:
    """The peak and bandwidth floors for this device: fractions of its datasheet, with what to test them on."""
    spec = device.datasheet_peaks
    ds_bf16 = spec.tflops.get("bf16") if spec else None
    ds_bw = spec.bandwidth_gbs if spec else None
    why = ("needs a CUDA GPU" if not device.is_cuda else "smoke sizes" if smoke else
           f"no datasheet entry for {device.name}")
    out = []
    c = Claim(f"sustained BF16 matmul reaches at least {BF16_FLOOR:.0%} of the datasheet dense peak"
              + (f" ({BF16_FLOOR * ds_bf16:,.0f} of {ds_bf16:g} TFLOP/s)" if ds_bf16 else ""),
              low=BF16_FLOOR * ds_bf16 if ds_bf16 else 0.0, unit="TFLOP/s", source="self-check floor",
              key="00.bf16_floor", quote=_course(f"sustained BF16 matmul reaches at least {BF16_FLOOR:.0%} of the "
                                                 "datasheet dense peak"))
    rounds = peaks.rounds.get("bf16") or []
    val = (max(rounds), (min(rounds), max(rounds))) if rounds and device.is_cuda and not smoke and ds_bf16 else None
    out.append((c, val, why if val is None else "best of the sustained rounds; interval: all rounds"))
    c = Claim(f"device-to-device copy reaches at least {COPY_FLOOR:.0%} of the datasheet memory bandwidth"
              + (f" ({COPY_FLOOR * ds_bw:,.0f} of {ds_bw:g} GB/s)" if ds_bw else ""),
              low=COPY_FLOOR * ds_bw if ds_bw else 0.0, unit="GB/s", source="self-check floor",
              key="00.copy_floor", quote=_course(f"device-to-device copy reaches at least {COPY_FLOOR:.0%} of the "
                                                 "datasheet memory bandwidth"))
    val = peaks.copy_gbs if device.is_cuda and not smoke and ds_bw else None
    out.append((c, val, why if val is None else "1 GiB copy, bytes read + written"))
    return out


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


def monitor_overhead(device: DeviceInfo, *, phases: int = 8, blocks: int = 8, block_s: float = 0.25,
                     width: int = 2048, batch: int = 2048) -> tuple[Measurement, Measurement]:
    """Per-step time of a small training loop with the monitor off and on, in alternating phases of one run.

    Each "on" phase keeps one Monitor running across its blocks, so its polling thread really competes with the
    loop; phases go off, on, on, off against drift. The default loop keeps the GPU busy a few ms per step: a loop
    of sub-millisecond steps is launch-bound, whose run-to-run noise (several % on a shared host) hides an effect
    this small. Eight phases (16 s) read the H200's overhead to about ±0.2% against the claim's 1%."""
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


def timer_workloads(device: DeviceInfo, *, small: bool) -> dict[str, tuple[str, Any]]:
    """The three calls both timers time: (what it is, the call). Full sizes on a GPU; small ones on a CPU."""
    dev = device.torch_device
    tiny = torch.zeros(64, 64, device=dev)
    n = 1024 if small or not device.is_cuda else 8192
    dtype = torch.bfloat16 if device.is_cuda else torch.float32
    a, b = (torch.randn(n, n, device=dev, dtype=dtype) for _ in range(2))
    numel = (1 << 20) if small or not device.is_cuda else (1 << 28)
    x = torch.randn(numel, device=dev)
    return {"tiny_add": ("in-place add on 64x64 (launch-bound)", lambda: tiny.add_(1.0)),
            "matmul": (f"{n}-cubed {str(dtype).removeprefix('torch.')} matmul", lambda: a @ b),
            "gelu": (f"GELU over {numel:,} floats", lambda: torch.nn.functional.gelu(x))}


def timer_agreement(device: DeviceInfo, *, small: bool = False, min_time_s: float = 1.0) -> dict[str, Any]:
    """gpulab's median over torch.utils.benchmark.Timer.blocked_autorange's, for each of `timer_workloads`, with
    the mode gpulab chose; a ratio of 1 is agreement (the goal: within 3% on a GPU)."""
    from torch.utils import benchmark as tb

    out: dict[str, Any] = {}
    for key, (what, fn) in timer_workloads(device, small=small).items():
        ours = benchmark(fn, label=key, min_time_s=min_time_s, device=device.torch_device)
        theirs = tb.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads()  # its default is 1
                          ).blocked_autorange(min_run_time=min_time_s)
        out[key] = {"what": what, "gpulab_s": ours.median, "torch_s": theirs.median,
                    "ratio": ours.median / theirs.median, "gpulab_mode": ours.method}
        synchronize()
    return out


def run_check(*, smoke: bool = False, save: bool = True, progress: bool = False) -> NotebookResult:
    """Run the self-check and return (and by default save) its result as 00_device.json; `progress` shows a bar
    over its five stages (the full sizes take minutes on a CPU)."""
    from tqdm.auto import tqdm

    device = get_device()
    result = NotebookResult("00_device", smoke=smoke, device=device)
    bar = tqdm(total=5, desc="self-check", disable=not progress)
    bar.set_postfix_str("peaks")
    peaks = measure_peaks(device, size=1024 if smoke else None)
    result.record("host", host_speed(device, launches=200, rounds=3) if smoke else
                  host_speed(device, launches=2000, rounds=5))
    bar.update()
    bar.set_postfix_str("monitor busy and idle")
    result.record("measured_peaks", peaks.to_dict())
    result.record("datasheet", asdict(device.datasheet_peaks) if device.datasheet_peaks else None)
    n, busy_s, idle_s = (256, 0.3, 0.3) if smoke else (8192, 2.0, 1.0)
    busy = _matmul_window(device, busy_s, n)
    idle = _idle_window(device, idle_s, settle_s=0.0 if smoke else 1.5).trace
    result.record("matmul_window", busy.to_dict())
    result.record("idle_window", idle.to_dict())
    bar.update()
    bar.set_postfix_str("monitor overhead")
    off, on = (monitor_overhead(device, phases=2, blocks=3, block_s=0.02, width=256, batch=64) if smoke
               else monitor_overhead(device))
    ratio = on.median / off.median
    cmp = Comparison("monitor overhead (small training loop)", RunResult("monitor off", off, item_name="steps"),
                     RunResult("monitor on", on, item_name="steps"), device=device.name,
                     notes=[f"on/off time ratio {ratio:.4f} (medians of {on.n} alternating blocks)"])
    result.add(cmp)
    result.record("monitor_overhead_ratio", ratio)
    bar.update()
    bar.set_postfix_str("timer agreement")
    result.record("timer_agreement", timer_agreement(device, small=smoke, min_time_s=0.05 if smoke else 1.0))
    bar.update()
    bar.set_postfix_str("verdicts")

    gpu_why = "needs a CUDA GPU" if not device.is_cuda else None
    for claim, value, note in floor_claims(device, peaks, smoke):
        result.claim(claim.check(value, note=note, measurement="peaks") if value is not None
                     else claim.untestable(note))
    gpm_why = busy.available.get("gpm_tensor_active")
    monitor_claims = [
        (_monitor_claim("NVML utilization >= 90% during ~2 s of large BF16 matmuls", "00.nvml_busy", low=90),
         busy.estimate("nvml_util"), gpu_why or "NVML not available"),
        (_monitor_claim("GPM tensor activity > 50% during ~2 s of large BF16 matmuls", "00.gpm_tensor", low=50),
         busy.estimate("gpm_tensor_active"), gpu_why or gpm_why or "GPM not available"),
        (_monitor_claim("NVML utilization < 10% during ~1 s idle", "00.nvml_idle", high=10),
         idle.estimate("nvml_util"), gpu_why or "NVML not available"),
    ]
    for claim, value, why in monitor_claims:
        result.claim(claim.check(value) if value is not None else claim.untestable(why))
    overhead = _monitor_claim("the monitor slows a small training loop by under 1%", "00.monitor_overhead", high=1.0)
    result.claim(overhead.check(cmp.estimate().map(lambda r: (1 / r - 1) * 100),
                                note="on/off step time; interval from both sides' quartiles"))
    bar.update()
    bar.close()
    if save:
        result.save()
    return result


def print_check(result: NotebookResult) -> None:
    """Print the self-check's claims, one line each."""
    for c in result.claims:
        print(f"{c.label:>12}  {c.text}: measured {c._measured_str()}" + (f" ({c.note})" if c.note else ""))
    host = result.extra.get("host")
    if host:
        print(f"{'host':>12}  {host['cpu']}, {host['cores']} cores: {host['launch_us']:.3g} µs per eager op "
              f"(one-element add; median of {len(host['launch_us_rounds'])} rounds)")
    for key, t in (result.extra.get("timer_agreement") or {}).items():
        print(f"{'timer':>12}  {t['what']}: gpulab / torch.utils.benchmark {t['ratio']:.3f} "
              f"({t['gpulab_s'] * 1e6:.4g} vs {t['torch_s'] * 1e6:.4g} µs; gpulab's {t['gpulab_mode']})")
    off_on = result.extra.get("monitor_overhead_ratio")
    if off_on:
        print(f"            monitor on/off time ratio {off_on:.4f}")
    print(f"saved: {result.path()}")
