"""Where the CPU waits for the GPU: training and eval loops with and without per-step syncs, pinned and
pageable host-to-device copies, and a copy overlapped with compute on a second CUDA stream.

    loop = TrainLoop(model, batches, autocast_dtype=torch.bfloat16)
    slow = loop.fn(8, log="item_twice")           # two .item() per step: two syncs
    fast = loop.fn(8, log="gpu")                  # losses summed on the GPU, one .item() per 8 steps
    masked = loop.fn(8, log="none", mask="index") # loss[mask].mean(): a data-dependent shape, a hidden sync
    probe = loop.fn(1, log="cpu")                 # loss.cpu() every step ("branch": `if loss.sum() > 0:`)
    ev = eval_fn(model, batches, transfer="per_batch")   # .cpu().numpy() every batch, as many eval loops do
    ov = CopyComputeOverlap(n_chunks=8, chunk_mb=64)     # ov.serial / ov.overlapped / ov.copy_only / ov.compute_only
    q = queued_copy_timing(h2d["pageable_non_blocking"], busy_work(0.02))  # does the call wait for queued work?

Every loop runs on a CPU too (there a sync costs nothing, so the before/after is within noise); the copy and
stream helpers need CUDA and say so.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..claims import Estimate

LOG_MODES = ("item_twice", "item_once", "gpu", "none", "cpu", "branch")
MASK_MODES = ("none", "index", "where")
TRANSFERS = ("per_batch", "once")

__all__ = ["LOG_MODES", "MASK_MODES", "TRANSFERS", "token_batches", "masked_mean", "TrainLoop", "eval_fn",
           "CopyTiming", "copy_timing", "h2d_fns", "CopyComputeOverlap", "QueuedCopyTiming", "queued_copy_timing",
           "busy_work", "count_syncs", "hidden_share"]


def _need_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA GPU")


def token_batches(n: int, batch: int, seq: int, vocab: int, device: torch.device | str, *,
                  pad_fraction: float = 0.1, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """`n` random (tokens, targets, mask) batches already on `device`; mask is False at ~pad_fraction positions.

    Random ids, never zeros; made once up front so the loops time the model and the syncs, not data loading.
    """
    for name, v in (("n", n), ("batch", batch), ("seq", seq), ("vocab", vocab)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name}={v!r} must be a positive integer")
    if not 0.0 <= pad_fraction < 1.0:
        raise ValueError(f"pad_fraction={pad_fraction} must be in [0, 1)")
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(0, vocab, (batch, seq), generator=g)
        y = torch.randint(0, vocab, (batch, seq), generator=g)
        mask = torch.rand(batch, seq, generator=g) >= pad_fraction
        out.append((x.to(device), y.to(device), mask.to(device)))
    return out


def masked_mean(values: torch.Tensor, mask: torch.Tensor, how: str = "where") -> torch.Tensor:
    """Mean of `values` where `mask` is True.

    how="index": values[mask].mean() - the result's size depends on the data, so the CPU must wait for the
    GPU to count the mask before it can allocate it (a sync). how="where": a fixed-shape torch.where and a
    division, all on the GPU (no sync). how="none": the plain mean, mask ignored.
    """
    if how == "index":
        return values[mask].mean()
    if how == "where":
        return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device)).sum() / \
            mask.sum().clamp(min=1)
    if how == "none":
        return values.mean()
    raise ValueError(f"how={how!r}; allowed: {', '.join(MASK_MODES)}")


def _autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


class TrainLoop:
    """Training steps of a language model over pre-made batches, with a chosen logging, masking and zero_grad habit.

    `model(x)` must return logits (B, T, vocab) or a tuple whose first item is the logits (gpulab's GPT does).
    """

    def __init__(self, model: torch.nn.Module, batches: list, *, lr: float = 3e-4,
                 autocast_dtype: torch.dtype | None = None, fused: bool | None = None):
        if not batches:
            raise ValueError("batches must not be empty")
        self.model, self.batches, self.autocast_dtype = model, batches, autocast_dtype
        self.device = next(model.parameters()).device
        fused = self.device.type == "cuda" if fused is None else fused
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=fused)
        self._i = 0
        self.last_postfix = ""  # what a progress bar would show; kept so the formatting is not optimised away

    def step(self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, *, mask_mode: str = "none",
             set_to_none: bool = True) -> torch.Tensor:
        """One step: zero_grad, forward, (masked) cross-entropy, backward, optimizer step. Returns the loss, detached."""
        self.model.train()
        self.opt.zero_grad(set_to_none=set_to_none)
        with _autocast(self.device, self.autocast_dtype):
            out = self.model(x)
            logits = out[0] if isinstance(out, tuple) else out
            per_token = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
            loss = masked_mean(per_token, mask.reshape(-1), mask_mode)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def run(self, steps: int, *, log: str = "item_once", mask: str = "none", set_to_none: bool = True) -> float | None:
        """`steps` training steps; returns the mean loss as a Python float (None with log="none").

        log="item_twice": `total += loss.item()` and a progress-bar string from another `loss.item()` (2 syncs/step);
        "item_once": one `loss.item()` reused for both (1 sync/step); "gpu": losses summed on the GPU and read
        once after the loop (1 sync per `steps` steps); "none": nothing read back; "cpu": `loss.cpu()` every step
        (the guide's `.cpu()`, 1 sync/step); "branch": `if loss.sum() > 0:` every step (data-dependent control
        flow, 1 sync/step). "none", "cpu" and "branch" return None.
        """
        if log not in LOG_MODES:
            raise ValueError(f"log={log!r}; allowed: {', '.join(LOG_MODES)}")
        if mask not in MASK_MODES:
            raise ValueError(f"mask={mask!r}; allowed: {', '.join(MASK_MODES)}")
        if not isinstance(steps, int) or steps <= 0:
            raise ValueError(f"steps={steps!r} must be a positive integer")
        total, total_gpu, positive = 0.0, None, 0
        for _ in range(steps):
            x, y, m = self.batches[self._i % len(self.batches)]
            self._i += 1
            loss = self.step(x, y, m, mask_mode=mask, set_to_none=set_to_none)
            if log == "item_twice":
                total += loss.item()
                self.last_postfix = f"loss={loss.item():.4f}"
            elif log == "item_once":
                v = loss.item()
                total += v
                self.last_postfix = f"loss={v:.4f}"
            elif log == "gpu":
                total_gpu = loss if total_gpu is None else total_gpu + loss
            elif log == "cpu":
                self.last_postfix = f"loss={float(loss.cpu()):.4f}"  # float() of a host tensor: no second sync
            elif log == "branch":
                if loss.sum() > 0:  # Python needs the bool now: the CPU waits for the GPU
                    positive += 1
        if log == "gpu":
            return total_gpu.item() / steps
        return total / steps if log in ("item_twice", "item_once") else None

    def fn(self, steps: int, **kwargs: Any) -> Callable[[], float | None]:
        """A no-argument callable running `run(steps, **kwargs)`: what gl.before_after times."""
        self.run(1, **kwargs)  # validates the arguments now, not inside the timing
        return lambda: self.run(steps, **kwargs)


def eval_fn(model: torch.nn.Module, batches: list, *, transfer: str = "per_batch",
            autocast_dtype: torch.dtype | None = None) -> Callable[[], float]:
    """A callable evaluating next-token accuracy at the last position over `batches`.

    transfer="per_batch": `all_preds.extend(preds.cpu().numpy())` every batch (a sync per batch);
    "once": predictions stay on the GPU in a list and are concatenated and copied once after the loop.
    """
    if transfer not in TRANSFERS:
        raise ValueError(f"transfer={transfer!r}; allowed: {', '.join(TRANSFERS)}")
    if not batches:
        raise ValueError("batches must not be empty")
    device = next(model.parameters()).device

    def run() -> float:
        was_training = model.training
        model.eval()
        preds, labels = [], []
        with torch.no_grad(), _autocast(device, autocast_dtype):
            for x, y, _ in batches:
                out = model(x)
                logits = out[0] if isinstance(out, tuple) else out
                p, lab = logits[:, -1].argmax(-1), y[:, -1]
                if transfer == "per_batch":
                    preds.extend(p.cpu().numpy())
                    labels.extend(lab.cpu().numpy())
                else:
                    preds.append(p)
                    labels.append(lab)
        if transfer == "once":
            preds_np, labels_np = torch.cat(preds).cpu().numpy(), torch.cat(labels).cpu().numpy()
        else:
            preds_np, labels_np = np.asarray(preds), np.asarray(labels)
        model.train(was_training)
        return float((preds_np == labels_np).mean())

    return run


def count_syncs(variants: dict[str, Callable[[], Any]]) -> dict[str, int]:
    """Synchronizing calls each variant makes in one run, from torch.cuda.set_sync_debug_mode("warn").

    An exact count per variant (each warning is one synchronizing call); {} without CUDA, where there is no
    device to wait for and the debug mode reports nothing.
    """
    from ..profiling import find_syncs

    if not torch.cuda.is_available():
        return {}
    return {name: len(find_syncs(fn)) for name, fn in variants.items()}


def hidden_share(speedup: Estimate, overlapped_s: float, shorter: Estimate) -> Estimate:
    """Percent of the shorter task (copy or compute) that overlap hid, with its interval.

    serial - overlapped = overlapped * (speedup - 1); divided by the shorter task's time. The interval combines
    the speedup's interval with the shorter task's (the widest ratio of the ends).
    """
    if not (overlapped_s > 0 and shorter.lo > 0):
        raise ValueError("overlapped_s and the shorter task's times must be > 0")
    saved = speedup.map(lambda r: (r - 1) * overlapped_s)
    value = saved.value / shorter.value * 100
    ends = [a / b * 100 for a in (saved.lo, saved.hi) for b in (shorter.lo, shorter.hi)] + [value]
    return Estimate(value, min(ends), max(ends))


# ---------------------------------------------------------------- host-to-device copies

def _quartiles(values: list[float]) -> tuple[float, float, float]:
    """(q1, median, q3) of a non-empty list (inclusive method; one value is its own quartiles)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


@dataclass
class CopyTiming:
    """How long a copy call took to return to Python, against how long the copy ran on the GPU."""

    label: str
    host_s: float  # median time until the call returned control to Python
    device_s: float  # median time the copy took on the GPU (CUDA events around it)
    nbytes: int
    fractions: list[float] = field(default_factory=list)  # host time / device time of each repeat

    @property
    def gbs(self) -> float:
        return self.nbytes / self.device_s / 1e9

    @property
    def host_fraction(self) -> float:
        """Host time over device time: near 0 means the call returned at once; near 1 means it waited."""
        return self.host_s / self.device_s

    def fraction_estimate(self) -> Estimate:
        """The per-repeat host/device fraction: median with its quartiles (the ratio of medians without repeats)."""
        if not self.fractions:
            return Estimate.exact(self.host_fraction)
        q1, med, q3 = _quartiles(self.fractions)
        return Estimate(med, q1, q3)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"gbs": self.gbs, "host_fraction": self.host_fraction}


def copy_timing(copy: Callable[[], Any], nbytes: int, *, label: str = "", repeats: int = 10) -> CopyTiming:
    """Time `copy()` twice over: host clock until it returns (no sync) and CUDA events on the GPU."""
    _need_cuda("copy_timing")
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    copy()  # warm-up
    torch.cuda.synchronize()
    host, dev = [], []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        s.record()
        copy()
        t1 = time.perf_counter()  # before any sync: the call has returned, the copy may still be running
        e.record()
        torch.cuda.synchronize()
        host.append(t1 - t0)
        dev.append(s.elapsed_time(e) / 1e3)
    return CopyTiming(label, statistics.median(host), statistics.median(dev), nbytes,
                      fractions=[h / d for h, d in zip(host, dev)])


@dataclass
class QueuedCopyTiming:
    """A copy issued behind queued GPU work: did the call return while the GPU was still busy (overlap),
    or only after the queued work and the copy were done (no overlap)?"""

    label: str
    host_s: list[float]  # per repeat: time until the copy call returned
    queued_s: list[float]  # per repeat: the queued work's time on the GPU
    copy_s: list[float]  # per repeat: the copy's time on the GPU (from the end of the queued work)

    @property
    def waited(self) -> list[float]:
        """Per repeat: host time / (queued work + copy) on the GPU. ~1: the call waited for both; ~0: it returned."""
        return [h / (q + c) for h, q, c in zip(self.host_s, self.queued_s, self.copy_s)]

    def estimate(self) -> Estimate:
        """The waited fraction: median with its quartiles over the repeats."""
        q1, med, q3 = _quartiles(self.waited)
        return Estimate(med, q1, q3)

    def medians(self) -> dict[str, float]:
        """Median seconds of the call's return (host), the queued work and the copy (GPU)."""
        return {"host_s": statistics.median(self.host_s), "queued_s": statistics.median(self.queued_s),
                "copy_s": statistics.median(self.copy_s)}

    def to_dict(self) -> dict[str, Any]:
        e = self.estimate()
        return asdict(self) | {"waited_median": e.value, "waited_q1": e.lo, "waited_q3": e.hi} | {
            f"median_{k}": v for k, v in self.medians().items()}


def busy_work(seconds: float, *, device: torch.device | str | None = None, size: int = 2048) -> Callable[[], None]:
    """A callable that queues about `seconds` of GPU work (chained fp32 matmuls) and returns at once."""
    _need_cuda("busy_work")
    if not seconds > 0:
        raise ValueError(f"seconds={seconds} must be > 0")
    device = torch.device(device or "cuda")
    a = torch.randn(size, size, device=device) / size**0.5
    b = torch.empty_like(a)

    def matmuls(n: int) -> None:
        for _ in range(n):
            torch.matmul(a, a, out=b)

    matmuls(3)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    matmuls(10)
    e.record()
    torch.cuda.synchronize()
    n = max(1, round(seconds / (s.elapsed_time(e) / 1e3 / 10)))
    return lambda: matmuls(n)


def queued_copy_timing(copy: Callable[[], Any], queue_work: Callable[[], Any], *, label: str = "",
                       repeats: int = 10) -> QueuedCopyTiming:
    """Queue `queue_work()` on the GPU, then call `copy()` at once and time how long the call takes to return.

    A copy that overlaps returns while the queued work still runs; one that synchronizes (a "non_blocking"
    copy from pageable memory, which CUDA stages through a pinned buffer after a stream sync) returns only
    after the queued work and the copy are done.
    """
    _need_cuda("queued_copy_timing")
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    queue_work()
    copy()  # warm-up
    torch.cuda.synchronize()
    host, queued, copied = [], [], []
    for _ in range(repeats):
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize()
        e0.record()
        queue_work()
        e1.record()
        t0 = time.perf_counter()
        copy()
        t1 = time.perf_counter()  # the call has returned; nothing synchronized yet on our side
        e2.record()
        torch.cuda.synchronize()
        host.append(t1 - t0)
        queued.append(e0.elapsed_time(e1) / 1e3)
        copied.append(e1.elapsed_time(e2) / 1e3)
    return QueuedCopyTiming(label or getattr(copy, "__name__", "copy"), host, queued, copied)


def h2d_fns(nbytes: int, device: torch.device | str | None = None) -> dict[str, Callable[[], Any]]:
    """Host-to-device copies of `nbytes` of random floats into a preallocated GPU buffer.

    Keys: "pageable" (ordinary host memory, blocking), "pageable_non_blocking", "pinned" (page-locked, blocking)
    and "pinned_non_blocking". The buffers are allocated once, so the timings are the copies alone.
    """
    _need_cuda("h2d_fns")
    if nbytes < 4:
        raise ValueError(f"nbytes={nbytes} must be >= 4")
    device = torch.device(device or "cuda")
    n = nbytes // 4
    pageable = torch.randn(n)
    pinned = torch.randn(n).pin_memory()
    dst = torch.empty(n, device=device)
    return {"pageable": lambda: dst.copy_(pageable),
            "pageable_non_blocking": lambda: dst.copy_(pageable, non_blocking=True),
            "pinned": lambda: dst.copy_(pinned),
            "pinned_non_blocking": lambda: dst.copy_(pinned, non_blocking=True)}


class CopyComputeOverlap:
    """Copy `n_chunks` pinned host chunks to the GPU and run a matmul on each: serially, or overlapped.

    serial(): copy i, compute i, copy i+1, ... all on one stream. overlapped(): the copies go on a side stream
    into two alternating buffers while the default stream computes on the other one; events order them.
    The compute is `repeats` matmuls of the chunk (rows x width) by a width x width matrix, calibrated so one
    chunk's compute takes about as long as its copy (where overlap helps most) unless `repeats` is given.
    """

    def __init__(self, n_chunks: int = 8, chunk_mb: float = 64, *, width: int = 2048, repeats: int | None = None,
                 device: torch.device | str | None = None, seed: int = 0):
        _need_cuda("CopyComputeOverlap")
        if n_chunks < 2:
            raise ValueError(f"n_chunks={n_chunks} must be >= 2")
        if chunk_mb <= 0 or width <= 0:
            raise ValueError("chunk_mb and width must be > 0")
        self.device = torch.device(device or "cuda")
        rows = max(1, int(chunk_mb * 2**20 / 4 / width))
        g = torch.Generator().manual_seed(seed)
        self.host = [torch.randn(rows, width, generator=g).pin_memory() for _ in range(n_chunks)]
        self.bufs = [torch.empty(rows, width, device=self.device) for _ in range(2)]
        self.w = torch.randn(width, width, device=self.device) / width**0.5
        self.out = [torch.empty(rows, width, device=self.device) for _ in range(2)]
        self.copy_stream = torch.cuda.Stream(self.device)
        self.chunk_bytes = rows * width * 4
        self.repeats = repeats or self._calibrate()

    def _time(self, fn: Callable[[], Any], n: int = 5) -> float:
        fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / 1e3 / n

    def _calibrate(self) -> int:
        t_copy = self._time(lambda: self.bufs[0].copy_(self.host[0], non_blocking=True))
        t_mm = self._time(lambda: torch.matmul(self.bufs[0], self.w, out=self.out[0]))
        return int(min(64, max(1, round(t_copy / t_mm))))

    def _compute(self, buf: torch.Tensor) -> None:
        """`repeats` chained matmuls starting from the chunk; the results land in two scratch buffers."""
        a, b = self.out
        torch.matmul(buf, self.w, out=a)
        for _ in range(self.repeats - 1):
            torch.matmul(a, self.w, out=b)
            a, b = b, a

    def serial(self) -> None:
        for i, h in enumerate(self.host):
            buf = self.bufs[i % 2]
            buf.copy_(h, non_blocking=True)
            self._compute(buf)

    def overlapped(self) -> None:
        cur = torch.cuda.current_stream(self.device)
        side = self.copy_stream
        side.wait_stream(cur)  # the buffers may still be in use by the previous call's compute
        free: list[torch.cuda.Event | None] = [None, None]
        for i, h in enumerate(self.host):
            j = i % 2
            with torch.cuda.stream(side):
                if free[j] is not None:
                    side.wait_event(free[j])  # compute on this buffer (chunk i-2) must be done
                self.bufs[j].copy_(h, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(side)
            cur.wait_event(ready)
            self._compute(self.bufs[j])
            done = torch.cuda.Event()
            done.record(cur)
            free[j] = done

    def copy_only(self) -> None:
        for i, h in enumerate(self.host):
            self.bufs[i % 2].copy_(h, non_blocking=True)

    def compute_only(self) -> None:
        for i in range(len(self.host)):
            self._compute(self.bufs[i % 2])
