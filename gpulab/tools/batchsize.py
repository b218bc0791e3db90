"""Batch size: find the largest one that fits (and the fastest) and check that gradient accumulation is exact.

    search = find_max_batch_size(lambda b: step(b), max_batch=1024)   # doubling from 1, then bisection
    grad_accumulation_matches(make_model, x, y, loss_fn, micro_batches=4)       # same gradients as one batch

Timing a GPT step at any batch size and reading a sweep (throughput, utilization, memory, the guide's sweet spot)
is in `gpulab.workloads.sweeps`.
"""
from __future__ import annotations

import copy
import html
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from ..measuring.device import as_torch_device, synchronize
from ..measuring.memory import is_oom
from ..measuring.memory import release as _release
from ..measuring.text import si
from ..measuring.files import JsonRecord


class SimulatedOutOfMemory(RuntimeError):
    """Raised when a batch would need more memory than a simulated limit (memory_limit_bytes)."""


ROW_KEYS = ("batch_size", "fits", "samples_per_s", "step_ms", "peak_mem_bytes", "error")


@dataclass
class BatchSizeSearch(JsonRecord):
    """Every batch size tried (fits or not, speed, peak memory), the largest that fits and the fastest."""

    max_fitting: int | None
    best_throughput: int | None
    tried: list[dict[str, Any]] = field(default_factory=list)
    memory_allocated_before: int | None = None
    memory_allocated_after: int | None = None
    memory_allocated_between_steps: int | None = None
    memory_limit_bytes: int | None = None
    device: str = "cpu"
    max_batch: int | None = None  # the search's cap
    notes: list[str] = field(default_factory=list)

    @property
    def capped(self) -> bool:
        """True when the search stopped at its cap, not at a batch that ran out of memory: larger may fit."""
        return self.max_batch is not None and self.max_fitting == self.max_batch

    @property
    def verdict(self) -> str:
        """One line: the largest batch that fits and the fastest, saying when the search stopped at its cap."""
        if self.max_fitting is None:
            return "no batch size fits"
        line = f"largest that fits {self.max_fitting}"
        if self.capped:
            line += f" (stopped at the cap max_batch={self.max_batch}; larger may fit)"
        return line + (f", fastest {self.best_throughput}" if self.best_throughput is not None else "")

    @property
    def memory_recovered(self) -> bool | None:
        """Whether allocated GPU memory is back to its level between training steps (None off CUDA).

        The level is taken after the first step that fit, not before the search: that step legitimately
        creates state that stays (optimizer moments, gradients, the cuBLAS workspace).
        """
        baseline = self.memory_allocated_between_steps
        baseline = self.memory_allocated_before if baseline is None else baseline
        if baseline is None or self.memory_allocated_after is None:
            return None
        return self.memory_allocated_after <= baseline

    def __repr__(self) -> str:
        return (f"BatchSizeSearch({self.verdict}; tried {[r['batch_size'] for r in self.tried]} on {self.device})")

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{_HEADS.get(k, k.replace('_', ' '))}</th>" for k in ROW_KEYS)
        body = ""
        for r in sorted(self.tried, key=lambda r: r["batch_size"]):
            style = " style='background:#dcfce7;font-weight:bold'" if r["batch_size"] == self.best_throughput else ""
            style = " style='color:#b42318'" if not r["fits"] else style
            body += f"<tr{style}>" + "".join(f"<td>{_fmt(k, r.get(k))}</td>" for k in ROW_KEYS) + "</tr>"
        limit = (f"; simulated memory limit {self.memory_limit_bytes / 2**20:.1f} MiB"
                 if self.memory_limit_bytes else "")
        mem = {True: "allocated memory back to its between-steps level",
               False: "allocated memory NOT back to its between-steps level (something holds tensors)",
               None: "memory not tracked (no CUDA)"}[self.memory_recovered]
        cap = f" (stopped at the cap max_batch={self.max_batch}; larger may fit)" if self.capped else ""
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return (f"<div><b>Batch size search</b> on {self.device}{limit}: largest that fits "
                f"<b>{self.max_fitting}</b>{cap}, fastest <b>{self.best_throughput}</b> (highlighted); {mem}"
                f"<table><tr>{head}</tr>{body}</table>" + (f"<ul>{notes}</ul>" if notes else "") + "</div>")


_HEADS = {"batch_size": "batch size", "samples_per_s": "samples/s", "step_ms": "step", "peak_mem_bytes": "peak memory"}


def _fmt(key: str, v: Any) -> str:
    """A table cell: three significant figures with SI prefixes; memory in GB as on the rest of the page."""
    if v is None:
        return "—"
    if key == "peak_mem_bytes":
        return si(v, "B")
    if key == "step_ms" and isinstance(v, (int, float)):
        return si(v / 1e3, "s")
    if key == "error":
        return html.escape(_short_error(str(v)))
    if key == "fits":
        return "yes" if v else "no"
    return si(v) if isinstance(v, float) else html.escape(str(v))


def _short_error(msg: str, limit: int = 80) -> str:
    """An error for a table cell: its first sentences up to `limit` characters, never cut inside a word
    ("OutOfMemoryError: CUDA out of memory. Tried to allocate 16.50 GiB.", not "... this process h")."""
    if len(msg) <= limit:
        return msg
    out = ""
    for part in re.split(r"(?<=\.) ", msg):
        if out and len(out) + 1 + len(part) > limit:
            return out + " …"
        out = f"{out} {part}" if out else part
    if len(out) <= limit:
        return out
    cut = out[:limit].rsplit(" ", 1)[0]
    return cut + " …"


CPU_ALLOCATION_FAILURES = ("can't allocate", "cannot allocate", "defaultcpuallocator", "not enough memory")


def is_allocation_failure(exc: BaseException) -> bool:
    """Out of memory on any device: CUDA's OutOfMemoryError, a RuntimeError saying "out of memory", a CPU
    allocator's failure ("DefaultCPUAllocator: can't allocate memory") or Python's MemoryError."""
    if isinstance(exc, MemoryError) or is_oom(exc):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc).lower() for s in CPU_ALLOCATION_FAILURES)


CUDA_MAX_BATCH = 4096  # the default cap on a GPU; a CPU has none (its memory swaps before it fails)
BATCHNORM_ONE = "more than 1 value per channel when training"  # BatchNorm's error at batch 1 in training mode


def _is_batchnorm_at_one(exc: BaseException, batch: int) -> bool:
    return batch == 1 and isinstance(exc, ValueError) and BATCHNORM_ONE in str(exc)


def find_max_batch_size(step_fn: Callable[[int], Any], *, start: int = 1, max_batch: int | None = None,
                        device: Any = None, memory_limit_bytes: int | None = None,
                        memory_fn: Callable[[int], int] | None = None, measure_throughput: bool = True,
                        timed_steps: int = 3, progress: bool = True) -> BatchSizeSearch:
    """Double the batch size from `start` until a step runs out of memory (or reaches `max_batch`), then bisect.

    `step_fn(batch_size)` runs one full training step and should drop its own references when it returns.
    Out-of-memory is whatever `is_allocation_failure` recognises. `max_batch` is 4096 by default on CUDA; on a CPU
    it must be given, since a batch too big for memory swaps for minutes before it fails. A search that reaches the
    cap says so (`capped`). A model with BatchNorm cannot train at batch 1: that batch is noted and skipped.
    `memory_limit_bytes` simulates a smaller device: a batch fails when `memory_fn(batch_size)`, or on CUDA the
    step's measured peak, exceeds it. Each batch that fits is timed (1 warm-up step, the median of `timed_steps`)."""
    for name, v, lo in (("start", start, 1), ("max_batch", max_batch, 1), ("timed_steps", timed_steps, 1)):
        if (v is not None or name != "max_batch") and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
            raise ValueError(f"{name}={v!r} must be an integer >= {lo}")
    if max_batch is not None and start > max_batch:
        raise ValueError(f"start={start} must not exceed max_batch={max_batch}")
    if memory_limit_bytes is not None and memory_limit_bytes <= 0:
        raise ValueError(f"memory_limit_bytes={memory_limit_bytes!r} must be positive")
    if not callable(step_fn):
        raise ValueError("step_fn must be callable as step_fn(batch_size)")
    dev = as_torch_device(device)
    cuda = dev.type == "cuda"
    if memory_fn is not None and memory_limit_bytes is None:
        raise ValueError("memory_fn needs memory_limit_bytes (the simulated limit it is compared with)")
    if memory_limit_bytes is not None and memory_fn is None and not cuda:
        raise ValueError("memory_limit_bytes needs memory_fn off CUDA (there is no allocator to measure)")
    if max_batch is None:
        if not cuda and memory_limit_bytes is None:
            raise ValueError(f"max_batch is needed on {dev.type!r}: a batch too big for a CPU's memory swaps for "
                             "minutes before it fails; give the largest batch to try, e.g. max_batch=64")
        max_batch = max(CUDA_MAX_BATCH, start)

    _release(dev)
    before = torch.cuda.memory_allocated(dev) if cuda else None
    tried: list[dict[str, Any]] = []
    notes: list[str] = []
    state: dict[str, int | None] = {"between_steps": None}
    bar = tqdm(desc="batch size search", unit="try", disable=not progress)

    def run_step(b: int) -> None:
        if memory_limit_bytes is not None and memory_fn is not None and memory_fn(b) > memory_limit_bytes:
            raise SimulatedOutOfMemory(f"simulated out of memory: batch {b} needs {memory_fn(b)} bytes "
                                       f"> limit {memory_limit_bytes}")
        step_fn(b)
        synchronize(dev)
        if memory_limit_bytes is not None and memory_fn is None:  # CUDA: compare the real peak to the limit
            peak = torch.cuda.max_memory_allocated(dev)
            if peak > memory_limit_bytes:
                raise SimulatedOutOfMemory(f"simulated out of memory: batch {b} peaked at {peak} bytes "
                                           f"> limit {memory_limit_bytes}")

    def attempt(b: int) -> bool | None:
        """True: batch `b` fits; False: out of memory; None: too small for the model (BatchNorm at batch 1)."""
        row = dict(batch_size=b, fits=False, samples_per_s=None, step_ms=None, peak_mem_bytes=None, error=None)
        too_small = False
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        try:
            run_step(b)  # the first step is also the warm-up
            if measure_throughput:
                times = []
                for _ in range(timed_steps):
                    synchronize(dev)
                    t0 = time.perf_counter()
                    run_step(b)
                    times.append(time.perf_counter() - t0)
                step_s = statistics.median(times)
                row.update(step_ms=step_s * 1e3, samples_per_s=b / step_s)
            row["fits"] = True
            if cuda:
                row["peak_mem_bytes"] = torch.cuda.max_memory_allocated(dev)
                if state["between_steps"] is None:
                    state["between_steps"] = torch.cuda.memory_allocated(dev)
        except ValueError as e:
            if not _is_batchnorm_at_one(e, b):
                raise
            row["error"], too_small = "BatchNorm in training mode needs 2 or more samples per batch", True
            notes.append("batch 1 skipped: the model's BatchNorm cannot train on one sample (it needs more than 1 "
                         "value per channel); the search went on from 2")
        except (RuntimeError, MemoryError) as e:
            if not is_allocation_failure(e):
                raise
            row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"  # a string, not the exception
        if not row["fits"]:
            # Out of the except block now: the traceback (and the tensors its frames held) can be freed.
            _release(dev)
        tried.append(row)
        bar.update(1)
        bar.set_postfix(batch=b, fits=row["fits"])
        return None if too_small else row["fits"]

    try:
        good, bad, b = 0, None, start
        while True:  # doubling phase
            fits = attempt(b)
            if fits is None and b < max_batch:  # too small for the model, not too big for memory: go on
                b += 1
            elif fits:
                good = b
                if b >= max_batch:
                    break
                b = min(2 * b, max_batch)
            else:
                bad = None if fits is None else b
                break
        while bad is not None and bad - good > 1:  # bisection between the last fit and the first failure
            mid = (good + bad) // 2
            if attempt(mid):
                good = mid
            else:
                bad = mid
    finally:
        bar.close()
    _release(dev)
    after = torch.cuda.memory_allocated(dev) if cuda else None
    fitting = [r for r in tried if r["fits"] and r["samples_per_s"] is not None]
    best = max(fitting, key=lambda r: r["samples_per_s"])["batch_size"] if fitting else None
    return BatchSizeSearch(max_fitting=good or None, best_throughput=best, tried=tried,
                           memory_allocated_before=before, memory_allocated_after=after,
                           memory_allocated_between_steps=state["between_steps"],
                           memory_limit_bytes=memory_limit_bytes, device=str(dev), max_batch=max_batch,
                           notes=notes)


def grad_accumulation_matches(model_fn: Callable[[], torch.nn.Module], x: torch.Tensor, y: torch.Tensor,
                              loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], micro_batches: int,
                              *, dtype: torch.dtype | None = None, seed: int = 0, rtol: float = 1e-4
                              ) -> dict[str, Any]:
    """Gradients of one big batch vs `micro_batches` accumulated micro-batches (each loss / k): how close?

    Exact in real arithmetic for a mean loss without batch-coupled layers (BatchNorm, dropout); `dtype=torch.float64`
    shows the float32 difference is rounding. Returns max_abs_diff, rel_diff and matches (rel_diff <= rtol)."""
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches!r} must be a positive integer")
    if len(x) % micro_batches:
        raise ValueError(f"micro_batches={micro_batches} must divide the batch size {len(x)}")
    torch.manual_seed(seed)
    big = model_fn()
    torch.manual_seed(seed)
    acc = model_fn()
    acc.load_state_dict(copy.deepcopy(big.state_dict()))  # identical even if model_fn is not seed-deterministic
    if dtype is not None:
        big, acc = big.to(dtype), acc.to(dtype)
        x = x.to(dtype) if x.is_floating_point() else x
    big, acc = big.to(x.device), acc.to(x.device)

    loss_fn(big(x), y).backward()
    for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        (loss_fn(acc(xs), ys) / micro_batches).backward()  # a mean loss: each micro-batch counts 1/k

    diffs, ref = [], []
    for p, q in zip(big.parameters(), acc.parameters()):
        if p.grad is None:
            continue
        diffs.append((p.grad - q.grad).double().flatten())
        ref.append(p.grad.double().flatten())
    diff, ref_all = torch.cat(diffs), torch.cat(ref)
    rel = (diff.norm() / ref_all.norm().clamp_min(1e-300)).item()
    return {"micro_batches": micro_batches, "batch_size": len(x), "micro_batch_size": len(x) // micro_batches,
            "dtype": str(next(big.parameters()).dtype).removeprefix("torch."),
            "max_abs_diff": diff.abs().max().item(), "max_abs_grad": ref_all.abs().max().item(),
            "rel_diff": rel, "matches": rel <= rtol}
