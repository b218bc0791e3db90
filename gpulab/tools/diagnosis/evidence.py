"""Collect a step's evidence: its time, a profile (idle split, kernel classes), syncs, loader wait, memory, MFU.

Everything lands in one JSON-ready dict that rules.py reads (its keys are listed there).
"""
from __future__ import annotations

import contextlib
import itertools
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ...measuring.device import get_device, usable_cores
from ...measuring.flops import count_flops, mfu
from ...measuring.profiling import find_syncs, profile
from ...measuring.timing import benchmark
from ..traces import load_trace, time_breakdown
from .classify import shares, step_classes

IDLE_KEYS = {"idle: host launching": "host_launching", "idle: after a sync": "after_sync",
             "idle: queued work waiting": "queued"}


class BatchSource:
    """Batches drawn from a loader (cycled), moved to the device, with the host's wait for each one counted."""

    def __init__(self, loader: Any, device: torch.device):
        self.loader, self.device, self.wait_s, self.taken = loader, device, 0.0, 0
        self._it = iter(loader)
        self._serve: Callable[[], tuple[Any, Any]] | None = None  # set while replaying

    @contextlib.contextmanager
    def replaying(self, n: int):
        """Serve `n` batches drawn now, in turn, until the block ends (the loader's own work then stays out)."""
        batches = [self.next() for _ in range(n)]
        served = itertools.count()
        self._serve = lambda: batches[next(served) % n]
        try:
            yield
        finally:
            self._serve = None

    def next(self) -> tuple[Any, Any]:
        if self._serve is not None:
            return self._serve()
        t0 = time.perf_counter()
        try:
            xb, yb = next(self._it)
        except StopIteration:
            self._it = iter(self.loader)
            xb, yb = next(self._it)
        self.wait_s += time.perf_counter() - t0
        self.taken += 1
        nb = self.device.type == "cuda"
        return xb.to(self.device, non_blocking=nb), yb.to(self.device, non_blocking=nb)


def optimizer_facts(opt: torch.optim.Optimizer | None, gpu: bool) -> dict[str, Any] | None:
    """The optimizer's class, whether it is fused or foreach (torch's default where None) and its tensor count."""
    if opt is None:
        return None
    g = opt.param_groups[0]
    fused = bool(g.get("fused"))
    foreach = g.get("foreach")
    if foreach is None:  # torch's default: foreach on CUDA tensors, the per-tensor loop on a CPU
        foreach = gpu and not fused and not g.get("differentiable")
    return {"class": type(opt).__name__, "fused": fused, "foreach": bool(foreach),
            "tensors": sum(len(pg["params"]) for pg in opt.param_groups)}


def model_facts(model: torch.nn.Module | None) -> dict[str, Any]:
    """Whether the model has convolutions, and whether they hold their weights channels_last."""
    if model is None:
        return {"conv": None, "channels_last": None}
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    return {"conv": bool(convs), "channels_last": bool(convs) and all(
        c.weight.is_contiguous(memory_format=torch.channels_last) and not c.weight.is_contiguous() for c in convs)}


def loader_wait(step: Callable[[], Any], feed: BatchSource, seconds: float, gpu: bool) -> dict[str, float]:
    """The share of step time the host spends waiting for the loader, over about `seconds` of steps."""
    feed.wait_s, feed.taken = 0.0, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or feed.taken < 2:
        step()
    if gpu:
        torch.cuda.synchronize()
    total = time.perf_counter() - t0
    return {"loader_wait_share": min(1.0, feed.wait_s / total), "loader_wait_ms": feed.wait_s / feed.taken * 1e3}


def memory_headroom(step: Callable[[], Any], device: torch.device) -> float | None:
    """The share of the GPU's memory still free at the step's peak (None on a CPU)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    _, total = torch.cuda.mem_get_info(device)
    return max(0.0, 1.0 - torch.cuda.max_memory_allocated(device) / total)


def profile_evidence(step: Callable[[], Any], step_ms: float) -> dict[str, Any]:
    """Profile a few steps (about a second's worth, 2 to 8): idle split and kernel classes as shares of the step."""

    n = max(2, min(8, int(1000.0 / max(step_ms, 1e-3))))
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "diagnose_trace.json"
        prof = profile(step, steps=n, warmup=1, trace_path=trace_path, record_shapes=True)
        trace = load_trace(trace_path)
    breakdown = time_breakdown(trace, unprofiled_step_ms=step_ms)
    classes = step_classes(trace)
    out: dict[str, Any] = {"profiled_step_ms": classes["step_ms"] or prof.wall_ms / prof.steps,
                           "classes": shares(classes), "kernels_per_step": classes["kernels_per_step"],
                           "optimizer_range_ms": classes["optimizer_range_ms"], "busy": None, "idle": None}
    ms = out["profiled_step_ms"]
    out["sync_wait"] = min(1.0, classes["sync_wait_ms"] / ms) if ms > 0 else 0.0  # the host blocked in syncs
    if breakdown.window_ms > 0:
        frac = breakdown.fractions()
        out["busy"] = frac.get("kernels", 0.0)
        out["idle"] = {short: frac.get(long, 0.0) for long, short in IDLE_KEYS.items()}
        out["breakdown_note"] = breakdown.note
    return out


def with_loader_wait(prof: dict[str, Any], wait: float) -> dict[str, Any]:
    """A profile of the step on ready batches, as shares of the whole step that also waits `wait` of its time for
    the loader: each share shrinks by (1 - wait), and the wait joins the host's idle (no kernel runs meanwhile)."""
    keep = 1.0 - min(max(wait, 0.0), 1.0)
    out = dict(prof)
    out["profiled_step_ms"] = prof["profiled_step_ms"] / keep if keep > 0 else prof["profiled_step_ms"]
    out["classes"] = {k: v * keep for k, v in (prof.get("classes") or {}).items()}
    out["sync_wait"] = prof.get("sync_wait", 0.0) * keep
    if prof.get("busy") is not None:
        out["busy"] = prof["busy"] * keep
    if prof.get("idle") is not None:
        out["idle"] = {k: v * keep for k, v in prof["idle"].items()}
        out["idle"]["host_launching"] = out["idle"].get("host_launching", 0.0) + (1.0 - keep)
    return out


def collect(step: Callable[[], Any], *, device: torch.device, model: torch.nn.Module | None = None,
            optimizer: torch.optim.Optimizer | None = None, batch_size: int | None = None,
            feed: BatchSource | None = None, min_time_s: float = 0.3,
            tick: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Every piece of evidence the rules read, from running `step` (its side effects are the caller's to undo)."""

    gpu = device.type == "cuda"
    ev: dict[str, Any] = {"gpu": gpu, "device": str(device), "batch_size": batch_size, "loader_wait_share": None,
                          "loader_wait_ms": None}
    tick("timing the step")
    step()  # the first step allocates the optimizer's state
    ev["step_ms"] = benchmark(step, min_time_s=min_time_s, device=device, min_repeats=3).median * 1e3
    if feed is not None:  # the wait first: the profile below replays batches, so it holds the step's own work
        tick("loader wait")
        ev |= loader_wait(step, feed, max(0.5, 3 * min_time_s), gpu)
        ev["loader_workers"] = getattr(feed.loader, "num_workers", None)
        ev["cores"] = usable_cores()  # what the workers of the fix can use
    # The rest runs on batches drawn now: a profile, the sync search and the FLOP count hold the step's own work,
    # not a main-process decode's thousands of small ops (one profile of those took 51 s of a 15 s budget).
    with feed.replaying(3) if feed is not None else contextlib.nullcontext():
        tick("profiling")
        wait = ev["loader_wait_share"] or 0.0
        ev |= with_loader_wait(profile_evidence(step, ev["step_ms"] * (1 - wait)), wait)
        tick("syncs and memory")
        syncs = find_syncs(step)
        ev["syncs_per_step"] = None if syncs is None else float(len(syncs))
        ev["sync_calls"] = syncs or []
        ev["memory_headroom"] = memory_headroom(step, device)
        ev["mfu"] = _mfu(step, ev["step_ms"] / 1e3, gpu)
    ev |= model_facts(model)
    facts = optimizer_facts(optimizer, gpu)
    if facts is not None:
        facts["share"] = min(1.0, ev.pop("optimizer_range_ms") / ev["profiled_step_ms"]) \
            if ev["profiled_step_ms"] > 0 else 0.0
    ev["optimizer"] = facts
    return ev


def _mfu(step: Callable[[], Any], step_s: float, gpu: bool) -> float | None:
    """FLOPs counted over the step's time, against the device's BF16 dense datasheet peak (None without one)."""

    peak = get_device().datasheet_tflops("bf16") if gpu else None
    if not peak:
        return None
    try:
        flops = count_flops(step).total
    except Exception:  # a step the counter cannot trace still gets its other evidence
        return None
    return mfu(flops, step_s, peak) if flops else None
