"""The host's speed: the time of one eager kernel launch, which bounds every loop of small kernels.

A GPU finishes a one-element add faster than Python and the driver can launch the next, so a loop of them runs
at the host's pace. The same GPU behind a slower or busier host runs launch-bound work (small batches, sync
points, data loading) slower, and the verdicts about that work can differ between two runs on one GPU model.
Each lesson records the launch time when it starts and when it saves, so a comparison can say so.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from .device import DeviceInfo, physical_cores, synchronize

# Launch times further apart than this (as a ratio) are worth a sentence: run-to-run drift on one quiet host stays
# within a few percent, while the hosts of the reference machines ranged from 6.2 to 9.5 µs.
DIFFERENT_HOST_SPEED = 1.15


def launch_times_us(device: DeviceInfo, *, launches: int = 2000, rounds: int = 5) -> list[float]:
    """Host time per eager op on a one-element tensor (a kernel launch on a GPU), in µs, one value per round."""
    if launches < 1 or rounds < 1:
        raise ValueError(f"launches={launches}, rounds={rounds}: both must be at least 1")
    x = torch.zeros(1, device=device.torch_device)
    for _ in range(100):  # warm-up: the first launches load the kernel
        x.add_(1)
    synchronize()
    per_op = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(launches):
            x.add_(1)
        synchronize()
        per_op.append((time.perf_counter() - t0) / launches * 1e6)
    return per_op


def host_speed(device: DeviceInfo, *, launches: int = 1000, rounds: int = 3) -> dict[str, Any] | None:
    """The host's CPU and its launch time now: {"cpu", "cores", "physical_cores", "launch_us" (median),
    "launch_us_rounds"}.

    None where this process cannot run an op on `device` (a GPU described, but no CUDA here)."""
    if device.torch_device.type == "cuda" and not torch.cuda.is_available():
        return None
    rounds_us = launch_times_us(device, launches=launches, rounds=rounds)
    return {"cpu": device.cpu, "cores": device.cpu_cores, "physical_cores": physical_cores(),
            "launch_us": statistics.median(rounds_us),
            "launch_us_rounds": rounds_us}


def recorded_host(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The `host` a loaded result file recorded (None for files written before it was timed)."""
    return ((result or {}).get("extra") or {}).get("host")


def launch_range_us(host: dict[str, Any] | None) -> tuple[float, float] | None:
    """(fastest, slowest) of a result's launch times at its start and end; None for files without them."""
    if not host:
        return None
    values = [v for v in (host.get("launch_us"), host.get("launch_us_end")) if isinstance(v, (int, float))]
    return (min(values), max(values)) if values else None


def speed_difference(mine: dict[str, Any] | None, reference: dict[str, Any] | None) -> str | None:
    """One sentence on two results' host launch times (the `host` each lesson records); None when either has none.

    Says whether the hosts ran at about the same speed or one was slower, since launch-bound numbers follow it.
    """
    a, b = launch_range_us(mine), launch_range_us(reference)
    if a is None or b is None:
        return None

    def span(r: tuple[float, float]) -> str:
        return f"{r[0]:.2g}" if f"{r[0]:.2g}" == f"{r[1]:.2g}" else f"{r[0]:.2g}-{r[1]:.2g}"

    ratio = statistics.mean(a) / statistics.mean(b)
    text = f"host {span(a)} µs per kernel launch here, {span(b)} µs in the reference"
    if ratio > DIFFERENT_HOST_SPEED:
        return text + f": this host was {ratio:.2g}x slower, so launch-bound work ran slower here"
    if ratio < 1 / DIFFERENT_HOST_SPEED:
        return text + f": this host was {1 / ratio:.2g}x faster, so launch-bound work ran faster here"
    return text + ": about the same speed"
