"""Feeding the GPU: a CUDA-stream prefetcher, a DataLoader settings sweep that measures, not guesses, and a
check that the host launches steps faster than the GPU runs them, and endless loaders. Notebook 05's images and
steps are in `gpulab.workloads.image_feeds`; `gpulab.tools.feeds` times a fed loop as a pipeline."""
from __future__ import annotations

import gc
import html
import itertools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import psutil
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler
from tqdm.auto import tqdm

from ..measuring import checks
from ..measuring.device import as_torch_device, synchronize, usable_cores
from ..measuring.text import pct, si
from ..measuring.files import JsonRecord


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move the tensors in a (nested) tuple/list/dict batch to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device, non_blocking) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    return batch


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            yield from _tensors(b)
    elif isinstance(batch, dict):
        for b in batch.values():
            yield from _tensors(b)


class CUDAPrefetcher:
    """Iterate `loader`, copying batch i+1 to the GPU on a side stream while the model works on batch i.

    The copy only overlaps compute when the loader's batches are in pinned memory (`pin_memory=True`).
    Off CUDA it is plain iteration (moving batches with `.to(device)`), so the same loop runs on a CPU.
    """

    def __init__(self, loader: Iterable, device: Any = None):
        self.loader, self.device = loader, as_torch_device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if self.stream is None:
            for batch in self.loader:
                yield to_device(batch, self.device)
            return
        it = iter(self.loader)
        nxt = self._preload(it)
        while nxt is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.stream)  # the copy must have landed before compute reads it
            batch = nxt
            for t in _tensors(batch):
                # Allocated on the side stream, used on this one: keep the allocator from reusing it too early.
                t.record_stream(current)
            nxt = self._preload(it)
            yield batch

    def _preload(self, it: Iterator) -> Any:
        try:
            batch = next(it)
        except StopIteration:
            return None
        with torch.cuda.stream(self.stream):
            return to_device(batch, self.device, non_blocking=True)


def launch_headroom(step: Callable[[Any, Any], Any], x: torch.Tensor, y: torch.Tensor, *, steps: int = 4,
                    repeats: int = 5) -> dict[str, float]:
    """Host seconds to launch one training step beside the GPU seconds to run it (medians of `repeats` bursts of
    `steps` steps, each queued behind an untimed burst so the GPU never waits at its start).

    A loop keeps its GPU busy only while launching a step is quicker than running it; where the two are close, a
    change to the copy measures the host instead. Needs CUDA tensors."""
    checks.positive_int("steps", steps)
    checks.positive_int("repeats", repeats)
    if x.device.type != "cuda":
        raise ValueError(f"launch_headroom needs CUDA tensors; x is on {x.device}")
    host, gpu = [], []
    for _ in range(repeats):
        torch.cuda.synchronize(x.device)
        for _ in range(steps):  # untimed: keeps the GPU busy while the timed burst is launched
            step(x, y)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        for _ in range(steps):
            step(x, y)
        end.record()
        host.append((time.perf_counter() - t0) / steps)
        end.synchronize()
        gpu.append(start.elapsed_time(end) / 1e3 / steps)  # GPU wall per step: its work, or the host's pace
    return {"host_s": statistics.median(host), "gpu_s": statistics.median(gpu), "batch": len(x)}


ROW_KEYS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "samples_per_s", "seconds",
            "cpu_percent", "batches")


@dataclass
class DataLoaderTuning(JsonRecord):
    """Throughput of every DataLoader setting tried, the fastest one, and what was skipped and why."""

    rows: list[dict[str, Any]]
    best: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    batch_size: int = 0
    device: str = "cpu"

    def best_loader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `DataLoader(dataset, **kwargs)` with the fastest setting (batch size included)."""
        if self.best is None:
            raise ValueError("no setting was measured")
        kw = {"batch_size": self.batch_size, "num_workers": self.best["num_workers"],
              "pin_memory": self.best["pin_memory"]}
        if self.best["num_workers"] > 0:  # DataLoader rejects these without workers
            kw.update(prefetch_factor=self.best["prefetch_factor"],
                      persistent_workers=self.best["persistent_workers"])
        return kw

    def __repr__(self) -> str:
        b = self.best
        best = (f"num_workers={b['num_workers']}, pin_memory={b['pin_memory']}, prefetch_factor="
                f"{b['prefetch_factor']}, persistent_workers={b['persistent_workers']}: "
                f"{b['samples_per_s']:.1f} samples/s") if b else "none"
        return f"DataLoaderTuning({len(self.rows)} settings on {self.device}, best: {best})"

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{_HEADS.get(k, k.replace('_', ' '))}</th>" for k in ROW_KEYS)
        body = ""
        for r in self.rows:
            style = " style='background:#dcfce7;font-weight:bold'" if r == self.best else ""
            cells = "".join(f"<td>{_fmt(r.get(k), k)}</td>" for k in ROW_KEYS)
            body += f"<tr{style}>{cells}</tr>"
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return (f"<div><b>DataLoader settings</b> (batch size {self.batch_size}, {self.device}; fastest "
                f"highlighted)<table><tr>{head}</tr>{body}</table>" + (f"<ul>{notes}</ul>" if notes else "")
                + "</div>")


_HEADS = {"samples_per_s": "samples/s", "seconds": "time", "cpu_percent": "host CPU"}


def _fmt(v: Any, key: str = "") -> str:
    """A table cell: three significant figures, the unit named (`key` picks it)."""
    if isinstance(v, float):
        return si(v, "s") if key == "seconds" else pct(v, 1) if key == "cpu_percent" else si(v)
    return "—" if v is None else html.escape(str(v))


def _as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


_ENDLESS = 2**40  # samples in an "endless" epoch: no timed run ever reaches its end


def workers(n: int) -> str:
    """'1 worker', '4 workers'."""
    return f"{n} worker" + ("" if n == 1 else "s")


def endless_loader(dataset: Dataset, *, batch_size: int, num_workers: int = 0, pin_memory: bool = False,
                   prefetch_factor: int | None = 2, persistent_workers: bool = False, seed: int = 0,
                   **kwargs: Any) -> DataLoader:
    """A DataLoader whose single epoch never ends (random samples with replacement, seeded): one iterator can
    feed any number of timed calls without an epoch boundary (a worker restart) in the middle."""
    checks.positive_int("batch_size", batch_size)
    checks.positive_int("num_workers", num_workers, minimum=0)
    sampler = RandomSampler(dataset, replacement=True, num_samples=_ENDLESS,
                            generator=torch.Generator().manual_seed(seed))
    extra = dict(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers) if num_workers else {}
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      pin_memory=pin_memory and torch.cuda.is_available(), **extra, **kwargs)


def sweep_workers(cores: int, batches: int) -> list[int]:
    """tune_dataloader's default workers: 0, 1, half and all the cores, none above the batches timed (idle workers)."""
    return sorted(w for w in {0, 1, max(1, cores // 2), cores} if w <= max(1, batches))


def _shutdown(it: Any) -> None:
    # Stop worker processes now rather than whenever the garbage collector gets to the iterator.
    if hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


class _EpochSampler(Sampler[int]):
    """Random indices, `num_samples` per epoch (settable between epochs), with replacement when the data is short."""

    def __init__(self, n_data: int, seed: int = 0):
        if n_data <= 0:
            raise ValueError("dataset must not be empty")
        self.n_data, self.num_samples, self.generator = n_data, n_data, torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        n, k = self.n_data, self.num_samples
        g = self.generator
        idx = torch.randperm(n, generator=g)[:k] if k <= n else torch.randint(n, (k,), generator=g)
        return iter(idx.tolist())


def tune_dataloader(dataset: Dataset, model_step: Callable[[Any, Any], Any], *, batch_size: int,
                    device: Any = None, workers: Sequence[int] | None = None,
                    pin_memory: bool | Sequence[bool] = (False, True), prefetch_factor: int | Sequence[int] = 2,
                    persistent_workers: bool | Sequence[bool] = True, batches: int | None = None,
                    warmup_batches: int = 2, progress: bool = True, multiprocessing_context: Any = None,
                    seed: int = 0) -> DataLoaderTuning:
    """Time `model_step(x, y)` fed by a DataLoader under each combination of settings; return them all.

    Each setting runs a warm-up epoch of `warmup_batches`, then a timed epoch of `batches` that starts with
    `iter(loader)`, so it pays the worker start-up every epoch pays unless the workers are persistent. `cpu_percent`
    is the whole host's CPU use during the timed epoch. The defaults scale to the dataset: one pass over it (2-20
    `batches`), `sweep_workers` workers, the guide's prefetch_factor=2 and persistent workers."""
    checks.positive_int("batch_size", batch_size)
    checks.positive_int("batches", 1 if batches is None else batches)
    checks.positive_int("warmup_batches", warmup_batches, minimum=0)
    if not callable(model_step):
        raise ValueError("model_step must be callable as model_step(x, y)")
    batches = batches or min(20, max(2, len(dataset) // batch_size))  # one pass over the data, 2 to 20 batches
    workers = list(sweep_workers(usable_cores(), batches) if workers is None else _as_tuple(workers))
    for w in workers:
        checks.positive_int("workers", w, minimum=0)
    prefetch = tuple(dict.fromkeys(_as_tuple(prefetch_factor)))
    for p in prefetch:
        checks.positive_int("prefetch_factor", p)
    pins, persist = _as_tuple(pin_memory), _as_tuple(persistent_workers)
    if not workers or not prefetch or not pins or not persist:
        raise ValueError("workers, pin_memory, prefetch_factor and persistent_workers need at least one value")
    dev = as_torch_device(device)
    notes = []
    if True in pins and dev.type != "cuda":
        pins = tuple(p for p in pins if not p) or (False,)
        notes.append("pin_memory=True skipped: pinned memory only helps (and only works) with a CUDA device")
    if max(workers) > usable_cores():
        notes.append(f"more workers than usable CPU cores ({usable_cores()}): they compete for the same cores")

    settings = []
    for w, pin in itertools.product(dict.fromkeys(workers), dict.fromkeys(pins)):
        if w == 0:
            settings.append((0, bool(pin), None, False))
        else:
            settings += [(w, bool(pin), pf, bool(ps)) for pf, ps in itertools.product(prefetch, dict.fromkeys(persist))]

    sampler = _EpochSampler(len(dataset), seed)
    rows = []
    for w, pin, pf, ps in tqdm(settings, desc="DataLoader settings", disable=not progress):
        sampler.generator.manual_seed(seed)  # every setting reads the same images in the same order
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=w, pin_memory=pin,
                            prefetch_factor=pf, persistent_workers=ps,
                            multiprocessing_context=multiprocessing_context if w > 0 else None)
        its = []
        try:
            # Whole epochs, as in training: at an epoch's end non-persistent workers exit, persistent ones wait.
            if warmup_batches:
                sampler.num_samples = warmup_batches * batch_size
                its.append(iter(loader))
                for x, y in its[-1]:
                    model_step(*to_device((x, y), dev, non_blocking=pin))
            sampler.num_samples = batches * batch_size
            synchronize(dev)
            psutil.cpu_percent(interval=None)  # starts the CPU-use window
            t0 = time.perf_counter()
            its.append(iter(loader))
            n_batches = n_items = 0
            for x, y in its[-1]:
                model_step(*to_device((x, y), dev, non_blocking=pin))
                n_batches, n_items = n_batches + 1, n_items + len(x)
            synchronize(dev)
            seconds = time.perf_counter() - t0
            cpu = psutil.cpu_percent(interval=None)
        finally:
            for it in its:
                _shutdown(it)
            del its, loader
        rows.append(dict(num_workers=w, pin_memory=pin, prefetch_factor=pf, persistent_workers=ps,
                         samples_per_s=n_items / seconds, seconds=seconds, cpu_percent=cpu, batches=n_batches))
    gc.collect()
    best = max(rows, key=lambda r: r["samples_per_s"]) if rows else None
    return DataLoaderTuning(rows=rows, best=best, notes=notes, batch_size=batch_size, device=str(dev))
